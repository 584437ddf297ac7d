// The simple path: SIMT kernels that compute exactly fusedattn.h for any dtype (float32, float16,
// bfloat16 in any combination), any head dims that fit shared memory, and any strides. They serve
// float32 problems and every tensor the tensor-core path cannot take (unaligned or strided rows,
// head dims it is not compiled for). Also here: the small kernels both paths share (fills, the
// backward's preprocess, dsink and dbias reductions, the dQ conversion).
//
// Layout of the work: one warp per query row (forward, dQ) or key row (dK/dV); a block of
// kRowsPerBlock warps shares chunks of 32 keys (or queries) staged in shared memory as float.
// Softmax statistics are kept in natural units and float; exp/log/tanh are the precise ones.
// Nothing is O(seqlen^2) in memory and every result is deterministic.
#include <algorithm>
#include <climits>

#include "backends/flash/device_common.cuh"
#include "backends/flash/dq_accum_layout.h"
#include "backends/flash/kernels.h"
#include "common/cuda_util.h"

namespace fusedattn::flash {
namespace {

constexpr int kRowsPerBlock = 4;  // warps per block, one row each
constexpr int kChunk = 32;        // keys (or queries) per shared-memory chunk: one per lane

// Row strides of the staged chunks: odd, so that 32 lanes reading one column of 32 rows hit 32
// different banks.
__host__ __device__ inline int OddStride(int d) { return d | 1; }

__host__ __device__ inline size_t ForwardSmemFloats(int dqk, int dv) {
  return size_t{kChunk} * OddStride(dqk) + size_t{kChunk} * dv +
         size_t{kRowsPerBlock} * (dqk + dv + kChunk);
}
__host__ __device__ inline size_t DqSmemFloats(int dqk, int dv) {
  return size_t{kChunk} * OddStride(dqk) + size_t{kChunk} * OddStride(dv) +
         size_t{kRowsPerBlock} * (2 * dqk + dv + kChunk);
}
__host__ __device__ inline size_t DkdvSmemFloats(int dqk, int dv) {
  return size_t{kChunk} * OddStride(dqk) + size_t{kChunk} * OddStride(dv) + 2 * kChunk +
         size_t{kRowsPerBlock} * (2 * dqk + 2 * dv + 2 * kChunk);
}
__host__ __device__ inline size_t ReduceDbiasSmemFloats(int dqk, int dv) {
  return size_t{kRowsPerBlock} * (dqk + dv);
}

Status SetSmem(const void* kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(bytes)));
  return Status::Ok();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

Status CheckBlocks(int64_t blocks, const char* what) {
  if (blocks > INT_MAX)
    return NotSupported("flash: %s needs %lld blocks, more than a grid holds", what,
                        (long long)blocks);
  return Status::Ok();
}

// Stages rows [first, first + count) of a q/k/v-like tensor (head h, dim d) into a float chunk of
// kChunk rows with row stride `stride`; rows past count are zero.
__device__ void StageRows(const TensorArg& t, fusedattn_dtype dtype, int b, int h, int64_t start,
                          int64_t first, int count, int d, float* chunk, int stride) {
  for (int e = threadIdx.x; e < kChunk * d; e += blockDim.x) {
    int r = e / d, x = e % d;
    chunk[r * stride + x] =
        r < count ? LoadElem(t.data, dtype, Offset(t, b, h, start, first + r, x)) : 0.f;
  }
}

// The keys [*lo, *hi) that any row of the block [row0, row0 + kRowsPerBlock) sees.
__device__ void BlockKeyRange(const FlashParams& p, int64_t row0, const SeqInfo& seq, int* lo,
                              int* hi) {
  int block_lo = INT_MAX, block_hi = 0;
  for (int w = 0; w < kRowsPerBlock; ++w) {
    int l, h;
    VisibleKeys(p, row0 + w, seq.len_q, seq.len_kv, &l, &h);
    if (l < h) {
      block_lo = min(block_lo, l);
      block_hi = max(block_hi, h);
    }
  }
  *lo = block_lo;
  *hi = block_hi;
}

// The simple kernels' score (ScoreOf): tanhf for the softcap on float32 inputs, which only these
// kernels run; on float16/bfloat16 the tensor-core kernels' SoftcapTanh, because the other
// direction of such a problem may run there (a tensor-core forward's LSE with this backward's P
// when dO is not 16-byte aligned, say), and P = exp(s - LSE) needs the same s in both.
__device__ __forceinline__ float SimpleScoreOf(const FlashParams& p, float qk, int b, int h,
                                               int64_t i, int64_t j, int len_q, int len_kv,
                                               float* dcap) {
  return p.qkv_dtype == FUSEDATTN_DTYPE_FLOAT32
             ? ScoreOf</*kExactTanh=*/true>(p, qk, b, h, i, j, len_q, len_kv, dcap)
             : ScoreOf</*kExactTanh=*/false>(p, qk, b, h, i, j, len_q, len_kv, dcap);
}

// ------------------------------------------------------------------------------------------------
// Forward
// ------------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kRowsPerBlock * 32)
    SimpleForwardKernel(const FlashParams p, int row_tiles) {
  extern __shared__ float smem[];
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int ks_stride = OddStride(dqk);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* Ks = smem;                    // [kChunk][ks_stride]
  float* Vs = Ks + kChunk * ks_stride;  // [kChunk][dv]
  float* qs = Vs + kChunk * dv + warp * (dqk + dv + kChunk);
  float* acc = qs + dqk;
  float* ps = acc + dv;

  const TileIndex tile = DecomposeBlock(blockIdx.x, row_tiles, p.heads_q);
  const int b = tile.b, h = tile.h, hk = h / p.group;
  const SeqInfo seq = LoadSeq(p, b);
  const int64_t row0 = int64_t{tile.tile} * kRowsPerBlock;
  const int64_t i = row0 + warp;
  int lo, hi, block_lo, block_hi;
  VisibleKeys(p, i, seq.len_q, seq.len_kv, &lo, &hi);
  BlockKeyRange(p, row0, seq, &block_lo, &block_hi);

  for (int x = lane; x < dqk; x += 32)
    qs[x] = i < seq.len_q ? LoadElem(p.q.data, p.qkv_dtype, Offset(p.q, b, h, seq.start_q, i, x))
                          : 0.f;
  for (int x = lane; x < dv; x += 32) acc[x] = 0.f;
  DropoutRow drop{};
  if (p.dropout) drop = DropoutRowOf(p, b, h, i);

  float m = -INFINITY, l = 0.f;  // running max and sum (natural units)
  for (int c0 = block_lo; c0 < block_hi; c0 += kChunk) {
    const int n = min(kChunk, block_hi - c0);
    __syncthreads();  // the previous chunk is consumed
    StageRows(p.k, p.qkv_dtype, b, hk, seq.start_kv, c0, n, dqk, Ks, ks_stride);
    StageRows(p.v, p.qkv_dtype, b, hk, seq.start_kv, c0, n, dv, Vs, dv);
    __syncthreads();
    const int key = c0 + lane;
    const bool visible = key >= lo && key < hi;
    float s = -INFINITY;
    if (visible) {
      float qk = 0.f;
      for (int x = 0; x < dqk; ++x) qk += qs[x] * Ks[lane * ks_stride + x];
      s = SimpleScoreOf(p, qk, b, h, i, key, seq.len_q, seq.len_kv, nullptr);
    }
    const float m_new = fmaxf(m, WarpMax(s));
    if (m_new == -INFINITY) continue;  // nothing visible yet (warp-uniform)
    const float correction = expf(m - m_new);
    float prob = visible ? expf(s - m_new) : 0.f;
    l = l * correction + WarpSum(prob);
    if (p.dropout && visible && !drop.Keep(key)) prob = 0.f;
    ps[lane] = prob;
    __syncwarp();
    for (int x = lane; x < dv; x += 32) {
      float a = acc[x] * correction;
      for (int r = 0; r < n; ++r) a += ps[r] * Vs[r * dv + x];
      acc[x] = a;
    }
    __syncwarp();
    m = m_new;
  }

  const bool has_keys = i < seq.len_q && m > -INFINITY;
  float lse = -INFINITY, norm = 0.f;
  if (has_keys) {
    const float extra = ExtraLogit(p, h);
    const float top = fmaxf(m, extra);
    const float a = expf(m - top);
    const float z = l * a + expf(extra - top);
    lse = top + logf(z);
    norm = a / z * p.keep_scale;
  }
  const int64_t rows_out = p.thd ? seq.len_q : p.max_seqlen_q;
  if (i < rows_out)
    for (int x = lane; x < dv; x += 32)
      StoreElem(p.o.data, p.o_dtype, Offset(p.o, b, h, seq.start_q, i, x), acc[x] * norm);
  if (lane == 0) {
    if (p.lse.data && (p.lse.packed ? i < seq.len_q : i < p.max_seqlen_q))
      p.lse.data[LseOffset(p.lse, b, h, seq.start_q, i)] = lse;
    if (p.max_logit && has_keys) AtomicMaxFloat(&p.max_logit[h * p.max_logit_stride], m);
  }
}

// ------------------------------------------------------------------------------------------------
// Backward
// ------------------------------------------------------------------------------------------------

// Row `row` of the [batch][heads_q][max_seqlen_q] row order of the backward's per-row buffers.
struct QueryRow {
  int64_t i;
  int h, b;
};
__device__ __forceinline__ QueryRow QueryRowOf(const FlashParams& p, int64_t row) {
  return {row % p.max_seqlen_q, static_cast<int>((row / p.max_seqlen_q) % p.heads_q),
          static_cast<int>(row / p.max_seqlen_q / p.heads_q)};
}

// 8 16-bit values (one 16-byte load) as floats.
__device__ __forceinline__ void Unpack8(uint4 raw, bool bf16, float out[8]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (bf16) {
      out[2 * k] = __uint_as_float(words[k] << 16);
      out[2 * k + 1] = __uint_as_float(words[k] & 0xFFFF0000u);
    } else {
      const __half2 h = *reinterpret_cast<const __half2*>(&words[k]);
      const float2 f = __half22float2(h);
      out[2 * k] = f.x;
      out[2 * k + 1] = f.y;
    }
  }
}

// A group of kLanes lanes per row (b, h, i < max_seqlen_q): delta = rowsum(dO * O), the sink
// partial, the zeroed dq_accum row. kVector: 16-bit O and dO whose rows are 16-byte vectors
// (VectorRows) with head_dim_v = 8 kLanes, one 16-byte load of each per lane, float4 zeroing;
// otherwise kLanes = 32 and element loads of any dtype and stride. (The element loads were a
// visible part of short-sequence backwards: ~400 us at 16k tokens x 2048 on H100.)
template <int kLanes, bool kVector>
__global__ void __launch_bounds__(256) PreprocessKernel(const FlashParams p, int64_t rows) {
  static_assert(32 % kLanes == 0, "whole groups per warp");
  const int64_t row = (int64_t{blockIdx.x} * 256 + threadIdx.x) / kLanes;
  const int lane = threadIdx.x % kLanes;
  if (row >= rows) return;  // whole groups leave together
  const auto [i, h, b] = QueryRowOf(p, row);
  const SeqInfo seq = LoadSeq(p, b);
  const float lse = BackwardLse(p, b, h, seq, i);
  const bool valid = lse != INFINITY;
  float delta = 0.f;
  if (valid) {
    if constexpr (kVector) {
      const bool bf16 = p.o_dtype == FUSEDATTN_DTYPE_BFLOAT16;
      const uint4 o_raw = *reinterpret_cast<const uint4*>(
          static_cast<const uint16_t*>(p.o.data) + Offset(p.o, b, h, seq.start_q, i, 8 * lane));
      const uint4 do_raw =
          *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.d_o.data) +
                                          Offset(p.d_o, b, h, seq.start_q, i, 8 * lane));
      float o[8], d_o[8];
      Unpack8(o_raw, bf16, o);
      Unpack8(do_raw, bf16, d_o);
#pragma unroll
      for (int k = 0; k < 8; ++k) delta += o[k] * d_o[k];
    } else {
      for (int x = lane; x < p.head_dim_v; x += kLanes)
        delta += LoadElem(p.d_o.data, p.o_dtype, Offset(p.d_o, b, h, seq.start_q, i, x)) *
                 LoadElem(p.o.data, p.o_dtype, Offset(p.o, b, h, seq.start_q, i, x));
    }
  }
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2)
    delta += __shfl_xor_sync(0xffffffffu, delta, offset);
  if (lane == 0) {
    p.delta[row] = delta;
    if (p.sink_partial)
      p.sink_partial[row] = valid ? -expf(ExtraLogit(p, h) - lse) * delta : 0.f;
  }
  if (p.dq_accum) {
    float* accum = p.dq_accum + row * p.dq_accum_dim;
    if constexpr (kVector) {
      for (int x = 4 * lane; x < p.dq_accum_dim; x += 4 * kLanes)
        *reinterpret_cast<float4*>(accum + x) = make_float4(0.f, 0.f, 0.f, 0.f);
    } else {
      for (int x = lane; x < p.dq_accum_dim; x += kLanes) accum[x] = 0.f;
    }
  }
}

// dQ from the float32 workspace, kPer elements per thread: 8 for a 16-bit dQ whose rows are
// 16-byte vectors (one 16-byte store), else 1 (any dtype and stride). The workspace is row-major
// or tiled (p.dq_accum_tiled, dq_accum_layout.h): there the 8 columns of a thread lie in four
// float2 pairs of its row (DqBlockPosition keeps columns 2q, 2q + 1 together).
template <int kPer>
__global__ void __launch_bounds__(256) ConvertDqKernel(const FlashParams p, int64_t items) {
  const int per_row = p.head_dim_qk / kPer;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < items;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int x = static_cast<int>(e % per_row) * kPer;
    const int64_t row = e / per_row;
    const auto [i, h, b] = QueryRowOf(p, row);
    int64_t start_q = 0;
    if (p.thd) {
      const SeqInfo seq = LoadSeq(p, b);
      if (i >= seq.len_q) continue;
      start_q = seq.start_q;
    }
    const float* slab = p.dq_accum + (row - i) * p.dq_accum_dim;  // this (b, h)'s rows
    const int64_t at = Offset(p.dq, b, h, start_q, i, x);
    if constexpr (kPer == 1) {
      const int64_t from = p.dq_accum_tiled
                               ? DqTiledOffset(static_cast<int>(i), x, p.max_seqlen_q,
                                               p.dq_accum_dim)
                               : i * p.dq_accum_dim + x;
      StoreElem(p.dq.data, p.qkv_dtype, at, slab[from]);
    } else {
      static_assert(kPer == 8, "one 16-byte vector");
      float v[8];
      if (p.dq_accum_tiled) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 pair = *reinterpret_cast<const float2*>(
              slab + DqTiledOffset(static_cast<int>(i), x + 2 * k, p.max_seqlen_q,
                                   p.dq_accum_dim));
          v[2 * k] = pair.x;
          v[2 * k + 1] = pair.y;
        }
      } else {
        const float* in = slab + i * p.dq_accum_dim + x;
        const float4 lo = reinterpret_cast<const float4*>(in)[0];
        const float4 hi = reinterpret_cast<const float4*>(in)[1];
        v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
        v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
      }
      uint32_t words[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (p.qkv_dtype == FUSEDATTN_DTYPE_BFLOAT16) {
          const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
          words[k] = *reinterpret_cast<const uint32_t*>(&pair);
        } else {
          const __half2 pair = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
          words[k] = *reinterpret_cast<const uint32_t*>(&pair);
        }
      }
      *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.dq.data) + at) =
          make_uint4(words[0], words[1], words[2], words[3]);
    }
  }
}

// dQ: one warp per query row, keys in chunks.
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    SimpleDqKernel(const FlashParams p, int row_tiles) {
  extern __shared__ float smem[];
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int ks_stride = OddStride(dqk), vs_stride = OddStride(dv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* Ks = smem;
  float* Vs = Ks + kChunk * ks_stride;
  float* qs = Vs + kChunk * vs_stride + warp * (2 * dqk + dv + kChunk);
  float* dos = qs + dqk;
  float* dqs = dos + dv;
  float* gs = dqs + dqk;

  const TileIndex tile = DecomposeBlock(blockIdx.x, row_tiles, p.heads_q);
  const int b = tile.b, h = tile.h, hk = h / p.group;
  const SeqInfo seq = LoadSeq(p, b);
  const int64_t row0 = int64_t{tile.tile} * kRowsPerBlock;
  const int64_t i = row0 + warp;
  int lo, hi, block_lo, block_hi;
  VisibleKeys(p, i, seq.len_q, seq.len_kv, &lo, &hi);
  BlockKeyRange(p, row0, seq, &block_lo, &block_hi);
  const float lse = i < seq.len_q ? BackwardLse(p, b, h, seq, i) : INFINITY;
  const bool valid = lse != INFINITY;
  const float delta = valid ? p.delta[RowIndex(p, b, h, i)] : 0.f;

  for (int x = lane; x < dqk; x += 32) {
    qs[x] = valid ? LoadElem(p.q.data, p.qkv_dtype, Offset(p.q, b, h, seq.start_q, i, x)) : 0.f;
    dqs[x] = 0.f;
  }
  for (int x = lane; x < dv; x += 32)
    dos[x] = valid ? LoadElem(p.d_o.data, p.o_dtype, Offset(p.d_o, b, h, seq.start_q, i, x)) : 0.f;
  DropoutRow drop{};
  if (p.dropout) drop = DropoutRowOf(p, b, h, i);

  for (int c0 = block_lo; c0 < block_hi; c0 += kChunk) {
    const int n = min(kChunk, block_hi - c0);
    __syncthreads();
    StageRows(p.k, p.qkv_dtype, b, hk, seq.start_kv, c0, n, dqk, Ks, ks_stride);
    StageRows(p.v, p.qkv_dtype, b, hk, seq.start_kv, c0, n, dv, Vs, vs_stride);
    __syncthreads();
    if (!valid) continue;
    const int key = c0 + lane;
    float g = 0.f;
    if (key >= lo && key < hi) {
      float qk = 0.f, dp = 0.f, dcap = 1.f;
      for (int x = 0; x < dqk; ++x) qk += qs[x] * Ks[lane * ks_stride + x];
      for (int x = 0; x < dv; ++x) dp += dos[x] * Vs[lane * vs_stride + x];
      const float s = SimpleScoreOf(p, qk, b, h, i, key, seq.len_q, seq.len_kv, &dcap);
      const float prob = expf(s - lse);
      if (p.dropout) dp = drop.Keep(key) ? dp * p.keep_scale : 0.f;
      g = prob * (dp - delta) * dcap * p.scale;
    }
    gs[lane] = g;
    __syncwarp();
    for (int x = lane; x < dqk; x += 32) {
      float a = dqs[x];
      for (int r = 0; r < n; ++r) a += gs[r] * Ks[r * ks_stride + x];
      dqs[x] = a;
    }
    __syncwarp();
  }
  const int64_t rows_out = p.thd ? seq.len_q : p.max_seqlen_q;
  if (i < rows_out)
    for (int x = lane; x < dqk; x += 32)
      StoreElem(p.dq.data, p.qkv_dtype, Offset(p.dq, b, h, seq.start_q, i, x), dqs[x]);
}

// dK and dV (and dbias per p.dbias_mode): one warp per key row of kv head hk, summing over the
// group's query heads and the query rows that see the block's keys, in a fixed order.
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    SimpleDkdvKernel(const FlashParams p, int key_tiles) {
  extern __shared__ float smem[];
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int qs_stride = OddStride(dqk), dos_stride = OddStride(dv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* Qs = smem;
  float* dOs = Qs + kChunk * qs_stride;
  float* lse_s = dOs + kChunk * dos_stride;
  float* delta_s = lse_s + kChunk;
  float* ks = delta_s + kChunk + warp * (2 * dqk + 2 * dv + 2 * kChunk);
  float* vs = ks + dqk;
  float* dks = vs + dv;
  float* dvs = dks + dqk;
  float* ps = dvs + dv;
  float* gs = ps + kChunk;

  const TileIndex tile = DecomposeBlock(blockIdx.x, key_tiles, p.heads_kv);
  const int b = tile.b, hk = tile.h;
  const SeqInfo seq = LoadSeq(p, b);
  const int64_t key0 = int64_t{tile.tile} * kRowsPerBlock;
  const int64_t j = key0 + warp;
  const bool key_valid = j < seq.len_kv;
  for (int x = lane; x < dqk; x += 32) {
    ks[x] = key_valid ? LoadElem(p.k.data, p.qkv_dtype, Offset(p.k, b, hk, seq.start_kv, j, x))
                      : 0.f;
    dks[x] = 0.f;
  }
  for (int x = lane; x < dv; x += 32) {
    vs[x] = key_valid ? LoadElem(p.v.data, p.qkv_dtype, Offset(p.v, b, hk, seq.start_kv, j, x))
                      : 0.f;
    dvs[x] = 0.f;
  }
  int first, last;
  RowsSeeingKeys(p, key0, key0 + kRowsPerBlock, seq.len_q, seq.len_kv, &first, &last);

  for (int hh = 0; hh < p.group; ++hh) {
    const int h = hk * p.group + hh;
    for (int64_t c0 = first; c0 <= last; c0 += kChunk) {
      const int n = static_cast<int>(min(int64_t{kChunk}, last + 1 - c0));
      __syncthreads();
      StageRows(p.q, p.qkv_dtype, b, h, seq.start_q, c0, n, dqk, Qs, qs_stride);
      StageRows(p.d_o, p.o_dtype, b, h, seq.start_q, c0, n, dv, dOs, dos_stride);
      for (int r = threadIdx.x; r < kChunk; r += blockDim.x) {
        lse_s[r] = r < n ? BackwardLse(p, b, h, seq, c0 + r) : INFINITY;
        delta_s[r] = r < n ? p.delta[RowIndex(p, b, h, c0 + r)] : 0.f;
      }
      __syncthreads();
      if (!key_valid) continue;
      const int64_t i = c0 + lane;
      int lo = 0, hi = 0;
      if (lane < n) VisibleKeys(p, i, seq.len_q, seq.len_kv, &lo, &hi);
      const float lse = lse_s[lane];
      float pk = 0.f, g = 0.f;
      if (j >= lo && j < hi && lse != INFINITY) {
        float qk = 0.f, dp = 0.f, dcap = 1.f;
        for (int x = 0; x < dqk; ++x) qk += Qs[lane * qs_stride + x] * ks[x];
        for (int x = 0; x < dv; ++x) dp += dOs[lane * dos_stride + x] * vs[x];
        const float s = SimpleScoreOf(p, qk, b, h, i, j, seq.len_q, seq.len_kv, &dcap);
        const float prob = expf(s - lse);
        float keep = 1.f;
        if (p.dropout) keep = DropoutRowOf(p, b, h, i).Keep(j) ? p.keep_scale : 0.f;
        pk = prob * keep;
        const float ds = prob * (dp * keep - delta_s[lane]);
        g = ds * dcap * p.scale;
        if (p.dbias_mode != kDbiasNone)
          WriteDbias(p, b, h, i, j, p.bias_type == FUSEDATTN_BIAS_PRE_SCALE ? g : ds);
      }
      ps[lane] = pk;
      gs[lane] = g;
      __syncwarp();
      for (int x = lane; x < dv; x += 32) {
        float a = dvs[x];
        for (int r = 0; r < n; ++r) a += ps[r] * dOs[r * dos_stride + x];
        dvs[x] = a;
      }
      for (int x = lane; x < dqk; x += 32) {
        float a = dks[x];
        for (int r = 0; r < n; ++r) a += gs[r] * Qs[r * qs_stride + x];
        dks[x] = a;
      }
      __syncwarp();
    }
  }
  const int64_t rows_out = p.thd ? seq.len_kv : p.max_seqlen_kv;
  if (j < rows_out) {
    for (int x = lane; x < dqk; x += 32)
      StoreElem(p.dk.data, p.qkv_dtype, Offset(p.dk, b, hk, seq.start_kv, j, x), dks[x]);
    for (int x = lane; x < dv; x += 32)
      StoreElem(p.dv.data, p.qkv_dtype, Offset(p.dv, b, hk, seq.start_kv, j, x), dvs[x]);
  }
}

// dbias summed over its broadcast axes in a fixed order: one warp per dbias row (bb, bh, i),
// lanes over keys; recomputes q.k and dO.v for every (b, h) summed.
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    ReduceDbiasKernel(const FlashParams p, int64_t rows, int bias_batch, int bias_heads) {
  extern __shared__ float smem[];
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* qs = smem + warp * (dqk + dv);
  float* dos = qs + dqk;
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + warp;
  if (row >= rows) return;  // no block-wide barrier below
  const int64_t i = row % p.max_seqlen_q;
  const int bh = static_cast<int>((row / p.max_seqlen_q) % bias_heads);
  const int bb = static_cast<int>(row / p.max_seqlen_q / bias_heads);
  const int b_begin = bias_batch == 1 ? 0 : bb, b_end = bias_batch == 1 ? p.batch : bb + 1;
  const int h_begin = bias_heads == 1 ? 0 : bh, h_end = bias_heads == 1 ? p.heads_q : bh + 1;

  for (int64_t j0 = 0; j0 < p.max_seqlen_kv; j0 += 32) {
    const int64_t j = j0 + lane;
    float sum = 0.f;
    for (int b = b_begin; b < b_end; ++b) {
      const SeqInfo seq = LoadSeq(p, b);
      if (i >= seq.len_q) continue;
      int lo, hi;
      VisibleKeys(p, i, seq.len_q, seq.len_kv, &lo, &hi);
      for (int h = h_begin; h < h_end; ++h) {
        const float lse = BackwardLse(p, b, h, seq, i);
        if (lse == INFINITY) continue;  // warp-uniform
        const int hk = h / p.group;
        __syncwarp();
        for (int x = lane; x < dqk; x += 32)
          qs[x] = LoadElem(p.q.data, p.qkv_dtype, Offset(p.q, b, h, seq.start_q, i, x));
        for (int x = lane; x < dv; x += 32)
          dos[x] = LoadElem(p.d_o.data, p.o_dtype, Offset(p.d_o, b, h, seq.start_q, i, x));
        __syncwarp();
        if (j < lo || j >= hi) continue;
        float qk = 0.f, dp = 0.f, dcap = 1.f;
        for (int x = 0; x < dqk; ++x)
          qk += qs[x] * LoadElem(p.k.data, p.qkv_dtype, Offset(p.k, b, hk, seq.start_kv, j, x));
        for (int x = 0; x < dv; ++x)
          dp += dos[x] * LoadElem(p.v.data, p.qkv_dtype, Offset(p.v, b, hk, seq.start_kv, j, x));
        const float s = SimpleScoreOf(p, qk, b, h, i, j, seq.len_q, seq.len_kv, &dcap);
        const float prob = expf(s - lse);
        if (p.dropout) dp = DropoutRowOf(p, b, h, i).Keep(j) ? dp * p.keep_scale : 0.f;
        const float ds = prob * (dp - p.delta[RowIndex(p, b, h, i)]);
        sum += p.bias_type == FUSEDATTN_BIAS_PRE_SCALE ? ds * dcap * p.scale : ds;
      }
    }
    if (j < p.max_seqlen_kv) StoreElem(p.dbias.data, p.dbias.dtype, DbiasOffset(p, bb, bh, i, j), sum);
  }
}

__global__ void __launch_bounds__(256) ReduceDsinkKernel(const FlashParams p) {
  __shared__ float partial[256];
  const int h = blockIdx.x;
  const int64_t rows = int64_t{p.batch} * p.max_seqlen_q;
  float sum = 0.f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int b = static_cast<int>(r / p.max_seqlen_q);
    sum += p.sink_partial[RowIndex(p, b, h, r % p.max_seqlen_q)];
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int width = blockDim.x / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) p.dsink[h * p.dsink_stride] = partial[0];
}

__global__ void FillMaxLogitKernel(const FlashParams p) {
  for (int h = blockIdx.x * blockDim.x + threadIdx.x; h < p.heads_q; h += gridDim.x * blockDim.x)
    p.max_logit[h * p.max_logit_stride] = -INFINITY;
}

__global__ void __launch_bounds__(256)
    ZeroDbiasKernel(const FlashParams p, int64_t elements, int bias_heads) {
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < elements;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = e % p.max_seqlen_kv;
    const int64_t i = (e / p.max_seqlen_kv) % p.max_seqlen_q;
    const int64_t plane = e / p.max_seqlen_kv / p.max_seqlen_q;
    const int h = static_cast<int>(plane % bias_heads);
    const int b = static_cast<int>(plane / bias_heads);
    StoreElem(p.dbias.data, p.dbias.dtype, DbiasOffset(p, b, h, i, j), 0.f);
  }
}

unsigned ElementwiseBlocks(int64_t elements) {
  return static_cast<unsigned>(std::min<int64_t>(CeilDiv(elements, 256), 65536));
}

}  // namespace

size_t SimpleSharedBytes(int dqk, int dv) {
  size_t floats = std::max({ForwardSmemFloats(dqk, dv), DqSmemFloats(dqk, dv),
                            DkdvSmemFloats(dqk, dv), ReduceDbiasSmemFloats(dqk, dv)});
  return floats * sizeof(float);
}

size_t SimpleSharedLimit() {
  int device = 0, bytes = 48 * 1024;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
          cudaSuccess)
    return static_cast<size_t>(bytes);
  cudaGetLastError();
  return 48 * 1024;
}

Status ProbeKernelImage() {
  cudaFuncAttributes attributes;
  cudaError_t err = cudaFuncGetAttributes(&attributes, FillMaxLogitKernel);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return NotSupported("%s", NoKernelForDeviceReason(cudaGetErrorString(err)).c_str());
  }
  return Status::Ok();
}

Status LaunchSimpleForward(const FlashParams& p, cudaStream_t stream) {
  const int row_tiles = static_cast<int>(CeilDiv(p.max_seqlen_q, kRowsPerBlock));
  const int64_t blocks = int64_t{row_tiles} * p.heads_q * p.batch;
  FUSEDATTN_RETURN_IF_ERROR(CheckBlocks(blocks, "the simple forward"));
  const size_t smem = ForwardSmemFloats(p.head_dim_qk, p.head_dim_v) * sizeof(float);
  FUSEDATTN_RETURN_IF_ERROR(SetSmem(reinterpret_cast<const void*>(SimpleForwardKernel), smem));
  SimpleForwardKernel<<<static_cast<unsigned>(blocks), kRowsPerBlock * 32, smem, stream>>>(
      p, row_tiles);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status LaunchSimpleBackward(const FlashParams& p, cudaStream_t stream) {
  const int row_tiles = static_cast<int>(CeilDiv(p.max_seqlen_q, kRowsPerBlock));
  const int64_t dq_blocks = int64_t{row_tiles} * p.heads_q * p.batch;
  FUSEDATTN_RETURN_IF_ERROR(CheckBlocks(dq_blocks, "the simple dQ kernel"));
  const size_t dq_smem = DqSmemFloats(p.head_dim_qk, p.head_dim_v) * sizeof(float);
  FUSEDATTN_RETURN_IF_ERROR(SetSmem(reinterpret_cast<const void*>(SimpleDqKernel), dq_smem));
  SimpleDqKernel<<<static_cast<unsigned>(dq_blocks), kRowsPerBlock * 32, dq_smem, stream>>>(
      p, row_tiles);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());

  const int key_tiles = static_cast<int>(CeilDiv(p.max_seqlen_kv, kRowsPerBlock));
  const int64_t kv_blocks = int64_t{key_tiles} * p.heads_kv * p.batch;
  FUSEDATTN_RETURN_IF_ERROR(CheckBlocks(kv_blocks, "the simple dK/dV kernel"));
  const size_t kv_smem = DkdvSmemFloats(p.head_dim_qk, p.head_dim_v) * sizeof(float);
  FUSEDATTN_RETURN_IF_ERROR(SetSmem(reinterpret_cast<const void*>(SimpleDkdvKernel), kv_smem));
  SimpleDkdvKernel<<<static_cast<unsigned>(kv_blocks), kRowsPerBlock * 32, kv_smem, stream>>>(
      p, key_tiles);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status LaunchFillMaxLogit(const FlashParams& p, cudaStream_t stream) {
  FillMaxLogitKernel<<<ElementwiseBlocks(p.heads_q), 256, 0, stream>>>(p);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status LaunchZeroDbias(const FlashParams& p, cudaStream_t stream) {
  const int bias_batch = p.dbias.stride_b == 0 ? 1 : p.batch;
  const int bias_heads = p.dbias.stride_h == 0 ? 1 : p.heads_q;
  const int64_t elements =
      int64_t{bias_batch} * bias_heads * p.max_seqlen_q * int64_t{p.max_seqlen_kv};
  ZeroDbiasKernel<<<ElementwiseBlocks(elements), 256, 0, stream>>>(p, elements, bias_heads);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

// Whether every row of `t` (cols 16-bit elements, head-dim stride 1) is a run of 16-byte
// vectors: aligned base and strides.
bool VectorRows(const TensorArg& t, int cols) {
  const auto aligned = [](int64_t elements) { return elements % 8 == 0; };
  return t.stride_d == 1 && cols % 8 == 0 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 &&
         aligned(t.stride_b) && aligned(t.stride_h) && aligned(t.stride_s);
}

bool SixteenBit(fusedattn_dtype dtype) {
  return dtype == FUSEDATTN_DTYPE_BFLOAT16 || dtype == FUSEDATTN_DTYPE_FLOAT16;
}

// Whether the dQ workspace's rows are runs of float4.
bool AccumVectors(const FlashParams& p) {
  return p.dq_accum_dim % 4 == 0 && reinterpret_cast<uintptr_t>(p.dq_accum) % 16 == 0;
}

template <int kLanes, bool kVector>
Status LaunchPreprocess(const FlashParams& p, int64_t rows, cudaStream_t stream) {
  const int64_t blocks = CeilDiv(rows * kLanes, 256);
  FUSEDATTN_RETURN_IF_ERROR(CheckBlocks(blocks, "the backward preprocess"));
  PreprocessKernel<kLanes, kVector><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, rows);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status LaunchBackwardPreprocess(const FlashParams& p, cudaStream_t stream) {
  const int64_t rows = int64_t{p.batch} * p.heads_q * p.max_seqlen_q;
  if (SixteenBit(p.o_dtype) && (p.dq_accum == nullptr || AccumVectors(p)) &&
      VectorRows(p.o, p.head_dim_v) && VectorRows(p.d_o, p.head_dim_v)) {
    switch (p.head_dim_v) {
      case 64: return LaunchPreprocess<8, true>(p, rows, stream);
      case 128: return LaunchPreprocess<16, true>(p, rows, stream);
      case 256: return LaunchPreprocess<32, true>(p, rows, stream);
      default: break;  // element loads below
    }
  }
  return LaunchPreprocess<32, false>(p, rows, stream);
}

Status LaunchReduceDsink(const FlashParams& p, cudaStream_t stream) {
  ReduceDsinkKernel<<<static_cast<unsigned>(p.heads_q), 256, 0, stream>>>(p);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status LaunchReduceDbias(const FlashParams& p, cudaStream_t stream) {
  const int bias_batch = p.dbias.stride_b == 0 ? 1 : p.batch;
  const int bias_heads = p.dbias.stride_h == 0 ? 1 : p.heads_q;
  const int64_t rows = int64_t{bias_batch} * bias_heads * p.max_seqlen_q;
  const int64_t blocks = CeilDiv(rows, kRowsPerBlock);
  FUSEDATTN_RETURN_IF_ERROR(CheckBlocks(blocks, "the dbias reduction"));
  const size_t smem = ReduceDbiasSmemFloats(p.head_dim_qk, p.head_dim_v) * sizeof(float);
  FUSEDATTN_RETURN_IF_ERROR(SetSmem(reinterpret_cast<const void*>(ReduceDbiasKernel), smem));
  ReduceDbiasKernel<<<static_cast<unsigned>(blocks), kRowsPerBlock * 32, smem, stream>>>(
      p, rows, bias_batch, bias_heads);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

Status LaunchConvertDq(const FlashParams& p, cudaStream_t stream) {
  const int64_t elements =
      int64_t{p.batch} * p.heads_q * p.max_seqlen_q * int64_t{p.head_dim_qk};
  if (SixteenBit(p.qkv_dtype) && VectorRows(p.dq, p.head_dim_qk) && AccumVectors(p))
    ConvertDqKernel<8><<<ElementwiseBlocks(elements / 8), 256, 0, stream>>>(p, elements / 8);
  else
    ConvertDqKernel<1><<<ElementwiseBlocks(elements), 256, 0, stream>>>(p, elements);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

// A score_mod tensor's gradient from its float32 sum (dense [E_b, E_h, E_q, E_kv], jit.h): element
// (b, h, i, j) of `out` (dtype, strides) = sum[((b * E_h + h) * E_q + i) * E_kv + j].
__global__ void ConvertFlexGradKernel(const float* sum, FlexTensorArg out, fusedattn_dtype dtype,
                                      int64_t e_h, int64_t e_q, int64_t e_kv, int64_t elements) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < elements;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = e % e_kv, i = (e / e_kv) % e_q, h = (e / (e_kv * e_q)) % e_h,
                  b = e / (e_kv * e_q * e_h);
    StoreElem(const_cast<void*>(out.data), dtype,
              b * out.stride_b + h * out.stride_h + i * out.stride_q + j * out.stride_kv, sum[e]);
  }
}

Status LaunchConvertFlexGrad(const float* sum, const int64_t extents[4], const FlexTensorArg& out,
                             fusedattn_dtype dtype, cudaStream_t stream) {
  const int64_t elements = extents[0] * extents[1] * extents[2] * extents[3];
  if (elements == 0) return Status::Ok();
  ConvertFlexGradKernel<<<ElementwiseBlocks(elements), 256, 0, stream>>>(
      sum, out, dtype, extents[1], extents[2], extents[3], elements);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace fusedattn::flash
