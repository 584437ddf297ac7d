// Attention semantics defined once: which keys a query row sees under fusedattn.h's causal mask
// and sliding window, with the diagonal aligned to the top left or the bottom right. Every backend
// reads it, on the host and on the device: the reference (through Problem::visible_keys), flash's
// kernels (device_common.cuh), small_seq's kernels (device.cuh), cuDNN's mapping and fix-up
// kernels, and the score_mod band recognizer (flex/band_mask.h). Plain inline C++ for host compilers, __host__ __device__ under nvcc and NVRTC
// (jit.cpp embeds this header for the score_mod kernels). tests/cpu/band_test.cpp is its
// specification.
//
// The rule (fusedattn.h): in a sequence of seqlen_q queries and seqlen_kv keys, query i sees key j
// when 0 <= j < seqlen_kv, i < seqlen_q and
//   d - left <= j <= d + right,   d = i + shift,   shift = bottom_right ? seqlen_kv - seqlen_q : 0,
// where left / right = -1 leave that side unbounded (right is 0 for causal masks).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FUSEDATTN_BAND_HD __host__ __device__ __forceinline__
#else
#define FUSEDATTN_BAND_HD inline
#endif

namespace fusedattn {

// Where the diagonal of a band sits when seqlen_q != seqlen_kv: row 0 on key 0 (top left), or the
// last row on the last key (bottom right, what a KV cache needs). Masks map to it in fusedattn.h:
// CAUSAL / PADDING_CAUSAL are top left, *_BOTTOM_RIGHT and every window without a causal mask
// bottom right (FlashAttention's convention).
enum class DiagonalAlignment : int { kTopLeft = 0, kBottomRight = 1 };

inline const char* DiagonalAlignmentName(DiagonalAlignment a) {
  return a == DiagonalAlignment::kBottomRight ? "bottom_right" : "top_left";
}

struct Band {
  int64_t left = -1;   // keys j >= d - left are visible; -1: unbounded
  int64_t right = -1;  // keys j <= d + right are visible; -1: unbounded (0 for causal masks)
  bool bottom_right = false;  // d = i + seqlen_kv - seqlen_q, else d = i

  FUSEDATTN_BAND_HD bool operator==(const Band& o) const {
    return left == o.left && right == o.right && bottom_right == o.bottom_right;
  }

  FUSEDATTN_BAND_HD DiagonalAlignment alignment() const {
    return bottom_right ? DiagonalAlignment::kBottomRight : DiagonalAlignment::kTopLeft;
  }
  // Whether the band hides anything beyond the sequence lengths.
  FUSEDATTN_BAND_HD bool bounded() const { return left >= 0 || right >= 0; }

  // The diagonal's shift: key i + shift is on the diagonal of row i.
  FUSEDATTN_BAND_HD int64_t shift(int64_t seqlen_q, int64_t seqlen_kv) const {
    return bottom_right ? seqlen_kv - seqlen_q : 0;
  }

  // Unclamped key bounds of row i: the visible keys are [raw_lo, raw_hi) intersected with
  // [0, seqlen_kv). Both are non-decreasing in i (the band moves right by one key per row), so
  // rows [a, b] see at most [raw_lo(a), raw_hi(b)). Unbounded sides are +-2^61, far from overflow.
  FUSEDATTN_BAND_HD int64_t raw_lo(int64_t i, int64_t shift) const {
    return left >= 0 ? i + shift - left : INT64_MIN / 4;
  }
  FUSEDATTN_BAND_HD int64_t raw_hi(int64_t i, int64_t shift) const {
    return right >= 0 ? i + shift + right + 1 : INT64_MAX / 4;
  }

  // The visible keys [lo, hi) of row i; empty (lo >= hi, and then lo == hi) when the row sees no
  // key, also for rows outside [0, seqlen_q).
  FUSEDATTN_BAND_HD void keys_of_row(int64_t i, int64_t seqlen_q, int64_t seqlen_kv, int64_t* lo,
                                     int64_t* hi) const {
    const int64_t s = shift(seqlen_q, seqlen_kv);
    int64_t begin = 0, end = seqlen_kv;
    if (raw_lo(i, s) > begin) begin = raw_lo(i, s);
    if (raw_hi(i, s) < end) end = raw_hi(i, s);
    if (i >= seqlen_q || i < 0) end = begin;
    *lo = begin;
    *hi = end < begin ? begin : end;
  }

  // Row i has no visible key (also true for rows past the sequence).
  FUSEDATTN_BAND_HD bool row_empty(int64_t i, int64_t seqlen_q, int64_t seqlen_kv) const {
    int64_t lo = 0, hi = 0;
    keys_of_row(i, seqlen_q, seqlen_kv, &lo, &hi);
    return lo >= hi;
  }

  // The rows [first, last] (empty when first > last) that see some key of [key_lo, key_hi): row i
  // sees one when raw_hi(i) > key_lo and raw_lo(i) < key_hi (with the keys clipped to the
  // sequence), i.e. i >= key_lo - shift - right and i <= key_hi - 1 - shift + left.
  FUSEDATTN_BAND_HD void rows_seeing_keys(int64_t key_lo, int64_t key_hi, int64_t seqlen_q,
                                          int64_t seqlen_kv, int64_t* first,
                                          int64_t* last) const {
    if (key_lo < 0) key_lo = 0;
    if (key_hi > seqlen_kv) key_hi = seqlen_kv;
    *first = 0, *last = -1;
    if (key_lo >= key_hi || seqlen_q <= 0) return;
    const int64_t s = shift(seqlen_q, seqlen_kv);
    int64_t f = 0, l = seqlen_q - 1;
    if (right >= 0 && key_lo - s - right > f) f = key_lo - s - right;
    if (left >= 0 && key_hi - 1 - s + left < l) l = key_hi - 1 - s + left;
    if (f > l) return;
    *first = f, *last = l;
  }

  // No row of the sequence sees key j (also true for keys past the sequence).
  FUSEDATTN_BAND_HD bool key_unseen(int64_t j, int64_t seqlen_q, int64_t seqlen_kv) const {
    if (j < 0 || j >= seqlen_kv) return true;
    int64_t first = 0, last = -1;
    rows_seeing_keys(j, j + 1, seqlen_q, seqlen_kv, &first, &last);
    return first > last;
  }

  // Whether any row / any key of a sequence with these lengths is empty / unseen. Emptiness is
  // monotone along the rows (and keys), so the first and the last decide.
  FUSEDATTN_BAND_HD bool any_row_empty(int64_t seqlen_q, int64_t seqlen_kv) const {
    if (seqlen_q <= 0) return false;
    return row_empty(0, seqlen_q, seqlen_kv) || row_empty(seqlen_q - 1, seqlen_q, seqlen_kv);
  }
  FUSEDATTN_BAND_HD bool any_key_unseen(int64_t seqlen_q, int64_t seqlen_kv) const {
    if (seqlen_kv <= 0) return false;
    return key_unseen(0, seqlen_q, seqlen_kv) || key_unseen(seqlen_kv - 1, seqlen_q, seqlen_kv);
  }
};

// The band of a mask and window as fusedattn.h defines them (after MakeProblem's normalization:
// window_right is 0 under a causal mask, windows without one align to the bottom right).
FUSEDATTN_BAND_HD Band MakeBand(int64_t window_left, int64_t window_right, bool bottom_right) {
  Band b;
  b.left = window_left;
  b.right = window_right;
  b.bottom_right = bottom_right;
  return b;
}

}  // namespace fusedattn
