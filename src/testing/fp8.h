// FP8 scaling factors for tests and benchmarks: one block of float32 scalars that a call's FP8
// pointers address (fusedattn.h, "FP8 attention"). The block lives on the host for CPU calls;
// for CUDA calls copy it to device memory and point the args at the copy (same layout).
#pragma once

#include <cmath>

#include "fusedattn/fusedattn.h"

namespace fusedattn::testing {

struct Fp8Factors {
  float descale_q = 1, descale_k = 1, descale_v = 1, descale_o = 1, descale_do = 1;
  float descale_s = 1, descale_dp = 1;
  float scale_s = 1, scale_o = 1, scale_dp = 1, scale_dq = 1, scale_dk = 1, scale_dv = 1;
  // Outputs.
  float amax_s = -1, amax_o = -1, amax_dp = -1, amax_dq = -1, amax_dk = -1, amax_dv = -1;
};

inline bool IsFp8(fusedattn_dtype dtype) {
  return dtype == FUSEDATTN_DTYPE_FP8_E4M3 || dtype == FUSEDATTN_DTYPE_FP8_E5M2;
}

// The dtype a config gives dO / dQKV (DEFAULT resolved as fusedattn.h says).
inline fusedattn_dtype DoDtype(const fusedattn_config& c) {
  return c.do_dtype == FUSEDATTN_DTYPE_DEFAULT ? c.o_dtype : c.do_dtype;
}
inline fusedattn_dtype DqkvDtype(const fusedattn_config& c) {
  return c.dqkv_dtype == FUSEDATTN_DTYPE_DEFAULT ? c.qkv_dtype : c.dqkv_dtype;
}

// Points the FP8 fields of the args at `block` (an Fp8Factors on the host or a device copy of
// one): exactly the pointers the config reads (fusedattn.h), the others NULL.
inline void PointFwdArgsAt(const fusedattn_config& c, Fp8Factors* block, fusedattn_fwd_args* a) {
  a->descale_q = &block->descale_q;
  a->descale_k = &block->descale_k;
  a->descale_v = &block->descale_v;
  a->descale_s = &block->descale_s;
  a->scale_s = &block->scale_s;
  a->scale_o = IsFp8(c.o_dtype) ? &block->scale_o : nullptr;
  a->amax_s = &block->amax_s;
  a->amax_o = &block->amax_o;
}

inline void PointBwdArgsAt(const fusedattn_config& c, Fp8Factors* block, fusedattn_bwd_args* a) {
  const bool dqkv_fp8 = IsFp8(DqkvDtype(c));
  a->descale_q = &block->descale_q;
  a->descale_k = &block->descale_k;
  a->descale_v = &block->descale_v;
  a->descale_o = IsFp8(c.o_dtype) ? &block->descale_o : nullptr;
  a->descale_do = &block->descale_do;
  a->descale_s = &block->descale_s;
  a->descale_dp = &block->descale_dp;
  a->scale_s = &block->scale_s;
  a->scale_dp = &block->scale_dp;
  a->scale_dq = dqkv_fp8 ? &block->scale_dq : nullptr;
  a->scale_dk = dqkv_fp8 ? &block->scale_dk : nullptr;
  a->scale_dv = dqkv_fp8 ? &block->scale_dv : nullptr;
  a->amax_dp = &block->amax_dp;
  a->amax_dq = &block->amax_dq;
  a->amax_dk = &block->amax_dk;
  a->amax_dv = &block->amax_dv;
}

// The largest power of two p with amax * p <= max_finite (the FP8 type's largest value): a
// scale that never saturates and whose reciprocal is exact. amax 0: 1.
inline float PowerOfTwoScale(double amax, double max_finite) {
  if (!(amax > 0)) return 1.0f;
  return static_cast<float>(std::exp2(std::floor(std::log2(max_finite / amax))));
}

}  // namespace fusedattn::testing
