// The decode kernel: one block per (sequence, kv head, split of the keys, chunk of query rows).
//
//  * The block's query rows are those of the kv head's whole GQA group (row r = query
//    i = r / group of head hk * group + r % group), so that every key and value is read once per
//    kv head. Q (kRows rows, 16 or 32) stays in shared memory.
//  * Keys come in tiles of kBlockN = 64 through kStages shared-memory stages with cp.async:
//    kStages - 1 tiles are in flight while one is computed, which is what a memory-bound kernel
//    needs. Paged K/V: every row's address goes through the page table; an entry outside
//    [0, num_pages) is never followed (the row reads as zeros), and only entries of keys below
//    the sequence's length are read. Contiguous K/V (kPaged false) reads rows of the sequence.
//  * Each warp takes 16 keys of every tile (mma.sync m16n8k16: S = Q K^T, then O += P V with P
//    from S's registers) and keeps its own online softmax; at the end the four warps' results are
//    merged through shared memory.
//  * Splits: with one split the block writes o and lse (the off-by-one or sink logit included);
//    with several it writes O_s (normalized within the split) and LSE_s to the workspace, and
//    DecodeCombineKernel (decode.cu) merges them, adding the extra logit once.
//  * Scores are in log2 units in the loop (scale * log2(e) folded in); softcap, ALiBi and bias go
//    through ScoreOf (device_common.cuh), the masks through VisibleKeys.
#pragma once

#include <climits>

#include "backends/flash/decode.h"
#include "backends/flash/device_common.cuh"
#include "backends/flash/mma.cuh"
#include "common/cuda_util.h"

namespace fusedattn::flash {

// Programmatic dependent launch (sm_90; DecodeParams::programmatic_launch). A grid launched with
// programmatic stream serialization may start while the grid before it still runs: it waits for
// that grid's completion and the visibility of its writes here, before its first global read or
// write. AllowNextGridLaunch lets the grid after this one start launching (its blocks then wait
// in WaitForPreviousGrid), which hides a launch's latency behind this grid's tail. Both are no-ops
// for a grid launched without it, and compiled out before sm_90 (never launched that way there).
__device__ __forceinline__ void WaitForPreviousGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void AllowNextGridLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Launches kernel<<<blocks, threads, smem, stream>>>(args...), with programmatic stream
// serialization when `programmatic` (the kernel must call WaitForPreviousGrid first).
template <typename... Args>
Status LaunchMaybeProgrammatic(void (*kernel)(Args...), unsigned blocks, int threads, size_t smem,
                               bool programmatic, cudaStream_t stream, const Args&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = programmatic ? 1 : 0;
  FUSEDATTN_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
  return Status::Ok();
}

// Lengths and token starts of sequence b: LoadPagedSeq (paged: the keys from seqlens_kv) or
// LoadSeq (contiguous), as the other kernels read them; clamped so that bad index tensors can
// never send the kernel outside the tensors.
template <bool kPaged>
__device__ __forceinline__ SeqInfo DecodeSeq(const DecodeParams& d, int b) {
  return kPaged ? LoadPagedSeq(d.base, b) : LoadSeq(d.base, b);
}

template <typename Element, int kHeadDim, int kRows, bool kPaged>
__global__ void __launch_bounds__(DecodeTile<kHeadDim>::kWarps * 32,
                                  DecodeMinBlocksPerSm<kHeadDim, kRows>())
    DecodeKernel(const DecodeParams d) {
  WaitForPreviousGrid();  // programmatic launch: the previous kernel's writes (q, K/V, max_logit)
  using T = typename ElementTraits<Element>::Type;
  using Tile = DecodeTile<kHeadDim>;
  constexpr int kBlockN = Tile::kBlockN, kWarps = Tile::kWarps, kStages = Tile::kStages;
  constexpr int kThreads = kWarps * 32;
  constexpr int kStride = kHeadDim + 8;      // shared-memory rows of Q, K, V (elements)
  constexpr int kRedStride = kHeadDim + 8;   // rows of the warps' partial O (floats)
  constexpr int kMTiles = kRows / 16;
  constexpr int kDTiles = kHeadDim / 8;
  constexpr int kPieces = kHeadDim / 8;      // 16-byte pieces of a row
  constexpr int kRowsPerPass = kThreads / kPieces;
  constexpr int kPasses = kBlockN / kRowsPerPass;
  constexpr int kWarpKeys = kBlockN / kWarps;
  static_assert(kRows % 16 == 0 && kWarpKeys == 16, "one m16n8k16 k-step of keys per warp");
  static_assert(kThreads % kPieces == 0 && kBlockN % kRowsPerPass == 0, "whole rows per pass");

  const FlashParams& p = d.base;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  T* Qs = reinterpret_cast<T*>(smem_bytes);
  T* stages = Qs + kRows * kStride;  // stage st: K at st * 2 * kBlockN * kStride, V after it
  // After the key loop the stages' memory holds the reduction of the warps' results.
  float* red_o = reinterpret_cast<float*>(stages);          // [kWarps][kRows][kRedStride]
  float* red_m = red_o + kWarps * kRows * kRedStride;        // [kWarps][kRows], log2 units
  float* red_l = red_m + kWarps * kRows;                     // [kWarps][kRows]
  float* red_f = red_l + kWarps * kRows;                     // [kWarps][kRows]: O_w's factor
  float* row_lse = red_f + kWarps * kRows;                   // [kRows]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  // Block -> (b, hk, split, chunk), chunks fastest (they read the same keys, from L2).
  int64_t x = blockIdx.x;
  const int chunk = static_cast<int>(x % d.row_chunks);
  x /= d.row_chunks;
  const int split = static_cast<int>(x % d.splits);
  x /= d.splits;
  const int hk = static_cast<int>(x % p.heads_kv);
  const int b = static_cast<int>(x / p.heads_kv);
  const int group = p.group;
  const SeqInfo seq = DecodeSeq<kPaged>(d, b);
  const int row0 = chunk * kRows;                       // first row of the block
  const int row_end = min(d.rows, row0 + kRows);        // one past its last

  // The key tiles [n_first, n_end) this block visits: those its rows can see (rows are ordered
  // by query position, and the visible ranges are monotonic in it), inside its split.
  int n_first = 0, n_end = 0;
  {
    const int i_first = row0 / group;
    const int i_last = min((row_end - 1) / group, seq.len_q - 1);
    if (i_first <= i_last) {
      const int64_t shift = DiagShift(p, seq.len_q, seq.len_kv);
      const int64_t key_lo = ClampI64(RawLo(p, i_first, shift), 0, seq.len_kv);
      const int64_t key_hi = ClampI64(RawHi(p, i_last, shift), 0, seq.len_kv);
      if (key_lo < key_hi) {
        n_first = max(static_cast<int>(key_lo / kBlockN), split * d.tiles_per_split);
        n_end = min(static_cast<int>((key_hi + kBlockN - 1) / kBlockN),
                    (split + 1) * d.tiles_per_split);
      }
    }
  }
  const int n_count = max(n_end - n_first, 0);

  // Q: the block's rows, zeros for rows past the group's rows or the sequence's queries.
  for (int e = threadIdx.x; e < kRows * kPieces; e += kThreads) {
    const int br = e / kPieces, c = (e % kPieces) * 8;
    const int r = row0 + br;
    const int i = r / group, h = hk * group + r % group;
    const bool valid = r < row_end && i < seq.len_q;
    const T* src = static_cast<const T*>(p.q.data) +
                   (valid ? Offset(p.q, b, h, seq.start_q, i, c) : 0);
    CpAsync16(Qs + br * kStride + c, src, valid);
  }

  // K and V rows of tile n into stage st. Thread x copies the piece at column 8 (x % kPieces)
  // of rows x / kPieces + k * kRowsPerPass. Rows past the sequence's keys, and rows on a page
  // outside the pool, are zero-filled without a read.
  const T* k_pool = static_cast<const T*>(p.k.data);
  const T* v_pool = static_cast<const T*>(p.v.data);
  const int piece = (threadIdx.x % kPieces) * 8;
  const int first_row = threadIdx.x / kPieces;
  const int64_t k_head = hk * p.k.stride_h + piece, v_head = hk * p.v.stride_h + piece;
  const int32_t* table_row =
      kPaged ? p.paged.page_table + b * p.paged.page_table_stride : nullptr;
  // Contiguous: the sequence's first key (LoadSeq keeps start + length inside the tensor).
  const int64_t k_seq = kPaged ? 0 : b * p.k.stride_b + seq.start_kv * p.k.stride_s;
  const int64_t v_seq = kPaged ? 0 : b * p.v.stride_b + seq.start_kv * p.v.stride_s;
  auto issue_tile = [&](int n, int st) {
    T* Ks = stages + st * 2 * kBlockN * kStride;
    T* Vs = Ks + kBlockN * kStride;
    const int key0 = n * kBlockN;
    int64_t k_off[kPasses], v_off[kPasses];
    bool valid[kPasses];
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int j = key0 + first_row + pass * kRowsPerPass;
      valid[pass] = j < seq.len_kv;
      k_off[pass] = 0, v_off[pass] = 0;
      if constexpr (kPaged) {
        // j < len_kv <= max_seqlen_kv, and the row holds ceil(max_seqlen_kv / page_size)
        // entries (validated): the entry read is one of the sequence's own.
        // A power-of-two page size (page_shift >= 0, uniform) takes a shift and a mask instead
        // of the integer division and remainder, which cost dozens of instructions per row.
        const int entry = d.page_shift >= 0 ? j >> d.page_shift : j / p.paged.page_size;
        const int64_t page = valid[pass] ? __ldg(table_row + entry) : 0;
        valid[pass] = valid[pass] && page >= 0 && page < p.paged.num_pages;
        const int64_t token =
            d.page_shift >= 0 ? j & (p.paged.page_size - 1) : j % p.paged.page_size;
        if (valid[pass]) {
          k_off[pass] = page * p.k.stride_b + token * p.k.stride_s;
          v_off[pass] = page * p.v.stride_b + token * p.v.stride_s;
        }
      } else {
        if (valid[pass]) {
          k_off[pass] = k_seq + int64_t{j} * p.k.stride_s;
          v_off[pass] = v_seq + int64_t{j} * p.v.stride_s;
        }
      }
    }
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = first_row + pass * kRowsPerPass;
      CpAsync16(Ks + row * kStride + piece, k_pool + (valid[pass] ? k_off[pass] + k_head : 0),
                valid[pass]);
      CpAsync16(Vs + row * kStride + piece, v_pool + (valid[pass] ? v_off[pass] + v_head : 0),
                valid[pass]);
    }
  };

  // Prologue: Q and the first kStages - 1 tiles, one commit group per tile (empty groups keep
  // the count uniform), Q in the first.
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_count) issue_tile(n_first + st, st);
    CpAsyncCommit();
  }
  AllowNextGridLaunch();  // the combine (or the next call) may start launching

  // This thread's rows: (mt, r) -> block row 16 mt + 8 r + g. Their queries, heads and visible
  // key ranges are fixed for the whole block.
  int row_i[kMTiles][2], row_h[kMTiles][2], row_lo[kMTiles][2], row_hi[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int rr = row0 + mt * 16 + 8 * r + g;
      row_i[mt][r] = rr / group;
      row_h[mt][r] = hk * group + rr % group;
      row_lo[mt][r] = row_hi[mt][r] = 0;
      if (rr < row_end)
        VisibleKeys(p, row_i[mt][r], seq.len_q, seq.len_kv, &row_lo[mt][r], &row_hi[mt][r]);
    }

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
  const bool score_mods = HasScoreMods(p);  // bias, ALiBi, softcap
  const int warp_key = warp * kWarpKeys;    // this warp's keys inside a tile

  for (int k = 0; k < n_count; ++k) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // tile k landed for every thread; every warp is done with tile k - 1
    if (k + kStages - 1 < n_count) issue_tile(n_first + k + kStages - 1, (k + kStages - 1) % kStages);
    CpAsyncCommit();

    const T* Ks = stages + (k % kStages) * 2 * kBlockN * kStride;
    const T* Vs = Ks + kBlockN * kStride;
    const int key0 = (n_first + k) * kBlockN + warp_key;

    // S = Q K^T over this warp's 16 keys: s[mt][0] keys key0..+7, s[mt][1] keys key0+8..+15.
    float s[kMTiles][2][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      uint32_t bk[4];
      LoadBFromRows(bk, Ks, kStride, warp_key, ks * 16, lane);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        uint32_t a[4];
        LoadA(a, Qs, kStride, mt * 16, ks * 16, lane);
        Mma<Element>(s[mt][0], a, bk[0], bk[1]);
        Mma<Element>(s[mt][1], a, bk[2], bk[3]);
      }
    }

    // Scores (log2 units), -inf where the mask hides the key. Element (mt, nt, e) is row
    // 16 mt + 8 (e / 2) + g, key key0 + 8 nt + 2 t + e % 2.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int j = key0 + nt * 8 + 2 * t + c;
            float& v = s[mt][nt][2 * r + c];
            if (j < row_lo[mt][r] || j >= row_hi[mt][r])
              v = -INFINITY;
            else if (score_mods)
              v = ScoreOf(p, v, b, row_h[mt][r], row_i[mt][r], j, seq.len_q, seq.len_kv,
                          nullptr) *
                  kLog2e;
            else
              v *= scale_log2;
          }

    // Online softmax of this warp's keys.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float tile_max = fmaxf(fmaxf(s[mt][0][2 * r], s[mt][0][2 * r + 1]),
                               fmaxf(s[mt][1][2 * r], s[mt][1][2 * r + 1]));
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
        for (int nt = 0; nt < 2; ++nt) {
          const float p0 = FastExp2(s[mt][nt][2 * r] - base);
          const float p1 = FastExp2(s[mt][nt][2 * r + 1] - base);
          sum += p0 + p1;
          s[mt][nt][2 * r] = p0;
          s[mt][nt][2 * r + 1] = p1;
        }
        row_sum[mt][r] = sum;
      }

    // O += P V: P (16 rows x this warp's 16 keys) is the A operand, from S's registers.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      uint32_t a[4];
      a[0] = Pack<Element>(s[mt][0][0], s[mt][0][1]);
      a[1] = Pack<Element>(s[mt][0][2], s[mt][0][3]);
      a[2] = Pack<Element>(s[mt][1][0], s[mt][1][1]);
      a[3] = Pack<Element>(s[mt][1][2], s[mt][1][3]);
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t bv[4];
        LoadBFromColumns(bv, Vs, kStride, dp * 16, warp_key, lane);
        Mma<Element>(acc_o[mt][2 * dp], a, bv[0], bv[1]);
        Mma<Element>(acc_o[mt][2 * dp + 1], a, bv[2], bv[3]);
      }
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // every warp is done with the stages: they become the reduction's memory

  // Each warp's (max, sum, O) per row into shared memory.
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = mt * 16 + 8 * r + g;
      float sum = row_sum[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (t == 0) {
        red_m[warp * kRows + row] = row_max[mt][r];
        red_l[warp * kRows + row] = sum;
      }
      float* o_row = red_o + (warp * kRows + row) * kRedStride;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        o_row[dt * 8 + 2 * t] = acc_o[mt][dt][2 * r];
        o_row[dt * 8 + 2 * t + 1] = acc_o[mt][dt][2 * r + 1];
      }
    }
  __syncthreads();

  // Per row: the block's max M and sum L over the warps, the LSE and each warp's factor. With
  // one split the extra logit (off-by-one, sink) enters here; with several, in the combine.
  if (threadIdx.x < kRows) {
    const int row = threadIdx.x;
    const int rr = row0 + row;
    const int h = hk * group + rr % group;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, red_m[w * kRows + row]);
    float lse = -INFINITY;
    if (m == -INFINITY) {  // no visible key in this block (or not a row)
#pragma unroll
      for (int w = 0; w < kWarps; ++w) red_f[w * kRows + row] = 0.f;
    } else {
      float l = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        l += red_l[w * kRows + row] * FastExp2(red_m[w * kRows + row] - m);
      const float extra = d.splits == 1 ? ExtraLogit(p, h) * kLog2e : -INFINITY;
      const float top = fmaxf(m, extra);
      const float a = FastExp2(m - top);
      const float z = l * a + FastExp2(extra - top);
      lse = (top + log2f(z)) * kLn2;
      const float norm = a / z;
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        red_f[w * kRows + row] = FastExp2(red_m[w * kRows + row] - m) * norm;
      if (p.max_logit) AtomicMaxFloat(&p.max_logit[h * p.max_logit_stride], m * kLn2);
    }
    row_lse[row] = lse;
    if (rr < row_end) {
      const int i = rr / group;
      if (d.splits == 1) {
        if (p.lse.data && (p.lse.packed ? i < seq.len_q : i < p.max_seqlen_q))
          p.lse.data[LseOffset(p.lse, b, h, seq.start_q, i)] = lse;
      } else {
        d.partial_lse[((int64_t{split} * p.batch + b) * p.heads_q + h) * p.max_seqlen_q + i] =
            lse;
      }
    }
  }
  __syncthreads();

  // O = sum over warps of O_w * factor_w, one element per thread and step (rows of the output
  // are contiguous along the head dim).
  const int64_t rows_out = p.thd ? seq.len_q : p.max_seqlen_q;
  for (int e = threadIdx.x; e < kRows * kHeadDim; e += kThreads) {
    const int row = e / kHeadDim, col = e % kHeadDim;
    const int rr = row0 + row;
    if (rr >= row_end) break;  // rows only grow with e
    const int i = rr / group, h = hk * group + rr % group;
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      o += red_o[(w * kRows + row) * kRedStride + col] * red_f[w * kRows + row];
    if (d.splits == 1) {
      if (i < rows_out) StoreElem(p.o.data, p.o_dtype, Offset(p.o, b, h, seq.start_q, i, col), o);
    } else {
      d.partial_o[(((int64_t{split} * p.batch + b) * p.heads_q + h) * p.max_seqlen_q + i) *
                      kHeadDim +
                  col] = o;
    }
  }
}

template <typename Element, int kHeadDim, int kRows, bool kPaged>
Status LaunchDecodeInstance(const DecodeParams& d, cudaStream_t stream) {
  constexpr size_t smem = DecodeSmemBytes<kHeadDim, kRows>();
  const int64_t blocks = int64_t{d.base.batch} * d.base.heads_kv * d.splits * d.row_chunks;
  if (blocks > INT_MAX) return NotSupported("flash decode: %lld blocks", (long long)blocks);
  auto kernel = DecodeKernel<Element, kHeadDim, kRows, kPaged>;
  FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem)));
  // All of the unified L1 as shared memory: the planner counts blocks_per_sm blocks resident
  // from the SM's whole shared memory (DeviceFacts::smem_per_sm), and the K/V stream goes
  // through shared memory (cp.async.cg), not L1.
  FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  return LaunchMaybeProgrammatic(kernel, static_cast<unsigned>(blocks),
                                 DecodeTile<kHeadDim>::kWarps * 32, smem, d.programmatic_launch,
                                 stream, d);
}

template <typename Element, int kHeadDim>
Status LaunchDecode(const DecodeParams& d, int block_rows, cudaStream_t stream) {
  const bool paged = d.base.paged.page_table != nullptr;
  if (block_rows == 16)
    return paged ? LaunchDecodeInstance<Element, kHeadDim, 16, true>(d, stream)
                 : LaunchDecodeInstance<Element, kHeadDim, 16, false>(d, stream);
  return paged ? LaunchDecodeInstance<Element, kHeadDim, 32, true>(d, stream)
               : LaunchDecodeInstance<Element, kHeadDim, 32, false>(d, stream);
}

}  // namespace fusedattn::flash
