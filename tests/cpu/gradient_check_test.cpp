// The reference's backward against central finite differences of its own forward: the gradient of
// the scalar loss L = sum(O * dO) with respect to every element of q, k, v, the bias (pre- and
// post-scale, broadcast or not) and the sink logits, under softcap, ALiBi and dropout (the mask is
// fixed by seed and offset, so L stays a smooth function of the inputs).
//
// This checks the analytic formulas themselves, which the brute-force comparison cannot: the
// oracle and the reference were derived from the same calculus.
//
// Inputs are float32 multiples of 2^-10 in [-1.5, 1.5], so x +- eps with eps = 2^-7 is exact.
// The loss is summed in double from float32 O; its rounding noise (~1e-6) over 2 eps gives
// ~5e-5 of absolute noise, the truncation error eps^2 f'''/6 is ~1e-5: a correct gradient shows
// a relative error of about 1e-5 to 3e-5 here, so 5e-4 leaves a wide margin and is still far
// below what a wrong term gives (a missing softcap derivative, scale or sink term is an O(10%)
// error).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/status.h"
#include "test_util.h"
#include "testing/tensors.h"

namespace fusedattn {
namespace {

using testing::HostTensor;
using testing::MakeProblemTensors;
using testing::ProblemTensors;
using testing::TensorOptions;

constexpr double kEps = 1.0 / 128;
constexpr double kTolerance = 5e-4;

struct GradientCase {
  std::string name;
  fusedattn_config config;
  TensorOptions options;
};

fusedattn_config BaseConfig() {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.is_training = 1;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.batch = 2, c.heads_q = 4, c.heads_kv = 2;
  c.max_seqlen_q = 5, c.max_seqlen_kv = 6, c.head_dim_qk = 4, c.head_dim_v = 3;
  return c;
}

std::vector<GradientCase> Cases() {
  std::vector<GradientCase> cases;
  {
    GradientCase k{"PreScaleBiasSoftcapCausalGqa", BaseConfig(), {}};
    k.config.mask = FUSEDATTN_MASK_CAUSAL;
    k.config.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
    k.config.bias_batch = 1, k.config.bias_heads = 4, k.config.bias_requires_grad = 1;
    k.config.softcap = 1.0;
    cases.push_back(k);
  }
  {
    GradientCase k{"PostScaleBiasOffByOneWindowDropout", BaseConfig(), {}};
    k.config.heads_kv = 1;
    k.config.window_left = 2, k.config.window_right = 1;
    k.config.bias_type = FUSEDATTN_BIAS_POST_SCALE;
    k.config.bias_batch = 2, k.config.bias_heads = 1, k.config.bias_requires_grad = 1;
    k.config.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE;
    k.config.dropout = 0.3;
    k.config.attn_scale = 0.8;
    cases.push_back(k);
  }
  {
    GradientCase k{"AlibiSinkSoftcapThdBottomRight", BaseConfig(), {}};
    auto& c = k.config;
    c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
    c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
    c.bias_type = FUSEDATTN_BIAS_ALIBI;
    c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    c.softcap = 2.0;
    k.options.thd_gaps = true;
    k.options.len_q = {5, 3}, k.options.len_kv = {4, 6};
    cases.push_back(k);
  }
  {
    GradientCase k{"SinkDropoutPaddingFullBias", BaseConfig(), {}};
    auto& c = k.config;
    c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_BHSD;
    c.mask = FUSEDATTN_MASK_PADDING;
    c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
    c.bias_batch = 2, c.bias_heads = 4, c.bias_requires_grad = 1;
    c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    c.dropout = 0.2;
    k.options.len_q = {5, 2}, k.options.len_kv = {6, 3};
    cases.push_back(k);
  }
  {
    GradientCase k{"PreScaleBiasSinkSoftcapDropoutSlidingWindow", BaseConfig(), {}};
    auto& c = k.config;
    c.heads_kv = 4;
    c.max_seqlen_q = 6, c.max_seqlen_kv = 4;
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    c.window_left = 1;
    c.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
    c.bias_batch = 1, c.bias_heads = 1, c.bias_requires_grad = 1;
    c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    c.softcap = 1.25;
    c.dropout = 0.4;
    cases.push_back(k);
  }
  for (auto& k : cases) k.options.input_range = 1.5;
  return cases;
}

// Rounds every storage element to a multiple of 2^-10 so that +-eps perturbations are exact.
void Quantize(HostTensor& t) {
  for (int64_t i = 0; i < t.storage_elements(); ++i)
    t.set(i, std::round(t.get(i) * 1024.0) / 1024.0);
}

// L = sum(O * dO) over the elements the forward writes. O and dO share one layout here.
double Loss(const fusedattn_config& c, ProblemTensors& t) {
  test::Result r = test::Forward(c, t.fwd_args());
  EXPECT_TRUE(r.ok()) << test::StatusText(r);
  double loss = 0;
  for (int64_t i = 0; i < t.o.storage_elements(); ++i)
    if (!t.o.is_poison(i)) loss += t.o.get(i) * t.d_o.get(i);
  return loss;
}

struct Agreement {
  double rel_error = 0;
  double worst_abs = 0;
  int64_t worst_index = -1;
  double worst_fd = 0, worst_analytic = 0;
  int64_t checked = 0;
  int64_t unwritten_nonzero = 0;  // elements the backward leaves untouched but L depends on
};

// Central differences of L over every element of `input`, against `gradient` (same layout).
Agreement CheckGradient(const fusedattn_config& c, ProblemTensors& t, HostTensor& input,
                        const HostTensor& gradient) {
  Agreement a;
  double diff2 = 0, ref2 = 0;
  for (int64_t i = 0; i < input.storage_elements(); ++i) {
    const double x = input.get(i);
    input.set(i, x + kEps);
    const double plus = Loss(c, t);
    input.set(i, x - kEps);
    const double minus = Loss(c, t);
    input.set(i, x);
    const double fd = (plus - minus) / (2 * kEps);
    if (gradient.is_poison(i)) {
      // Not written by the backward (THD tokens outside every sequence): L must not depend on it.
      if (std::fabs(fd) > 1e-4) ++a.unwritten_nonzero;
      continue;
    }
    const double g = gradient.get(i);
    diff2 += (fd - g) * (fd - g);
    ref2 += g * g;
    ++a.checked;
    if (std::fabs(fd - g) > a.worst_abs)
      a.worst_abs = std::fabs(fd - g), a.worst_index = i, a.worst_fd = fd, a.worst_analytic = g;
  }
  a.rel_error = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return a;
}

std::string Describe(const Agreement& a) {
  return Format(
      "rel_error=%.3g over %lld elements; worst element %lld: finite difference %.6g, "
      "backward %.6g; %lld untouched elements that L depends on",
      a.rel_error, (long long)a.checked, (long long)a.worst_index, a.worst_fd, a.worst_analytic,
      (long long)a.unwritten_nonzero);
}

enum class Input { kQ, kK, kV, kBias, kSink };

const char* GradientName(Input x) {
  switch (x) {
    case Input::kQ: return "dQ";
    case Input::kK: return "dK";
    case Input::kV: return "dV";
    case Input::kBias: return "dBias";
    case Input::kSink: return "dSink";
  }
  return "?";
}

struct GradientCheck {
  GradientCase problem;
  Input input;
};

// Every case checks q, k and v, and the bias and sink logits where it has them.
std::vector<GradientCheck> Checks() {
  std::vector<GradientCheck> checks;
  for (const GradientCase& k : Cases()) {
    for (Input x : {Input::kQ, Input::kK, Input::kV}) checks.push_back({k, x});
    if (k.config.bias_requires_grad) checks.push_back({k, Input::kBias});
    if (k.config.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK)
      checks.push_back({k, Input::kSink});
  }
  return checks;
}

class BackwardMatchesFiniteDifferences : public ::testing::TestWithParam<GradientCheck> {};

TEST_P(BackwardMatchesFiniteDifferences, OfSumOTimesDo) {
  const GradientCase& k = GetParam().problem;
  const fusedattn_config c = k.config;
  ProblemTensors t = MakeProblemTensors(c, k.options);
  for (HostTensor* x : {&t.q, &t.k, &t.v, &t.d_o, &t.bias, &t.sink_logits})
    if (!x->empty()) Quantize(*x);
  ASSERT_EQ(t.o.strides(), t.d_o.strides()) << "the loss needs O and dO in one layout";
  test::Result r = test::Forward(c, t.fwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  r = test::Backward(c, t.bwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r);

  HostTensor* input = nullptr;
  const HostTensor* gradient = nullptr;
  switch (GetParam().input) {
    case Input::kQ: input = &t.q, gradient = &t.dq; break;
    case Input::kK: input = &t.k, gradient = &t.dk; break;
    case Input::kV: input = &t.v, gradient = &t.dv; break;
    case Input::kBias: input = &t.bias, gradient = &t.dbias; break;
    case Input::kSink: input = &t.sink_logits, gradient = &t.dsink; break;
  }
  const char* name = GradientName(GetParam().input);
  Agreement a = CheckGradient(c, t, *input, *gradient);
  EXPECT_GT(a.checked, 0) << name;
  EXPECT_LE(a.rel_error, kTolerance) << name << " in " << k.name << ": " << Describe(a);
  EXPECT_EQ(a.unwritten_nonzero, 0) << name << " in " << k.name << ": " << Describe(a);
  std::printf("[ fd ] %s %s: %s\n", k.name.c_str(), name, Describe(a).c_str());
}

INSTANTIATE_TEST_SUITE_P(Cases, BackwardMatchesFiniteDifferences, ::testing::ValuesIn(Checks()),
                         [](const auto& info) {
                           return info.param.problem.name + "_" + GradientName(info.param.input);
                         });

}  // namespace
}  // namespace fusedattn
