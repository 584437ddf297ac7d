// The fast backward, recomputing P from the forward's LSE:
//
// FastBackwardKernel: one block per (key tile, kv head, sequence). K and V of kBlockN keys stay in
// shared memory; the block walks the query heads of its group and the query tiles that can see
// its keys (kBlockM rows each) and per query tile
//   phase 1  S^T = K Q^T and dP^T = V dO^T (each warp 16 keys x some queries), then
//            P^T = exp(S^T - LSE) (dropout applied), dS^T = P^T o (dP^T - D) * softcap' * scale,
//            both written to shared memory (and dbias, when asked, stored or added);
//   phase 2  dV += P^T dO and dK += dS^T Q (each warp 16 keys x some dims, in registers across
//            the whole walk), dQ += dS K added in float32 to a workspace with atomics (skipped
//            when deterministic).
// dK and dV are written once at the end: deterministic, GQA heads summed in a fixed order.
//
// FastBackwardDqKernel (deterministic mode): one block per (query tile, head, sequence), walking
// the key tiles in a fixed order like the forward and accumulating dQ = dS K in registers.
#pragma once

#ifndef __CUDACC_RTC__
#include <climits>

#include "common/cuda_util.h"
#endif
#include "backends/flash/device_common.cuh"
#include "backends/flash/mma.cuh"
#include "backends/flash/tiles.h"

namespace fusedattn::flash {

// Mod: the score-modifier policy (device_common.cuh), as in the forward.
template <typename Element, int kHeadDim, int kBlockM, int kBlockN, int kWarps, bool kFull,
          typename Mod = NoScoreMod>
__global__ void __launch_bounds__(kWarps * 32)
    FastBackwardKernel(const FlashParams p, int n_tiles) {
  using T = typename ElementTraits<Element>::Type;
  constexpr int kThreads = kWarps * 32;
  constexpr int kStride = kHeadDim + 8;  // K, V, Q, dO tiles
  constexpr int kPStride = kBlockM + 8;  // P^T, dS^T tiles [key][query]
  // Phase 1 and the dK/dV part of phase 2: warp w owns keys 16 (w % kKeyGroups) ..; the warps of
  // one key group split the queries (phase 1) or the head dim (phase 2).
  constexpr int kKeyGroups = kBlockN / 16;
  static_assert(kWarps % kKeyGroups == 0, "warps per key group");
  constexpr int kSplit = kWarps / kKeyGroups;
  constexpr int kQueryCols = kBlockM / kSplit;
  constexpr int kNT1 = kQueryCols / 8;
  constexpr int kDimCols = kHeadDim / kSplit;
  constexpr int kNT2 = kDimCols / 8;
  // With one warp per key group the warp has all queries of its keys, and P^T stays in registers.
  constexpr bool kPInRegisters = kSplit == 1;
  // dQ part of phase 2: warp w owns queries 16 (w % kQueryGroups) .. and a share of the dims,
  // processed in chunks of at most 64 columns.
  constexpr int kQueryGroups = kBlockM / 16;
  static_assert(kWarps % kQueryGroups == 0, "warps per query group");
  constexpr int kDqCols = kHeadDim / (kWarps / kQueryGroups);
  constexpr int kDqChunk = kDqCols < 64 ? kDqCols : 64;
  constexpr int kNTQ = kDqChunk / 8;
  static_assert(kQueryCols % 16 == 0 && kDimCols % 16 == 0 && kDqChunk % 16 == 0 &&
                    kDqCols % kDqChunk == 0,
                "tiles");
  static_assert(kFull || !Mod::kActive, "score_mod graphs run in the full variant");

  extern __shared__ __align__(16) unsigned char smem_bytes[];
  T* Ks = reinterpret_cast<T*>(smem_bytes);
  T* Vs = Ks + kBlockN * kStride;
  T* q_buffers = Vs + kBlockN * kStride;             // [2][kBlockM][kStride]
  T* do_buffers = q_buffers + 2 * kBlockM * kStride;  // [2][kBlockM][kStride]
  T* Ps = do_buffers + 2 * kBlockM * kStride;
  T* dSs = Ps + kBlockN * kPStride;
  float* lse_buffers = reinterpret_cast<float*>(dSs + kBlockN * kPStride);  // [2][kBlockM], log2
  float* delta_buffers = lse_buffers + 2 * kBlockM;                        // [2][kBlockM]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const TileIndex tile = DecomposeBlock(blockIdx.x, n_tiles, p.heads_kv);
  const int b = tile.b, hk = tile.h;
  const SeqInfo seq = LoadSeq(p, b);
  const int n0 = tile.tile * kBlockN;
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int64_t rows_out = p.thd ? seq.len_kv : p.max_seqlen_kv;

  int first = 0, last = -1;  // query rows that may see the block's keys
  if (n0 < seq.len_kv) RowsSeeingKeys(p, n0, n0 + kBlockN, seq.len_q, seq.len_kv, &first, &last);
  if (first > last) {  // no query sees these keys: dK = dV = 0
    ZeroKeyBlockGradients<kThreads>(p, b, hk, seq, n0, kBlockN);
    return;
  }

  const T* k_base = static_cast<const T*>(p.k.data) + Offset(p.k, b, hk, seq.start_kv, n0, 0);
  const T* v_base = static_cast<const T*>(p.v.data) + Offset(p.v, b, hk, seq.start_kv, n0, 0);
  LoadTile<kBlockN, kHeadDim, kStride, kThreads>(Ks, k_base, p.k.stride_s, seq.len_kv - n0, dqk,
                                                 p.k.data);
  LoadTile<kBlockN, kHeadDim, kStride, kThreads>(Vs, v_base, p.v.stride_s, seq.len_kv - n0, dv,
                                                 p.v.data);
  CpAsyncCommit();

  const int key_row0 = (warp % kKeyGroups) * 16;
  const int part = warp / kKeyGroups;
  const int q_col0 = part * kQueryCols;  // phase 1
  const int dim0 = part * kDimCols;      // phase 2 (dK, dV)
  const int q_row0 = (warp % kQueryGroups) * 16;
  const int dq_dim0 = (warp / kQueryGroups) * kDqCols;
  const int64_t shift = DiagShift(p, seq.len_q, seq.len_kv);
  const float scale_log2 = p.scale * kLog2e;
  const bool score_mods = kFull && (Mod::kActive || HasScoreMods(p));

  float acc_dk[kNT2][4], acc_dv[kNT2][4];
#pragma unroll
  for (int nt = 0; nt < kNT2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[nt][e] = acc_dv[nt][e] = 0.f;

  // The steps walk the query heads of the group and, per head, the query tiles
  // [m_first, m_first + m_count) that can see the block's keys (with a mask_mod, only the tiles
  // its block mask does not hide entirely). A step's Q and dO land in buffer step % 2 while the
  // step before computes; its LSE and D are read into registers during the step before and
  // stored into their buffer at the end of it.
  const int m_first = first / kBlockM;
  const int m_count = last / kBlockM - m_first + 1;
  const int h_end = (hk + 1) * p.group;
  auto advance = [&](int* h, int* m_tile) {  // to the step after (h, m_tile)
    do {
      if (++*m_tile >= m_first + m_count) *m_tile = m_first, ++*h;
    } while (Mod::kActive && *h < h_end && !FlexTileActive(p, b, *h, *m_tile, tile.tile));
  };
  auto load_step = [&](int h, int m0, int buf) {
    LoadTile<kBlockM, kHeadDim, kStride, kThreads>(
        q_buffers + buf * kBlockM * kStride,
        static_cast<const T*>(p.q.data) + Offset(p.q, b, h, seq.start_q, m0, 0), p.q.stride_s,
        seq.len_q - m0, dqk, p.q.data);
    LoadTile<kBlockM, kHeadDim, kStride, kThreads>(
        do_buffers + buf * kBlockM * kStride,
        static_cast<const T*>(p.d_o.data) + Offset(p.d_o, b, h, seq.start_q, m0, 0),
        p.d_o.stride_s, seq.len_q - m0, dv, p.d_o.data);
    CpAsyncCommit();
  };
  // LSE (log2 units, +inf for rows without a gradient) and D of row threadIdx.x of a step.
  auto read_stats = [&](int h, int m0, float* lse, float* delta) {
    *lse = INFINITY;
    *delta = 0.f;
    const int64_t i = int64_t{m0} + threadIdx.x;
    if (threadIdx.x < kBlockM && i < seq.len_q) {
      const float l = BackwardLse(p, b, h, seq, i);
      *lse = l == INFINITY ? INFINITY : l * kLog2e;
      *delta = p.delta[RowIndex(p, b, h, i)];
    }
  };
  int h = hk * p.group, m_tile = m_first;
  if (Mod::kActive && !FlexTileActive(p, b, h, m_tile, tile.tile)) advance(&h, &m_tile);
  if (h < h_end) {
    load_step(h, m_tile * kBlockM, 0);
    float lse, delta;
    read_stats(h, m_tile * kBlockM, &lse, &delta);
    if (threadIdx.x < kBlockM) lse_buffers[threadIdx.x] = lse, delta_buffers[threadIdx.x] = delta;
  }

  for (int step = 0; h < h_end; ++step) {
    const int buf = step & 1;
    const int m0 = m_tile * kBlockM;
    int next_h = h, next_m_tile = m_tile;
    advance(&next_h, &next_m_tile);
    const bool has_next = next_h < h_end;
    const T* Qs = q_buffers + buf * kBlockM * kStride;
    const T* dOs = do_buffers + buf * kBlockM * kStride;
    const float* lse_s = lse_buffers + buf * kBlockM;
    const float* delta_s = delta_buffers + buf * kBlockM;
    const DropoutRow drop_row0 = DropoutRowOf(p, b, h, 0);
    CpAsyncWait<0>();
    __syncthreads();  // this step's Q, dO, LSE, D are in place; every warp is done with the last
    float next_lse = INFINITY, next_delta = 0.f;
    if (has_next) {
      load_step(next_h, next_m_tile * kBlockM, buf ^ 1);
      read_stats(next_h, next_m_tile * kBlockM, &next_lse, &next_delta);
    }

    // Phase 1: S^T = K Q^T and dP^T = V dO^T for keys key_row0.., queries q_col0..
    float st[kNT1][4], dpt[kNT1][4];
#pragma unroll
    for (int nt = 0; nt < kNT1; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nt][e] = dpt[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {  // padded columns are zero: no branch here
      uint32_t ak[4], av[4];
      LoadA(ak, Ks, kStride, key_row0, ks * 16, lane);
      LoadA(av, Vs, kStride, key_row0, ks * 16, lane);
#pragma unroll
      for (int np = 0; np < kNT1 / 2; ++np) {
        uint32_t bq[4], bo[4];
        LoadBFromRows(bq, Qs, kStride, q_col0 + np * 16, ks * 16, lane);
        LoadBFromRows(bo, dOs, kStride, q_col0 + np * 16, ks * 16, lane);
        Mma<Element>(st[2 * np], ak, bq[0], bq[1]);
        Mma<Element>(st[2 * np + 1], ak, bq[2], bq[3]);
        Mma<Element>(dpt[2 * np], av, bo[0], bo[1]);
        Mma<Element>(dpt[2 * np + 1], av, bo[2], bo[3]);
      }
    }

    // P^T = 2^(S^T scale log2(e) - LSE): rows past the sequence or without keys have LSE +inf
    // (P = 0); keys the mask hides get P = 0 on tiles that cross the mask's boundary (tiles
    // inside it run no mask code).
    const bool interior =
        TileFullyVisible(p, m0, kBlockM, n0, kBlockN, seq.len_q, seq.len_kv, shift);
    // dcap: d s / d t of the softcap; dmod: d score_mod / d s; spipe: the pipeline's s (the
    // score_mod's input, for the tensor gradients).
    float dcap[kFull ? kNT1 : 1][4];
    float dmod[Mod::kActive ? kNT1 : 1][4];
    float spipe[Mod::kTensorGrads ? kNT1 : 1][4];
#pragma unroll
    for (int nt = 0; nt < kNT1; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int query_local = q_col0 + nt * 8 + 2 * t + (e & 1);
        float u;
        if constexpr (kFull) dcap[nt][e] = 1.f;
        if (!score_mods) {
          u = st[nt][e] * scale_log2;
        } else {
          const int64_t j = n0 + key_row0 + g + 8 * (e >> 1), i = m0 + query_local;
          int lo, hi;
          VisibleKeys(p, i, seq.len_q, seq.len_kv, &lo, &hi);
          float derivative = 1.f, score = -INFINITY;
          if constexpr (Mod::kActive) dmod[nt][e] = 0.f;
          if (j >= lo && j < hi) {
            score = ScoreOf(p, st[nt][e], b, h, i, j, seq.len_q, seq.len_kv, &derivative);
            if constexpr (Mod::kActive) {
              if constexpr (Mod::kTensorGrads) spipe[nt][e] = score;
              float modified, d_s;
              const bool visible = Mod::Backward(p, score, b, h, i, j, seq.len_q, seq.len_kv,
                                                 &modified, &d_s);
              score = visible ? modified : -INFINITY;
              dmod[nt][e] = d_s;
            }
          }
          u = score * kLog2e;
          if constexpr (kFull) dcap[nt][e] = derivative;
        }
        st[nt][e] = FastExp2(u - lse_s[query_local]);
      }
    if (!interior && !score_mods) {
#pragma unroll
      for (int nt = 0; nt < kNT1; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t j = n0 + key_row0 + g + 8 * (e >> 1);
          const int64_t i = m0 + q_col0 + nt * 8 + 2 * t + (e & 1);
          int lo, hi;
          VisibleKeys(p, i, seq.len_q, seq.len_kv, &lo, &hi);
          if (j < lo || j >= hi) st[nt][e] = 0.f;
        }
    }
    // dS^T = P^T o (dP^T - D) * softcap' * scale; P^T gets the dropout mask and scale.
#pragma unroll
    for (int nt = 0; nt < kNT1; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int query_local = q_col0 + nt * 8 + 2 * t + (e & 1);
        const float prob = st[nt][e];
        float keep = 1.f;
        if (kFull && p.dropout && prob != 0.f) {
          DropoutRow drop = drop_row0;
          drop.row += static_cast<uint32_t>(m0 + query_local);
          keep = DropoutKeep1(drop, n0 + key_row0 + g + 8 * (e >> 1)) ? p.keep_scale : 0.f;
        }
        const float ds = prob * (dpt[nt][e] * keep - delta_s[query_local]);
        float grad = ds * p.scale;  // d loss / d (q.k)
        if constexpr (kFull) {
          // d loss / d (the pipeline's s): through the score_mod, where a zero stays zero even
          // if the derivative is not finite (as in the reference).
          float ds_pipe = ds;
          if constexpr (Mod::kActive) {
            const int64_t i = m0 + query_local, j = n0 + key_row0 + g + 8 * (e >> 1);
            ds_pipe = ds != 0.f ? ds * dmod[nt][e] : 0.f;
            if constexpr (Mod::kTensorGrads)
              if (ds != 0.f)
                Mod::AddTensorGrads(p, spipe[nt][e], ds, b, h, i, j, seq.len_q, seq.len_kv);
            grad = ds_pipe * p.scale;
          }
          grad *= dcap[nt][e];
          if (p.dbias_mode != kDbiasNone && prob != 0.f)
            WriteDbias(p, b, h, m0 + query_local, n0 + key_row0 + g + 8 * (e >> 1),
                       p.bias_type == FUSEDATTN_BIAS_PRE_SCALE ? grad : ds_pipe);
        }
        st[nt][e] = prob * keep;
        dpt[nt][e] = grad;
      }
    // dS^T to shared memory for dQ (every warp reads all keys there); P^T too unless the warp
    // keeps it in registers.
#pragma unroll
    for (int nt = 0; nt < kNT1; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int at = (key_row0 + g + 8 * r) * kPStride + q_col0 + nt * 8 + 2 * t;
        if constexpr (!kPInRegisters)
          *reinterpret_cast<uint32_t*>(Ps + at) = Pack<Element>(st[nt][2 * r], st[nt][2 * r + 1]);
        *reinterpret_cast<uint32_t*>(dSs + at) =
            Pack<Element>(dpt[nt][2 * r], dpt[nt][2 * r + 1]);
      }

    // Phase 2: dV += P^T dO, dK += dS^T Q for keys key_row0.., dims dim0..
    if constexpr (kPInRegisters) {
      // The warp computed all kBlockM queries of its keys: P^T and dS^T are A operands already
      // (the accumulator layout of S^T is the A layout), no barrier needed before this.
#pragma unroll
      for (int ks = 0; ks < kBlockM / 16; ++ks) {
        uint32_t ap[4], ads[4];
        ap[0] = Pack<Element>(st[2 * ks][0], st[2 * ks][1]);
        ap[1] = Pack<Element>(st[2 * ks][2], st[2 * ks][3]);
        ap[2] = Pack<Element>(st[2 * ks + 1][0], st[2 * ks + 1][1]);
        ap[3] = Pack<Element>(st[2 * ks + 1][2], st[2 * ks + 1][3]);
        ads[0] = Pack<Element>(dpt[2 * ks][0], dpt[2 * ks][1]);
        ads[1] = Pack<Element>(dpt[2 * ks][2], dpt[2 * ks][3]);
        ads[2] = Pack<Element>(dpt[2 * ks + 1][0], dpt[2 * ks + 1][1]);
        ads[3] = Pack<Element>(dpt[2 * ks + 1][2], dpt[2 * ks + 1][3]);
#pragma unroll
        for (int np = 0; np < kNT2 / 2; ++np) {
          const int col = dim0 + np * 16;
          uint32_t bo[4], bq[4];
          LoadBFromColumns(bo, dOs, kStride, col, ks * 16, lane);
          LoadBFromColumns(bq, Qs, kStride, col, ks * 16, lane);
          Mma<Element>(acc_dv[2 * np], ap, bo[0], bo[1]);
          Mma<Element>(acc_dv[2 * np + 1], ap, bo[2], bo[3]);
          Mma<Element>(acc_dk[2 * np], ads, bq[0], bq[1]);
          Mma<Element>(acc_dk[2 * np + 1], ads, bq[2], bq[3]);
        }
      }
      __syncthreads();  // dS^T of every warp is in shared memory
    } else {
      __syncthreads();  // P^T and dS^T of every warp are in shared memory
#pragma unroll
      for (int ks = 0; ks < kBlockM / 16; ++ks) {
        uint32_t ap[4], ads[4];
        LoadA(ap, Ps, kPStride, key_row0, ks * 16, lane);
        LoadA(ads, dSs, kPStride, key_row0, ks * 16, lane);
#pragma unroll
        for (int np = 0; np < kNT2 / 2; ++np) {
          const int col = dim0 + np * 16;
          uint32_t bo[4], bq[4];
          LoadBFromColumns(bo, dOs, kStride, col, ks * 16, lane);
          LoadBFromColumns(bq, Qs, kStride, col, ks * 16, lane);
          Mma<Element>(acc_dv[2 * np], ap, bo[0], bo[1]);
          Mma<Element>(acc_dv[2 * np + 1], ap, bo[2], bo[3]);
          Mma<Element>(acc_dk[2 * np], ads, bq[0], bq[1]);
          Mma<Element>(acc_dk[2 * np + 1], ads, bq[2], bq[3]);
        }
      }
    }
    // dQ += dS K for queries q_row0.., dims dq_dim0.., added into the float32 workspace.
    if (p.dq_accum) {
#pragma unroll
      for (int chunk = 0; chunk < kDqCols / kDqChunk; ++chunk) {
        const int col0 = dq_dim0 + chunk * kDqChunk;
        if (col0 >= dqk) break;
        float acc[kNTQ][4];
#pragma unroll
        for (int nt = 0; nt < kNTQ; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < kBlockN / 16; ++ks) {
          uint32_t a[4];
          LoadATransposed(a, dSs, kPStride, q_row0, ks * 16, lane);
#pragma unroll
          for (int np = 0; np < kNTQ / 2; ++np) {
            uint32_t bk[4];
            LoadBFromColumns(bk, Ks, kStride, col0 + np * 16, ks * 16, lane);
            Mma<Element>(acc[2 * np], a, bk[0], bk[1]);
            Mma<Element>(acc[2 * np + 1], a, bk[2], bk[3]);
          }
        }
        // Float4 atomics: lanes t and t ^ 1 swap halves so that the even lane adds 4 columns of
        // tile nt = 2k and the odd lane 4 columns of tile 2k + 1.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t i = m0 + q_row0 + g + 8 * r;
          float* row = p.dq_accum + RowIndex(p, b, h, i < seq.len_q ? i : 0) * p.dq_accum_dim;
#pragma unroll
          for (int k = 0; k < kNTQ / 2; ++k) {
            const bool odd = (t & 1) != 0;
            const float send0 = odd ? acc[2 * k][2 * r] : acc[2 * k + 1][2 * r];
            const float send1 = odd ? acc[2 * k][2 * r + 1] : acc[2 * k + 1][2 * r + 1];
            const float recv0 = __shfl_xor_sync(0xffffffffu, send0, 1);
            const float recv1 = __shfl_xor_sync(0xffffffffu, send1, 1);
            const int x = col0 + (odd ? (2 * k + 1) * 8 + 2 * (t - 1) : 2 * k * 8 + 2 * t);
            const float4 value =
                odd ? make_float4(recv0, recv1, acc[2 * k + 1][2 * r], acc[2 * k + 1][2 * r + 1])
                    : make_float4(acc[2 * k][2 * r], acc[2 * k][2 * r + 1], recv0, recv1);
            if (i < seq.len_q && x < dqk) {
#if __CUDA_ARCH__ >= 900
              atomicAdd(reinterpret_cast<float4*>(row + x), value);
#else
              atomicAdd(row + x, value.x);
              atomicAdd(row + x + 1, value.y);
              atomicAdd(row + x + 2, value.z);
              atomicAdd(row + x + 3, value.w);
#endif
            }
          }
        }
      }
    }
    if (has_next && threadIdx.x < kBlockM) {
      lse_buffers[(buf ^ 1) * kBlockM + threadIdx.x] = next_lse;
      delta_buffers[(buf ^ 1) * kBlockM + threadIdx.x] = next_delta;
    }
    h = next_h;
    m_tile = next_m_tile;
  }
  CpAsyncWait<0>();  // K and V, when the block mask left no step

  // dK, dV of the block's keys (zero for keys past the sequence).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = n0 + key_row0 + g + 8 * r;
    if (j >= rows_out) continue;
    const int64_t at_k = Offset(p.dk, b, hk, seq.start_kv, j, 0);
    const int64_t at_v = Offset(p.dv, b, hk, seq.start_kv, j, 0);
#pragma unroll
    for (int nt = 0; nt < kNT2; ++nt) {
      const int x = dim0 + nt * 8 + 2 * t;
      if (x < dqk)
        StorePair<Element>(p.dk.data, at_k + x * p.dk.stride_d, p.dk.stride_d, acc_dk[nt][2 * r],
                           acc_dk[nt][2 * r + 1]);
      if (x < dv)
        StorePair<Element>(p.dv.data, at_v + x * p.dv.stride_d, p.dv.stride_d, acc_dv[nt][2 * r],
                           acc_dv[nt][2 * r + 1]);
    }
  }
}

template <typename Element, int kHeadDim, int kBlockM, int kBlockN, int kWarps, bool kFull,
          typename Mod = NoScoreMod>
__global__ void __launch_bounds__(kWarps * 32)
    FastBackwardDqKernel(const FlashParams p, int m_tiles) {
  using T = typename ElementTraits<Element>::Type;
  constexpr int kThreads = kWarps * 32;
  constexpr int kStride = kHeadDim + 8;
  constexpr int kNTiles = kBlockN / 8;
  constexpr int kDTiles = kHeadDim / 8;
  static_assert(kBlockM == 16 * kWarps && kBlockN % 16 == 0, "one 16-row tile per warp");
  static_assert(kFull || !Mod::kActive, "score_mod graphs run in the full variant");

  extern __shared__ __align__(16) unsigned char smem_bytes[];
  T* Qs = reinterpret_cast<T*>(smem_bytes);
  T* dOs = Qs + kBlockM * kStride;
  T* Ks = dOs + kBlockM * kStride;
  T* Vs = Ks + kBlockN * kStride;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const TileIndex tile = DecomposeBlock(blockIdx.x, m_tiles, p.heads_q);
  const int m_tile = m_tiles - 1 - tile.tile;
  const int b = tile.b, h = tile.h, hk = h / p.group;
  const SeqInfo seq = LoadSeq(p, b);
  const int m0 = m_tile * kBlockM;
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int64_t shift = DiagShift(p, seq.len_q, seq.len_kv);
  const int64_t rows_out = p.thd ? seq.len_q : p.max_seqlen_q;

  int n_tile_begin, n_tile_end;
  KeyTilesSeenBy(p, seq, m0, kBlockM, kBlockN, shift, &n_tile_begin, &n_tile_end);
  if (n_tile_begin >= n_tile_end) {  // no key: dQ = 0
    const int rows = min(kBlockM, p.max_seqlen_q - m0);
    for (int e = threadIdx.x; e < rows * dqk; e += kThreads)
      if (m0 + e / dqk < rows_out)
        StoreElem(p.dq.data, p.qkv_dtype, Offset(p.dq, b, h, seq.start_q, m0 + e / dqk, e % dqk),
                  0.f);
    return;
  }

  const T* k_base = static_cast<const T*>(p.k.data) + Offset(p.k, b, hk, seq.start_kv, 0, 0);
  const T* v_base = static_cast<const T*>(p.v.data) + Offset(p.v, b, hk, seq.start_kv, 0, 0);
  LoadTile<kBlockM, kHeadDim, kStride, kThreads>(
      Qs, static_cast<const T*>(p.q.data) + Offset(p.q, b, h, seq.start_q, m0, 0), p.q.stride_s,
      seq.len_q - m0, dqk, p.q.data);
  LoadTile<kBlockM, kHeadDim, kStride, kThreads>(
      dOs, static_cast<const T*>(p.d_o.data) + Offset(p.d_o, b, h, seq.start_q, m0, 0),
      p.d_o.stride_s, seq.len_q - m0, dv, p.d_o.data);
  CpAsyncCommit();

  int64_t row_index[2];
  int key_lo[2], key_hi[2];
  float lse[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_index[r] = m0 + warp * 16 + g + 8 * r;
    VisibleKeys(p, row_index[r], seq.len_q, seq.len_kv, &key_lo[r], &key_hi[r]);
    lse[r] = INFINITY;
    delta[r] = 0.f;
    if (row_index[r] < seq.len_q) {
      const float l = BackwardLse(p, b, h, seq, row_index[r]);
      lse[r] = l == INFINITY ? INFINITY : l * kLog2e;
      delta[r] = p.delta[RowIndex(p, b, h, row_index[r])];
    }
  }
  const DropoutRow drop_row0 = DropoutRowOf(p, b, h, 0);
  const float scale_log2 = p.scale * kLog2e;
  const bool score_mods = kFull && (Mod::kActive || HasScoreMods(p));

  float acc[kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[dt][e] = 0.f;

  for (int n_tile = n_tile_begin; n_tile < n_tile_end; ++n_tile) {
    if constexpr (Mod::kActive)  // the block mask hides the whole tile (uniform in the block)
      if (!FlexTileActive(p, b, h, m_tile, n_tile)) continue;
    const int n0 = n_tile * kBlockN;
    __syncthreads();  // every warp is done with the previous K, V
    LoadTile<kBlockN, kHeadDim, kStride, kThreads>(Ks, k_base + n0 * p.k.stride_s, p.k.stride_s,
                                                   seq.len_kv - n0, dqk, p.k.data);
    LoadTile<kBlockN, kHeadDim, kStride, kThreads>(Vs, v_base + n0 * p.v.stride_s, p.v.stride_s,
                                                   seq.len_kv - n0, dv, p.v.data);
    CpAsyncCommit();
    CpAsyncWait<0>();
    __syncthreads();

    float s[kNTiles][4], dp[kNTiles][4];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {  // padded columns are zero: no branch here
      uint32_t aq[4], ao[4];
      LoadA(aq, Qs, kStride, warp * 16, ks * 16, lane);
      LoadA(ao, dOs, kStride, warp * 16, ks * 16, lane);
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t bk[4], bv[4];
        LoadBFromRows(bk, Ks, kStride, np * 16, ks * 16, lane);
        LoadBFromRows(bv, Vs, kStride, np * 16, ks * 16, lane);
        Mma<Element>(s[2 * np], aq, bk[0], bk[1]);
        Mma<Element>(s[2 * np + 1], aq, bk[2], bk[3]);
        Mma<Element>(dp[2 * np], ao, bv[0], bv[1]);
        Mma<Element>(dp[2 * np + 1], ao, bv[2], bv[3]);
      }
    }

    const bool interior =
        TileFullyVisible(p, m0, kBlockM, n0, kBlockN, seq.len_q, seq.len_kv, shift);
    float dcap[kFull ? kNTiles : 1][4];
    float dmod[Mod::kActive ? kNTiles : 1][4];  // d score_mod / d s
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t j = n0 + nt * 8 + 2 * t + (e & 1);
        float u;
        if constexpr (kFull) dcap[nt][e] = 1.f;
        if (!score_mods) {
          u = s[nt][e] * scale_log2;
        } else {
          float derivative = 1.f, score = -INFINITY;
          if constexpr (Mod::kActive) dmod[nt][e] = 0.f;
          if (j >= key_lo[r] && j < key_hi[r]) {
            score = ScoreOf(p, s[nt][e], b, h, row_index[r], j, seq.len_q, seq.len_kv,
                            &derivative);
            if constexpr (Mod::kActive) {
              float modified, d_s;
              const bool visible = Mod::Backward(p, score, b, h, row_index[r], j, seq.len_q,
                                                 seq.len_kv, &modified, &d_s);
              score = visible ? modified : -INFINITY;
              dmod[nt][e] = d_s;
            }
          }
          u = score * kLog2e;
          if constexpr (kFull) dcap[nt][e] = derivative;
        }
        s[nt][e] = FastExp2(u - lse[r]);  // lse = +inf: the row has no gradient
      }
    if (!interior && !score_mods) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = n0 + nt * 8 + 2 * t + (e & 1);
          if (j < key_lo[e >> 1] || j >= key_hi[e >> 1]) s[nt][e] = 0.f;
        }
    }
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        bool keep[2] = {true, true};
        if (kFull && p.dropout) {
          DropoutRow drop = drop_row0;
          drop.row += static_cast<uint32_t>(row_index[r]);
          DropoutKeep2(drop, n0 + nt * 8 + 2 * t, &keep[0], &keep[1]);
        }
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int e = 2 * r + c;
          const float keep_scale = kFull && p.dropout ? (keep[c] ? p.keep_scale : 0.f) : 1.f;
          const float ds = s[nt][e] * (dp[nt][e] * keep_scale - delta[r]);
          float grad = ds * p.scale;
          if constexpr (Mod::kActive) grad = ds != 0.f ? grad * dmod[nt][e] : 0.f;
          if constexpr (kFull) grad *= dcap[nt][e];
          s[nt][e] = grad;
        }
      }

    // dQ += dS K
#pragma unroll
    for (int kp = 0; kp < kNTiles / 2; ++kp) {
      uint32_t a[4];
      a[0] = Pack<Element>(s[2 * kp][0], s[2 * kp][1]);
      a[1] = Pack<Element>(s[2 * kp][2], s[2 * kp][3]);
      a[2] = Pack<Element>(s[2 * kp + 1][0], s[2 * kp + 1][1]);
      a[3] = Pack<Element>(s[2 * kp + 1][2], s[2 * kp + 1][3]);
#pragma unroll
      for (int dp2 = 0; dp2 < kDTiles / 2; ++dp2) {
        uint32_t bk[4];
        LoadBFromColumns(bk, Ks, kStride, dp2 * 16, kp * 16, lane);
        Mma<Element>(acc[2 * dp2], a, bk[0], bk[1]);
        Mma<Element>(acc[2 * dp2 + 1], a, bk[2], bk[3]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = row_index[r];
    if (i >= rows_out) continue;
    const int64_t at = Offset(p.dq, b, h, seq.start_q, i, 0);
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      const int x = dt * 8 + 2 * t;
      if (x < dqk)
        StorePair<Element>(p.dq.data, at + x * p.dq.stride_d, p.dq.stride_d, acc[dt][2 * r],
                           acc[dt][2 * r + 1]);
    }
  }
}

#ifndef __CUDACC_RTC__
template <typename Element, int kHeadDim, bool kFull>
Status LaunchFastBackwardVariant(const FlashParams& p, cudaStream_t stream) {
  using Tile = BwdTile<kHeadDim>;
  using T = typename ElementTraits<Element>::Type;
  const size_t smem = BwdSmemBytes<kHeadDim>(sizeof(T));
  const int n_tiles = (p.max_seqlen_kv + Tile::kBlockN - 1) / Tile::kBlockN;
  const int64_t blocks = int64_t{n_tiles} * p.heads_kv * p.batch;
  if (blocks > INT_MAX) return NotSupported("flash: %lld backward blocks", (long long)blocks);
  auto kernel =
      FastBackwardKernel<Element, kHeadDim, Tile::kBlockM, Tile::kBlockN, Tile::kWarps, kFull>;
  FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(blocks), Tile::kWarps * 32, smem, stream>>>(p, n_tiles);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

template <typename Element, int kHeadDim>
Status LaunchFastBackward(const FlashParams& p, cudaStream_t stream) {
  return NeedsFullKernel(p) ? LaunchFastBackwardVariant<Element, kHeadDim, true>(p, stream)
                            : LaunchFastBackwardVariant<Element, kHeadDim, false>(p, stream);
}

template <typename Element, int kHeadDim, bool kFull>
Status LaunchFastBackwardDqVariant(const FlashParams& p, cudaStream_t stream) {
  using Tile = DqTile<kHeadDim>;
  using T = typename ElementTraits<Element>::Type;
  const size_t smem = DqSmemBytes<kHeadDim>(sizeof(T));
  const int m_tiles = (p.max_seqlen_q + Tile::kBlockM - 1) / Tile::kBlockM;
  const int64_t blocks = int64_t{m_tiles} * p.heads_q * p.batch;
  if (blocks > INT_MAX) return NotSupported("flash: %lld dQ blocks", (long long)blocks);
  auto kernel =
      FastBackwardDqKernel<Element, kHeadDim, Tile::kBlockM, Tile::kBlockN, Tile::kWarps, kFull>;
  FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(blocks), Tile::kWarps * 32, smem, stream>>>(p, m_tiles);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

template <typename Element, int kHeadDim>
Status LaunchFastBackwardDq(const FlashParams& p, cudaStream_t stream) {
  return NeedsFullKernel(p) ? LaunchFastBackwardDqVariant<Element, kHeadDim, true>(p, stream)
                            : LaunchFastBackwardDqVariant<Element, kHeadDim, false>(p, stream);
}

#endif  // __CUDACC_RTC__

}  // namespace fusedattn::flash
