// Host side of flash's decode kernel (decode.h) and the combine kernel of its splits.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cmath>

#include "backends/flash/decode.h"
#include "backends/flash/decode_kernel.cuh"
#include "backends/flash/device_common.cuh"
#include "backends/flash/kernels.h"
#include "backends/flash/planner.h"
#include "common/cuda_util.h"
#include "problem/problem.h"

namespace fusedattn::flash {

namespace {

constexpr int kMaxSplits = 128;
constexpr size_t kAlign = 256;

size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// One warp per query row (b, h, i): LSE = log(sum_s exp(LSE_s) + exp(extra logit)),
// O = sum_s exp(LSE_s - LSE) O_s; splits without a visible key of the row (LSE_s = -inf) weigh 0
// (their O_s, zeros, is read but not added). A row no split saw has O = 0 and LSE = -inf.
// Latency, not bandwidth, is its cost (b = 1 has a few dozen rows, each over up to 128 splits):
// every lane reads the LSE of splits lane + 32 u at once, and the O_s rows are read
// kCombineBatch splits at a time (a float4 of 4 columns a lane), so that a row costs
// 1 + splits / kCombineBatch round trips to L2 rather than two per split.
constexpr int kCombineBatch = 16;

__global__ void __launch_bounds__(128) DecodeCombineKernel(const DecodeParams d) {
  WaitForPreviousGrid();  // the decode kernel's partials (programmatic launch)
  AllowNextGridLaunch();
  const FlashParams& p = d.base;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * 4 + warp;
  const int64_t rows = int64_t{p.batch} * p.heads_q * p.max_seqlen_q;
  if (row >= rows) return;
  const int i = static_cast<int>(row % p.max_seqlen_q);
  const int h = static_cast<int>((row / p.max_seqlen_q) % p.heads_q);
  const int b = static_cast<int>(row / (int64_t{p.max_seqlen_q} * p.heads_q));
  // The query side of the sequence (as the decode kernel reads it).
  const SeqInfo seq = LoadQuerySeq(p, b);
  const int len_q = seq.len_q;
  const int64_t start_q = seq.start_q;
  if (p.thd && i >= len_q) return;  // not a token of the sequence

  constexpr int kPerLane = kMaxSplits / 32;  // split lane + 32 u in weight[u]
  const int64_t stride_split = int64_t{p.batch} * p.heads_q * p.max_seqlen_q;
  const float* lse_s = d.partial_lse + row;  // split s at lse_s[s * stride_split]
  float weight[kPerLane];
  float m = -INFINITY;
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int s = lane + 32 * u;
    weight[u] = s < d.splits ? lse_s[s * stride_split] : -INFINITY;
    m = fmaxf(m, weight[u]);
  }
  m = WarpMax(m);
  const int dv = p.head_dim_v;
  const int col = 4 * lane;  // this lane's columns col..col+3 (head_dim_v in {64, 128})
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float lse = -INFINITY;
  if (m != -INFINITY) {
    const float extra = ExtraLogit(p, h);
    const float top = fmaxf(m, extra);
    float z = 0.f;
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) {
      weight[u] = weight[u] == -INFINITY ? 0.f : expf(weight[u] - top);
      z += weight[u];
    }
    z = WarpSum(z) + expf(extra - top);
    lse = top + logf(z);
    const float inv_z = 1.f / z;
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) weight[u] *= inv_z;  // exp(LSE_s - LSE)
    const float* o_row = d.partial_o + row * dv + col;      // split s at + s * stride_split * dv
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) {
      if (32 * u >= d.splits) break;
#pragma unroll
      for (int s0 = 0; s0 < 32; s0 += kCombineBatch) {
        const int first = 32 * u + s0;
        if (first >= d.splits) break;
        float4 o[kCombineBatch];
#pragma unroll
        for (int k = 0; k < kCombineBatch; ++k) {
          o[k] = make_float4(0.f, 0.f, 0.f, 0.f);
          if (first + k < d.splits && col < dv)
            o[k] = *reinterpret_cast<const float4*>(o_row + (first + k) * stride_split * dv);
        }
#pragma unroll
        for (int k = 0; k < kCombineBatch; ++k) {
          const float w = __shfl_sync(0xffffffffu, weight[u], s0 + k);
          if (w > 0.f) {
            acc.x = fmaf(w, o[k].x, acc.x), acc.y = fmaf(w, o[k].y, acc.y);
            acc.z = fmaf(w, o[k].z, acc.z), acc.w = fmaf(w, o[k].w, acc.w);
          }
        }
      }
    }
  }
  if (col < dv) {
    StoreElem(p.o.data, p.o_dtype, Offset(p.o, b, h, start_q, i, col), acc.x);
    StoreElem(p.o.data, p.o_dtype, Offset(p.o, b, h, start_q, i, col + 1), acc.y);
    StoreElem(p.o.data, p.o_dtype, Offset(p.o, b, h, start_q, i, col + 2), acc.z);
    StoreElem(p.o.data, p.o_dtype, Offset(p.o, b, h, start_q, i, col + 3), acc.w);
  }
  if (lane == 0 && p.lse.data && (p.lse.packed ? i < len_q : i < p.max_seqlen_q))
    p.lse.data[LseOffset(p.lse, b, h, start_q, i)] = lse;
}

Status LaunchDecodeCombine(const DecodeParams& d, cudaStream_t stream) {
  const int64_t rows = int64_t{d.base.batch} * d.base.heads_q * d.base.max_seqlen_q;
  const int64_t blocks = (rows + 3) / 4;
  if (blocks > INT_MAX) return NotSupported("flash decode combine: %lld blocks", (long long)blocks);
  return LaunchMaybeProgrammatic(DecodeCombineKernel, static_cast<unsigned>(blocks), 128, 0,
                                 d.programmatic_launch, stream, d);
}

bool HalfType(fusedattn_dtype dtype) {
  return dtype == FUSEDATTN_DTYPE_FLOAT16 || dtype == FUSEDATTN_DTYPE_BFLOAT16;
}

size_t SmemBytes(int head_dim, int block_rows) {
  if (head_dim == 64)
    return block_rows == 16 ? DecodeSmemBytes<64, 16>() : DecodeSmemBytes<64, 32>();
  return block_rows == 16 ? DecodeSmemBytes<128, 16>() : DecodeSmemBytes<128, 32>();
}

int MinBlocksPerSm(int head_dim, int block_rows) {
  if (head_dim == 64)
    return block_rows == 16 ? DecodeMinBlocksPerSm<64, 16>() : DecodeMinBlocksPerSm<64, 32>();
  return block_rows == 16 ? DecodeMinBlocksPerSm<128, 16>() : DecodeMinBlocksPerSm<128, 32>();
}

// cp.async reads 16-byte pieces of rows: the head dim innermost and every row 16-byte aligned.
bool RowsAligned16(const TensorView& t) {
  return t.stride_d == 1 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 &&
         t.stride_b % 8 == 0 && t.stride_h % 8 == 0 && t.stride_s % 8 == 0;
}

}  // namespace

Status DecodeFits(const Problem& p, const DeviceFacts& device) {
  const auto& c = p.config;
  if (!HalfType(c.qkv_dtype) || c.o_dtype != c.qkv_dtype)
    return NotSupported("flash's decode kernel takes float16 or bfloat16 with o_dtype equal, but "
                        "qkv_dtype = %s, o_dtype = %s",
                        DtypeName(c.qkv_dtype), DtypeName(c.o_dtype));
  if (c.head_dim_qk != c.head_dim_v || (c.head_dim_qk != 64 && c.head_dim_qk != 128))
    return NotSupported("flash's decode kernel is built for head_dim_qk = head_dim_v in {64, "
                        "128}, but head_dim_qk = %lld, head_dim_v = %lld",
                        (long long)c.head_dim_qk, (long long)c.head_dim_v);
  if (c.max_seqlen_q > 16)
    return NotSupported("flash's decode kernel takes max_seqlen_q <= 16 query rows per sequence, "
                        "but max_seqlen_q = %lld (on sm_90, chunked prefill against pages runs "
                        "on the Hopper forward)",
                        (long long)c.max_seqlen_q);
  if (c.dropout > 0.0)
    return NotSupported("flash's decode kernel has no dropout (dropout = %g)", c.dropout);
  if (p.score_mod)
    return NotSupported("flash's decode kernel does not compile score_mod graphs yet");
  const int cc = device.compute_capability;
  if (cc < 80)
    return NotSupported("flash's decode kernel needs compute capability 8.0 or later (mma.sync, "
                        "cp.async); this GPU has %d.%d",
                        cc / 10, cc % 10);
  const DecodePlan plan = PlanDecode(p, device);
  const size_t need = SmemBytes(plan.head_dim, plan.block_rows);
  const size_t limit = device.smem_per_block;
  if (need > limit)
    return NotSupported("flash's decode kernel at head dim %d needs %zu bytes of shared memory "
                        "per block, more than the %zu this GPU gives",
                        plan.head_dim, need, limit);
  const int64_t blocks = c.batch * c.heads_kv * int64_t{plan.splits} * plan.row_chunks;
  if (blocks > INT_MAX || c.batch * c.heads_q * c.max_seqlen_q / 4 > INT_MAX)
    return NotSupported("flash's decode kernel: batch = %lld with heads_kv = %lld needs more "
                        "thread blocks than a CUDA grid holds",
                        (long long)c.batch, (long long)c.heads_kv);
  return Status::Ok();
}

bool WantsDecode(const Problem& p, const DeviceFacts& device) {
  return p.device == Device::kCuda && DecodeFits(p, device).ok();
}

// Decode is memory-bound, and a block streams its key tiles one after another with a fixed
// number of bytes in flight, so the time is that of the busiest block slot: waves x (tiles per
// split + 1), the 1 for the pipeline's fill (the first tile's latency) and the block's
// reduction. Splits are whole 64-key tiles, at most kMaxSplits (the combine's limit). Among the
// split counts whose cost is within 5% of the least, the fewest: fewer partials to write and
// combine. With base >= slots the batch alone fills the GPU: one split, no combine.
//
// Host cost: up to kMaxSplits candidates with a few 64-bit divisions each (about 1 us), and a
// call plans its decode several times (fit, workspace, plan, run), a decode loop every step with
// the same numbers for 64 steps: the thread keeps its last answer.
int DecodeSplitsFor(int64_t tiles, int64_t base, int64_t slots) {
  if (base <= 0 || slots <= 0 || base >= slots) return 1;
  thread_local int64_t last_tiles = -1, last_base = -1, last_slots = -1;
  thread_local int last_splits = 1;
  if (tiles == last_tiles && base == last_base && slots == last_slots) return last_splits;
  const int64_t most = std::min<int64_t>(tiles, kMaxSplits);
  int64_t used[kMaxSplits + 1], cost[kMaxSplits + 1];
  int64_t least = INT64_MAX;
  for (int64_t s = 1; s <= most; ++s) {
    const int64_t per = (tiles + s - 1) / s;
    used[s] = (tiles + per - 1) / per;  // splits with keys
    cost[s] = (base * used[s] + slots - 1) / slots * (per + 1);
    least = std::min(least, cost[s]);
  }
  int splits = 1;
  for (int64_t s = 1; s <= most; ++s)
    if (cost[s] * 100 <= least * 105) {
      splits = static_cast<int>(used[s]);
      break;
    }
  last_tiles = tiles, last_base = base, last_slots = slots, last_splits = splits;
  return splits;
}

DecodePlan PlanDecode(const Problem& p, const DeviceFacts& device) {
  const auto& c = p.config;
  DecodePlan plan;
  plan.head_dim = c.head_dim_qk <= 64 ? 64 : 128;
  const int64_t group = c.heads_q / c.heads_kv;
  plan.rows = static_cast<int>(group * c.max_seqlen_q);
  plan.block_rows = plan.rows <= 16 ? 16 : 32;
  plan.row_chunks = (plan.rows + plan.block_rows - 1) / plan.block_rows;

  // Splits (DecodeSplitsFor): blocks resident per SM from shared memory (DeviceFacts) and the
  // instance's register budget (DecodeMinBlocksPerSm).
  const int64_t tiles = std::max<int64_t>(1, (c.max_seqlen_kv + 63) / 64);
  const size_t smem = SmemBytes(plan.head_dim, plan.block_rows) + device.reserved_smem_per_block;
  const int64_t most_per_sm = MinBlocksPerSm(plan.head_dim, plan.block_rows);
  const int64_t per_sm =
      std::max<int64_t>(1, std::min<int64_t>(most_per_sm, device.smem_per_sm / smem));
  plan.blocks_per_sm = static_cast<int>(per_sm);
  const int64_t slots = int64_t{device.sm_count} * per_sm;  // 0 SMs (no device): one split
  const int64_t base = c.batch * c.heads_kv * plan.row_chunks;
  const int64_t splits = DecodeSplitsFor(tiles, base, slots);
  plan.tiles_per_split = static_cast<int>((tiles + splits - 1) / splits);
  plan.splits = static_cast<int>((tiles + plan.tiles_per_split - 1) / plan.tiles_per_split);
  plan.blocks = base * plan.splits;
  // Programmatic launches only where the kernel that runs has griddepcontrol compiled in: the
  // sm_90a instances (decode_kernel.cuh compiles the waits for __CUDA_ARCH__ >= 900). A newer GPU
  // runs the default build's compute_80 PTX, without the waits, where such a launch would let a
  // kernel read what the grid before it has not finished writing.
  plan.programmatic_launch = device.compute_capability == 90;
  if (plan.splits > 1) {
    const size_t rows = static_cast<size_t>(plan.splits) * c.batch * c.heads_q * c.max_seqlen_q;
    plan.workspace = AlignUp(rows * c.head_dim_v * sizeof(float)) + AlignUp(rows * sizeof(float));
  }
  return plan;
}

size_t DecodeWorkspaceBytes(const Problem& p, const DeviceFacts& device) {
  return PlanDecode(p, device).workspace;
}


Status RunDecode(const Problem& problem, const FwdTensors& t, const FlashParams& common,
                 const DeviceFacts& device, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream) {
  const auto& c = problem.config;
  if (!RowsAligned16(t.q) || !RowsAligned16(t.k) || !RowsAligned16(t.v))
    return NotSupported(
        "flash's decode kernel reads q, k and v rows with 16-byte copies: they must be "
        "contiguous along the head dim (stride 1) and 16-byte aligned (pointer and strides)");
  const DecodePlan plan = PlanDecode(problem, device);
  if (plan.workspace > 0 && (workspace == nullptr || workspace_bytes < plan.workspace))
    return Status(FUSEDATTN_ERROR_WORKSPACE,
                  Format("flash decode needs %zu bytes of workspace (%d splits), %zu given",
                         plan.workspace, plan.splits, workspace_bytes));
  DecodeParams d;
  d.base = common;
  d.base.max_logit = t.max_logit;
  d.base.max_logit_stride = t.max_logit_stride;
  if (problem.paged) {  // common.paged holds the table (the backend's SetPagedKv)
    const int page_size = d.base.paged.page_size;
    if (page_size > 0 && (page_size & (page_size - 1)) == 0)
      while ((int64_t{1} << (d.page_shift + 1)) <= page_size) ++d.page_shift;
  }
  d.rows = plan.rows;
  d.row_chunks = plan.row_chunks;
  d.splits = plan.splits;
  d.tiles_per_split = plan.tiles_per_split;
  d.programmatic_launch = plan.programmatic_launch;
  if (plan.splits > 1) {
    const size_t rows = static_cast<size_t>(plan.splits) * c.batch * c.heads_q * c.max_seqlen_q;
    d.partial_o = static_cast<float*>(workspace);
    d.partial_lse = reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                             AlignUp(rows * c.head_dim_v * sizeof(float)));
  }
  if (d.base.max_logit) FUSEDATTN_RETURN_IF_ERROR(LaunchFillMaxLogit(d.base, stream));
  const bool half = c.qkv_dtype == FUSEDATTN_DTYPE_FLOAT16;
  Status launched =
      plan.head_dim == 64
          ? (half ? LaunchDecode<Half, 64>(d, plan.block_rows, stream)
                  : LaunchDecode<Bfloat16, 64>(d, plan.block_rows, stream))
          : (half ? LaunchDecode<Half, 128>(d, plan.block_rows, stream)
                  : LaunchDecode<Bfloat16, 128>(d, plan.block_rows, stream));
  FUSEDATTN_RETURN_IF_ERROR(launched);
  if (plan.splits > 1) FUSEDATTN_RETURN_IF_ERROR(LaunchDecodeCombine(d, stream));
  return Status::Ok();
}

}  // namespace fusedattn::flash
