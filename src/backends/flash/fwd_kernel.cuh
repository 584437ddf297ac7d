// The fast forward: one block per (query tile, head, sequence), online softmax over the key tiles
// the mask lets the query tile see, on the tensor cores.
//
//  * Q (kBlockM rows) stays in shared memory; K and V tiles (kBlockN keys) stream through one
//    buffer each with cp.async: V(n) loads while S = Q K(n)^T and the softmax run, K(n-1) loads
//    while O += P V(n) runs.
//  * Each warp owns kBlockM / kWarps query rows; S and O live in registers, P is re-packed from
//    S's accumulators into the A operand of P V without touching shared memory.
//  * Scores are kept in log2 units (scale * log2(e) folded in), exponentials are ex2.approx.
//  * Key tiles are walked from the last to the first; only tiles the mask reaches are visited
//    (causal, windows, lengths), and element masks are applied only on tiles that cross a
//    boundary. Everything else (bias kinds, ALiBi, softcap, sink, dropout, lengths) is a runtime
//    argument: uniform branches.
#pragma once

#ifndef __CUDACC_RTC__
#include <climits>

#include "common/cuda_util.h"
#endif
#include "backends/flash/device_common.cuh"
#include "backends/flash/mma.cuh"
#include "backends/flash/tiles.h"

namespace fusedattn::flash {

// O = 0 and LSE = -inf for the rows [m0, m0 + rows) of a tile whose rows see no key.
template <int kThreads>
__device__ void WriteRowsWithoutKeys(const FlashParams& p, int b, int h, const SeqInfo& seq,
                                     int m0, int rows) {
  const int64_t rows_out = p.thd ? seq.len_q : p.max_seqlen_q;
  const int dv = p.head_dim_v;
  for (int e = threadIdx.x; e < rows * dv; e += kThreads) {
    const int64_t i = m0 + e / dv;
    if (i < rows_out)
      StoreElem(p.o.data, p.o_dtype, Offset(p.o, b, h, seq.start_q, i, e % dv), 0.f);
  }
  if (p.lse.data)
    for (int r = threadIdx.x; r < rows; r += kThreads) {
      const int64_t i = m0 + r;
      if (p.lse.packed ? i < seq.len_q : i < p.max_seqlen_q)
        p.lse.data[LseOffset(p.lse, b, h, seq.start_q, i)] = -INFINITY;
    }
}

// Mod: the score-modifier policy (device_common.cuh's NoScoreMod, or a graph compiled at run
// time, which needs kFull).
template <typename Element, int kHeadDim, int kBlockM, int kBlockN, int kWarps, bool kFull,
          typename Mod = NoScoreMod>
__global__ void __launch_bounds__(kWarps * 32)
    FastForwardKernel(const FlashParams p, int m_tiles) {
  using T = typename ElementTraits<Element>::Type;
  constexpr int kThreads = kWarps * 32;
  constexpr int kStride = kHeadDim + 8;
  constexpr int kRowsPerWarp = kBlockM / kWarps;
  constexpr int kMTiles = kRowsPerWarp / 16;  // 16-row mma tiles per warp
  constexpr int kNTiles = kBlockN / 8;        // 8-column tiles of S
  constexpr int kDTiles = kHeadDim / 8;       // 8-column tiles of O
  static_assert(kRowsPerWarp % 16 == 0 && kBlockN % 16 == 0 && kHeadDim % 16 == 0, "tiles");
  static_assert(kFull || !Mod::kActive, "score_mod graphs run in the full variant");

  extern __shared__ __align__(16) unsigned char smem_bytes[];
  T* Qs = reinterpret_cast<T*>(smem_bytes);
  T* Ks = Qs + kBlockM * kStride;
  T* Vs = Ks + kBlockN * kStride;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const TileIndex tile = DecomposeBlock(blockIdx.x, m_tiles, p.heads_q);
  const int m_tile = m_tiles - 1 - tile.tile;  // the longest causal tiles start first
  const int b = tile.b, h = tile.h, hk = h / p.group;
  const SeqInfo seq = LoadSeq(p, b);
  const int m0 = m_tile * kBlockM;
  const int64_t shift = DiagShift(p, seq.len_q, seq.len_kv);

  // The key tiles [n_tile_begin, n_tile_end) this query tile sees.
  int n_tile_begin, n_tile_end;
  KeyTilesSeenBy(p, seq, m0, kBlockM, kBlockN, shift, &n_tile_begin, &n_tile_end);
  // The next key tile to visit below n_tile: the one before it, or with a mask_mod the next one
  // its block mask does not hide entirely.
  auto next_tile = [&](int n_tile) {
    int n = n_tile - 1;
    if constexpr (Mod::kActive)
      while (n >= n_tile_begin && !FlexTileActive(p, b, h, m_tile, n)) --n;
    return n;
  };
  if constexpr (Mod::kActive) n_tile_end = next_tile(n_tile_end) + 1;
  if (n_tile_begin >= n_tile_end) {
    WriteRowsWithoutKeys<kThreads>(p, b, h, seq, m0, min(kBlockM, p.max_seqlen_q - m0));
    return;
  }

  const T* q_base = static_cast<const T*>(p.q.data) + Offset(p.q, b, h, seq.start_q, m0, 0);
  const T* k_base = static_cast<const T*>(p.k.data) + Offset(p.k, b, hk, seq.start_kv, 0, 0);
  const T* v_base = static_cast<const T*>(p.v.data) + Offset(p.v, b, hk, seq.start_kv, 0, 0);
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  auto load_k = [&](int n_tile) {
    const int n0 = n_tile * kBlockN;
    LoadTile<kBlockN, kHeadDim, kStride, kThreads>(Ks, k_base + n0 * p.k.stride_s, p.k.stride_s,
                                                   seq.len_kv - n0, dqk, p.k.data);
  };
  auto load_v = [&](int n_tile) {
    const int n0 = n_tile * kBlockN;
    LoadTile<kBlockN, kHeadDim, kStride, kThreads>(Vs, v_base + n0 * p.v.stride_s, p.v.stride_s,
                                                   seq.len_kv - n0, dv, p.v.data);
  };
  LoadTile<kBlockM, kHeadDim, kStride, kThreads>(Qs, q_base, p.q.stride_s, seq.len_q - m0, dqk,
                                                 p.q.data);
  load_k(n_tile_end - 1);
  CpAsyncCommit();

  // This thread's rows: (mt, r) -> m0 + warp_row0 + 16 mt + 8 r + g (recomputed where needed:
  // registers are the scarce resource of this kernel).
  const int warp_row0 = warp * kRowsPerWarp;
  auto row_of = [&](int mt, int r) { return m0 + warp_row0 + mt * 16 + 8 * r + g; };
  const DropoutRow drop_row0 = DropoutRowOf(p, b, h, 0);  // row i's stream: .row + i

  float acc_o[kMTiles][kDTiles][4];
  float row_max[kMTiles][2], row_sum[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  const float scale_log2 = p.scale * kLog2e;
  const bool score_mods = kFull && (Mod::kActive || HasScoreMods(p));

  for (int n_tile = n_tile_end - 1, next = 0; n_tile >= n_tile_begin; n_tile = next) {
    const int n0 = n_tile * kBlockN;
    next = next_tile(n_tile);
    CpAsyncWait<0>();
    __syncthreads();  // K(n) landed for every thread; every warp is done with V(n+1)
    load_v(n_tile);
    CpAsyncCommit();

    // S = Q K^T
    float s[kMTiles][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {  // padded columns are zero: no branch here
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) LoadA(a[mt], Qs, kStride, warp_row0 + mt * 16, ks * 16, lane);
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t bk[4];
        LoadBFromRows(bk, Ks, kStride, np * 16, ks * 16, lane);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma<Element>(s[mt][2 * np], a[mt], bk[0], bk[1]);
          Mma<Element>(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }

    // Scores in log2 units; -inf where the mask hides the key. Tiles inside the mask (most of
    // them) run no mask code at all.
    const bool interior =
        TileFullyVisible(p, m0, kBlockM, n0, kBlockN, seq.len_q, seq.len_kv, shift);
    if (!score_mods) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] *= scale_log2;
      if (!interior) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            int lo, hi;
            VisibleKeys(p, row_of(mt, r), seq.len_q, seq.len_kv, &lo, &hi);
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                const int j = n0 + nt * 8 + 2 * t + c;
                if (j < lo || j >= hi) s[mt][nt][2 * r + c] = -INFINITY;
              }
          }
      }
    } else {  // bias, ALiBi, softcap, score_mod: only visible elements are read and computed
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = row_of(mt, r);
          int lo, hi;
          VisibleKeys(p, i, seq.len_q, seq.len_kv, &lo, &hi);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int j = n0 + nt * 8 + 2 * t + c;
              float& x = s[mt][nt][2 * r + c];
              float score = -INFINITY;
              if (j >= lo && j < hi) {
                score = ScoreOf(p, x, b, h, i, j, seq.len_q, seq.len_kv, nullptr);
                if constexpr (Mod::kActive) {
                  float modified;
                  const bool visible =
                      Mod::Forward(p, score, b, h, i, j, seq.len_q, seq.len_kv, &modified);
                  score = visible ? modified : -INFINITY;
                }
              }
              x = score * kLog2e;
            }
        }
    }

    // Online softmax: rescale the running sums and O by 2^(old max - new max).
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
          tile_max = fmaxf(tile_max, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[mt][r], tile_max);
        const float base = new_max == -INFINITY ? 0.f : new_max;  // a row that saw nothing yet
        const float correction = FastExp2(row_max[mt][r] - base);
        row_max[mt][r] = new_max;
        float sum = row_sum[mt][r] * correction;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          acc_o[mt][dt][2 * r] *= correction;
          acc_o[mt][dt][2 * r + 1] *= correction;
        }
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          const float p0 = FastExp2(s[mt][nt][2 * r] - base);
          const float p1 = FastExp2(s[mt][nt][2 * r + 1] - base);
          sum += p0 + p1;
          s[mt][nt][2 * r] = p0;
          s[mt][nt][2 * r + 1] = p1;
        }
        row_sum[mt][r] = sum;
      }
    if (kFull && p.dropout) {  // the sum keeps dropped probabilities; P V does not
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            DropoutRow drop = drop_row0;
            drop.row += static_cast<uint32_t>(row_of(mt, r));
            bool keep0, keep1;
            DropoutKeep2(drop, n0 + nt * 8 + 2 * t, &keep0, &keep1);
            if (!keep0) s[mt][nt][2 * r] = 0.f;
            if (!keep1) s[mt][nt][2 * r + 1] = 0.f;
          }
    }

    CpAsyncWait<0>();
    __syncthreads();  // V(n) landed; every warp is done with K(n)
    if (next >= n_tile_begin) {
      load_k(next);
      CpAsyncCommit();
    }

    // O += P V, P from S's registers.
#pragma unroll
    for (int kp = 0; kp < kNTiles / 2; ++kp) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        a[mt][0] = Pack<Element>(s[mt][2 * kp][0], s[mt][2 * kp][1]);
        a[mt][1] = Pack<Element>(s[mt][2 * kp][2], s[mt][2 * kp][3]);
        a[mt][2] = Pack<Element>(s[mt][2 * kp + 1][0], s[mt][2 * kp + 1][1]);
        a[mt][3] = Pack<Element>(s[mt][2 * kp + 1][2], s[mt][2 * kp + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t bv[4];
        LoadBFromColumns(bv, Vs, kStride, dp * 16, kp * 16, lane);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma<Element>(acc_o[mt][2 * dp], a[mt], bv[0], bv[1]);
          Mma<Element>(acc_o[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  }

  // Epilogue: O = acc / (sum + extra logit), LSE, max logit.
  const float extra = ExtraLogit(p, h) * kLog2e;
  const int64_t rows_out = p.thd ? seq.len_q : p.max_seqlen_q;
  float thread_max = -INFINITY;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float m = row_max[mt][r];
      const int64_t i = row_of(mt, r);
      float lse = -INFINITY, norm = 0.f;
      if (m != -INFINITY) {
        const float top = fmaxf(m, extra);
        const float a = FastExp2(m - top);
        const float z = sum * a + FastExp2(extra - top);
        lse = (top + log2f(z)) * kLn2;
        norm = a / z * p.keep_scale;
        thread_max = fmaxf(thread_max, m);
      }
      if (i < rows_out) {
        const int64_t at = Offset(p.o, b, h, seq.start_q, i, 0);
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          const int x = dt * 8 + 2 * t;
          if (x < dv)
            StorePair<Element>(p.o.data, at + x * p.o.stride_d, p.o.stride_d,
                               acc_o[mt][dt][2 * r] * norm, acc_o[mt][dt][2 * r + 1] * norm);
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
}

#ifndef __CUDACC_RTC__
template <typename Element, int kHeadDim, bool kFull>
Status LaunchFastForwardVariant(const FlashParams& p, cudaStream_t stream) {
  using Tile = FwdTile<kHeadDim, kFull>;
  using T = typename ElementTraits<Element>::Type;
  const size_t smem = FwdSmemBytes<kHeadDim, kFull>(sizeof(T));
  const int m_tiles = (p.max_seqlen_q + Tile::kBlockM - 1) / Tile::kBlockM;
  const int64_t blocks = int64_t{m_tiles} * p.heads_q * p.batch;
  if (blocks > INT_MAX) return NotSupported("flash: %lld forward blocks", (long long)blocks);
  auto kernel =
      FastForwardKernel<Element, kHeadDim, Tile::kBlockM, Tile::kBlockN, Tile::kWarps, kFull>;
  FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(blocks), Tile::kWarps * 32, smem, stream>>>(p, m_tiles);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

template <typename Element, int kHeadDim>
Status LaunchFastForward(const FlashParams& p, cudaStream_t stream) {
  return NeedsFullKernel(p) ? LaunchFastForwardVariant<Element, kHeadDim, true>(p, stream)
                            : LaunchFastForwardVariant<Element, kHeadDim, false>(p, stream);
}

#endif  // __CUDACC_RTC__

}  // namespace fusedattn::flash
