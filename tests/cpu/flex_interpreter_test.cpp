// The CPU interpreter of score modifiers: the value of every operation as fusedattn.h defines it,
// the inputs, and tensor reads with broadcasting over the axes a tensor leaves out.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "flex_test_util.h"

namespace fusedattn {
namespace {

using flex_test::At;
using flex_test::Internal;
using flex_test::Outputs;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The score output of f(s) at s.
template <typename F>
double ScoreOf(F&& f, double s) {
  ScoreMod mod;
  mod.set_score(f(mod, mod.score())).finalize();
  return Outputs(Internal(mod)->forward(), At(s)).score;
}

TEST(FlexInterpreter, UnaryOperations) {
  EXPECT_EQ(ScoreOf([](ScoreMod&, Expr s) { return -s; }, 2.5), -2.5);
  EXPECT_EQ(ScoreOf([](ScoreMod&, Expr s) { return abs(s); }, -2.5), 2.5);
  EXPECT_DOUBLE_EQ(ScoreOf([](ScoreMod&, Expr s) { return exp(s); }, 1.5), std::exp(1.5));
  EXPECT_DOUBLE_EQ(ScoreOf([](ScoreMod&, Expr s) { return log(s); }, 1.5), std::log(1.5));
  EXPECT_DOUBLE_EQ(ScoreOf([](ScoreMod&, Expr s) { return tanh(s); }, 0.7), std::tanh(0.7));
  EXPECT_DOUBLE_EQ(ScoreOf([](ScoreMod&, Expr s) { return sigmoid(s); }, 0.7),
                   1.0 / (1.0 + std::exp(-0.7)));
  EXPECT_EQ(ScoreOf([](ScoreMod&, Expr s) { return sigmoid(s); }, -kInf), 0.0);
}

TEST(FlexInterpreter, BinaryArithmetic) {
  EXPECT_EQ(ScoreOf([](ScoreMod&, Expr s) { return s + 2.0; }, 3.0), 5.0);
  EXPECT_EQ(ScoreOf([](ScoreMod&, Expr s) { return 2.0 - s; }, 3.0), -1.0);
  EXPECT_EQ(ScoreOf([](ScoreMod&, Expr s) { return s * 2.0; }, 3.0), 6.0);
  EXPECT_EQ(ScoreOf([](ScoreMod&, Expr s) { return s / 2.0; }, 3.0), 1.5);
}

TEST(FlexInterpreter, MinAndMaxPropagateNaNAndOtherwiseCompare) {
  auto min2 = [](ScoreMod&, Expr s) { return min(s, 2.0); };
  auto max2 = [](ScoreMod&, Expr s) { return max(s, 2.0); };
  EXPECT_EQ(ScoreOf(min2, 3.0), 2.0);
  EXPECT_EQ(ScoreOf(min2, -kInf), -kInf);
  EXPECT_TRUE(std::isnan(ScoreOf(min2, kNaN)));
  EXPECT_EQ(ScoreOf(max2, 3.0), 3.0);
  EXPECT_TRUE(std::isnan(ScoreOf(max2, kNaN)));
}

// Comparisons, logic and select, through select(cond, 1, 0).
TEST(FlexInterpreter, ComparisonsLogicAndSelect) {
  auto truth = [](auto cond) {
    return [cond](ScoreMod& m, Expr s) { return select(cond(m, s), 1.0, 0.0); };
  };
  EXPECT_EQ(ScoreOf(truth([](ScoreMod&, Expr s) { return s < 1.0; }), 0.5), 1.0);
  EXPECT_EQ(ScoreOf(truth([](ScoreMod&, Expr s) { return s <= 1.0; }), 1.0), 1.0);
  EXPECT_EQ(ScoreOf(truth([](ScoreMod&, Expr s) { return s > 1.0; }), 1.0), 0.0);
  EXPECT_EQ(ScoreOf(truth([](ScoreMod&, Expr s) { return s >= 1.0; }), 1.0), 1.0);
  EXPECT_EQ(ScoreOf(truth([](ScoreMod&, Expr s) { return eq(s, 1.0); }), 1.0), 1.0);
  EXPECT_EQ(ScoreOf(truth([](ScoreMod&, Expr s) { return ne(s, 1.0); }), 1.0), 0.0);
  // NaN compares false, except !=.
  EXPECT_EQ(ScoreOf(truth([](ScoreMod&, Expr s) { return s < 1.0 || s >= 1.0; }), kNaN), 0.0);
  EXPECT_EQ(ScoreOf(truth([](ScoreMod&, Expr s) { return ne(s, s); }), kNaN), 1.0);
  EXPECT_EQ(ScoreOf(truth([](ScoreMod&, Expr s) { return s > 0.0 && s < 1.0; }), 0.5), 1.0);
  EXPECT_EQ(ScoreOf(truth([](ScoreMod&, Expr s) { return !(s > 0.0); }), 0.5), 0.0);
}

TEST(FlexInterpreter, InputsAreTheIndicesAndTheSequenceLengths) {
  ScoreMod mod;
  // A number that encodes every input in its own decimal digits.
  mod.set_score(mod.batch() * 1e6 + mod.head() * 1e5 + mod.q_idx() * 1e4 + mod.kv_idx() * 1e3 +
                mod.seqlen_q() * 1e2 + mod.seqlen_kv() * 10.0 + mod.score());
  mod.finalize();
  flex::Point p;
  p.batch = 1, p.head = 2, p.q_idx = 3, p.kv_idx = 4, p.seqlen_q = 5, p.seqlen_kv = 6;
  p.score = 7;
  EXPECT_EQ(Outputs(Internal(mod)->forward(), p).score, 1234567.0);
}

TEST(FlexInterpreter, TensorsAreReadAtTheirAxesAndBroadcastOverTheOthers) {
  ScoreMod mod;
  // doc: int32 [batch, q]; scale: float32 [head]; the score is doc(b, i) * 10 + scale(h).
  Expr doc = mod.tensor("doc", FUSEDATTN_DTYPE_INT32,
                        FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_Q);
  Expr scale = mod.tensor("scale", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_HEAD);
  mod.set_score(doc * 10.0 + scale).finalize();
  std::vector<int32_t> doc_data = {1, 2, 3, 4, 5, 6};  // [2, 3]
  std::vector<float> scale_data = {0.25f, 0.5f};       // [2]
  std::vector<flex::TensorRead> reads(2);
  reads[0].data = doc_data.data(), reads[0].dtype = FUSEDATTN_DTYPE_INT32;
  reads[0].stride_b = 3, reads[0].stride_q = 1;
  reads[1].data = scale_data.data(), reads[1].dtype = FUSEDATTN_DTYPE_FLOAT32;
  reads[1].stride_h = 1;
  flex::Point p;
  p.batch = 1, p.head = 1, p.q_idx = 2, p.kv_idx = 9;  // kv_idx is broadcast over
  EXPECT_EQ(Outputs(Internal(mod)->forward(), p, reads).score, 60.5);
  p.batch = 0, p.head = 0, p.q_idx = 1;
  EXPECT_EQ(Outputs(Internal(mod)->forward(), p, reads).score, 20.25);
}

TEST(FlexInterpreter, TheMaskOutputDecidesVisibility) {
  ScoreMod mod;
  mod.set_mask(mod.q_idx() >= mod.kv_idx()).finalize();
  EXPECT_TRUE(Outputs(Internal(mod)->forward(), At(0.0, 3, 3)).visible);
  EXPECT_FALSE(Outputs(Internal(mod)->forward(), At(0.0, 3, 4)).visible);
  EXPECT_EQ(Outputs(Internal(mod)->forward(), At(1.25, 3, 3)).score, 1.25);  // s unchanged
}

}  // namespace
}  // namespace fusedattn
