// Fully masked rows: a query row that sees no key has O = 0 and LSE = -inf, contributes nothing to
// any gradient (dQ = 0 for it; dK, dV, dBias, dSink get nothing from it) and produces no NaN, for
// every softmax variant (off-by-one and sink included: their extra logit does not make a row
// with no visible key a row with a defined softmax).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "brute_force.h"
#include "test_util.h"
#include "testing/tensors.h"

namespace fusedattn {
namespace {

using testing::HostTensor;
using testing::MakeProblemTensors;
using testing::ProblemTensors;
using testing::TensorOptions;

enum class Construction {
  kBottomRightWithMoreQueries,  // causal_bottom_right, sq > skv: the first sq - skv rows see
                                // nothing
  kWindowBeforeTheKeys,         // no mask, window (0, 0) bottom-right, sq > skv: same rows
  kPaddingWithoutKeys,          // padding: a sequence with no keys, and query rows past lengths
  kThdWithoutKeys,              // THD: a sequence with no keys
  kNoKeyAnywhere,               // padding: every sequence without keys
};

const char* ConstructionName(Construction c) {
  switch (c) {
    case Construction::kBottomRightWithMoreQueries: return "BottomRightWithMoreQueries";
    case Construction::kWindowBeforeTheKeys: return "WindowBeforeTheKeys";
    case Construction::kPaddingWithoutKeys: return "PaddingWithoutKeys";
    case Construction::kThdWithoutKeys: return "ThdWithoutKeys";
    case Construction::kNoKeyAnywhere: return "NoKeyAnywhere";
  }
  return "?";
}

const char* SoftmaxShort(fusedattn_softmax s) {
  switch (s) {
    case FUSEDATTN_SOFTMAX_VANILLA: return "Vanilla";
    case FUSEDATTN_SOFTMAX_OFF_BY_ONE: return "OffByOne";
    case FUSEDATTN_SOFTMAX_LEARNABLE_SINK: return "LearnableSink";
  }
  return "?";
}

struct Problem {
  fusedattn_config config;
  TensorOptions options;
};

Problem Make(Construction construction, fusedattn_softmax softmax) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.batch = 3, c.heads_q = 2, c.heads_kv = 1, c.max_seqlen_q = 6, c.max_seqlen_kv = 4;
  c.head_dim_qk = 8, c.head_dim_v = 5;
  c.is_training = 1, c.return_max_logit = 1;
  c.softmax_type = softmax;
  // Every feature that could turn an empty row into a NaN: bias with its gradient, softcap,
  // dropout.
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  c.bias_batch = 1, c.bias_heads = 2, c.bias_requires_grad = 1;
  c.softcap = 2.0;
  c.dropout = 0.2;
  TensorOptions o;
  switch (construction) {
    case Construction::kBottomRightWithMoreQueries:
      c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
      break;
    case Construction::kWindowBeforeTheKeys: c.window_left = 0, c.window_right = 0; break;
    case Construction::kPaddingWithoutKeys:
      c.mask = FUSEDATTN_MASK_PADDING;
      o.len_q = {6, 4, 2}, o.len_kv = {4, 0, 3};
      break;
    case Construction::kThdWithoutKeys:
      c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
      c.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
      o.len_q = {6, 3, 2}, o.len_kv = {4, 0, 3};
      o.thd_gaps = true;
      break;
    case Construction::kNoKeyAnywhere:
      c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
      o.len_q = {6, 1, 3}, o.len_kv = {0, 0, 0};
      break;
  }
  return {c, o};
}

using Param = std::tuple<Construction, fusedattn_softmax>;

class FullyMaskedRows : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const auto [construction, softmax] = GetParam();
    Problem p = Make(construction, softmax);
    c_ = p.config;
    t_ = MakeProblemTensors(c_, p.options);
    seqs_ = brute_force::SequencesOf(t_);
    test::Result r = test::Forward(c_, t_.fwd_args());
    ASSERT_TRUE(r.ok()) << test::StatusText(r);
    r = test::Backward(c_, t_.bwd_args());
    ASSERT_TRUE(r.ok()) << test::StatusText(r);
  }
  bool RowSeesNothing(int64_t b, int64_t i) const {
    for (int64_t j = 0; j < c_.max_seqlen_kv; ++j)
      if (brute_force::Visible(c_, i, j, seqs_[b].len_q, seqs_[b].len_kv)) return false;
    return true;
  }
  // The rows the spec writes: every row of BSHD-like tensors, the sequence's rows in THD.
  int64_t RowsQ(int64_t b) const {
    return c_.q_format == FUSEDATTN_FORMAT_THD ? seqs_[b].len_q : c_.max_seqlen_q;
  }
  double At(const HostTensor& t, fusedattn_format f, int64_t b, int64_t i, int64_t h, int64_t x,
            int64_t start) const {
    return t.at(brute_force::LogicalIndex(f, b, i, h, x, start));
  }
  fusedattn_config c_{};
  ProblemTensors t_;
  std::vector<brute_force::Sequence> seqs_;
};

TEST_P(FullyMaskedRows, HaveZeroOutputAndMinusInfinityLse) {
  int64_t masked = 0;
  for (int64_t b = 0; b < c_.batch; ++b)
    for (int64_t i = 0; i < RowsQ(b); ++i) {
      if (!RowSeesNothing(b, i)) continue;
      for (int64_t h = 0; h < c_.heads_q; ++h) {
        ++masked;
        for (int64_t x = 0; x < c_.head_dim_v; ++x)
          EXPECT_EQ(At(t_.o, c_.o_format, b, i, h, x, seqs_[b].start_q), 0.0)
              << "O[b=" << b << ", i=" << i << ", h=" << h << ", x=" << x << "]";
        EXPECT_EQ(t_.lse.at({b, h, i}), -INFINITY)
            << "LSE[b=" << b << ", h=" << h << ", i=" << i << "]";
      }
    }
  EXPECT_GT(masked, 0) << "the construction has no fully masked row";
}

TEST_P(FullyMaskedRows, HaveZeroDq) {
  for (int64_t b = 0; b < c_.batch; ++b)
    for (int64_t i = 0; i < RowsQ(b); ++i) {
      if (!RowSeesNothing(b, i)) continue;
      for (int64_t h = 0; h < c_.heads_q; ++h)
        for (int64_t x = 0; x < c_.head_dim_qk; ++x)
          EXPECT_EQ(At(t_.dq, c_.dqkv_format, b, i, h, x, seqs_[b].start_q), 0.0)
              << "dQ[b=" << b << ", i=" << i << ", h=" << h << ", x=" << x << "]";
    }
}

// The gradients of the whole problem equal the oracle's, which sums over visible entries only,
// and contain no NaN anywhere (Compare counts NaN where the oracle has a number).
TEST_P(FullyMaskedRows, ContributeNothingToAnyGradientAndNoNan) {
  const auto want = brute_force::Expected(t_, brute_force::Compute(t_, &t_.o));
  const std::string where = std::string(ConstructionName(std::get<0>(GetParam()))) + " " +
                            SoftmaxShort(std::get<1>(GetParam()));
  EXPECT_MATCHES("O", t_.o, want.o, 1e-6, where);
  EXPECT_MATCHES("dQ", t_.dq, want.dq, 2e-6, where);
  EXPECT_MATCHES("dK", t_.dk, want.dk, 2e-6, where);
  EXPECT_MATCHES("dV", t_.dv, want.dv, 2e-6, where);
  EXPECT_MATCHES("dBias", t_.dbias, want.dbias, 2e-6, where);
  if (!want.dsink.empty()) EXPECT_MATCHES("dSink", t_.dsink, want.dsink, 2e-6, where);
}

// When no row sees any key, every gradient is exactly zero and max_logit is -inf.
TEST(NoVisibleKeyAnywhere, GivesZeroGradientsAndMinusInfinityMaxLogit) {
  for (fusedattn_softmax softmax : {FUSEDATTN_SOFTMAX_VANILLA, FUSEDATTN_SOFTMAX_OFF_BY_ONE,
                                    FUSEDATTN_SOFTMAX_LEARNABLE_SINK}) {
    Problem p = Make(Construction::kNoKeyAnywhere, softmax);
    ProblemTensors t = MakeProblemTensors(p.config, p.options);
    ASSERT_TRUE(test::Forward(p.config, t.fwd_args()).ok());
    ASSERT_TRUE(test::Backward(p.config, t.bwd_args()).ok());
    const std::string name = SoftmaxShort(softmax);
    auto count_not = [](const HostTensor& t, double value) {
      int64_t n = 0;
      for (double x : t.to_vector()) n += !(x == value);
      return n;
    };
    EXPECT_EQ(count_not(t.max_logit, -INFINITY), 0) << "max_logit, " << name;
    EXPECT_EQ(count_not(t.o, 0.0), 0) << "O, " << name;
    EXPECT_EQ(count_not(t.lse, -INFINITY), 0) << "LSE, " << name;
    EXPECT_EQ(count_not(t.dq, 0.0), 0) << "dQ, " << name;
    EXPECT_EQ(count_not(t.dk, 0.0), 0) << "dK, " << name;
    EXPECT_EQ(count_not(t.dv, 0.0), 0) << "dV, " << name;
    EXPECT_EQ(count_not(t.dbias, 0.0), 0) << "dBias, " << name;
    if (!t.dsink.empty()) EXPECT_EQ(count_not(t.dsink, 0.0), 0) << "dSink, " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FullyMaskedRows,
    ::testing::Combine(::testing::Values(Construction::kBottomRightWithMoreQueries,
                                         Construction::kWindowBeforeTheKeys,
                                         Construction::kPaddingWithoutKeys,
                                         Construction::kThdWithoutKeys,
                                         Construction::kNoKeyAnywhere),
                       ::testing::Values(FUSEDATTN_SOFTMAX_VANILLA, FUSEDATTN_SOFTMAX_OFF_BY_ONE,
                                         FUSEDATTN_SOFTMAX_LEARNABLE_SINK)),
    [](const auto& info) {
      return std::string(ConstructionName(std::get<0>(info.param))) + "_" +
             SoftmaxShort(std::get<1>(info.param));
    });

}  // namespace
}  // namespace fusedattn
