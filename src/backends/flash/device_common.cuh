// Device helpers shared by every flash kernel: sequence lengths and starts, the mask as per-row
// key ranges, the score pipeline of fusedattn.h, typed loads/stores, reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#ifndef __CUDACC_RTC__  // NVRTC: built in (jit.cpp gives the rest)
#include <cuda_runtime.h>

#include <cstdint>
#endif

#include "backends/flash/params.h"
#include "common/band.h"
#include "common/philox.h"

namespace fusedattn::flash {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ------------------------------------------------------------------------------------------------
// Sequences
// ------------------------------------------------------------------------------------------------

struct SeqInfo {
  int len_q, len_kv;         // this sequence's lengths, clamped to [0, max_seqlen]
  int64_t start_q, start_kv; // token starts (THD), else 0
};

__device__ __forceinline__ int64_t ClampI64(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// Lengths from cu_seqlens and THD starts from seq_offsets (or cu_seqlens), clamped so that bad
// index tensors can never send a kernel outside the tensors: lengths to [0, max_seqlen], starts
// to [0, tokens] and lengths to the tokens left after the start.
__device__ __forceinline__ SeqInfo LoadSeq(const FlashParams& p, int b) {
  SeqInfo s{p.max_seqlen_q, p.max_seqlen_kv, 0, 0};
  if (!p.padding) return s;
  int64_t lq = int64_t{p.cu_seqlens_q[b + 1]} - p.cu_seqlens_q[b];
  int64_t lkv = int64_t{p.cu_seqlens_kv[b + 1]} - p.cu_seqlens_kv[b];
  lq = ClampI64(lq, 0, p.max_seqlen_q);
  lkv = ClampI64(lkv, 0, p.max_seqlen_kv);
  if (p.thd) {
    int64_t sq = p.seq_offsets_q ? p.seq_offsets_q[b] : p.cu_seqlens_q[b];
    int64_t skv = p.seq_offsets_kv ? p.seq_offsets_kv[b] : p.cu_seqlens_kv[b];
    sq = ClampI64(sq, 0, p.tokens_q);
    skv = ClampI64(skv, 0, p.tokens_kv);
    lq = lq < p.tokens_q - sq ? lq : p.tokens_q - sq;
    lkv = lkv < p.tokens_kv - skv ? lkv : p.tokens_kv - skv;
    s.start_q = sq;
    s.start_kv = skv;
  }
  s.len_q = static_cast<int>(lq);
  s.len_kv = static_cast<int>(lkv);
  return s;
}

// The query side of LoadSeq alone (len_q, start_q; the key side as without per-sequence
// lengths: max_seqlen_kv keys from 0), with the same clamps: for callers that must not read
// cu_seqlens_kv, which paged K/V does not have.
__device__ __forceinline__ SeqInfo LoadQuerySeq(const FlashParams& p, int b) {
  SeqInfo s{p.max_seqlen_q, p.max_seqlen_kv, 0, 0};
  if (!p.padding) return s;
  int64_t lq = int64_t{p.cu_seqlens_q[b + 1]} - p.cu_seqlens_q[b];
  lq = ClampI64(lq, 0, p.max_seqlen_q);
  if (p.thd) {
    int64_t sq = p.seq_offsets_q ? p.seq_offsets_q[b] : p.cu_seqlens_q[b];
    sq = ClampI64(sq, 0, p.tokens_q);
    lq = lq < p.tokens_q - sq ? lq : p.tokens_q - sq;
    s.start_q = sq;
  }
  s.len_q = static_cast<int>(lq);
  return s;
}

// Sequence b of a paged K/V problem (p.paged): the query side as LoadSeq reads it, the keys
// seqlens_kv[b] clamped to [0, max_seqlen_kv], starting at key 0 of the sequence's pages.
__device__ __forceinline__ SeqInfo LoadPagedSeq(const FlashParams& p, int b) {
  SeqInfo s = LoadQuerySeq(p, b);
  s.len_kv = static_cast<int>(ClampI64(p.paged.seqlens_kv[b], 0, p.max_seqlen_kv));
  return s;
}

// Element offset of (b, h, i, x) of a tensor; start is the sequence's token start.
__device__ __forceinline__ int64_t Offset(const TensorArg& t, int b, int h, int64_t start,
                                          int64_t i, int64_t x) {
  return b * t.stride_b + (start + i) * t.stride_s + h * t.stride_h + x * t.stride_d;
}

__device__ __forceinline__ int64_t LseOffset(const LseArg& t, int b, int h, int64_t start_q,
                                             int64_t i) {
  return t.packed ? (start_q + i) * t.stride_s + h * t.stride_h
                  : b * t.stride_b + h * t.stride_h + i * t.stride_s;
}

// ------------------------------------------------------------------------------------------------
// Mask
// ------------------------------------------------------------------------------------------------

// The band of fusedattn.h's mask rule (common/band.h, shared by every backend) is BandOf(p)
// (params.h, with TileFullyVisible); the helpers below are its int-typed forms for the kernels.

// The diagonal's shift: key j = i + shift is on the diagonal of query i.
__device__ __forceinline__ int64_t DiagShift(const FlashParams& p, int len_q, int len_kv) {
  return BandOf(p).shift(len_q, len_kv);
}

// Unclamped key bounds of query i (Band::raw_lo / raw_hi): visible keys are [RawLo(i), RawHi(i))
// intersected with [0, len_kv). Both are non-decreasing in i, so a block of rows sees at most
// [RawLo(first row), RawHi(last row)).
__device__ __forceinline__ int64_t RawLo(const FlashParams& p, int64_t i, int64_t shift) {
  return BandOf(p).raw_lo(i, shift);
}
__device__ __forceinline__ int64_t RawHi(const FlashParams& p, int64_t i, int64_t shift) {
  return BandOf(p).raw_hi(i, shift);
}

// The visible keys [*lo, *hi) of query i (empty when *lo >= *hi), clamped to [0, len_kv].
__device__ __forceinline__ void VisibleKeys(const FlashParams& p, int64_t i, int len_q,
                                            int len_kv, int* lo, int* hi) {
  if (i >= len_q) {
    *lo = *hi = 0;
    return;
  }
  int64_t begin = 0, end = 0;
  BandOf(p).keys_of_row(i, len_q, len_kv, &begin, &end);
  if (begin > len_kv) begin = end = len_kv;
  *lo = static_cast<int>(begin);
  *hi = static_cast<int>(end);
}

// The key tiles [*begin, *end) of block_n keys that the query rows [m0, m0 + block_m) of a
// sequence can see; empty (begin >= end) when those rows see no key.
__device__ __forceinline__ void KeyTilesSeenBy(const FlashParams& p, const SeqInfo& seq, int m0,
                                               int block_m, int block_n, int64_t shift,
                                               int* begin, int* end) {
  *begin = *end = 0;
  if (m0 >= seq.len_q) return;
  const int last_row = min(m0 + block_m, seq.len_q) - 1;
  const int64_t key_lo = ClampI64(RawLo(p, m0, shift), 0, seq.len_kv);
  const int64_t key_hi = ClampI64(RawHi(p, last_row, shift), 0, seq.len_kv);
  if (key_lo >= key_hi) return;
  *begin = static_cast<int>(key_lo / block_n);
  *end = static_cast<int>((key_hi + block_n - 1) / block_n);
}

// The query rows [*first, *last] (empty when first > last) that may see a key in [n_lo, n_hi)
// (a superset: rows inside still need their own check).
__device__ __forceinline__ void RowsSeeingKeys(const FlashParams& p, int64_t n_lo, int64_t n_hi,
                                               int len_q, int len_kv, int* first, int* last) {
  int64_t f = 0, l = -1;
  BandOf(p).rows_seeing_keys(n_lo, n_hi, len_q, len_kv, &f, &l);
  *first = static_cast<int>(f);
  *last = static_cast<int>(l);
}

// ------------------------------------------------------------------------------------------------
// Typed access
// ------------------------------------------------------------------------------------------------

__device__ __forceinline__ float LoadElem(const void* base, fusedattn_dtype dtype, int64_t index) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT16: return __half2float(static_cast<const __half*>(base)[index]);
    case FUSEDATTN_DTYPE_BFLOAT16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
    default: return static_cast<const float*>(base)[index];
  }
}

// x rounded to e4m3 (fusedattn.h's Q8_e4m3: nearest, ties to even, saturated, NaN kept). Only the
// Hopper FP8 forward stores e4m3 (sm_90); on targets below sm_89, which have no cvt to FP8 and run
// no FP8 kernel, any value but 0 becomes NaN (0x7f), so that a stray use shows.
__device__ __forceinline__ unsigned char Fp8E4m3Byte(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short bits;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(bits) : "f"(0.f), "f"(x));
  return static_cast<unsigned char>(bits & 0xffu);
#else
  return x == 0.f ? 0 : 0x7f;
#endif
}

__device__ __forceinline__ void StoreElem(void* base, fusedattn_dtype dtype, int64_t index,
                                          float value) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FP8_E4M3:
      static_cast<unsigned char*>(base)[index] = Fp8E4m3Byte(value);
      break;
    case FUSEDATTN_DTYPE_FLOAT16: static_cast<__half*>(base)[index] = __float2half_rn(value); break;
    case FUSEDATTN_DTYPE_BFLOAT16:
      static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value);
      break;
    default: static_cast<float*>(base)[index] = value; break;
  }
}

// dK = dV = 0 for the keys [n0, n0 + block_n) of sequence b, kv head hk (a key block that no
// query sees; rows past the tensor's rows skipped), by all kThreads threads of the block.
template <int kThreads>
__device__ void ZeroKeyBlockGradients(const FlashParams& p, int b, int hk, const SeqInfo& seq,
                                      int n0, int block_n) {
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int64_t rows_out = p.thd ? seq.len_kv : p.max_seqlen_kv;
  const int rows = min(block_n, p.max_seqlen_kv - n0);
  for (int e = threadIdx.x; e < rows * dqk; e += kThreads)
    if (n0 + e / dqk < rows_out)
      StoreElem(p.dk.data, p.qkv_dtype, Offset(p.dk, b, hk, seq.start_kv, n0 + e / dqk, e % dqk),
                0.f);
  for (int e = threadIdx.x; e < rows * dv; e += kThreads)
    if (n0 + e / dv < rows_out)
      StoreElem(p.dv.data, p.qkv_dtype, Offset(p.dv, b, hk, seq.start_kv, n0 + e / dv, e % dv),
                0.f);
}

// ------------------------------------------------------------------------------------------------
// Score pipeline
// ------------------------------------------------------------------------------------------------

__device__ __forceinline__ float BiasAt(const BiasArg& bias, int b, int h, int64_t i, int64_t j) {
  return LoadElem(bias.data, bias.dtype,
                  b * bias.stride_b + h * bias.stride_h + i * bias.stride_q + j * bias.stride_kv);
}

// Whether the score needs more than attn_scale * q.k (bias, softcap or ALiBi).
__host__ __device__ __forceinline__ bool HasScoreMods(const FlashParams& p) {
  return p.bias_type != FUSEDATTN_BIAS_NONE || p.softcap > 0.f;
}

// Whether the fast path needs its full kernel (score modifiers or dropout): params.h's rule, which
// the planner applies to the config.
__host__ __device__ __forceinline__ bool NeedsFullKernel(const FlashParams& p) {
  return NeedsFullKernel(p.bias_type, p.softcap, p.dropout);
}

// ALiBi (fusedattn.h): s -= slope[h] * |i + len_kv - len_q - j|, i.e. the distance of key j from
// AlibiDiagonal(i), bottom-right aligned whatever the mask. The Hopper forward's softcap-alibi
// instances (fwd_kernel_sm90.cuh) read the same two helpers.
__host__ __device__ __forceinline__ int64_t AlibiDiagonal(int64_t i, int len_q, int len_kv) {
  return i + int64_t{len_kv} - len_q;
}
__device__ __forceinline__ float AlibiSlope(const FlashParams& p, int h) {
  return p.alibi_slopes[h * p.alibi_stride];
}

// tanh for the softcap, with the hardware's approximation (MUFU.TANH: one instruction against
// tanhf's two MUFU operations and a dozen FMAs; FlashAttention's CUDA kernels take the same one).
// The softmax already keeps the MUFU unit busy with an ex2 per score, so tanhf made the softcap
// the bottleneck of the Hopper forward (0.53x its plain variant). Its relative error is at most
// about 2^-11 (PTX ISA, tanh.approx.f32), so a score is within softcap * 2^-11 of fusedattn.h's.
// Every kernel of this folder on float16/bfloat16 inputs (through ScoreOf, the Hopper policy, or
// the simple kernels' SimpleScoreOf) calls this one function, so that a forward's LSE and a
// backward's P agree whichever of them ran; float32 problems, which only the simple kernels run,
// keep tanhf (ScoreOf<true>).
__device__ __forceinline__ float SoftcapTanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The score s of fusedattn.h from qk = q.k, for a query i < len_q and key j < len_kv.
// *dcap receives ds/dt of the softcap (1 without it), t = scale * (qk + pre_bias).
// kExactTanh: tanhf for the softcap instead of SoftcapTanh (float32 problems' accuracy).
template <bool kExactTanh = false>
__device__ __forceinline__ float ScoreOf(const FlashParams& p, float qk, int b, int h, int64_t i,
                                         int64_t j, int len_q, int len_kv, float* dcap) {
  float t = qk;
  if (p.bias_type == FUSEDATTN_BIAS_PRE_SCALE) t += BiasAt(p.bias, b, h, i, j);
  t *= p.scale;
  float derivative = 1.f;
  if (p.softcap > 0.f) {
    float th = kExactTanh ? tanhf(t / p.softcap) : SoftcapTanh(t / p.softcap);
    t = p.softcap * th;
    derivative = 1.f - th * th;
  }
  if (p.bias_type == FUSEDATTN_BIAS_POST_SCALE) t += BiasAt(p.bias, b, h, i, j);
  if (p.bias_type == FUSEDATTN_BIAS_ALIBI) {
    float distance = fabsf(static_cast<float>(AlibiDiagonal(i, len_q, len_kv) - j));
    t -= AlibiSlope(p, h) * distance;
  }
  if (dcap) *dcap = derivative;
  return t;
}

// ------------------------------------------------------------------------------------------------
// The score-modifier hook
// ------------------------------------------------------------------------------------------------

// The fast kernels take the score modifier as a template policy. The ahead-of-time instances use
// NoScoreMod (every function is the identity, kActive false, so none of its code exists there);
// a score_mod graph is compiled at run time (jit.cpp) into a struct with the same members and the
// same kernels are instantiated with it by NVRTC. s is the score of the pipeline above (scale,
// bias, softcap, ALiBi: ScoreOf), i and j the query and key inside the sequence, len_q and
// len_kv the sequence's lengths.
struct NoScoreMod {
  static constexpr bool kActive = false;       // a graph is compiled in
  static constexpr bool kTensorGrads = false;  // some tensor of the graph requires grad
  // Whether the key stays visible (mask_mod); *score = score_mod(s).
  __device__ __forceinline__ static bool Forward(const FlashParams&, float s, int, int, int64_t,
                                                 int64_t, int, int, float* score) {
    *score = s;
    return true;
  }
  // As Forward, with the graph's q_idx and kv_idx given as floats (fi == i and fj == j, exact:
  // the caller passes them only below 2^24), which a caller computes once per row and per key
  // rather than converting i and j per element (I2F issues at the MUFU unit's rate).
  __device__ __forceinline__ static bool ForwardAt(const FlashParams&, float s, int, int, int64_t,
                                                   int64_t, float, float, int, int, float* score) {
    *score = s;
    return true;
  }
  // As Forward, and *d_s = d score / d s.
  __device__ __forceinline__ static bool Backward(const FlashParams&, float s, int, int, int64_t,
                                                  int64_t, int, int, float* score, float* d_s) {
    *score = s;
    *d_s = 1.f;
    return true;
  }
  // Adds ds * d score / d tensor (ds = d loss / d modified score) to the tensors' gradient sums.
  __device__ __forceinline__ static void AddTensorGrads(const FlashParams&, float, float, int,
                                                        int, int64_t, int64_t, int, int) {}
};

// Whether the kernel visits tile (m_tile, n_tile) of sequence b, head h: false only where the
// mask_mod's block mask says it hides the whole tile.
__device__ __forceinline__ bool FlexTileActive(const FlashParams& p, int b, int h, int m_tile,
                                               int n_tile) {
  const FlexArgs& f = p.flex;
  return f.block_mask == nullptr ||
         f.block_mask[b * f.block_mask_stride_b + h * f.block_mask_stride_h +
                      int64_t{m_tile} * f.block_mask_n_tiles + n_tile] != 0;
}

// FlexOffset over the axes a score_mod tensor declares (FUSEDATTN_SCORE_MOD_AXIS_* bits): the
// strides of the others are 0 (AuxTensorView), so leaving their terms out reads the same
// element, and the compiler then sees that a tensor without the key axis has one element per
// row (jit.cpp's generated reads).
template <unsigned kAxes>
__device__ __forceinline__ int64_t FlexAxesOffset(const FlexTensorArg& t, int b, int h, int64_t i,
                                                  int64_t j) {
  int64_t at = 0;
  if constexpr ((kAxes & FUSEDATTN_SCORE_MOD_AXIS_BATCH) != 0) at += b * t.stride_b;
  if constexpr ((kAxes & FUSEDATTN_SCORE_MOD_AXIS_HEAD) != 0) at += h * t.stride_h;
  if constexpr ((kAxes & FUSEDATTN_SCORE_MOD_AXIS_Q) != 0) at += i * t.stride_q;
  if constexpr ((kAxes & FUSEDATTN_SCORE_MOD_AXIS_KV) != 0) at += j * t.stride_kv;
  return at;
}

// The Hopper forward's walk over a block mask (fwd_kernel_sm90.cuh, kScoreMod), by a whole warp
// (32 tiles per round trip, warp-uniform results): the key tiles of [begin, *end) that the block
// mask shows for query tile m_tile of sequence b, head h: *count of them, and *end becomes the
// last one + 1 (begin when there is none). Needs p.flex.block_mask.
__device__ __forceinline__ void FlexShownKeyTiles(const FlashParams& p, int b, int h, int m_tile,
                                                  int begin, int* end, int* count) {
  const int lane = threadIdx.x % 32;
  int shown = 0, last = begin - 1;
  for (int top = *end; top > begin; top -= 32) {
    const int tile = top - 1 - lane;
    const unsigned ballot =
        __ballot_sync(0xffffffffu, tile >= begin && FlexTileActive(p, b, h, m_tile, tile));
    shown += __popc(ballot);
    if (last < begin && ballot != 0) last = top - __ffs(ballot);
  }
  *count = shown;
  *end = last + 1;
}
// The next key tile below `tile` (walking down) that the block mask shows, or begin - 1 when
// none is left; by a whole warp, as FlexShownKeyTiles.
__device__ __forceinline__ int FlexNextShownKeyTile(const FlashParams& p, int b, int h, int m_tile,
                                                    int begin, int tile) {
  const int lane = threadIdx.x % 32;
  for (int top = tile; top > begin; top -= 32) {
    const int t = top - 1 - lane;
    const unsigned ballot =
        __ballot_sync(0xffffffffu, t >= begin && FlexTileActive(p, b, h, m_tile, t));
    if (ballot != 0) return top - __ffs(ballot);
  }
  return begin - 1;
}

__device__ __forceinline__ int64_t FlexOffset(const FlexTensorArg& t, int b, int h, int64_t i,
                                              int64_t j) {
  return b * t.stride_b + h * t.stride_h + i * t.stride_q + j * t.stride_kv;
}

// The extra logit of the softmax denominator in natural units: -inf (vanilla), 0 (off-by-one),
// or the head's sink.
__device__ __forceinline__ float ExtraLogit(const FlashParams& p, int h) {
  switch (p.softmax_type) {
    case FUSEDATTN_SOFTMAX_OFF_BY_ONE: return 0.f;
    case FUSEDATTN_SOFTMAX_LEARNABLE_SINK: return p.sink_logits[h * p.sink_stride];
    default: return -INFINITY;
  }
}

// ex2.approx: 2^x to about 2 ulp, 2^-inf = 0 (the softmax's exponentials on the fast path).
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ DropoutRow DropoutRowOf(const FlashParams& p, int b, int h,
                                                   int64_t i) {
  return MakeDropoutRow(p.dropout_seed, p.dropout_offset, p.dropout_threshold, b, h, i,
                        p.heads_q, p.max_seqlen_q);
}

// LSE of row i as the backward uses it: a row without a visible key, or with a non-finite LSE,
// contributes nothing (reported as +inf so that exp(s - lse) = 0).
__device__ __forceinline__ float BackwardLse(const FlashParams& p, int b, int h, const SeqInfo& seq, int64_t i) {
  int lo, hi;
  VisibleKeys(p, i, seq.len_q, seq.len_kv, &lo, &hi);
  if (lo >= hi) return INFINITY;
  float lse = p.lse.data[LseOffset(p.lse, b, h, seq.start_q, i)];
  return isfinite(lse) ? lse : INFINITY;
}

__device__ __forceinline__ int64_t RowIndex(const FlashParams& p, int b, int h, int64_t i) {
  return (int64_t{b} * p.heads_q + h) * p.max_seqlen_q + i;
}

// Element (b, h, i, j) of dbias (broadcast axes have stride 0 in p.dbias).
__device__ __forceinline__ int64_t DbiasOffset(const FlashParams& p, int b, int h, int64_t i,
                                               int64_t j) {
  return b * p.dbias.stride_b + h * p.dbias.stride_h + i * p.dbias.stride_q +
         j * p.dbias.stride_kv;
}

// Adds a bias gradient per p.dbias_mode: stored (each element written once) or added atomically
// (float32 dbias).
__device__ __forceinline__ void WriteDbias(const FlashParams& p, int b, int h, int64_t i,
                                           int64_t j, float value) {
  const int64_t at = DbiasOffset(p, b, h, i, j);
  if (p.dbias_mode == kDbiasStore)
    StoreElem(p.dbias.data, p.dbias.dtype, at, value);
  else
    atomicAdd(static_cast<float*>(p.dbias.data) + at, value);
}

// Whether keys j and j + 1 (j even) of a dropout row are kept, given the four words of their
// group, words = row.Words(j >> 2) (fusedattn.h: key j takes word j % 4). Every tensor-core kernel
// decides a pair through this, whichever thread computed the words (the Hopper forward shares a
// group's words between two threads: sm90_scores.cuh's DropoutKeepBits).
__device__ __forceinline__ void DropoutKeepPair(const DropoutRow& row, const Philox4& words,
                                                int64_t j, bool* keep0, bool* keep1) {
  const bool high = (j & 2) != 0;
  *keep0 = (high ? words.z : words.x) >= row.threshold;
  *keep1 = (high ? words.w : words.y) >= row.threshold;
}

// Whether keys j and j + 1 (j even) of a dropout row are kept: both come from one Philox call.
__device__ __forceinline__ void DropoutKeep2(const DropoutRow& row, int64_t j, bool* keep0,
                                             bool* keep1) {
  DropoutKeepPair(row, row.Words(static_cast<uint32_t>(j >> 2)), j, keep0, keep1);
}

// Whether key j of a dropout row is kept.
__device__ __forceinline__ bool DropoutKeep1(const DropoutRow& row, int64_t j) {
  const Philox4 r = row.Words(static_cast<uint32_t>(j >> 2));
  const int which = static_cast<int>(j & 3);
  const uint32_t word = which == 0 ? r.x : which == 1 ? r.y : which == 2 ? r.z : r.w;
  return word >= row.threshold;
}

// ------------------------------------------------------------------------------------------------
// Reductions
// ------------------------------------------------------------------------------------------------

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// atomicMax for floats (no NaN): non-negative floats order like their int bits, negative ones
// in reverse of their unsigned bits. The target starts at -inf.
__device__ __forceinline__ void AtomicMaxFloat(float* address, float value) {
  if (value != value) return;
  value += 0.f;  // -0 -> +0
  if (value >= 0.f)
    atomicMax(reinterpret_cast<int*>(address), __float_as_int(value));
  else
    atomicMin(reinterpret_cast<unsigned int*>(address), __float_as_uint(value));
}

// Block index decomposition of a flattened grid: x = (b * heads + h) * tiles + tile.
struct TileIndex {
  int tile, h, b;
};
__device__ __forceinline__ TileIndex DecomposeBlock(int64_t block, int tiles, int heads) {
  TileIndex t;
  t.tile = static_cast<int>(block % tiles);
  int64_t rest = block / tiles;
  t.h = static_cast<int>(rest % heads);
  t.b = static_cast<int>(rest / heads);
  return t;
}

// Block index of a grid over a heavy-first schedule (schedule.h: order[batch], then
// tile_start[batch + 1]): the blocks walk the sequences heaviest first, and within a sequence its
// heads, tiles fastest, so that the blocks running together share one head's K/V (forward) or
// Q/dO (backward) in L2 (heads fastest cost the backward ~10% on H100). tile is the tile within
// sequence b (0 = the sequence's first in the kernel's own order), or -1 past the last scheduled
// block (the block has nothing to do).
__device__ __forceinline__ TileIndex ScheduledBlock(const int32_t* schedule, int64_t block,
                                                    int heads, int batch) {
  const int32_t* order = schedule;
  const int32_t* tile_start = schedule + batch;
  TileIndex t;
  t.h = 0;
  t.b = 0;
  t.tile = -1;
  if (block >= int64_t{__ldg(tile_start + batch)} * heads) return t;
  // The last position whose first block is <= block (positions with no tiles, at the end, start
  // at the total and are never chosen).
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (int64_t{__ldg(tile_start + mid)} * heads <= block)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int64_t start = __ldg(tile_start + lo);
  const int64_t tiles = __ldg(tile_start + lo + 1) - start;
  const int64_t local = block - start * heads;
  t.b = __ldg(order + lo);
  t.h = static_cast<int>(local / tiles);
  t.tile = static_cast<int>(local % tiles);
  return t;
}

}  // namespace fusedattn::flash
