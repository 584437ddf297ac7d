// flash's FP8 (e4m3) forward (the Hopper forward's FP8 instance: README "Hopper forward: FP8")
// against the reference's emulation of fusedattn.h's quantization points, with the bounds of
// tests/gpu/fp8_check.h (which also says why flash's quantization of P, relative to the running
// maximum and normalized after O += P V, stays within them). Each test skips, saying why, without
// a CUDA device, the flash backend, or where flash refuses the problem (not an sm_90 device, a
// build without sm_90a kernels): the refusal is printed.
//
// GPU run: GTEST_FILTER='*FlashFp8*' (scripts/gpu_run.sh, step hopper_fp8: also compute-sanitizer
// memcheck and racecheck on FlashFp8Sanitize.*).
#ifdef FUSEDATTN_WITH_FLASH

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/flash/planner.h"
#include "gpu/cudnn_run.h"  // Config, ReferenceConfig, SetFormats
#include "gpu/device_memory.h"
#include "gpu/fp8_check.h"
#include "gpu/skip.h"
#include "testing/fp8.h"
#include "testing/tensors.h"

namespace fusedattn::testing {
namespace {

constexpr fusedattn_dtype kE4M3 = FUSEDATTN_DTYPE_FP8_E4M3;

struct FlashFp8Case {
  std::string name;
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_kv, head_dim;
  fusedattn_mask mask;
  fusedattn_format format;
  fusedattn_dtype o_dtype;
};

std::vector<FlashFp8Case> Cases() {
  const auto kBshd = FUSEDATTN_FORMAT_BSHD, kSbhd = FUSEDATTN_FORMAT_SBHD,
             kBhsd = FUSEDATTN_FORMAT_BHSD;
  const auto kNone = FUSEDATTN_MASK_NONE, kCausal = FUSEDATTN_MASK_CAUSAL,
             kBottomRight = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  const auto kBf16 = FUSEDATTN_DTYPE_BFLOAT16, kFp16 = FUSEDATTN_DTYPE_FLOAT16,
             kFp32 = FUSEDATTN_DTYPE_FLOAT32;
  return {
      {"d128_nomask_bf16", 2, 4, 4, 256, 256, 128, kNone, kBshd, kBf16},
      {"d128_causal_s77_bf16", 1, 2, 2, 77, 77, 128, kCausal, kBshd, kBf16},
      {"d128_causal_mqa_s600_e4m3", 1, 4, 1, 600, 600, 128, kCausal, kBshd, kE4M3},
      {"d128_causal_s513_e4m3", 1, 2, 2, 513, 513, 128, kCausal, kBshd, kE4M3},
      {"d128_nomask_gqa_s130_fp32", 2, 8, 2, 130, 130, 128, kNone, kBshd, kFp32},
      {"d128_bottom_right_sq200_skv333_bhsd_bf16", 1, 2, 2, 200, 333, 128, kBottomRight, kBhsd,
       kBf16},
      // Rows 0 .. 132 see no key: O = 0, LSE = -inf.
      {"d128_bottom_right_sq333_skv200_sbhd_fp16", 2, 2, 1, 333, 200, 128, kBottomRight, kSbhd,
       kFp16},
      {"d128_nomask_sq1_skv1_e4m3", 3, 4, 2, 1, 1, 128, kNone, kBshd, kE4M3},
      {"d128_nomask_sq5_skv300_bf16", 2, 4, 2, 5, 300, 128, kNone, kBshd, kBf16},
      // d64 runs on the d128 instance (columns past 64 zero-filled).
      {"d64_nomask_s190_bf16", 1, 4, 4, 190, 190, 64, kNone, kBshd, kBf16},
      {"d64_causal_s129_e4m3", 1, 2, 2, 129, 129, 64, kCausal, kSbhd, kE4M3},
  };
}

// Small shapes for compute-sanitizer (memcheck, racecheck): tiles ending mid-tile, one block per
// head and both consumers idle or busy.
std::vector<FlashFp8Case> SanitizeCases() {
  return {
      {"s1", 1, 2, 1, 1, 1, 128, FUSEDATTN_MASK_NONE, FUSEDATTN_FORMAT_BSHD, kE4M3},
      {"s70_causal", 1, 2, 2, 70, 70, 128, FUSEDATTN_MASK_CAUSAL, FUSEDATTN_FORMAT_BSHD,
       FUSEDATTN_DTYPE_BFLOAT16},
      {"s130_nomask", 1, 2, 1, 130, 130, 128, FUSEDATTN_MASK_NONE, FUSEDATTN_FORMAT_BSHD,
       kE4M3},
  };
}

fusedattn_config ConfigOf(const FlashFp8Case& k) {
  fusedattn_config c = Config(k.batch, k.heads_q, k.heads_kv, k.seqlen_q, k.seqlen_kv,
                              k.head_dim, kE4M3);
  c.backend = FUSEDATTN_BACKEND_FLASH;
  c.o_dtype = k.o_dtype;
  c.mask = k.mask;
  SetFormats(&c, k.format);
  c.return_lse = 1;
  return c;
}

Fp8Factors FactorsFor(const ProblemTensors& host, const fusedattn_config& c) {
  // Powers of two (exact reciprocals); S never saturates (p <= 1, scale_s 256), nor O.
  Fp8Factors f;
  f.descale_q = 0.5f, f.descale_k = 0.25f, f.descale_v = 2.0f;
  f.scale_s = 256.0f, f.descale_s = 1.0f / 256;
  f.scale_o = IsFp8(c.o_dtype) ? PowerOfTwoScale(MaxAbsOf(host.v) * f.descale_v, 448.0) : 1.0f;
  f.descale_o = 1.0f / f.scale_o;
  return f;
}

// Skips (with flash's reason) where flash does not run FP8 here; checks that the plan of the
// call's own (device) arguments is the FP8 instance.
bool FlashRunsIt(const fusedattn_config& c, const ProblemTensors& host, std::string* why) {
  char msg[4096];
  fusedattn_backend chosen;
  if (fusedattn_get_backend(&c, &chosen, msg, sizeof msg) != FUSEDATTN_SUCCESS) {
    *why = msg;
    return false;
  }
  DeviceProblem dev;
  std::string error;
  EXPECT_TRUE(dev.upload(host, &error)) << error;
  DeviceFactors df;
  fusedattn_fwd_args a = dev.fwd_args();
  PointFwdArgsAt(c, df.ptr(), &a);
  flash::ForwardPlan plan;
  const Status status = flash::PlanForwardCall(c, a, &plan);
  EXPECT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(plan.path, flash::KernelPath::kHopperWgmma) << flash::DescribeForwardPlan(plan);
  EXPECT_EQ(plan.variant, flash::KernelVariant::kFp8) << flash::DescribeForwardPlan(plan);
  return true;
}

void CheckForward(const FlashFp8Case& k) {
  const fusedattn_config c = ConfigOf(k);
  const fusedattn_config ref_c = ReferenceConfig(c);
  TensorOptions opt;
  opt.seed = 11;
  opt.input_range = 2.0;
  ProblemTensors host = MakeProblemTensors(c, opt);
  std::string why;
  if (!FlashRunsIt(c, host, &why)) GTEST_SKIP() << "flash does not run this FP8 problem: " << why;
  const Fp8Factors f = FactorsFor(host, c);

  ProblemTensors ref = host;
  Fp8Factors ref_f = f;
  ASSERT_NO_FATAL_FAILURE(RunOnReference(ref_c, /*backward=*/false, &ref, &ref_f));
  ProblemTensors got;
  Fp8Factors got_f;
  ASSERT_NO_FATAL_FAILURE(RunOnDevice(c, /*backward=*/false, host, f, &got, &got_f));

  const Exact fwd = ExactAttention(c, host, f, false);
  const int64_t B = c.batch, SQ = c.max_seqlen_q, HQ = c.heads_q, D = c.head_dim_v;
  const std::vector<double> bound = InFormatOrder(fwd.o_bound, c.o_format, B, SQ, HQ, D);
  const std::vector<double> f32 = InFormatOrder(fwd.o_f32, c.o_format, B, SQ, HQ, D);
  const std::vector<double> exact = InFormatOrder(fwd.o, c.o_format, B, SQ, HQ, D);
  const double o_scale = IsFp8(c.o_dtype) ? f.scale_o : 1.0;
  ExpectCloseToReference("flash", "O", got.o, ref.o, bound, f32, c.max_seqlen_kv, kE4M3,
                         o_scale);
  {
    const std::vector<double> g = got.lse.to_vector(), r = ref.lse.to_vector();
    double worst = 0;
    int64_t mismatched = 0;
    for (size_t n = 0; n < g.size(); ++n) {
      if (std::isinf(r[n]) || std::isinf(g[n])) {
        mismatched += !(std::isinf(r[n]) && std::isinf(g[n]) && r[n] < 0 && g[n] < 0);
        continue;
      }
      worst = std::max(worst, std::fabs(g[n] - r[n]));
    }
    EXPECT_EQ(mismatched, 0) << "LSE: -inf exactly for the rows without keys";
    EXPECT_LE(worst, fwd.p_relative_f32) << "LSE";
  }
  EXPECT_NEAR(got_f.amax_s, ref_f.amax_s, fwd.p_relative_f32 * ref_f.amax_s + 1e-7) << "amax_s";
  double amax_o_limit = 0;
  for (size_t n = 0; n < fwd.o.size(); ++n)
    amax_o_limit = std::max(amax_o_limit, LimitBeforeRounding(fwd.o_bound[n], fwd.o_f32[n],
                                                              fwd.o[n], c.max_seqlen_kv, kE4M3));
  EXPECT_NEAR(got_f.amax_o, ref_f.amax_o, amax_o_limit + 1e-7) << "amax_o";
  // The inputs' other factors are untouched.
  EXPECT_EQ(got_f.scale_s, f.scale_s);
  ::testing::Test::RecordProperty("flash_vs_exact_O",
                                  std::to_string(RelativeError(got.o, exact, o_scale)));
  ::testing::Test::RecordProperty("reference_vs_exact_O",
                                  std::to_string(RelativeError(ref.o, exact, o_scale)));
}

class FlashFp8 : public ::testing::TestWithParam<FlashFp8Case> {};

TEST_P(FlashFp8, ForwardMatchesTheReferenceEmulation) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  CheckForward(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashFp8, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

TEST(FlashFp8Sanitize, SmallCases) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  for (const FlashFp8Case& k : SanitizeCases()) {
    SCOPED_TRACE(k.name);
    CheckForward(k);
  }
}

// The amax outputs are written by the call (zeroed first, then the kernel's maxima): a second
// call with other inputs gives the second call's amax, not the larger of both.
TEST(FlashFp8, AmaxOutputsAreTheCallsOwn) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  const FlashFp8Case k = Cases()[0];
  fusedattn_config c = ConfigOf(k);
  TensorOptions opt;
  opt.seed = 3;
  ProblemTensors host = MakeProblemTensors(c, opt);
  std::string why;
  if (!FlashRunsIt(c, host, &why)) GTEST_SKIP() << why;
  Fp8Factors f = FactorsFor(host, c);
  f.amax_s = 1e30f, f.amax_o = 1e30f;  // stale values from "an earlier call"
  ProblemTensors got;
  Fp8Factors got_f;
  ASSERT_NO_FATAL_FAILURE(RunOnDevice(c, false, host, f, &got, &got_f));
  EXPECT_GT(got_f.amax_s, 0.f);
  EXPECT_LE(got_f.amax_s, 1.f);
  EXPECT_GT(got_f.amax_o, 0.f);
  EXPECT_LE(got_f.amax_o, MaxAbsOf(host.v) * f.descale_v * 1.01);
}

// Invalid scaling factors are refused before anything is written (fusedattn.h: the check reads
// them on the host), on flash as on every backend.
TEST(FlashFp8, InvalidScalesAreRejectedBeforeAnythingIsWritten) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  const FlashFp8Case k = Cases()[1];
  fusedattn_config c = ConfigOf(k);
  ProblemTensors host = MakeProblemTensors(c, TensorOptions{});
  std::string why;
  if (!FlashRunsIt(c, host, &why)) GTEST_SKIP() << why;
  for (float bad : {0.f, -1.f, NAN, INFINITY}) {
    Fp8Factors f = FactorsFor(host, c);
    f.descale_k = bad;
    DeviceProblem dev;
    std::string error;
    ASSERT_TRUE(dev.upload(host, &error)) << error;
    DeviceFactors df;
    df.upload(f);
    size_t bytes = 0;
    char msg[4096];
    ASSERT_EQ(fusedattn_fwd_workspace_size(&c, &bytes, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
    DeviceBuffer workspace(std::max<size_t>(bytes, 16));
    fusedattn_fwd_args a = dev.fwd_args();
    PointFwdArgsAt(c, df.ptr(), &a);
    EXPECT_EQ(fusedattn_fwd(&c, &a, workspace.ptr, bytes, nullptr, msg, sizeof msg),
              FUSEDATTN_ERROR_INVALID_ARGUMENT)
        << bad;
    EXPECT_NE(std::string(msg).find("descale_k"), std::string::npos) << msg;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Fp8Factors after = df.download();
    EXPECT_EQ(after.amax_s, -1.f) << "amax_s written";
    EXPECT_EQ(after.amax_o, -1.f) << "amax_o written";
  }
}

}  // namespace
}  // namespace fusedattn::testing

#endif  // FUSEDATTN_WITH_FLASH
