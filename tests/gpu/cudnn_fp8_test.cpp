// FP8 attention on cuDNN (sdpa_fp8 / sdpa_fp8_backward) against the reference's emulation of
// fusedattn.h's quantization points (each test skips, saying why, without a CUDA device or the
// cuDNN backend, and where cuDNN refuses the configuration: the refusal is printed).
//
// Tolerances: tests/gpu/fp8_check.h (derived from src/testing/fp8.h's bounds). Errors against
// float64 unquantized attention are reported per tensor for both cuDNN and the reference (test
// properties cudnn_vs_exact_<tensor>, reference_vs_exact_<tensor>).
//
// GPU run: GTEST_FILTER='CudnnFp8*' (see scripts/gpu_run.sh, step fp8).
#ifdef FUSEDATTN_WITH_CUDNN

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu/cudnn_run.h"
#include "gpu/device_memory.h"
#include "gpu/fp8_check.h"
#include "gpu/skip.h"
#include "testing/fp8.h"
#include "testing/tensors.h"

namespace fusedattn::testing {
namespace {

constexpr fusedattn_dtype kE4M3 = FUSEDATTN_DTYPE_FP8_E4M3;
constexpr fusedattn_dtype kE5M2 = FUSEDATTN_DTYPE_FP8_E5M2;

struct Fp8Case {
  std::string name;
  int64_t batch, heads_q, heads_kv, seqlen, head_dim;
  fusedattn_mask mask;
  fusedattn_dtype do_dtype;  // dO, dP and dQ/dK/dV (TE's hybrid recipe: e5m2; its E4M3 one)
};

std::vector<Fp8Case> Cases() {
  return {
      {"d128_nomask_e4m3", 2, 4, 4, 256, 128, FUSEDATTN_MASK_NONE, kE4M3},
      {"d128_causal_e5m2", 2, 4, 4, 256, 128, FUSEDATTN_MASK_CAUSAL, kE5M2},
      {"d64_causal_gqa_e4m3", 2, 8, 2, 384, 64, FUSEDATTN_MASK_CAUSAL, kE4M3},
      {"d128_nomask_gqa_e5m2", 1, 8, 4, 512, 128, FUSEDATTN_MASK_NONE, kE5M2},
  };
}

fusedattn_config ConfigOf(const Fp8Case& k) {
  fusedattn_config c = Config(k.batch, k.heads_q, k.heads_kv, k.seqlen, k.seqlen, k.head_dim,
                              kE4M3);
  c.o_dtype = kE4M3;
  c.do_dtype = c.dqkv_dtype = k.do_dtype;
  c.mask = k.mask;
  c.is_training = 1;
  return c;
}

class CudnnFp8 : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(CudnnFp8, ForwardAndBackwardMatchTheReferenceEmulation) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  const fusedattn_config c = ConfigOf(GetParam());
  const fusedattn_config ref_c = ReferenceConfig(c);
  char why[4096];
  fusedattn_backend chosen;
  if (fusedattn_get_backend(&c, &chosen, why, sizeof why) != FUSEDATTN_SUCCESS)
    GTEST_SKIP() << "cuDNN refuses this FP8 problem here: " << why;

  TensorOptions opt;
  opt.seed = 7;
  opt.input_range = 2.0;
  ProblemTensors host = MakeProblemTensors(c, opt);
  // Scales: powers of two (exact reciprocals); S and O never saturate (p <= 1, |O| <= max |v|).
  Fp8Factors f;
  f.descale_q = 0.5f, f.descale_k = 0.25f, f.descale_v = 2.0f, f.descale_do = 0.125f;
  f.scale_s = 256.0f, f.descale_s = 1.0f / 256;
  f.scale_o = PowerOfTwoScale(MaxAbsOf(host.v) * f.descale_v, 448.0);
  f.descale_o = 1.0f / f.scale_o;

  // The reference's forward on host copies, then cuDNN's on the device.
  ProblemTensors ref = host;
  Fp8Factors ref_f = f;
  ASSERT_NO_FATAL_FAILURE(RunOnReference(ref_c, /*backward=*/false, &ref, &ref_f));
  ProblemTensors got;
  Fp8Factors got_f;
  ASSERT_NO_FATAL_FAILURE(RunOnDevice(c, /*backward=*/false, host, f, &got, &got_f));

  // Forward: O against the reference (both e4m3), LSE, amax.
  const Exact fwd = ExactAttention(c, host, f, false);
  const int64_t keys = c.max_seqlen_kv, queries = c.max_seqlen_q * (c.heads_q / c.heads_kv);
  ExpectCloseToReference("cuDNN", "O", got.o, ref.o, fwd.o_bound, fwd.o_f32, keys, kE4M3, f.scale_o);
  {
    const std::vector<double> g = got.lse.to_vector(), r = ref.lse.to_vector();
    double worst = 0;
    for (size_t n = 0; n < g.size(); ++n) worst = std::max(worst, std::fabs(g[n] - r[n]));
    // el_i (fp8.h) is at most p_relative_f32 / 1.01.
    EXPECT_LE(worst, fwd.p_relative_f32) << "LSE";
  }
  EXPECT_NEAR(got_f.amax_s, ref_f.amax_s, fwd.p_relative_f32 * ref_f.amax_s + 1e-7)
      << "amax_s";
  double amax_o_limit = 0;
  for (size_t n = 0; n < fwd.o.size(); ++n)
    amax_o_limit = std::max(amax_o_limit, LimitBeforeRounding(fwd.o_bound[n], fwd.o_f32[n],
                                                              fwd.o[n], keys, kE4M3));
  EXPECT_NEAR(got_f.amax_o, ref_f.amax_o, amax_o_limit) << "amax_o";
  RecordProperty("cudnn_vs_exact_O", std::to_string(RelativeError(got.o, fwd.o, f.scale_o)));
  RecordProperty("reference_vs_exact_O", std::to_string(RelativeError(ref.o, fwd.o, f.scale_o)));

  // Backward from the reference's O and LSE on both. Scales of dP and dQ/dK/dV from a first
  // reference pass (as delayed scaling would have them), then both run with them.
  ProblemTensors bwd_host = ref;  // inputs, and the reference's O and LSE
  {
    ProblemTensors probe = bwd_host;
    Fp8Factors pf = f;
    ASSERT_NO_FATAL_FAILURE(RunOnReference(ref_c, /*backward=*/true, &probe, &pf));
    const double top = MaxFinite(c.dqkv_dtype);
    f.scale_dp = PowerOfTwoScale(pf.amax_dp, MaxFinite(c.do_dtype));
    f.descale_dp = 1.0f / f.scale_dp;
    f.scale_dq = PowerOfTwoScale(pf.amax_dq, top);
    f.scale_dk = PowerOfTwoScale(pf.amax_dk, top);
    f.scale_dv = PowerOfTwoScale(pf.amax_dv, top);
  }
  ProblemTensors ref_b = bwd_host;
  Fp8Factors ref_bf = f;
  ASSERT_NO_FATAL_FAILURE(RunOnReference(ref_c, /*backward=*/true, &ref_b, &ref_bf));
  ProblemTensors got_b;
  Fp8Factors got_bf;
  ASSERT_NO_FATAL_FAILURE(RunOnDevice(c, /*backward=*/true, bwd_host, f, &got_b, &got_bf));

  const Exact bwd = ExactAttention(c, bwd_host, f, true);
  const fusedattn_dtype dp_type = c.do_dtype;
  ExpectCloseToReference("cuDNN", "dQ", got_b.dq, ref_b.dq, bwd.dq_bound, bwd.dq_f32, keys, dp_type,
                         f.scale_dq);
  ExpectCloseToReference("cuDNN", "dK", got_b.dk, ref_b.dk, bwd.dk_bound, bwd.dk_f32, queries, dp_type,
                         f.scale_dk);
  ExpectCloseToReference("cuDNN", "dV", got_b.dv, ref_b.dv, bwd.dv_bound, bwd.dv_f32, queries, kE4M3,
                         f.scale_dv);
  EXPECT_NEAR(got_bf.amax_dp, ref_bf.amax_dp, bwd.dp_f32 + 1e-9) << "amax_dp";
  auto amax_limit = [&](const std::vector<double>& exact, const std::vector<double>& bound,
                        const std::vector<double>& f32, int64_t reduction, fusedattn_dtype type) {
    double limit = 0;
    for (size_t n = 0; n < exact.size(); ++n)
      limit = std::max(limit, LimitBeforeRounding(bound[n], f32[n], exact[n], reduction, type));
    return limit;
  };
  EXPECT_NEAR(got_bf.amax_dq, ref_bf.amax_dq,
              amax_limit(bwd.dq, bwd.dq_bound, bwd.dq_f32, keys, dp_type))
      << "amax_dq";
  EXPECT_NEAR(got_bf.amax_dk, ref_bf.amax_dk,
              amax_limit(bwd.dk, bwd.dk_bound, bwd.dk_f32, queries, dp_type))
      << "amax_dk";
  EXPECT_NEAR(got_bf.amax_dv, ref_bf.amax_dv,
              amax_limit(bwd.dv, bwd.dv_bound, bwd.dv_f32, queries, kE4M3))
      << "amax_dv";
  const struct {
    const char* name;
    const HostTensor& got;
    const HostTensor& ref;
    const std::vector<double>& exact;
    double scale;
  } grads[] = {{"dQ", got_b.dq, ref_b.dq, bwd.dq, f.scale_dq},
               {"dK", got_b.dk, ref_b.dk, bwd.dk, f.scale_dk},
               {"dV", got_b.dv, ref_b.dv, bwd.dv, f.scale_dv}};
  for (const auto& g : grads) {
    RecordProperty(std::string("cudnn_vs_exact_") + g.name,
                   std::to_string(RelativeError(g.got, g.exact, g.scale)));
    RecordProperty(std::string("reference_vs_exact_") + g.name,
                   std::to_string(RelativeError(g.ref, g.exact, g.scale)));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnFp8, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// What cuDNN's FP8 path refuses is named, and selection says so (forced: the refusal; AUTO on a
// CUDA device: the reference runs it).
TEST(CudnnFp8Refusals, NameTheFeature) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  struct Refusal {
    const char* what;
    void (*change)(fusedattn_config&);
    const char* mentions;
  };
  const Refusal refusals[] = {
      {"padding", [](fusedattn_config& c) { c.mask = FUSEDATTN_MASK_PADDING; }, "FP8 with mask"},
      {"dropout", [](fusedattn_config& c) { c.dropout = 0.1; }, "FP8 with dropout"},
      {"bias", [](fusedattn_config& c) { c.bias_type = FUSEDATTN_BIAS_POST_SCALE; },
       "FP8 with bias_type"},
      {"float32 O", [](fusedattn_config& c) { c.o_dtype = FUSEDATTN_DTYPE_FLOAT32; },
       "o_dtype = float32"},
  };
  for (const Refusal& r : refusals) {
    fusedattn_config c = ConfigOf(Cases()[0]);
    r.change(c);
    char msg[4096];
    fusedattn_backend chosen;
    EXPECT_EQ(fusedattn_get_backend(&c, &chosen, msg, sizeof msg), FUSEDATTN_ERROR_NOT_SUPPORTED)
        << r.what;
    EXPECT_NE(std::string(msg).find(r.mentions), std::string::npos) << r.what << ": " << msg;
  }
}

}  // namespace
}  // namespace fusedattn::testing

#endif  // FUSEDATTN_WITH_CUDNN
