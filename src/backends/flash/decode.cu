// Host side of flash's decode kernel (decode.h) and the combine kernel of its splits.
#include <algorithm>
#include <climits>
#include <cmath>

#include "backends/flash/decode.h"
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
// O = sum_s exp(LSE_s - LSE) O_s; splits without a visible key of the row (LSE_s = -inf) do not
// enter (their O_s is not read). A row no split saw has O = 0 and LSE = -inf.
__global__ void __launch_bounds__(128) DecodeCombineKernel(const DecodeParams d) {
  const FlashParams& p = d.base;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * 4 + warp;
  const int64_t rows = int64_t{p.batch} * p.heads_q * p.max_seqlen_q;
  if (row >= rows) return;
  const int i = static_cast<int>(row % p.max_seqlen_q);
  const int h = static_cast<int>((row / p.max_seqlen_q) % p.heads_q);
  const int b = static_cast<int>(row / (int64_t{p.max_seqlen_q} * p.heads_q));
  // The query side of the sequence (as the decode kernel reads it).
  int len_q = p.max_seqlen_q;
  int64_t start_q = 0;
  if (p.padding) {
    int64_t lq = int64_t{p.cu_seqlens_q[b + 1]} - p.cu_seqlens_q[b];
    lq = ClampI64(lq, 0, p.max_seqlen_q);
    if (p.thd) {
      int64_t start = p.seq_offsets_q ? p.seq_offsets_q[b] : p.cu_seqlens_q[b];
      start = ClampI64(start, 0, p.tokens_q);
      lq = lq < p.tokens_q - start ? lq : p.tokens_q - start;
      start_q = start;
    }
    len_q = static_cast<int>(lq);
  }
  if (p.thd && i >= len_q) return;  // not a token of the sequence

  const int64_t stride_split = int64_t{p.batch} * p.heads_q * p.max_seqlen_q;
  const float* lse_s = d.partial_lse + row;  // split s at lse_s[s * stride_split]
  float m = -INFINITY;
  for (int s = lane; s < d.splits; s += 32) m = fmaxf(m, lse_s[s * stride_split]);
  m = WarpMax(m);
  const int dv = p.head_dim_v;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};  // columns lane + 32 k (head_dim_v <= 128)
  float lse = -INFINITY;
  if (m != -INFINITY) {
    const float extra = ExtraLogit(p, h);
    const float top = fmaxf(m, extra);
    float z = 0.f;
    for (int s = lane; s < d.splits; s += 32) {
      const float l = lse_s[s * stride_split];
      if (l != -INFINITY) z += expf(l - top);
    }
    z = WarpSum(z) + expf(extra - top);
    lse = top + logf(z);
    for (int s = 0; s < d.splits; ++s) {
      const float l = lse_s[s * stride_split];
      if (l == -INFINITY) continue;
      const float weight = expf(l - lse);
      const float* o_s = d.partial_o + (s * stride_split + row) * dv;
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (lane + 32 * k < dv) acc[k] += weight * o_s[lane + 32 * k];
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (lane + 32 * k < dv)
      StoreElem(p.o.data, p.o_dtype, Offset(p.o, b, h, start_q, i, lane + 32 * k), acc[k]);
  if (lane == 0 && p.lse.data && (p.lse.packed ? i < len_q : i < p.max_seqlen_q))
    p.lse.data[LseOffset(p.lse, b, h, start_q, i)] = lse;
}

Status LaunchDecodeCombine(const DecodeParams& d, cudaStream_t stream) {
  const int64_t rows = int64_t{d.base.batch} * d.base.heads_q * d.base.max_seqlen_q;
  const int64_t blocks = (rows + 3) / 4;
  if (blocks > INT_MAX) return NotSupported("flash decode combine: %lld blocks", (long long)blocks);
  DecodeCombineKernel<<<static_cast<unsigned>(blocks), 128, 0, stream>>>(d);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

bool HalfType(fusedattn_dtype dtype) {
  return dtype == FUSEDATTN_DTYPE_FLOAT16 || dtype == FUSEDATTN_DTYPE_BFLOAT16;
}

size_t SmemBytes(int head_dim, int block_rows) {
  if (head_dim == 64)
    return block_rows == 16 ? DecodeSmemBytes<64, 16>() : DecodeSmemBytes<64, 32>();
  return block_rows == 16 ? DecodeSmemBytes<128, 16>() : DecodeSmemBytes<128, 32>();
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
                        "but max_seqlen_q = %lld (chunked prefill against pages is not built "
                        "yet)",
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

DecodePlan PlanDecode(const Problem& p, const DeviceFacts& device) {
  const auto& c = p.config;
  DecodePlan plan;
  plan.head_dim = c.head_dim_qk <= 64 ? 64 : 128;
  const int64_t group = c.heads_q / c.heads_kv;
  plan.rows = static_cast<int>(group * c.max_seqlen_q);
  plan.block_rows = plan.rows <= 16 ? 16 : 32;
  plan.row_chunks = (plan.rows + plan.block_rows - 1) / plan.block_rows;

  // Splits: enough blocks to fill the GPU (at most 2 blocks per SM: the d128 32-row instance
  // takes 252 registers a thread, and shared memory may allow fewer), each split a
  // whole number of key tiles. Among split counts up to the tiles there are, the fewest whose
  // share of busy block slots over the waves is within 0.85 of the best (FlashAttention's rule:
  // fewer splits mean less combining).
  const int64_t tiles = std::max<int64_t>(1, (c.max_seqlen_kv + 63) / 64);
  const size_t smem = SmemBytes(plan.head_dim, plan.block_rows) + device.reserved_smem_per_block;
  const int64_t per_sm = std::max<int64_t>(1, std::min<int64_t>(2, device.smem_per_sm / smem));
  const int64_t slots = int64_t{device.sm_count} * per_sm;  // 0 SMs (no device): one split
  const int64_t base = c.batch * c.heads_kv * plan.row_chunks;
  auto efficiency = [&](int64_t splits) {
    const int64_t blocks = base * splits;
    const int64_t waves = (blocks + slots - 1) / slots;
    return static_cast<double>(blocks) / static_cast<double>(waves * slots);
  };
  auto used = [&](int64_t s) {  // splits with keys: ceil(tiles / ceil(tiles / s))
    const int64_t per = (tiles + s - 1) / s;
    return (tiles + per - 1) / per;
  };
  int64_t splits = 1;
  if (base < slots) {
    const int64_t most = std::min<int64_t>(tiles, kMaxSplits);
    double best = 0;
    for (int64_t s = 1; s <= most; ++s) best = std::max(best, efficiency(used(s)));
    for (int64_t s = 1; s <= most; ++s)
      if (efficiency(used(s)) >= 0.85 * best) {
        splits = used(s);
        break;
      }
  }
  plan.tiles_per_split = static_cast<int>((tiles + splits - 1) / splits);
  plan.splits = static_cast<int>((tiles + plan.tiles_per_split - 1) / plan.tiles_per_split);
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
  if (problem.paged) {
    d.page_table = t.page_table;
    d.page_table_stride = t.page_table_stride;
    d.page_size = static_cast<int>(c.page_size);
    d.num_pages = t.num_pages;
    d.seqlens_kv = t.seqlens_kv;
  }
  d.rows = plan.rows;
  d.row_chunks = plan.row_chunks;
  d.splits = plan.splits;
  d.tiles_per_split = plan.tiles_per_split;
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
