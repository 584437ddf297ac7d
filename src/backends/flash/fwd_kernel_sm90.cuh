// The Hopper forward (sm_90a): warpgroup MMA (wgmma) from 128-byte-swizzled shared memory, K/V
// tiles loaded by TMA through a two-stage mbarrier pipeline, FlashAttention-3 style.
//
// One block per (query tile of 128 rows, head, sequence), three warpgroups:
//  * warpgroup 0 is the producer (one warp works, with few registers: setmaxnreg 24/32): it loads
//    Q once and streams K(n), V(n) into stage n % 2, waiting until both consumers released the
//    stage (k_empty / v_empty) before overwriting it;
//  * warpgroups 1 and 2 are consumers (setmaxnreg 240/232), 64 query rows each: S = Q K^T with both
//    operands from shared memory (m64n128k16, K-major), the online softmax in registers
//    (exp2 with the scale folded into one FFMA), then O += P V with P in registers as the A
//    operand and V an MN-major B operand (transpose bit). The two consumers overlap each other's
//    softmax with their GEMMs on the tensor cores.
// Key tiles are walked from the last to the first; only tiles the mask reaches are visited and
// element masks run only on tiles that cross a boundary (per consumer's 64 rows). Out-of-bounds
// rows of a tensor are zero-filled by TMA; rows past a sequence's length that are inside the
// tensor (padding, THD) are real other tokens or garbage: S is masked there, and the producer
// zeroes the V rows of the one tile that crosses the end of the keys where O += P V reads them
// (0 * NaN would poison O).
// The last tile of a sequence with at most 64 rows left leaves consumer 1 idle, and d128's key
// tile with at most 64 keys left runs both products over 64 keys.
// The epilogue (sink, LSE, max logit, fully masked rows) is fwd_kernel.cuh's.
#pragma once

#include <climits>
#include <type_traits>

#include "backends/flash/device_common.cuh"
#include "backends/flash/schedule.h"
#include "backends/flash/fwd_kernel.cuh"
#include "backends/flash/sm90.h"
#include "backends/flash/wgmma.cuh"
#include "common/cuda_util.h"

namespace fusedattn::flash {

template <int kHeadDim>
struct Sm90FwdTile {
  static_assert(kHeadDim == 64 || kHeadDim == 128, "wgmma forward: head dims 64 and 128");
  static constexpr int kBlockM = 128;  // 2 consumer warpgroups x 64 rows
  // d64: 64 keys per step and two blocks per SM (registers for 2 x 384 threads), so that one
  // block's prologue and epilogue overlap the other's main loop on short sequences; d128: one
  // block per SM with 128 keys per step.
  static constexpr int kBlockN = kHeadDim == 64 ? 64 : 128;
  static constexpr int kMinBlocks = kHeadDim == 64 ? 2 : 1;
  static constexpr int kStages = 2;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerWarps = 8;
  // setmaxnreg: the block starts at 65536 / (384 kMinBlocks) registers per thread, rounded down to
  // 8 (168 or 80); the producer gives back what the consumers take.
  static constexpr int kStartRegs = 65536 / (kThreads * kMinBlocks) / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kHeadDim == 64 ? 104 : 240;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kStartRegs,
                "register budget");
  static constexpr int kColBlocks = kHeadDim / 64;       // 64-column (128-byte) swizzle blocks
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKvBytes = kBlockN * kHeadDim * 2;  // one K or V stage
  static constexpr int kBarrierOffset = kQBytes + 2 * kStages * kKvBytes;
  static constexpr int kBarriers = 2 + 4 * kStages;  // q_full, fix, k/v full, k/v empty
  static constexpr int kSmemBytes = kBarrierOffset + 8 * kBarriers + 1024;  // + alignment slack
};

struct Sm90Maps {
  CUtensorMap q, k, v;
};

template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(384, Sm90FwdTile<kHeadDim>::kMinBlocks)
    WgmmaForwardKernel(const __grid_constant__ Sm90Maps maps, const FlashParams p, int m_tiles) {
#if FUSEDATTN_SM90_DEVICE
  using Tile = Sm90FwdTile<kHeadDim>;
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kStages = Tile::kStages;
  constexpr int kColBlocks = Tile::kColBlocks, kKvBytes = Tile::kKvBytes;
  constexpr int kSTiles = kBlockN / 8;   // 8-column slices of S
  constexpr int kDTiles = kHeadDim / 8;  // 8-column slices of O

  // The plain grid, or the heavy-first schedule of THD problems (schedule.h).
  TileIndex tile;
  if (p.schedule != nullptr) {
    tile = ScheduledBlock(p.schedule, blockIdx.x, p.heads_q, p.batch);
    if (tile.tile < 0) return;  // past the last scheduled tile
  } else {
    tile = DecomposeBlock(blockIdx.x, m_tiles, p.heads_q);
  }
  const int b = tile.b, h = tile.h, hk = h / p.group;
  const SeqInfo seq = LoadSeq(p, b);
  // The longest causal tiles (the last ones) start first.
  const int m_tile = (p.schedule != nullptr ? (seq.len_q + kBlockM - 1) / kBlockM : m_tiles) - 1 -
                     tile.tile;
  const int m0 = m_tile * kBlockM;
  const int64_t shift = DiagShift(p, seq.len_q, seq.len_kv);

  // The key tiles [n_tile_begin, n_tile_end) this query tile sees.
  int n_tile_begin, n_tile_end;
  KeyTilesSeenBy(p, seq, m0, kBlockM, kBlockN, shift, &n_tile_begin, &n_tile_end);
  if (n_tile_begin >= n_tile_end) {
    WriteRowsWithoutKeys<Tile::kThreads>(p, b, h, seq, m0, min(kBlockM, p.max_seqlen_q - m0));
    return;
  }
  const int n_count = n_tile_end - n_tile_begin;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (SmemAddress(smem_raw) & 1023u)) & 1023u);
  unsigned char* q_s = smem;                                 // [col block][128 rows][128 B]
  unsigned char* k_s = smem + Tile::kQBytes;                 // [stage][col block][keys][128 B]
  unsigned char* v_s = k_s + kStages * kKvBytes;             // [stage][col block][keys][128 B]
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Tile::kBarrierOffset);
  uint64_t* q_full = bars;
  uint64_t* fix = bars + 1;  // the producer's own barrier for the V tile it patches
  uint64_t* k_full = bars + 2;
  uint64_t* v_full = k_full + kStages;
  uint64_t* k_empty = v_full + kStages;
  uint64_t* v_empty = k_empty + kStages;

  // A tile whose second 64 rows lie past the queries (the last tile of a sequence of 64 mod 128
  // rows): consumer 1 has nothing to compute and goes straight to its epilogue, so only
  // consumer 0's warps release the stages.
  const bool upper_rows_absent = m0 + 64 >= seq.len_q;
  const int releasing_warps = upper_rows_absent ? Tile::kConsumerWarps / 2 : Tile::kConsumerWarps;
  // d128's key tile [n0, n0 + 128) across the end of the keys with at most 64 keys left: both
  // products over 64 keys (S's upper columns are masked to -inf, V's upper rows not read).
  auto half_keys_at = [&](int n0) { return kBlockN == 128 && n0 + 64 >= seq.len_kv; };
  if (threadIdx.x == 0) {
    sm90::MbarInit(q_full, 1);
    sm90::MbarInit(fix, 1);
    for (int s = 0; s < kStages; ++s) {
      sm90::MbarInit(k_full + s, 1);
      sm90::MbarInit(v_full + s, 1);
      sm90::MbarInit(k_empty + s, releasing_warps);
      sm90::MbarInit(v_empty + s, releasing_warps);
    }
    sm90::FenceBarrierInit();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    // ---------------------------------------------------------------- producer
    sm90::RegistersDown<Tile::kProducerRegs>();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    const int batch_coord = p.thd ? 0 : b;
    const int kv_row0 = static_cast<int>(seq.start_kv);
    if (lane == 0) {
      sm90::PrefetchTensorMap(&maps.k);
      sm90::PrefetchTensorMap(&maps.v);
      sm90::MbarArriveExpectTx(q_full, Tile::kQBytes);
#pragma unroll
      for (int cb = 0; cb < kColBlocks; ++cb)
        sm90::TmaLoad4d(q_s + cb * kBlockM * 128, &maps.q, q_full, cb * 64,
                        static_cast<int>(seq.start_q) + m0, h, batch_coord);
    }
    uint32_t fix_parity = 0;
    for (int it = 0; it < n_count; ++it) {
      const int n0 = (n_tile_end - 1 - it) * kBlockN;
      const int stage = it % kStages;
      const uint32_t empty_parity = ((it / kStages) & 1) ^ 1;  // first use of a stage: no wait
      unsigned char* k_dst = k_s + stage * kKvBytes;
      unsigned char* v_dst = v_s + stage * kKvBytes;
      if (lane == 0) {
        sm90::MbarWait(k_empty + stage, empty_parity);
        sm90::MbarArriveExpectTx(k_full + stage, kKvBytes);
#pragma unroll
        for (int cb = 0; cb < kColBlocks; ++cb)
          sm90::TmaLoad4d(k_dst + cb * kBlockN * 128, &maps.k, k_full + stage, cb * 64,
                          kv_row0 + n0, hk, batch_coord);
        sm90::MbarWait(v_empty + stage, empty_parity);
      }
      // Rows past the keys but inside the tensor exist only with per-sequence lengths; they are
      // zeroed where O += P V reads them (all kBlockN rows, or the lower 64 at half_keys below).
      const int v_rows_read = half_keys_at(n0) ? 64 : kBlockN;
      const bool patch_v = p.padding && n0 + v_rows_read > seq.len_kv;
      uint64_t* v_bar = patch_v ? fix : v_full + stage;
      if (lane == 0) {
        sm90::MbarArriveExpectTx(v_bar, kKvBytes);
#pragma unroll
        for (int cb = 0; cb < kColBlocks; ++cb)
          sm90::TmaLoad4d(v_dst + cb * kBlockN * 128, &maps.v, v_bar, cb * 64, kv_row0 + n0, hk,
                          batch_coord);
      }
      if (patch_v) {  // zero V's rows [len_kv - n0, kBlockN) (whole rows: the swizzle stays inside a row)
        sm90::MbarWait(fix, fix_parity);
        fix_parity ^= 1;
        const int valid = seq.len_kv - n0;
        const int chunks = (kBlockN - valid) * 8;  // 16-byte chunks per column block
        for (int e = lane; e < kColBlocks * chunks; e += 32) {
          const int cb = e / chunks, rest = e % chunks;
          *reinterpret_cast<uint4*>(v_dst + cb * kBlockN * 128 + (valid + rest / 8) * 128 +
                                    (rest % 8) * 16) = make_uint4(0, 0, 0, 0);
        }
        sm90::FenceProxyAsync();  // generic writes before the consumers' wgmma (async proxy)
        __syncwarp();
        if (lane == 0) sm90::MbarArrive(v_full + stage);
      }
    }
    return;
  }

  // ---------------------------------------------------------------- consumers
  sm90::RegistersUp<Tile::kConsumerRegs>();
  const int wg = warpgroup - 1;  // rows [64 wg, 64 wg + 64) of the tile
  const int tid = threadIdx.x - 128 * warpgroup;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int wg_m0 = m0 + wg * 64;
  const int row0 = wg_m0 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8

  float acc_o[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // raw q.k units
  float row_sum[2] = {0.f, 0.f};              // this thread's columns only
  const float scale_log2 = p.scale * kLog2e;  // > 0 (checked by the launcher)

  const uint32_t q_addr = SmemAddress(q_s) + wg * 64 * 128;
  const uint32_t k_addr = SmemAddress(k_s), v_addr = SmemAddress(v_s);
  // Read from lane 0, so that the compiler knows the loop is warp-uniform (it then keeps its
  // uniform registers).
  const int loop_count = __shfl_sync(0xffffffffu, wg == 1 && upper_rows_absent ? 0 : n_count, 0);
  if (loop_count > 0) sm90::MbarWait(q_full, 0);

  for (int it = 0; it < loop_count; ++it) {
    const int n0 = (n_tile_end - 1 - it) * kBlockN;
    const int stage = it % kStages;
    const uint32_t full_parity = (it / kStages) & 1;
    const bool half_keys = half_keys_at(n0);

    // S = Q K^T: 16 columns of d per wgmma, 4 per 128-byte column block.
    float s[kBlockN / 2];
    sm90::MbarWait(k_full + stage, full_parity);
    auto score_product = [&](auto keys) {
      constexpr int kN = decltype(keys)::value;
      sm90::WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint64_t desc_q =
            sm90::MakeDesc(q_addr + (kk / 4) * (kBlockM * 128) + (kk % 4) * 32, 16, 1024);
        const uint64_t desc_k = sm90::MakeDesc(
            k_addr + stage * kKvBytes + (kk / 4) * (kBlockN * 128) + (kk % 4) * 32, 16, 1024);
        sm90::Wgmma<Element, kN>::template SS<0, 0>(sm90::LeadingColumns<kN>(s), desc_q, desc_k,
                                                    kk > 0);
      }
      sm90::WgmmaCommit();
    };
    if (half_keys)
      score_product(sm90::Static<64>());
    else
      score_product(sm90::Static<kBlockN>());
    sm90::WgmmaWait<0>();
    sm90::FenceOperands(s);
    __syncwarp();
    if (lane == 0) sm90::MbarArrive(k_empty + stage);  // this warp is done with K(n)

    // Mask: -inf where the key is hidden, only on tiles that cross a boundary for these rows.
    const bool interior = wg_m0 + 64 <= seq.len_q && n0 + kBlockN <= seq.len_kv &&
                          (p.window_left < 0 || n0 >= RawLo(p, wg_m0 + 63, shift)) &&
                          (p.window_right < 0 || n0 + kBlockN <= RawHi(p, wg_m0, shift));
    if (!interior) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        int lo, hi;
        VisibleKeys(p, row0 + 8 * r, seq.len_q, seq.len_kv, &lo, &hi);
#pragma unroll
        for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int j = n0 + nt * 8 + 2 * t + c;
            if (j < lo || j >= hi) s[4 * nt + 2 * r + c] = -INFINITY;
          }
      }
    }

    // Online softmax in log2 units: p = 2^(s * scale_log2 - max * scale_log2), one FFMA + ex2.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
        tile_max = fmaxf(tile_max, fmaxf(s[4 * nt + 2 * r], s[4 * nt + 2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[r], tile_max);
      const float base = new_max == -INFINITY ? 0.f : new_max * scale_log2;  // a row that saw nothing
      const float correction = FastExp2(row_max[r] * scale_log2 - base);
      row_max[r] = new_max;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float e = FastExp2(fmaf(s[4 * nt + 2 * r + c], scale_log2, -base));
          s[4 * nt + 2 * r + c] = e;
          sum += e;
        }
      row_sum[r] = row_sum[r] * correction + sum;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        acc_o[4 * dt + 2 * r] *= correction;
        acc_o[4 * dt + 2 * r + 1] *= correction;
      }
    }

    // P as the A operand: keys 16 kk.. of S (slices 2 kk, 2 kk + 1) in the m16n8k16 A layout.
    uint32_t pa[kBlockN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      pa[kk][0] = Pack<Element>(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = Pack<Element>(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = Pack<Element>(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = Pack<Element>(s[8 * kk + 6], s[8 * kk + 7]);
    }

    // O += P V: 16 keys per wgmma (two 8-row swizzle atoms, 2048 bytes).
    sm90::MbarWait(v_full + stage, full_parity);
    auto value_product = [&](auto key_chunks) {
      sm90::FenceOperands(acc_o);
      sm90::WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < decltype(key_chunks)::value; ++kk) {
        const uint64_t desc_v =
            sm90::MakeDesc(v_addr + stage * kKvBytes + kk * 2048, kBlockN * 128, 1024);
        sm90::Wgmma<Element, kHeadDim>::template RS<1>(acc_o, pa[kk], desc_v, true);
      }
      sm90::WgmmaCommit();
    };
    if (half_keys)
      value_product(sm90::Static<kBlockN / 32>());
    else
      value_product(sm90::Static<kBlockN / 16>());
    sm90::WgmmaWait<0>();
    sm90::FenceOperands(acc_o);
    __syncwarp();
    if (lane == 0) sm90::MbarArrive(v_empty + stage);  // this warp is done with V(n)
  }

  // Epilogue: O = acc / (sum + extra logit), LSE, max logit (as fwd_kernel.cuh).
  const float extra = ExtraLogit(p, h) * kLog2e;
  const int64_t rows_out = p.thd ? seq.len_q : p.max_seqlen_q;
  const int dv = p.head_dim_v;
  float thread_max = -INFINITY;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float m = row_max[r] == -INFINITY ? -INFINITY : row_max[r] * scale_log2;
    const int64_t i = row0 + 8 * r;
    float lse = -INFINITY, norm = 0.f;
    if (m != -INFINITY) {
      const float top = fmaxf(m, extra);
      const float a = FastExp2(m - top);
      const float z = sum * a + FastExp2(extra - top);
      lse = (top + log2f(z)) * kLn2;
      norm = a / z;
      thread_max = fmaxf(thread_max, m);
    }
    if (i < rows_out) {
      const int64_t at = Offset(p.o, b, h, seq.start_q, i, 0);
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const int x = dt * 8 + 2 * t;
        if (x < dv)
          StorePair<Element>(p.o.data, at + x * p.o.stride_d, p.o.stride_d,
                             acc_o[4 * dt + 2 * r] * norm, acc_o[4 * dt + 2 * r + 1] * norm);
      }
    }
    if (t == 0 && p.lse.data && (p.lse.packed ? i < seq.len_q : i < p.max_seqlen_q))
      p.lse.data[LseOffset(p.lse, b, h, seq.start_q, i)] = lse;
  }
  if (p.max_logit) {
    thread_max = WarpMax(thread_max);
    if (lane == 0 && thread_max != -INFINITY)
      AtomicMaxFloat(&p.max_logit[h * p.max_logit_stride], thread_max * kLn2);
  }
#endif  // FUSEDATTN_SM90_DEVICE
}

template <typename Element, int kHeadDim>
Status LaunchWgmmaForward(const FlashParams& p, cudaStream_t stream, bool* launched) {
  using Tile = Sm90FwdTile<kHeadDim>;
  static_assert(Tile::kBlockM == kSm90ScheduleRowsForward, "schedule.h: the planner's rows");
  *launched = false;
  if (NeedsFullKernel(p) || !(p.scale > 0.f) || p.head_dim_qk > kHeadDim ||
      p.head_dim_v > kHeadDim || p.qkv_dtype != p.o_dtype)
    return Status::Ok();
  const bool bf16 = std::is_same_v<Element, Bfloat16>;
  Sm90Maps maps;
  if (!EncodeLaunchTensorMap(&maps.q, p, p.q, true, p.head_dim_qk, Tile::kBlockM, bf16) ||
      !EncodeLaunchTensorMap(&maps.k, p, p.k, false, p.head_dim_qk, Tile::kBlockN, bf16) ||
      !EncodeLaunchTensorMap(&maps.v, p, p.v, false, p.head_dim_v, Tile::kBlockN, bf16))
    return Status::Ok();
  const int m_tiles = (p.max_seqlen_q + Tile::kBlockM - 1) / Tile::kBlockM;
  const int64_t blocks = int64_t{m_tiles} * p.heads_q * p.batch;
  if (blocks > INT_MAX) return Status::Ok();
  // THD: the heavy-first schedule of the query tiles (schedule.h), where no row outside the
  // sequences is written anyway (WriteRowsWithoutKeys writes rows < len_q of O and, packed, of
  // the LSE); a [batch, heads, max_seqlen_q] LSE gets -inf past len_q from the plain grid only.
  FlashParams run = p;
  run.schedule = nullptr;
  if (p.thd && p.schedule_workspace != nullptr && (p.lse.data == nullptr || p.lse.packed)) {
    bool scheduled = false;
    FUSEDATTN_RETURN_IF_ERROR(
        LaunchTileSchedule(p, /*by_keys=*/false, Tile::kBlockM, m_tiles, stream, &scheduled));
    if (scheduled) run.schedule = p.schedule_workspace;
  }
  auto kernel = WgmmaForwardKernel<Element, kHeadDim>;
  FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            Tile::kSmemBytes));
  kernel<<<static_cast<unsigned>(blocks), Tile::kThreads, Tile::kSmemBytes, stream>>>(maps, run,
                                                                                    m_tiles);
  *launched = true;
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace fusedattn::flash
