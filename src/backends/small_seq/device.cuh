// Device helpers of the small_seq kernels: how a warp lays a row over its lanes, typed loads and
// stores (16-byte vectors where the tensor allows, element by element otherwise), the sequence of
// a batch entry (clamped), its visible keys, the score pipeline and the dropout factors.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/small_seq/small_seq.h"
#include "common/band.h"
#include "common/philox.h"

namespace fusedattn::small_seq {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

// ------------------------------------------------------------------------------------------------
// Row layout. A row of kDim elements is cut into 16-byte vectors. kLanesPerRow lanes cover one
// row (consecutive lanes take consecutive vectors, so a warp's access is coalesced), each taking
// kVecsPerLane vectors kLanesPerRow apart. When a row has fewer than 32 vectors the warp holds
// kRowGroups rows at once: lane group g (lanes g * kLanesPerRow ...) works on key g of each step.
// ------------------------------------------------------------------------------------------------
template <typename T, int kDim>
struct RowLayout {
  static constexpr int kVecElems = 16 / static_cast<int>(sizeof(T));
  static constexpr int kVecsPerRow = kDim / kVecElems;
  static constexpr int kLanesPerRow = kVecsPerRow < 32 ? kVecsPerRow : 32;
  static constexpr int kRowGroups = 32 / kLanesPerRow;
  static constexpr int kVecsPerLane = kVecsPerRow / kLanesPerRow;
  static_assert(kDim % kVecElems == 0, "head dim must be a multiple of a 16-byte vector");
  static_assert((kLanesPerRow & (kLanesPerRow - 1)) == 0, "lanes per row must be a power of 2");
  static_assert(kVecsPerRow % kLanesPerRow == 0, "vectors must spread evenly over the lanes");

  __device__ __forceinline__ static int group(int lane) { return lane / kLanesPerRow; }
  // First column of this lane's c-th vector.
  __device__ __forceinline__ static int column(int lane, int c) {
    return (lane % kLanesPerRow + c * kLanesPerRow) * kVecElems;
  }
};

// Teams. The forward and backward give each (sequence, query head) row to one team of
// kLanes = kLanesPerRow lanes, and a warp holds kPerWarp = 32 / kLanes teams: at d = 128 in 16-bit
// a warp serves two rows, at d >= 256 one. A row's work is tiny (a few hundred bytes at
// skv = 2), so a warp's fixed costs (indices, the softmax tail, the stores) are shared by as many
// rows as its lanes can cover; teams never exchange data, so their lengths may differ.
// q.k and v rows must spread over the same number of lanes (equal head dims do).
template <typename T, int kDimQk, int kDimV>
struct Team {
  using Qk = RowLayout<T, kDimQk>;
  using V = RowLayout<T, kDimV>;
  static_assert(Qk::kLanesPerRow == V::kLanesPerRow,
                "a team covers its q.k and v rows with the same lanes");
  static constexpr int kLanes = Qk::kLanesPerRow;
  static constexpr int kPerWarp = 32 / kLanes;
  __host__ __device__ static constexpr int64_t WarpsFor(int64_t rows) {
    return (rows + kPerWarp - 1) / kPerWarp;
  }
  // The warps of a forward whose teams run rows_per_team rows each.
  __host__ __device__ static constexpr int64_t ForwardWarpsFor(int64_t rows, int rows_per_team) {
    const int64_t rows_per_warp = int64_t{kPerWarp} * rows_per_team;
    return (rows + rows_per_warp - 1) / rows_per_warp;
  }
};

// The forward's teams run several rows one after another (forward.cuh): a warp's fixed costs
// (indices, the softmax tail, the stores) then overlap the loads of its next row instead of
// leaving the SM without loads in flight, and a grid of fewer, longer-lived blocks has fewer
// block launches. Worth it where rows are small; long-lived warps cost a longer tail when the
// grid drains, so a warp runs about kForwardBytesPerWarp of q, K, V and O at most, at most
// kForwardRowsPerTeam rows per team, and only while the grid keeps kWarpsToFillGpu warps.
constexpr int kForwardRowsPerTeam = 4;
constexpr int64_t kForwardBytesPerWarp = 20 * 1024;
// Warps that fill the largest GPU twice over (an H100 SXM holds 132 x 64 resident warps).
constexpr int64_t kWarpsToFillGpu = 16384;
// Rows per team for a problem whose teams would need `warps_one_row_each` warps running one row
// each, where one step of a warp (a row per team) moves `bytes_per_step` bytes: 1 to
// kForwardRowsPerTeam.
__host__ __device__ constexpr int ForwardRowsPerTeam(int64_t warps_one_row_each,
                                                     int64_t bytes_per_step) {
  int64_t rows_per_team = warps_one_row_each / kWarpsToFillGpu;
  const int64_t by_bytes = kForwardBytesPerWarp / (bytes_per_step > 0 ? bytes_per_step : 1);
  if (by_bytes < rows_per_team) rows_per_team = by_bytes;
  return rows_per_team < 1 ? 1
         : rows_per_team > kForwardRowsPerTeam ? kForwardRowsPerTeam
                                               : static_cast<int>(rows_per_team);
}

// The largest value over the warp's teams (every lane gets it): lanes kLanes apart are the other
// teams' lanes at the same position.
template <int kLanes>
__device__ __forceinline__ float MaxOverTeams(float x) {
#pragma unroll
  for (int offset = kLanes; offset < 32; offset *= 2)
    x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}

// Keys per chunk of a team (forward and backward): the keys whose K and V rows a team holds in
// registers at once. Each lane holds at most kChunkVectors 16-byte vectors of K and as many of V.
// The bytes a warp has in flight cost registers, so the bytes in flight per SM are about the same
// for any chunk size; small chunks waste fewer registers on short sequences (skv = 2 leaves most
// of a large chunk empty) and let more warps reside.
constexpr int kChunkVectors = 2;
template <typename T, int kDimQk, int kDimV>
__host__ __device__ constexpr int ChunkKeys() {
  using Qk = RowLayout<T, kDimQk>;
  using V = RowLayout<T, kDimV>;
  int keys_qk = kChunkVectors / Qk::kVecsPerLane;
  int keys_v = kChunkVectors / V::kVecsPerLane;
  int keys = keys_qk < keys_v ? keys_qk : keys_v;
  return keys < 1 ? 1 : keys;
}

// Keys per chunk of GroupSumKernel, whose row groups split the keys of one (sequence, kv head):
// kChunkVectors vectors of dK and of dV per lane.
template <typename T, int kDimQk, int kDimV>
__host__ __device__ constexpr int GroupSumChunkKeys() {
  using Qk = RowLayout<T, kDimQk>;
  using V = RowLayout<T, kDimV>;
  int keys_qk = kChunkVectors * Qk::kRowGroups / Qk::kVecsPerLane;
  int keys_v = kChunkVectors * V::kRowGroups / V::kVecsPerLane;
  int keys = keys_qk < keys_v ? keys_qk : keys_v;
  if (keys > kMaxSeqlenKv) keys = static_cast<int>(kMaxSeqlenKv);
  int at_least = Qk::kRowGroups > V::kRowGroups ? Qk::kRowGroups : V::kRowGroups;
  return keys < at_least ? at_least : keys;
}

// Blocks per SM that each kernel asks the compiler to fit (the minimum of __launch_bounds__): the
// largest count whose register cap, 65536 / (kThreadsPerBlock * blocks) rounded down to 8, ptxas
// met without spilling (nvcc -Xptxas -v on sm_90a, CUDA 13.0, kChunkVectors = 2; the backward and
// group sum after the team kernels, the forward after its row pipeline: 16-bit at every head dim
// and float32 up to d = 256 at 4 blocks, 114-128 registers, 5 spills; float32 d = 512 at 3, 168
// registers). More resident warps keep more loads in flight. Redo the sweep when the kernels
// change.
enum class KernelKind { kForward, kBackward, kGroupSum };
template <KernelKind kKind, typename T, int kDim>
__host__ __device__ constexpr int MinBlocksPerSm() {
  constexpr bool k16Bit = sizeof(T) == 2;
  switch (kKind) {
    case KernelKind::kForward:
      // The pipelined forward holds two chunks and two rows (forward.cuh): fewer warps, each
      // with twice the loads in flight.
      return !k16Bit && kDim == 512 ? 3 : 4;
    case KernelKind::kBackward:
      if (k16Bit) return kDim == 128 ? 5 : 4;
      return kDim == 512 ? 3 : kDim == 256 ? 5 : 6;
    case KernelKind::kGroupSum:
      if (k16Bit) return kDim == 512 ? 4 : 5;
      return kDim == 512 ? 4 : kDim == 256 ? 6 : 7;
  }
  return 1;
}

// Sum over the kLanes lanes of a row group (every lane of the group gets the sum).
template <int kLanes>
__device__ __forceinline__ float GroupSum(float x) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

// ------------------------------------------------------------------------------------------------
// Element types.
// ------------------------------------------------------------------------------------------------
template <typename S>
struct Storage;

template <>
struct Storage<float> {
  static constexpr int kPerWord = 1;
  __device__ __forceinline__ static float Load(const float* p) { return __ldg(p); }
  __device__ __forceinline__ static void Store(float* p, float x) { *p = x; }
  __device__ __forceinline__ static uint32_t LoadBits(const float* p) {
    return __float_as_uint(__ldg(p));
  }
  __device__ __forceinline__ static void UnpackWord(uint32_t w, float* out) {
    out[0] = __uint_as_float(w);
  }
  __device__ __forceinline__ static uint32_t PackWord(const float* in) {
    return __float_as_uint(in[0]);
  }
};

template <>
struct Storage<__half> {
  static constexpr int kPerWord = 2;
  __device__ __forceinline__ static float Load(const __half* p) {
    return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(p))));
  }
  __device__ __forceinline__ static void Store(__half* p, float x) { *p = __float2half_rn(x); }
  __device__ __forceinline__ static uint32_t LoadBits(const __half* p) {
    return __ldg(reinterpret_cast<const unsigned short*>(p));
  }
  __device__ __forceinline__ static void UnpackWord(uint32_t w, float* out) {
    out[0] = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xFFFFu)));
    out[1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
  __device__ __forceinline__ static uint32_t PackWord(const float* in) {
    uint32_t lo = __half_as_ushort(__float2half_rn(in[0]));
    uint32_t hi = __half_as_ushort(__float2half_rn(in[1]));
    return lo | (hi << 16);
  }
};

template <>
struct Storage<__nv_bfloat16> {
  static constexpr int kPerWord = 2;
  __device__ __forceinline__ static float Load(const __nv_bfloat16* p) {
    return __uint_as_float(static_cast<uint32_t>(__ldg(reinterpret_cast<const unsigned short*>(p)))
                           << 16);
  }
  __device__ __forceinline__ static void Store(__nv_bfloat16* p, float x) {
    *p = __float2bfloat16_rn(x);
  }
  __device__ __forceinline__ static uint32_t LoadBits(const __nv_bfloat16* p) {
    return __ldg(reinterpret_cast<const unsigned short*>(p));
  }
  __device__ __forceinline__ static void UnpackWord(uint32_t w, float* out) {
    out[0] = __uint_as_float(w << 16);
    out[1] = __uint_as_float(w & 0xFFFF0000u);
  }
  __device__ __forceinline__ static uint32_t PackWord(const float* in) {
    uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(in[0]));
    uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(in[1]));
    return lo | (hi << 16);
  }
};

// ------------------------------------------------------------------------------------------------
// Loads and stores of N consecutive elements (a chunk) of the row at `row`, from its element
// `column`.
// Vectorized: N * sizeof(S) bytes in 16-byte (or one 8-byte) accesses, which the host has checked
// to be aligned. Otherwise one element at a time, stride_d apart (any stride, also 0).
// ------------------------------------------------------------------------------------------------
template <typename S, int N>
__device__ __forceinline__ void LoadFloats(const S* row, int column, int64_t stride_d,
                                           bool vectorized, float* out) {
  constexpr int kBytes = N * static_cast<int>(sizeof(S));
  constexpr int kWords = kBytes / 4;
  constexpr int kPerWord = Storage<S>::kPerWord;
  if (vectorized) {
    uint32_t words[kWords];
    const S* address = row + column;
    if constexpr (kBytes % 16 == 0) {
#pragma unroll
      for (int piece = 0; piece < kBytes / 16; ++piece) {
        uint4 raw = __ldg(reinterpret_cast<const uint4*>(address) + piece);
        words[4 * piece + 0] = raw.x;
        words[4 * piece + 1] = raw.y;
        words[4 * piece + 2] = raw.z;
        words[4 * piece + 3] = raw.w;
      }
    } else {
      static_assert(kBytes == 8, "chunks are 8, 16 or 32 bytes");
      uint2 raw = __ldg(reinterpret_cast<const uint2*>(address));
      words[0] = raw.x;
      words[1] = raw.y;
    }
#pragma unroll
    for (int w = 0; w < kWords; ++w) Storage<S>::UnpackWord(words[w], out + w * kPerWord);
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) out[e] = Storage<S>::Load(row + (column + e) * stride_d);
  }
}

template <typename S, int N>
__device__ __forceinline__ void StoreFloats(S* row, int column, int64_t stride_d,
                                            bool vectorized, const float* in) {
  constexpr int kBytes = N * static_cast<int>(sizeof(S));
  constexpr int kWords = kBytes / 4;
  constexpr int kPerWord = Storage<S>::kPerWord;
  if (vectorized) {
    uint32_t words[kWords];
#pragma unroll
    for (int w = 0; w < kWords; ++w) words[w] = Storage<S>::PackWord(in + w * kPerWord);
    // __stwb: an explicit vector store (plain assignments through a cast pointer were split
    // into 4-byte stores by the compiler).
    S* address = row + column;
    if constexpr (kBytes % 16 == 0) {
#pragma unroll
      for (int piece = 0; piece < kBytes / 16; ++piece)
        __stwb(reinterpret_cast<uint4*>(address) + piece,
               make_uint4(words[4 * piece], words[4 * piece + 1], words[4 * piece + 2],
                          words[4 * piece + 3]));
    } else {
      static_assert(kBytes == 8, "chunks are 8, 16 or 32 bytes");
      __stwb(reinterpret_cast<uint2*>(address), make_uint2(words[0], words[1]));
    }
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) Storage<S>::Store(row + (column + e) * stride_d, in[e]);
  }
}

// The same for a tensor whose dtype is known at run time only (O and dO follow o_dtype): the row
// starts `row_offset` elements into `data`.
template <int N>
__device__ __forceinline__ void LoadFloatsOfDtype(const void* data, int dtype, int64_t row_offset,
                                                  int column, int64_t stride_d, bool vectorized,
                                                  float* out) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT16:
      LoadFloats<__half, N>(static_cast<const __half*>(data) + row_offset, column, stride_d,
                            vectorized, out);
      break;
    case FUSEDATTN_DTYPE_BFLOAT16:
      LoadFloats<__nv_bfloat16, N>(static_cast<const __nv_bfloat16*>(data) + row_offset, column,
                                   stride_d, vectorized, out);
      break;
    default:
      LoadFloats<float, N>(static_cast<const float*>(data) + row_offset, column, stride_d,
                           vectorized, out);
      break;
  }
}

template <int N>
__device__ __forceinline__ void StoreFloatsOfDtype(void* data, int dtype, int64_t row_offset,
                                                   int column, int64_t stride_d, bool vectorized,
                                                   const float* in) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT16:
      StoreFloats<__half, N>(static_cast<__half*>(data) + row_offset, column, stride_d,
                             vectorized, in);
      break;
    case FUSEDATTN_DTYPE_BFLOAT16:
      StoreFloats<__nv_bfloat16, N>(static_cast<__nv_bfloat16*>(data) + row_offset, column,
                                    stride_d, vectorized, in);
      break;
    default:
      StoreFloats<float, N>(static_cast<float*>(data) + row_offset, column, stride_d,
                            vectorized, in);
      break;
  }
}

__device__ __forceinline__ float LoadScalarOfDtype(const void* base, int dtype, int64_t index) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT16: return Storage<__half>::Load(static_cast<const __half*>(base) + index);
    case FUSEDATTN_DTYPE_BFLOAT16:
      return Storage<__nv_bfloat16>::Load(static_cast<const __nv_bfloat16*>(base) + index);
    default: return __ldg(static_cast<const float*>(base) + index);
  }
}

__device__ __forceinline__ void StoreScalarOfDtype(void* base, int dtype, int64_t index,
                                                   float value) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT16:
      Storage<__half>::Store(static_cast<__half*>(base) + index, value);
      break;
    case FUSEDATTN_DTYPE_BFLOAT16:
      Storage<__nv_bfloat16>::Store(static_cast<__nv_bfloat16*>(base) + index, value);
      break;
    default: static_cast<float*>(base)[index] = value; break;
  }
}

// 16 raw bytes (one vector of T) of a K or V row, kept packed in registers until used: the
// elements column .. column + 16 / sizeof(T) - 1 of the row at `row`.
template <typename T>
__device__ __forceinline__ uint4 LoadRawVector(const T* row, int column, int64_t stride_d,
                                               bool vectorized) {
  if (vectorized) return __ldg(reinterpret_cast<const uint4*>(row + column));
  constexpr int kPerWord = Storage<T>::kPerWord;
  const T* first = row + column * stride_d;
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t bits = 0;
#pragma unroll
    for (int part = 0; part < kPerWord; ++part)
      bits |= Storage<T>::LoadBits(first + (i * kPerWord + part) * stride_d) << (16 * part);
    w[i] = bits;
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <typename T>
__device__ __forceinline__ void UnpackVector(const uint4& raw, float* out) {
  constexpr int kPerWord = Storage<T>::kPerWord;
  Storage<T>::UnpackWord(raw.x, out + 0 * kPerWord);
  Storage<T>::UnpackWord(raw.y, out + 1 * kPerWord);
  Storage<T>::UnpackWord(raw.z, out + 2 * kPerWord);
  Storage<T>::UnpackWord(raw.w, out + 3 * kPerWord);
}

// Element offset of row (b, h, token) of a tensor (token = the sequence's start + position).
__device__ __forceinline__ int64_t RowOffset(const KernelTensor& t, int64_t b, int64_t h,
                                             int64_t token) {
  return b * t.stride_b + token * t.stride_s + h * t.stride_h;
}

// ------------------------------------------------------------------------------------------------
// Sequences and masks.
// ------------------------------------------------------------------------------------------------
struct Sequence {
  int64_t len_q, len_kv;      // the sequence's own lengths, clamped to [0, max_seqlen]
  int64_t start_q, start_kv;  // THD token starts, clamped to the tensors (0 otherwise)
};

__device__ __forceinline__ int64_t Clamp(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// Lengths beyond max_seqlen or past the tensor's tokens are clamped: the kernels never address
// outside the tensors, whatever cu_seqlens and seq_offsets hold (fusedattn.h: results for such
// a sequence are undefined).
__device__ __forceinline__ Sequence LoadSequence(const KernelParams& p, int64_t b) {
  Sequence s{p.max_seqlen_q, p.max_seqlen_kv, 0, 0};
  if (!p.padding) return s;
  s.len_q = Clamp(int64_t{__ldg(p.cu_seqlens_q + b + 1)} - __ldg(p.cu_seqlens_q + b), 0,
                  p.max_seqlen_q);
  s.len_kv = Clamp(int64_t{__ldg(p.cu_seqlens_kv + b + 1)} - __ldg(p.cu_seqlens_kv + b), 0,
                   p.max_seqlen_kv);
  if (p.thd) {
    int64_t start_q = p.seq_offsets_q ? __ldg(p.seq_offsets_q + b) : __ldg(p.cu_seqlens_q + b);
    int64_t start_kv =
        p.seq_offsets_kv ? __ldg(p.seq_offsets_kv + b) : __ldg(p.cu_seqlens_kv + b);
    s.start_q = Clamp(start_q, 0, p.q_tokens);
    s.start_kv = Clamp(start_kv, 0, p.kv_tokens);
    if (s.len_q > p.q_tokens - s.start_q) s.len_q = p.q_tokens - s.start_q;
    if (s.len_kv > p.kv_tokens - s.start_kv) s.len_kv = p.kv_tokens - s.start_kv;
  }
  return s;
}

// The visible keys [lo, hi) of the query (position 0): the band of common/band.h at row 0.
__device__ __forceinline__ void VisibleKeys(const KernelParams& p, const Sequence& s,
                                            int64_t* lo, int64_t* hi) {
  MakeBand(p.window_left, p.window_right, p.bottom_right).keys_of_row(0, s.len_q, s.len_kv, lo, hi);
}

// ------------------------------------------------------------------------------------------------
// The score pipeline of fusedattn.h for query position 0 and key j, from qk = q . k and the bias
// element of the key (0 without a bias tensor). With dscore_dt, also d(score)/dt where
// t = scale * (qk + pre_bias) (the softcap's derivative).
// ------------------------------------------------------------------------------------------------
__device__ __forceinline__ float BiasOfKey(const KernelParams& p, int64_t b, int64_t h,
                                           int64_t j) {
  if (p.bias_type != FUSEDATTN_BIAS_PRE_SCALE && p.bias_type != FUSEDATTN_BIAS_POST_SCALE)
    return 0.0f;
  return LoadScalarOfDtype(p.bias.data, p.bias.dtype,
                           b * p.bias.stride_b + h * p.bias.stride_h + j * p.bias.stride_kv);
}

__device__ __forceinline__ float Score(const KernelParams& p, float qk, float bias, int64_t h,
                                       int64_t j, const Sequence& s, float* dscore_dt) {
  float t = p.scale * (p.bias_type == FUSEDATTN_BIAS_PRE_SCALE ? qk + bias : qk);
  float score = t, derivative = 1.0f;
  if (p.softcap > 0.0f) {
    float th = tanhf(t / p.softcap);
    score = p.softcap * th;
    derivative = 1.0f - th * th;
  }
  if (p.bias_type == FUSEDATTN_BIAS_POST_SCALE) score += bias;
  if (p.bias_type == FUSEDATTN_BIAS_ALIBI) {
    float distance = fabsf(static_cast<float>(s.len_kv - s.len_q - j));
    score -= __ldg(p.alibi_slopes + h * p.alibi_stride) * distance;
  }
  if (dscore_dt) *dscore_dt = derivative;
  return score;
}

// The extra logit of the denominator: -inf (vanilla), 0 (off-by-one) or the head's sink.
__device__ __forceinline__ float ExtraLogit(const KernelParams& p, int64_t h) {
  switch (p.softmax_type) {
    case FUSEDATTN_SOFTMAX_OFF_BY_ONE: return 0.0f;
    case FUSEDATTN_SOFTMAX_LEARNABLE_SINK: return __ldg(p.sink_logits + h * p.sink_stride);
    default: return -INFINITY;
  }
}

// Dropout of keys base .. base + kN - 1 of row (b, h) by the Philox rule of fusedattn.h (one
// Philox call per four keys): bit jj is set when key base + jj is kept. All set without dropout.
template <int kN>
__device__ __forceinline__ uint32_t DropoutKeepBits(const KernelParams& p, int64_t b, int64_t h,
                                                    int64_t base) {
  static_assert(kN <= 32, "one bit per key");
  if (!p.dropout) return 0xFFFFFFFFu;
  DropoutRow row = MakeDropoutRow(p.dropout_seed, p.dropout_offset, p.dropout_threshold, b, h,
                                  0, p.heads_q, p.max_seqlen_q);
  uint32_t bits = 0;
  Philox4 words{0, 0, 0, 0};
#pragma unroll
  for (int jj = 0; jj < kN; ++jj) {
    int64_t j = base + jj;
    if (jj == 0 || (j & 3) == 0) words = row.Words(static_cast<uint32_t>(j >> 2));
    int which = static_cast<int>(j & 3);
    uint32_t u = which == 0 ? words.x : which == 1 ? words.y : which == 2 ? words.z : words.w;
    if (u >= p.dropout_threshold) bits |= 1u << jj;
  }
  return bits;
}

// The factor a kept (keep_scale) or dropped (0) key puts on its probability; 1 without dropout.
__device__ __forceinline__ float DropoutFactor(const KernelParams& p, uint32_t keep_bits, int jj) {
  if (!p.dropout) return 1.0f;
  return (keep_bits >> jj) & 1u ? p.dropout_keep_scale : 0.0f;
}

// Maximum of floats by integer atomics: non-negative floats order as signed ints, negative ones
// in reverse as unsigned ints. Exact and order-independent. (-0 is stored as +0.)
__device__ __forceinline__ void AtomicMaxFloat(float* address, float value) {
  if (!(value < 0.0f))
    atomicMax(reinterpret_cast<int*>(address), __float_as_int(fabsf(value)));
  else
    atomicMin(reinterpret_cast<unsigned int*>(address), __float_as_uint(value));
}

}  // namespace fusedattn::small_seq
