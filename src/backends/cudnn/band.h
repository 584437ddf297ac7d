// Which query rows see no key and which keys no query sees, for one sequence of lengths
// (seqlen_q, seqlen_kv), under the mask rule of fusedattn.h. Host and device code share it: the
// host decides whether a problem can have such rows at all, the fix-up kernels use it per row.
// It must agree with Problem::visible_keys (tests/cpu/cudnn_plan_test.cpp checks that it does).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FUSEDATTN_BAND_HD __host__ __device__ __forceinline__
#else
#define FUSEDATTN_BAND_HD inline
#endif

namespace fusedattn::cudnn {

struct Band {
  int64_t left = -1;   // keys j >= d - left are visible; -1: unbounded
  int64_t right = -1;  // keys j <= d + right are visible; -1: unbounded (0 for causal masks)
  bool bottom_right = false;  // d = i + seqlen_kv - seqlen_q, else d = i

  // The visible keys [lo, hi) of row i; empty when lo >= hi.
  FUSEDATTN_BAND_HD void keys_of_row(int64_t i, int64_t seqlen_q, int64_t seqlen_kv, int64_t* lo,
                                     int64_t* hi) const {
    int64_t d = bottom_right ? i + seqlen_kv - seqlen_q : i;
    int64_t begin = 0, end = seqlen_kv;
    if (left >= 0 && d - left > begin) begin = d - left;
    if (right >= 0 && d + right + 1 < end) end = d + right + 1;
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

  // No row of the sequence sees key j (also true for keys past the sequence). Key j is visible to
  // row i when j - right <= d <= j + left, i.e. i in [j - right - shift, j + left - shift].
  FUSEDATTN_BAND_HD bool key_unseen(int64_t j, int64_t seqlen_q, int64_t seqlen_kv) const {
    if (j < 0 || j >= seqlen_kv || seqlen_q <= 0) return true;
    int64_t shift = bottom_right ? seqlen_kv - seqlen_q : 0;
    int64_t first = 0, last = seqlen_q - 1;
    if (right >= 0 && j - right - shift > first) first = j - right - shift;
    if (left >= 0 && j + left - shift < last) last = j + left - shift;
    return first > last;
  }

  // Whether any row / any key of a sequence with these lengths is empty / unseen. Emptiness is
  // monotone along the rows (the band moves right by one key per row), so the first and the last
  // row (key) decide.
  FUSEDATTN_BAND_HD bool any_row_empty(int64_t seqlen_q, int64_t seqlen_kv) const {
    if (seqlen_q <= 0) return false;
    return row_empty(0, seqlen_q, seqlen_kv) || row_empty(seqlen_q - 1, seqlen_q, seqlen_kv);
  }
  FUSEDATTN_BAND_HD bool any_key_unseen(int64_t seqlen_q, int64_t seqlen_kv) const {
    if (seqlen_kv <= 0) return false;
    return key_unseen(0, seqlen_q, seqlen_kv) || key_unseen(seqlen_kv - 1, seqlen_q, seqlen_kv);
  }
};

}  // namespace fusedattn::cudnn
