// FP8 attention (fusedattn.h, "FP8 attention"): the FP8 conversions against known bit patterns,
// the reference's emulation by hand and against float64 unquantized attention within a derived
// bound, the amax outputs, and every validation error.
//
// The bound. For an FP8 type with m mantissa bits and smallest normal 2^e_min, rounding to
// nearest moves a value y by at most half a unit in its last place:
//   |Q8(y) - y| <= u |y|   for |y| >= 2^e_min,  u = 2^-(m+1)
//   |Q8(y) - y| <= a       below it,            a = 2^(e_min - m - 1) (half the subnormal step)
// so |Q8(y) - y| <= u |y| + a as long as y does not saturate (the tests pick scales that keep
// every quantized value within the largest finite value). With y = x * scale and the quantized
// value read back as Q8(y) * descale, descale = 1 / scale exactly (powers of two):
//   |Q8(x * scale) / scale - x| <= u |x| + a / scale.
// e4m3: m = 3, e_min = -6: u = 2^-4, a = 2^-10.  e5m2: m = 2, e_min = -14: u = 2^-3, a = 2^-17.
// Everything else is exact in the specification, and the reference computes it in float64, so
// against float64 attention on the same (descaled) inputs, per output element:
//   O[i,x]  : sum_j (u_s |p_ij| + a_s / scale_s) |v_jx|
//   dV[j,x] : sum_i (u_s |p'_ij| + a_s / scale_s) |dO_ix|
//   dQ[i,x] : sum_j (u_dp |dP_ij| + a_dp / scale_dp) |k_jx|;  dK[j,x] likewise with |q_ix|
// plus the final rounding of the output (float32 here: 2^-24 relative; an FP8 output adds
// u_out |value| + a_out / scale_out) and 1e-12 for float64 accumulation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "test_util.h"
#include "testing/fp8.h"
#include "testing/tensors.h"

namespace fusedattn {
namespace {

using testing::Exact;
using testing::ExactAttention;
using testing::Fp8Factors;
using testing::Fp8Type;
using testing::MaxFinite;
using testing::RoundingOf;
using testing::HostTensor;
using testing::MakeProblemTensors;
using testing::ProblemTensors;
using testing::TensorOptions;

constexpr fusedattn_dtype kE4M3 = FUSEDATTN_DTYPE_FP8_E4M3;
constexpr fusedattn_dtype kE5M2 = FUSEDATTN_DTYPE_FP8_E5M2;

// ---------------------------------------------------------------------------------------------
// Conversions
// ---------------------------------------------------------------------------------------------
TEST(Fp8Conversion, E4M3DecodesKnownBitPatterns) {
  EXPECT_EQ(Fp8ToDouble(0x00, kE4M3), 0.0);
  EXPECT_TRUE(std::signbit(Fp8ToDouble(0x80, kE4M3)));
  EXPECT_EQ(Fp8ToDouble(0x01, kE4M3), std::ldexp(1.0, -9));  // smallest subnormal
  EXPECT_EQ(Fp8ToDouble(0x07, kE4M3), 7 * std::ldexp(1.0, -9));
  EXPECT_EQ(Fp8ToDouble(0x08, kE4M3), std::ldexp(1.0, -6));  // smallest normal
  EXPECT_EQ(Fp8ToDouble(0x38, kE4M3), 1.0);
  EXPECT_EQ(Fp8ToDouble(0x3C, kE4M3), 1.5);
  EXPECT_EQ(Fp8ToDouble(0x7E, kE4M3), 448.0);  // largest finite
  EXPECT_EQ(Fp8ToDouble(0xFE, kE4M3), -448.0);
  EXPECT_TRUE(std::isnan(Fp8ToDouble(0x7F, kE4M3)));  // the only NaN (no infinities)
  EXPECT_TRUE(std::isnan(Fp8ToDouble(0xFF, kE4M3)));
  EXPECT_EQ(Fp8ToDouble(0x78, kE4M3), 256.0);  // exponent field 15 is a normal binade
}

TEST(Fp8Conversion, E5M2DecodesKnownBitPatterns) {
  EXPECT_EQ(Fp8ToDouble(0x01, kE5M2), std::ldexp(1.0, -16));
  EXPECT_EQ(Fp8ToDouble(0x04, kE5M2), std::ldexp(1.0, -14));
  EXPECT_EQ(Fp8ToDouble(0x3C, kE5M2), 1.0);
  EXPECT_EQ(Fp8ToDouble(0x3E, kE5M2), 1.5);
  EXPECT_EQ(Fp8ToDouble(0x7B, kE5M2), 57344.0);
  EXPECT_EQ(Fp8ToDouble(0x7C, kE5M2), std::numeric_limits<double>::infinity());
  EXPECT_EQ(Fp8ToDouble(0xFC, kE5M2), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(Fp8ToDouble(0x7D, kE5M2)));
  EXPECT_TRUE(std::isnan(Fp8ToDouble(0x7F, kE5M2)));
}

TEST(Fp8Conversion, RoundsToNearestTiesToEven) {
  EXPECT_EQ(DoubleToFp8(1.0, kE4M3), 0x38);
  EXPECT_EQ(DoubleToFp8(1.0625, kE4M3), 0x38);  // tie between 1.0 (even) and 1.125
  EXPECT_EQ(DoubleToFp8(1.0626, kE4M3), 0x39);
  EXPECT_EQ(DoubleToFp8(1.1875, kE4M3), 0x3A);  // tie between 1.125 and 1.25 (even)
  EXPECT_EQ(DoubleToFp8(std::ldexp(1.0, -10), kE4M3), 0x00);      // tie between 0 and 2^-9
  EXPECT_EQ(DoubleToFp8(3 * std::ldexp(1.0, -10), kE4M3), 0x02);  // tie 2^-9 / 2^-8 -> even
  EXPECT_EQ(DoubleToFp8(-1.0625, kE4M3), 0xB8);
  EXPECT_EQ(DoubleToFp8(1.9375, kE4M3), 0x40);  // rounds up into the next binade: 2.0
  EXPECT_EQ(DoubleToFp8(1.125, kE5M2), 0x3C);   // tie between 1.0 (even) and 1.25
  EXPECT_EQ(DoubleToFp8(1.375, kE5M2), 0x3E);   // tie between 1.25 and 1.5 (even)
  EXPECT_EQ(DoubleToFp8(std::ldexp(1.0, -17), kE5M2), 0x00);
  EXPECT_EQ(DoubleToFp8(1e-30, kE4M3), 0x00);
  EXPECT_EQ(DoubleToFp8(-1e-30, kE4M3), 0x80);
  EXPECT_EQ(QuantizeFp8(448.0 / 3, kE4M3), 144.0);  // 149.3: between 144 and 160
}

TEST(Fp8Conversion, SaturatesToTheLargestFiniteValue) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(DoubleToFp8(448.0, kE4M3), 0x7E);
  EXPECT_EQ(DoubleToFp8(464.0, kE4M3), 0x7E);  // the tie above the largest value
  EXPECT_EQ(DoubleToFp8(1e6, kE4M3), 0x7E);
  EXPECT_EQ(DoubleToFp8(inf, kE4M3), 0x7E);
  EXPECT_EQ(DoubleToFp8(-inf, kE4M3), 0xFE);
  EXPECT_EQ(DoubleToFp8(inf, kE5M2), 0x7B);
  EXPECT_EQ(DoubleToFp8(-1e9, kE5M2), 0xFB);
  EXPECT_EQ(DoubleToFp8(NAN, kE4M3) & 0x7F, 0x7F);  // NaN stays NaN
  EXPECT_TRUE(std::isnan(QuantizeFp8(NAN, kE5M2)));
}

TEST(Fp8Conversion, EveryFiniteCodeRoundTrips) {
  for (fusedattn_dtype dtype : {kE4M3, kE5M2})
    for (int code = 0; code < 256; ++code) {
      const double value = Fp8ToDouble(static_cast<uint8_t>(code), dtype);
      if (!std::isfinite(value)) continue;
      EXPECT_EQ(DoubleToFp8(value, dtype), code) << static_cast<int>(dtype) << " code " << code;
    }
}

// ---------------------------------------------------------------------------------------------
// Problems
// ---------------------------------------------------------------------------------------------
fusedattn_config Fp8Config(fusedattn_mask mask, fusedattn_dtype o_dtype, fusedattn_dtype do_dtype,
                           fusedattn_dtype dqkv_dtype) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.backend = FUSEDATTN_BACKEND_REFERENCE;
  c.is_training = 1;
  c.batch = 2, c.heads_q = 4, c.heads_kv = 2;
  c.max_seqlen_q = 9, c.max_seqlen_kv = 14;
  c.head_dim_qk = c.head_dim_v = 16;
  c.qkv_dtype = kE4M3;
  c.o_dtype = o_dtype;
  c.do_dtype = do_dtype;
  c.dqkv_dtype = dqkv_dtype;
  c.mask = mask;
  return c;
}

ProblemTensors Fp8Tensors(const fusedattn_config& c) {
  TensorOptions opt;
  opt.seed = 11;
  opt.input_range = 2.0;  // q_fp8, k_fp8, v_fp8, dO_fp8 uniform in [-2, 2], rounded to FP8
  return MakeProblemTensors(c, opt);
}

// Descales that are not 1 (powers of two: their reciprocals are exact).
Fp8Factors InputFactors() {
  Fp8Factors f;
  f.descale_q = 0.5f, f.descale_k = 0.25f, f.descale_v = 2.0f, f.descale_do = 0.125f;
  f.scale_s = 256.0f, f.descale_s = 1.0f / 256;  // p <= 1: 256 p never saturates e4m3
  return f;
}

test::Result RunForward(const fusedattn_config& c, ProblemTensors* t, Fp8Factors* f) {
  fusedattn_fwd_args a = t->fwd_args();
  testing::PointFwdArgsAt(c, f, &a);
  return test::Forward(c, a);
}

test::Result RunBackward(const fusedattn_config& c, ProblemTensors* t, Fp8Factors* f) {
  fusedattn_bwd_args a = t->bwd_args();
  testing::PointBwdArgsAt(c, f, &a);
  return test::Backward(c, a);
}

// Every element of out (BSHD, read back and multiplied by `descale`) within bound of exact, with
// the output's own rounding added: float32, or an FP8 type with its scale. Returns the largest
// error (to show that quantization is visible).
double ExpectWithinBound(const char* name, const HostTensor& out, const std::vector<double>& exact,
                         const std::vector<double>& bound, double out_scale) {
  const auto& shape = out.shape();
  const bool fp8 = testing::IsFp8(out.dtype());
  const Fp8Type out_type = RoundingOf(out.dtype());
  double max_error = 0, worst_ratio = 0;
  int64_t n = 0, failures = 0;
  for (int64_t b = 0; b < shape[0]; ++b)
    for (int64_t s = 0; s < shape[1]; ++s)
      for (int64_t h = 0; h < shape[2]; ++h)
        for (int64_t x = 0; x < shape[3]; ++x, ++n) {
          const double got = out.at({b, s, h, x}) / out_scale;
          const double want = exact[n];
          double limit = bound[n] + std::ldexp(std::fabs(want) + bound[n], -24) + 1e-12;
          if (fp8) limit += out_type.u * (std::fabs(want) + limit) + out_type.a / out_scale;
          const double error = std::fabs(got - want);
          max_error = std::max(max_error, error);
          worst_ratio = std::max(worst_ratio, error / limit);
          if (!(error <= limit) && failures++ < 5)
            ADD_FAILURE() << name << " element " << n << ": " << got << " vs exact " << want
                          << ", error " << error << " > bound " << limit;
        }
  EXPECT_EQ(failures, 0) << name;
  ::testing::Test::RecordProperty(std::string(name) + "_worst_error_over_bound",
                                  std::to_string(worst_ratio));
  return max_error;
}

double MaxAbs(const HostTensor& t) {
  double m = 0;
  for (double x : t.to_vector()) m = std::max(m, std::fabs(x));
  return m;
}

// ---------------------------------------------------------------------------------------------
// The reference by hand: S = Q8_e4m3(p * scale_s), O = sum S * descale_s * v.
// ---------------------------------------------------------------------------------------------
struct ThreeEqualKeys {
  fusedattn_config c;
  ProblemTensors t;
  ThreeEqualKeys() {
    c = FUSEDATTN_CONFIG_INIT;
    c.device = FUSEDATTN_DEVICE_CPU;
    c.backend = FUSEDATTN_BACKEND_REFERENCE;
    c.batch = c.heads_q = c.heads_kv = 1;
    c.max_seqlen_q = 1, c.max_seqlen_kv = 3;
    c.head_dim_qk = c.head_dim_v = 16;
    c.qkv_dtype = kE4M3;
    c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
    t = MakeProblemTensors(c, TensorOptions{});
    t.q.fill(0.0);  // every score 0: p = 1/3 for each key
    t.v.fill(1.0);
  }
};

TEST(Fp8Reference, QuantizesTheSoftmaxOutputWithScaleS) {
  ThreeEqualKeys p;
  Fp8Factors f;
  f.scale_s = 448.0f;         // S = 448 / 3 = 149.3 -> 144 in e4m3
  f.descale_s = 1.0f / 448;  // not exact in float: the product uses the float value
  test::Result r = RunForward(p.c, &p.t, &f);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  const double expected = 3 * 144.0 * static_cast<double>(f.descale_s);  // 0.964..., not 1
  for (int64_t x = 0; x < 16; ++x) EXPECT_FLOAT_EQ(p.t.o.at({0, 0, 0, x}), expected);
  EXPECT_FLOAT_EQ(f.amax_s, 1.0f / 3);  // before scale_s
  EXPECT_FLOAT_EQ(f.amax_o, static_cast<float>(expected));
}

TEST(Fp8Reference, SaturatesTheSoftmaxOutputAtTheLargestFiniteValue) {
  ThreeEqualKeys p;
  Fp8Factors f;
  f.scale_s = 4096.0f;  // 4096 / 3 = 1365 > 448: saturates (no inf, no NaN)
  f.descale_s = 1.0f / 4096;
  test::Result r = RunForward(p.c, &p.t, &f);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_FLOAT_EQ(p.t.o.at({0, 0, 0, 0}), 3 * 448.0f / 4096);
}

TEST(Fp8Reference, WritesAnFp8OutputWithScaleO) {
  ThreeEqualKeys p;
  p.c.o_dtype = kE4M3;
  p.t.o = HostTensor(kE4M3, p.t.o.shape());
  p.t.o.poison();
  Fp8Factors f;
  f.scale_s = 448.0f, f.descale_s = 1.0f / 448;
  f.scale_o = 100.0f;  // O = 0.964 -> 96.4 -> 96 in e4m3
  test::Result r = RunForward(p.c, &p.t, &f);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(p.t.o.at({0, 0, 0, 0}), 96.0);
  EXPECT_FLOAT_EQ(f.amax_o, static_cast<float>(3 * 144.0 * static_cast<double>(f.descale_s)));
}

// ---------------------------------------------------------------------------------------------
// The reference against float64 unquantized attention, within the derived bound.
// ---------------------------------------------------------------------------------------------
struct BoundCase {
  fusedattn_mask mask;
  fusedattn_dtype do_dtype;
};

class Fp8Bound : public ::testing::TestWithParam<BoundCase> {};

TEST_P(Fp8Bound, ForwardIsWithinTheBoundAndAmaxIsExact) {
  const fusedattn_config c =
      Fp8Config(GetParam().mask, FUSEDATTN_DTYPE_FLOAT32, GetParam().do_dtype,
                FUSEDATTN_DTYPE_FLOAT32);
  ProblemTensors t = Fp8Tensors(c);
  Fp8Factors f = InputFactors();
  test::Result r = RunForward(c, &t, &f);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  const Exact e = ExactAttention(c, t, f, false);
  const double max_error = ExpectWithinBound("O", t.o, e.o, e.o_bound, 1.0);
  EXPECT_GT(max_error, 1e-4) << "S quantization is not visible in O";
  EXPECT_FLOAT_EQ(f.amax_s, static_cast<float>(e.amax_s));
  EXPECT_EQ(f.amax_o, static_cast<float>(MaxAbs(t.o)));  // max of the float32 O written

  // The same call with O in e4m3 and a scale that keeps it within 448.
  fusedattn_config c8 = c;
  c8.o_dtype = kE4M3;
  ProblemTensors t8 = Fp8Tensors(c8);
  Fp8Factors f8 = InputFactors();
  f8.scale_o = testing::PowerOfTwoScale(f.amax_o, 448.0);
  r = RunForward(c8, &t8, &f8);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  ExpectWithinBound("O_fp8", t8.o, e.o, e.o_bound, f8.scale_o);
  EXPECT_EQ(f8.amax_o, f.amax_o);  // before scale_o: the same unrounded O
}

TEST_P(Fp8Bound, BackwardIsWithinTheBoundAndAmaxIsExact) {
  const fusedattn_config c =
      Fp8Config(GetParam().mask, FUSEDATTN_DTYPE_FLOAT32, GetParam().do_dtype,
                FUSEDATTN_DTYPE_FLOAT32);
  ProblemTensors t = Fp8Tensors(c);
  Fp8Factors f = InputFactors();
  test::Result r = RunForward(c, &t, &f);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  // dP's scale from its exact amax (the test's float64 pass reads the O and LSE just written).
  f.scale_dp = 1.0f;
  const double amax_dp = ExactAttention(c, t, f, true).amax_dp;
  f.scale_dp = testing::PowerOfTwoScale(amax_dp, MaxFinite(GetParam().do_dtype));
  f.descale_dp = 1.0f / f.scale_dp;
  const Exact e = ExactAttention(c, t, f, true);
  r = RunBackward(c, &t, &f);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  double max_error = ExpectWithinBound("dQ", t.dq, e.dq, e.dq_bound, 1.0);
  max_error = std::max(max_error, ExpectWithinBound("dK", t.dk, e.dk, e.dk_bound, 1.0));
  EXPECT_GT(max_error, 1e-5) << "dP quantization is not visible in dQ, dK";
  EXPECT_GT(ExpectWithinBound("dV", t.dv, e.dv, e.dv_bound, 1.0), 1e-5)
      << "S quantization is not visible in dV";
  EXPECT_NEAR(f.amax_dp, e.amax_dp, 1e-6 * e.amax_dp);
  EXPECT_EQ(f.amax_dq, static_cast<float>(MaxAbs(t.dq)));
  EXPECT_EQ(f.amax_dk, static_cast<float>(MaxAbs(t.dk)));
  EXPECT_EQ(f.amax_dv, static_cast<float>(MaxAbs(t.dv)));

  // dQ/dK/dV in FP8 (dO's type) with scales from those amax: the same values, rounded once more.
  fusedattn_config c8 = c;
  c8.dqkv_dtype = GetParam().do_dtype;
  ProblemTensors t8 = Fp8Tensors(c8);
  t8.o = t.o, t8.lse = t.lse;
  Fp8Factors f8 = f;
  const double top = MaxFinite(c8.dqkv_dtype);
  f8.scale_dq = testing::PowerOfTwoScale(f.amax_dq, top);
  f8.scale_dk = testing::PowerOfTwoScale(f.amax_dk, top);
  f8.scale_dv = testing::PowerOfTwoScale(f.amax_dv, top);
  r = RunBackward(c8, &t8, &f8);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  ExpectWithinBound("dQ_fp8", t8.dq, e.dq, e.dq_bound, f8.scale_dq);
  ExpectWithinBound("dK_fp8", t8.dk, e.dk, e.dk_bound, f8.scale_dk);
  ExpectWithinBound("dV_fp8", t8.dv, e.dv, e.dv_bound, f8.scale_dv);
  EXPECT_EQ(f8.amax_dq, f.amax_dq);  // before scaling
  EXPECT_EQ(f8.amax_dv, f.amax_dv);
}

INSTANTIATE_TEST_SUITE_P(
    MasksAndDoTypes, Fp8Bound,
    ::testing::Values(BoundCase{FUSEDATTN_MASK_NONE, kE4M3}, BoundCase{FUSEDATTN_MASK_NONE, kE5M2},
                      BoundCase{FUSEDATTN_MASK_CAUSAL, kE4M3},
                      BoundCase{FUSEDATTN_MASK_CAUSAL, kE5M2}),
    [](const auto& info) {
      return std::string(info.param.mask == FUSEDATTN_MASK_CAUSAL ? "Causal" : "NoMask") +
             (info.param.do_dtype == kE5M2 ? "_dO_e5m2" : "_dO_e4m3");
    });

// Dropout scales p by 1 / (1 - dropout) before amax_s and S are taken.
TEST(Fp8Reference, AmaxSIncludesTheDropoutScale) {
  ThreeEqualKeys p;
  p.c.dropout = 0.5;
  Fp8Factors f;
  f.scale_s = 128.0f, f.descale_s = 1.0f / 128;
  test::Result r = RunForward(p.c, &p.t, &f);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  // A kept key carries p' = (1/3) / (1 - 0.5) = 2/3 (this seed keeps at least one of the three);
  // its S is Q8(2/3 * 128 = 85.3) = 88, so O is a multiple of 88 / 128.
  EXPECT_FLOAT_EQ(f.amax_s, 2.0f / 3);
  const double kept = p.t.o.at({0, 0, 0, 0}) / (88.0 / 128);
  EXPECT_GE(kept, 1.0);
  EXPECT_DOUBLE_EQ(kept, std::round(kept));
}

// ---------------------------------------------------------------------------------------------
// Validation: dtypes, pointers, values.
// ---------------------------------------------------------------------------------------------
bool Mentions(const std::string& message, const std::vector<std::string>& words) {
  for (const auto& w : words)
    if (message.find(w) == std::string::npos) return false;
  return true;
}

#define EXPECT_FP8_REJECTED(result, code, ...)                                         \
  do {                                                                                 \
    const test::Result& r_ = (result);                                                 \
    EXPECT_EQ(r_.status, code) << test::StatusText(r_);                                \
    EXPECT_TRUE(Mentions(r_.message, __VA_ARGS__)) << "message: " << r_.message;       \
  } while (0)

struct ConfigCase {
  const char* name;
  std::function<void(fusedattn_config&)> change;
  std::vector<std::string> mentions;
};

class Fp8ConfigValidation : public ::testing::TestWithParam<ConfigCase> {};

TEST_P(Fp8ConfigValidation, IsRefusedWithAMessageNamingTheField) {
  fusedattn_config c = Fp8Config(FUSEDATTN_MASK_NONE, kE4M3, kE5M2, kE5M2);
  GetParam().change(c);
  fusedattn_backend backend;
  EXPECT_FP8_REJECTED(test::GetBackend(c, &backend), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                      GetParam().mentions);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Fp8ConfigValidation,
    ::testing::Values(
        ConfigCase{"QkvE5M2", [](auto& c) { c.qkv_dtype = kE5M2; },
                   {"config.qkv_dtype = fp8_e5m2", "fp8_e4m3"}},
        ConfigCase{"OE5M2", [](auto& c) { c.o_dtype = kE5M2; },
                   {"config.o_dtype = fp8_e5m2", "fp8_e4m3, bfloat16, float16 or float32"}},
        ConfigCase{"OFp8WithBf16Qkv",
                   [](auto& c) {
                     c.qkv_dtype = FUSEDATTN_DTYPE_BFLOAT16;
                     c.do_dtype = c.dqkv_dtype = FUSEDATTN_DTYPE_DEFAULT;
                   },
                   {"config.o_dtype = fp8_e4m3", "qkv_dtype = bfloat16", "FP8 attention"}},
        ConfigCase{"DoDtypeOnBf16Problem",
                   [](auto& c) {
                     c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
                     c.dqkv_dtype = FUSEDATTN_DTYPE_DEFAULT;
                     c.do_dtype = FUSEDATTN_DTYPE_FLOAT16;
                   },
                   {"config.do_dtype = float16", "o_dtype = bfloat16", "only FP8 attention"}},
        ConfigCase{"DqkvDtypeOnBf16Problem",
                   [](auto& c) {
                     c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
                     c.do_dtype = FUSEDATTN_DTYPE_DEFAULT;
                     c.dqkv_dtype = kE5M2;
                   },
                   {"config.dqkv_dtype = fp8_e5m2", "qkv_dtype = bfloat16"}},
        ConfigCase{"TrainingWithBf16OAndDefaultDo",
                   [](auto& c) {
                     c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
                     c.do_dtype = FUSEDATTN_DTYPE_DEFAULT;
                   },
                   {"config.do_dtype = bfloat16", "default", "fp8_e4m3 or fp8_e5m2"}},
        ConfigCase{"DoDtypeInt32", [](auto& c) { c.do_dtype = FUSEDATTN_DTYPE_INT32; },
                   {"config.do_dtype = int32"}},
        ConfigCase{"DqkvDtypeUnknown",
                   [](auto& c) { c.dqkv_dtype = static_cast<fusedattn_dtype>(42); },
                   {"config.dqkv_dtype = 42", "not a fusedattn_dtype"}},
        ConfigCase{"QkvDtypeDefault", [](auto& c) { c.qkv_dtype = FUSEDATTN_DTYPE_DEFAULT; },
                   {"config.qkv_dtype = -1", "only config.do_dtype and config.dqkv_dtype"}}),
    [](const auto& info) { return std::string(info.param.name); });

// A forward-only FP8 problem with a bfloat16 O needs no dO dtype.
TEST(Fp8Validation, ForwardOnlyProblemWithBf16OutputNeedsNoDoDtype) {
  fusedattn_config c = Fp8Config(FUSEDATTN_MASK_NONE, FUSEDATTN_DTYPE_BFLOAT16,
                                 FUSEDATTN_DTYPE_DEFAULT, FUSEDATTN_DTYPE_DEFAULT);
  c.is_training = 0;
  ProblemTensors t = Fp8Tensors(c);
  Fp8Factors f = InputFactors();
  test::Result r = RunForward(c, &t, &f);
  EXPECT_TRUE(r.ok()) << test::StatusText(r);
  size_t bytes = 0;
  char msg[1024];
  EXPECT_EQ(fusedattn_bwd_workspace_size(&c, &bytes, msg, sizeof msg),
            FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(Mentions(msg, {"config.do_dtype = bfloat16"})) << msg;
}

// Each FP8 pointer of the forward: NULL where required, set where not read.
struct PointerCase {
  const char* name;
  fusedattn_dtype o_dtype;
  std::function<void(fusedattn_fwd_args&)> change;
  std::vector<std::string> mentions;
};

class Fp8FwdPointers : public ::testing::TestWithParam<PointerCase> {};

TEST_P(Fp8FwdPointers, AreRefusedByName) {
  const fusedattn_config c = Fp8Config(FUSEDATTN_MASK_NONE, GetParam().o_dtype, kE4M3, kE4M3);
  ProblemTensors t = Fp8Tensors(c);
  Fp8Factors f = InputFactors();
  fusedattn_fwd_args a = t.fwd_args();
  testing::PointFwdArgsAt(c, &f, &a);
  GetParam().change(a);
  EXPECT_FP8_REJECTED(test::Forward(c, a), FUSEDATTN_ERROR_INVALID_ARGUMENT, GetParam().mentions);
  EXPECT_TRUE(test::AllPoison(t.o)) << "an output was written";
  EXPECT_EQ(f.amax_s, -1.0f);
}

float g_one = 1.0f;

INSTANTIATE_TEST_SUITE_P(
    Cases, Fp8FwdPointers,
    ::testing::Values(
        PointerCase{"DescaleQ", kE4M3, [](auto& a) { a.descale_q = nullptr; },
                    {"args.descale_q is NULL", "q = q_fp8 * descale_q"}},
        PointerCase{"DescaleK", kE4M3, [](auto& a) { a.descale_k = nullptr; },
                    {"args.descale_k is NULL"}},
        PointerCase{"DescaleV", kE4M3, [](auto& a) { a.descale_v = nullptr; },
                    {"args.descale_v is NULL"}},
        PointerCase{"DescaleS", kE4M3, [](auto& a) { a.descale_s = nullptr; },
                    {"args.descale_s is NULL"}},
        PointerCase{"ScaleS", kE4M3, [](auto& a) { a.scale_s = nullptr; },
                    {"args.scale_s is NULL"}},
        PointerCase{"ScaleO", kE4M3, [](auto& a) { a.scale_o = nullptr; },
                    {"args.scale_o is NULL", "O_fp8 = O * scale_o"}},
        PointerCase{"AmaxS", kE4M3, [](auto& a) { a.amax_s = nullptr; },
                    {"args.amax_s is NULL"}},
        PointerCase{"AmaxO", kE4M3, [](auto& a) { a.amax_o = nullptr; },
                    {"args.amax_o is NULL"}},
        PointerCase{"ScaleOWithBf16O", FUSEDATTN_DTYPE_BFLOAT16,
                    [](auto& a) { a.scale_o = &g_one; },
                    {"args.scale_o is set but not read", "o_dtype = bfloat16"}},
        PointerCase{"QTensorDtype", kE4M3, [](auto& a) { a.q.dtype = FUSEDATTN_DTYPE_BFLOAT16; },
                    {"args.q.dtype = bfloat16", "fp8_e4m3 is expected"}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Fp8Validation, ScalingPointersOnANonFp8ProblemAreRefused) {
  fusedattn_config c = Fp8Config(FUSEDATTN_MASK_NONE, FUSEDATTN_DTYPE_BFLOAT16,
                                 FUSEDATTN_DTYPE_DEFAULT, FUSEDATTN_DTYPE_DEFAULT);
  c.qkv_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  ProblemTensors t = MakeProblemTensors(c, TensorOptions{});
  fusedattn_fwd_args a = t.fwd_args();
  a.descale_k = &g_one;
  EXPECT_FP8_REJECTED(test::Forward(c, a), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                      {"args.descale_k is set", "qkv_dtype = bfloat16", "pass NULL"});
  fusedattn_bwd_args b = t.bwd_args();
  b.amax_dv = &g_one;
  EXPECT_FP8_REJECTED(test::Backward(c, b), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                      {"args.amax_dv is set", "qkv_dtype = bfloat16"});
}

TEST(Fp8Validation, EveryBackwardPointerIsRequiredOrRefusedByName) {
  const fusedattn_config c = Fp8Config(FUSEDATTN_MASK_NONE, kE4M3, kE5M2, kE5M2);
  ProblemTensors t = Fp8Tensors(c);
  Fp8Factors f = InputFactors();
  fusedattn_bwd_args base = t.bwd_args();
  testing::PointBwdArgsAt(c, &f, &base);
  const std::vector<std::pair<std::string, std::function<void(fusedattn_bwd_args&)>>> cases = {
      {"args.descale_q", [](auto& a) { a.descale_q = nullptr; }},
      {"args.descale_k", [](auto& a) { a.descale_k = nullptr; }},
      {"args.descale_v", [](auto& a) { a.descale_v = nullptr; }},
      {"args.descale_o", [](auto& a) { a.descale_o = nullptr; }},
      {"args.descale_do", [](auto& a) { a.descale_do = nullptr; }},
      {"args.descale_s", [](auto& a) { a.descale_s = nullptr; }},
      {"args.descale_dp", [](auto& a) { a.descale_dp = nullptr; }},
      {"args.scale_s", [](auto& a) { a.scale_s = nullptr; }},
      {"args.scale_dp", [](auto& a) { a.scale_dp = nullptr; }},
      {"args.scale_dq", [](auto& a) { a.scale_dq = nullptr; }},
      {"args.scale_dk", [](auto& a) { a.scale_dk = nullptr; }},
      {"args.scale_dv", [](auto& a) { a.scale_dv = nullptr; }},
      {"args.amax_dp", [](auto& a) { a.amax_dp = nullptr; }},
      {"args.amax_dq", [](auto& a) { a.amax_dq = nullptr; }},
      {"args.amax_dk", [](auto& a) { a.amax_dk = nullptr; }},
      {"args.amax_dv", [](auto& a) { a.amax_dv = nullptr; }},
  };
  for (const auto& [name, change] : cases) {
    fusedattn_bwd_args a = base;
    change(a);
    EXPECT_FP8_REJECTED(test::Backward(c, a), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                        {name + " is NULL"});
  }
  EXPECT_TRUE(test::AllPoison(t.dq) && test::AllPoison(t.dk) && test::AllPoison(t.dv));

  // Not read: descale_o with a float32 O, scale_dq with float32 gradients.
  const fusedattn_config c32 =
      Fp8Config(FUSEDATTN_MASK_NONE, FUSEDATTN_DTYPE_FLOAT32, kE5M2, FUSEDATTN_DTYPE_FLOAT32);
  ProblemTensors t32 = Fp8Tensors(c32);
  fusedattn_bwd_args a = t32.bwd_args();
  testing::PointBwdArgsAt(c32, &f, &a);
  a.descale_o = &g_one;
  EXPECT_FP8_REJECTED(test::Backward(c32, a), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                      {"args.descale_o is set but not read", "o_dtype = float32"});
  testing::PointBwdArgsAt(c32, &f, &a);
  a.scale_dq = &g_one;
  EXPECT_FP8_REJECTED(test::Backward(c32, a), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                      {"args.scale_dq is set but not read", "dqkv_dtype = float32"});
  // A dO tensor of the wrong FP8 type.
  testing::PointBwdArgsAt(c32, &f, &a);
  a.d_o.dtype = kE4M3;
  EXPECT_FP8_REJECTED(test::Backward(c32, a), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                      {"args.d_o.dtype = fp8_e4m3", "fp8_e5m2 is expected"});
}

// Scale values: NaN, inf, 0 and negative values are refused before anything is written.
class Fp8ScaleValues : public ::testing::TestWithParam<float> {};

TEST_P(Fp8ScaleValues, AreRefusedInTheForwardAndBackward) {
  const float bad = GetParam();
  const fusedattn_config c = Fp8Config(FUSEDATTN_MASK_NONE, kE4M3, kE5M2, kE5M2);
  const std::vector<std::pair<const char*, float Fp8Factors::*>> forward = {
      {"args.descale_q", &Fp8Factors::descale_q}, {"args.descale_v", &Fp8Factors::descale_v},
      {"args.descale_s", &Fp8Factors::descale_s}, {"args.scale_s", &Fp8Factors::scale_s},
      {"args.scale_o", &Fp8Factors::scale_o}};
  for (const auto& [name, field] : forward) {
    ProblemTensors t = Fp8Tensors(c);
    Fp8Factors f = InputFactors();
    f.*field = bad;
    EXPECT_FP8_REJECTED(RunForward(c, &t, &f), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                        {name, "finite and > 0"});
    EXPECT_TRUE(test::AllPoison(t.o) && test::AllPoison(t.lse)) << name;
    EXPECT_EQ(f.amax_s, -1.0f) << name;
  }
  const std::vector<std::pair<const char*, float Fp8Factors::*>> backward = {
      {"args.descale_o", &Fp8Factors::descale_o}, {"args.descale_do", &Fp8Factors::descale_do},
      {"args.descale_dp", &Fp8Factors::descale_dp}, {"args.scale_dp", &Fp8Factors::scale_dp},
      {"args.scale_dk", &Fp8Factors::scale_dk}};
  for (const auto& [name, field] : backward) {
    ProblemTensors t = Fp8Tensors(c);
    Fp8Factors f = InputFactors();
    f.*field = bad;
    EXPECT_FP8_REJECTED(RunBackward(c, &t, &f), FUSEDATTN_ERROR_INVALID_ARGUMENT,
                        {name, "finite and > 0"});
    EXPECT_TRUE(test::AllPoison(t.dq) && test::AllPoison(t.dk) && test::AllPoison(t.dv))
        << name;
    EXPECT_EQ(f.amax_dq, -1.0f) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Values, Fp8ScaleValues,
                         ::testing::Values(std::numeric_limits<float>::quiet_NaN(),
                                           std::numeric_limits<float>::infinity(), 0.0f, -0.0f,
                                           -1.0f),
                         [](const auto& info) {
                           const float v = info.param;
                           if (std::isnan(v)) return std::string("NaN");
                           if (std::isinf(v)) return std::string("Inf");
                           if (v == 0) return std::string(std::signbit(v) ? "MinusZero" : "Zero");
                           return std::string("Negative");
                         });

// Callers built before the FP8 fields pass the shorter layouts: accepted, FP8 fields unread.
TEST(Fp8Validation, EarlierStructLayoutsAreStillAccepted) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.batch = c.heads_q = c.heads_kv = 1;
  c.max_seqlen_q = c.max_seqlen_kv = 4;
  c.head_dim_qk = c.head_dim_v = 8;
  c.is_training = 1;
  ProblemTensors t = MakeProblemTensors(c, TensorOptions{});
  c.do_dtype = kE5M2;  // past struct_size: never read
  c.struct_size = offsetof(fusedattn_config, do_dtype);
  fusedattn_fwd_args a = t.fwd_args();
  a.struct_size = offsetof(fusedattn_fwd_args, descale_q);
  a.descale_q = &g_one;  // past struct_size: never read
  test::Result r = test::Forward(c, a);
  EXPECT_TRUE(r.ok()) << test::StatusText(r);
  fusedattn_bwd_args b = t.bwd_args();
  b.struct_size = offsetof(fusedattn_bwd_args, descale_q);
  b.amax_dq = &g_one;
  r = test::Backward(c, b);
  EXPECT_TRUE(r.ok()) << test::StatusText(r);
}

}  // namespace
}  // namespace fusedattn
