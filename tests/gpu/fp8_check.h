// What the FP8 GPU tests share (cudnn_fp8_test.cpp, flash_fp8_test.cpp): one FP8 call on the
// reference (host tensors) and on the device (the backend the config selects or forces), and the
// per-element comparison with the bounds src/testing/fp8.h derives.
//
// Tolerances (derived, not guessed; src/testing/fp8.h computes the terms per output element).
// B: the bound of the quantization points against float64 unquantized attention. F: how far a
// float32 implementation's value x' before a quantization point (S or dP) may be from the exact
// x, carried through the GEMM that reads it (float32 scores, LSE, exp, dP). The reference rounds
// x, the GPU x'; each rounding is within u|x| + a of its input, so the two quantized values
// differ by at most 2(u|x| + a) + (1 + u)|x' - x|: summed over the GEMM, 2B + (1 + u)F. The
// GEMM itself accumulates on the FP8 tensor cores: g_n (fp8.h) times the sum of |terms|, at most
// g_n (B / u + B + F) (the sum of |x y| is at most B / u), n its reduction length (keys for O
// and dQ, queries times the GQA group for dK and dV); its descales multiply in float32 (4 2^-24
// relative). An output rounded to o_dtype rounds both sides once more: the limit L becomes
// (1 + u_out) L + 2(u_out |ref| + a_out / scale_out) (FP8, bfloat16, float16 or float32 O).
// The amax outputs reduce the same values before any output rounding: amax_o and
// amax_dq/dk/dv within the largest element's L, amax_s within its relative error
// (p_relative_f32), amax_dp within dp_f32. LSE within the largest score error plus the sum's
// (fp8.h el_i, below p_relative_f32).
//
// flash's FP8 forward quantizes S as Q8(e * scale_s) with e = exp(s - running max) and
// normalizes by the row sum l after O += P V (fusedattn.h "FP8 attention"): its element of P is
// Q8(e' scale_s) / scale_s * r with r = exp(m_running - m) / l <= 1 and e' r = p up to float32
// (F), so it is within u p + a / scale_s (+ F) of the exact p — the same bound as the
// reference's rounding of p scale_s: the 2B + (1 + u)F above holds unchanged (where scale_s <=
// 448; the tests use 256).
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fusedattn/fusedattn.h"
#include "gpu/device_memory.h"
#include "testing/fp8.h"
#include "testing/tensors.h"

namespace fusedattn::testing {

// The scaling block on the device, read back after a call.
struct DeviceFactors {
  DeviceBuffer buffer{sizeof(Fp8Factors)};
  Fp8Factors* ptr() { return static_cast<Fp8Factors*>(buffer.ptr); }
  void upload(const Fp8Factors& f) {
    cudaMemcpy(buffer.ptr, &f, sizeof f, cudaMemcpyHostToDevice);
  }
  Fp8Factors download() {
    Fp8Factors f;
    cudaMemcpy(&f, buffer.ptr, sizeof f, cudaMemcpyDeviceToHost);
    return f;
  }
};

// One FP8 call, the forward or the backward, on the reference: on the host tensors *t with the
// factors *f (its outputs and amax outputs written there).
inline void RunOnReference(const fusedattn_config& ref_c, bool backward, ProblemTensors* t,
                           Fp8Factors* f) {
  char msg[2048];
  if (backward) {
    fusedattn_bwd_args a = t->bwd_args();
    PointBwdArgsAt(ref_c, f, &a);
    ASSERT_EQ(fusedattn_bwd(&ref_c, &a, nullptr, 0, nullptr, msg, sizeof msg), FUSEDATTN_SUCCESS)
        << msg;
  } else {
    fusedattn_fwd_args a = t->fwd_args();
    PointFwdArgsAt(ref_c, f, &a);
    ASSERT_EQ(fusedattn_fwd(&ref_c, &a, nullptr, 0, nullptr, msg, sizeof msg), FUSEDATTN_SUCCESS)
        << msg;
  }
}

// The same call on the device (the backend c selects): `inputs` and the factors `f` uploaded,
// with a workspace of the size the call asks for; its outputs read back into *got (a copy of
// `inputs`), the factors block (with its amax outputs) into *got_f.
inline void RunOnDevice(const fusedattn_config& c, bool backward, const ProblemTensors& inputs,
                        const Fp8Factors& f, ProblemTensors* got, Fp8Factors* got_f) {
  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(inputs, &error)) << error;
  DeviceFactors df;
  df.upload(f);
  char why[4096];
  size_t bytes = 0;
  ASSERT_EQ(backward ? fusedattn_bwd_workspace_size(&c, &bytes, why, sizeof why)
                     : fusedattn_fwd_workspace_size(&c, &bytes, why, sizeof why),
            FUSEDATTN_SUCCESS)
      << why;
  DeviceBuffer workspace(std::max<size_t>(bytes, 16));
  fusedattn_status status;
  if (backward) {
    fusedattn_bwd_args a = dev.bwd_args();
    PointBwdArgsAt(c, df.ptr(), &a);
    status = fusedattn_bwd(&c, &a, workspace.ptr, bytes, nullptr, why, sizeof why);
  } else {
    fusedattn_fwd_args a = dev.fwd_args();
    PointFwdArgsAt(c, df.ptr(), &a);
    status = fusedattn_fwd(&c, &a, workspace.ptr, bytes, nullptr, why, sizeof why);
  }
  ASSERT_EQ(status, FUSEDATTN_SUCCESS) << why;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  *got = inputs;
  ASSERT_TRUE(dev.download_outputs(got, &error)) << error;
  *got_f = df.download();
}

inline double MaxAbsOf(const HostTensor& t) {
  double m = 0;
  for (double x : t.to_vector()) m = std::max(m, std::fabs(x));
  return m;
}

// ||got - exact|| / ||exact|| over a tensor read back with its scale (exact in got's order).
inline double RelativeError(const HostTensor& got, const std::vector<double>& exact,
                            double scale) {
  const std::vector<double> g = got.to_vector();
  double num = 0, den = 0;
  for (size_t n = 0; n < g.size(); ++n) {
    num += (g[n] / scale - exact[n]) * (g[n] / scale - exact[n]);
    den += exact[n] * exact[n];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// The rounding of an output dtype: FP8 (fp8.h), bfloat16 / float16 (unit roundoff, smallest
// subnormal step / 2) or float32.
inline Fp8Type OutputRoundingOf(fusedattn_dtype dtype) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FP8_E4M3:
    case FUSEDATTN_DTYPE_FP8_E5M2: return RoundingOf(dtype);
    case FUSEDATTN_DTYPE_BFLOAT16: return Fp8Type{std::ldexp(1.0, -9), std::ldexp(1.0, -134)};
    case FUSEDATTN_DTYPE_FLOAT16: return Fp8Type{std::ldexp(1.0, -11), std::ldexp(1.0, -25)};
    default: return Fp8Type{std::ldexp(1.0, -24), std::ldexp(1.0, -150)};
  }
}

// The limit of |device - reference| for one element before the output's rounding (header).
inline double LimitBeforeRounding(double bound, double f32, double ref, int64_t reduction,
                                  fusedattn_dtype quantized) {
  const double u = RoundingOf(quantized).u, gamma = GammaFp8Mma(reduction);
  return 2 * bound + (1 + u) * f32 + gamma * (bound / u + bound + f32) +
         4 * std::ldexp(1.0, -24) * std::fabs(ref);
}

// Every element of got within the header's limit of ref (bound and f32 in got's order). Returns
// the largest |got - ref| / limit. `who` names the device's backend in failures.
inline double ExpectCloseToReference(const char* who, const char* name, const HostTensor& got,
                                     const HostTensor& ref, const std::vector<double>& bound,
                                     const std::vector<double>& f32, int64_t reduction,
                                     fusedattn_dtype quantized, double scale) {
  const std::vector<double> g = got.to_vector(), r = ref.to_vector();
  const Fp8Type out = OutputRoundingOf(got.dtype());
  double worst = 0;
  int64_t failures = 0;
  for (size_t n = 0; n < g.size(); ++n) {
    const double gv = g[n] / scale, rv = r[n] / scale;
    const double limit =
        (1 + out.u) * LimitBeforeRounding(bound[n], f32[n], rv, reduction, quantized) +
        2 * (out.u * std::fabs(rv) + out.a / scale) + 1e-12;
    const double error = std::fabs(gv - rv);
    worst = std::max(worst, error / limit);
    if (!(error <= limit) && failures++ < 5)
      ADD_FAILURE() << name << " element " << n << ": " << who << " " << gv << ", reference "
                    << rv << ", |difference| " << error << " > " << limit;
  }
  EXPECT_EQ(failures, 0) << name;
  ::testing::Test::RecordProperty(std::string(name) + "_worst_over_limit", std::to_string(worst));
  return worst;
}

}  // namespace fusedattn::testing
