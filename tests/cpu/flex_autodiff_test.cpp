// The automatic backward of score modifiers: the derived d score / d s and d score / d tensor
// against central finite differences of the forward, against hand-written derivatives, its
// simplification (written out as text), and its safety through select.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flex/autodiff.h"
#include "flex_test_util.h"

namespace fusedattn {
namespace {

using flex_test::At;
using flex_test::Internal;
using flex_test::Outputs;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The text after "<label>: " on its line of describe().
std::string Line(const ScoreMod& mod, const std::string& label) {
  std::string text = mod.describe();
  size_t start = text.find(label + ": ");
  if (start == std::string::npos) return "<no " + label + " in: " + text + ">";
  start += label.size() + 2;
  return text.substr(start, text.find('\n', start) - start);
}

std::string DerivedDs(const std::function<Expr(ScoreMod&, Expr)>& f) {
  ScoreMod mod;
  mod.set_score(f(mod, mod.score())).finalize();
  return Line(mod, "d score/d s");
}

// ---------------------------------------------------------------------------------------------
// What the derivative is, written out: simplified, sharing the forward's nodes.
// ---------------------------------------------------------------------------------------------

TEST(FlexAutodiff, DerivativesOfSimpleModifiersAreSimplified) {
  EXPECT_EQ(DerivedDs([](ScoreMod&, Expr s) { return s * 2.0; }), "2 (derived)");
  EXPECT_EQ(DerivedDs([](ScoreMod& m, Expr s) { return s + (m.q_idx() - m.kv_idx()); }),
            "1 (derived)");
  EXPECT_EQ(DerivedDs([](ScoreMod& m, Expr s) { return s * m.head() + 1.0; }),
            "head (derived)");
  EXPECT_EQ(DerivedDs([](ScoreMod&, Expr s) { return -s; }), "-1 (derived)");
  EXPECT_EQ(DerivedDs([](ScoreMod& m, Expr) { return m.q_idx() * 0.5; }), "0 (derived)");
  EXPECT_EQ(DerivedDs([](ScoreMod&, Expr s) { return exp(s); }), "exp(s) (derived)");
}

TEST(FlexAutodiff, TanhSoftCapDerivativeReusesTheForwardTanh) {
  EXPECT_EQ(DerivedDs([](ScoreMod&, Expr s) { return 30.0 * tanh(s / 30.0); }),
            "mul(30, mul(0.033333333333333333, sub(1, mul(tanh(div(s, 30)), tanh(div(s, 30)))))) "
            "(derived)");
  ScoreMod mod;
  Expr t = tanh(mod.score() / 30.0);
  mod.set_score(30.0 * t).finalize();
  // Forward: s, 30, div, tanh, 30 * tanh (30 is one node). The backward adds the constants 1
  // and 1/30 (folded from d(s/30)), tanh * tanh, 1 - that, the two products, and nothing of the
  // forward twice.
  auto internal = Internal(mod);
  EXPECT_EQ(internal->forward().nodes.size(), 5u);
  EXPECT_EQ(internal->backward().nodes.size(), 11u);
}

TEST(FlexAutodiff, AMaskOnlyModifierHasTheIdentityDerivative) {
  ScoreMod mod;
  mod.set_mask(mod.q_idx() >= mod.kv_idx()).finalize();
  EXPECT_EQ(Line(mod, "d score/d s"), "1 (derived)");
}

TEST(FlexAutodiff, SelectPassesTheGradientToTheBranchTakenOnly) {
  EXPECT_EQ(DerivedDs([](ScoreMod& m, Expr s) { return select(m.q_idx() >= m.kv_idx(), s, -kInf); }),
            "select(ge(q_idx, kv_idx), 1, 0) (derived)");
  EXPECT_EQ(DerivedDs([](ScoreMod&, Expr s) { return min(s, 5.0); }),
            "select(lt(5, s), 0, 1) (derived)");
  EXPECT_EQ(DerivedDs([](ScoreMod&, Expr s) { return max(s, 5.0); }),
            "select(gt(5, s), 0, 1) (derived)");
}

// The branch not taken may be NaN or inf (log of a non-positive number, its derivative 1/0):
// none of it reaches the derivative.
TEST(FlexAutodiff, TheBranchNotTakenCannotPoisonTheDerivative) {
  ScoreMod mod;
  Expr s = mod.score();
  mod.set_score(select(s > 0.0, log(s), s)).finalize();
  auto backward = Internal(mod)->backward();
  for (double at : {0.0, -1.0, -kInf}) {
    auto v = Outputs(backward, At(at));
    EXPECT_EQ(v.d_score, 1.0) << "at s = " << at;
  }
  EXPECT_DOUBLE_EQ(Outputs(backward, At(4.0)).d_score, 0.25);
}

// x * 0 becomes 0 only where x is known to be finite: an index is, a float tensor may be inf.
TEST(FlexAutodiff, TimesZeroIsDroppedOnlyWhereItIsSafe) {
  EXPECT_EQ(DerivedDs([](ScoreMod& m, Expr s) { return s * m.q_idx() * 0.0; }), "0 (derived)");
  ScoreMod mod;
  Expr t = mod.tensor("t", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_Q);
  mod.set_score(mod.score() * t * 0.0).finalize();
  EXPECT_EQ(Line(mod, "d score/d s"), "mul(t, 0) (derived)");
}

TEST(FlexAutodiff, TheSimplifierFoldsConstantsAndIdentities) {
  flex::Graph graph;
  flex::Simplifier simplify(&graph);
  flex::Node leaf;
  leaf.op = flex::Op::kInput;
  leaf.slot = FUSEDATTN_SCORE_MOD_SCORE;
  const int32_t s = graph.Intern(leaf);
  leaf.slot = FUSEDATTN_SCORE_MOD_Q_IDX;
  const int32_t q = graph.Intern(leaf);
  const int32_t zero = simplify.Constant(0.0), one = simplify.Constant(1.0);
  const int32_t two = simplify.Constant(2.0);
  using flex::Op;
  EXPECT_EQ(simplify.Apply(Op::kAdd, s, zero), s);
  EXPECT_EQ(simplify.Apply(Op::kAdd, zero, s), s);
  EXPECT_EQ(simplify.Apply(Op::kSub, s, zero), s);
  EXPECT_EQ(simplify.Apply(Op::kMul, one, s), s);
  EXPECT_EQ(simplify.Apply(Op::kDiv, s, one), s);
  EXPECT_EQ(simplify.Apply(Op::kNeg, simplify.Apply(Op::kNeg, s)), s);
  EXPECT_EQ(simplify.Apply(Op::kMul, q, zero), zero);
  EXPECT_NE(simplify.Apply(Op::kMul, s, zero), zero);  // s may be inf: inf * 0 is NaN
  EXPECT_EQ(simplify.Apply(Op::kExp, zero), one);
  EXPECT_EQ(simplify.Apply(Op::kAdd, one, one), two);
  const int32_t yes = simplify.Apply(Op::kLt, one, two);  // folds to the boolean true
  EXPECT_EQ(graph.node(yes).op, Op::kConstant);
  EXPECT_EQ(simplify.Apply(Op::kSelect, yes, s, q), s);
  EXPECT_EQ(simplify.Apply(Op::kSelect, simplify.Apply(Op::kGt, one, two), s, q), q);
  EXPECT_EQ(simplify.Apply(Op::kSelect, simplify.Apply(Op::kGt, s, q), s, s), s);
}

// ---------------------------------------------------------------------------------------------
// Numbers: derived derivatives against central differences on random inputs
// ---------------------------------------------------------------------------------------------

struct Modifier {
  const char* name;
  std::function<Expr(ScoreMod&, Expr s, Expr t)> score;  // t: a float32 tensor [q, kv]
};

std::vector<Modifier> Modifiers() {
  return {
      {"TanhSoftCap", [](ScoreMod&, Expr s, Expr) { return 5.0 * tanh(s / 5.0); }},
      {"RelativeBias", [](ScoreMod& m, Expr s, Expr) { return s + 0.1 * (m.q_idx() - m.kv_idx()); }},
      {"Sigmoid", [](ScoreMod&, Expr s, Expr t) { return s * sigmoid(t * s); }},
      {"ExpLog", [](ScoreMod&, Expr s, Expr t) { return log(exp(s) + t * t + 1.0); }},
      {"Quotient", [](ScoreMod&, Expr s, Expr t) { return (s * t + 2.0) / (s * s + 1.0); }},
      {"AbsMinMax",
       [](ScoreMod&, Expr s, Expr t) { return max(abs(s - t), 0.5) + min(s * t, 1.0); }},
      {"SelectByIndex",
       [](ScoreMod& m, Expr s, Expr t) {
         return select(m.q_idx() >= m.kv_idx(), s * t, tanh(s) - t);
       }},
      {"TensorBias", [](ScoreMod&, Expr s, Expr t) { return s + t; }},
      {"SharedSubexpression",
       [](ScoreMod&, Expr s, Expr t) {
         Expr u = tanh(s * t);
         return u * u + u * s;
       }},
  };
}

void PrintTo(const Modifier& m, std::ostream* os) { *os << m.name; }

class FlexDerivative : public ::testing::TestWithParam<Modifier> {};

TEST_P(FlexDerivative, MatchesCentralDifferences) {
  const Modifier& m = GetParam();
  ScoreMod mod;
  Expr t = mod.tensor("t", FUSEDATTN_DTYPE_FLOAT32,
                      FUSEDATTN_SCORE_MOD_AXIS_Q | FUSEDATTN_SCORE_MOD_AXIS_KV, true);
  mod.set_score(m.score(mod, mod.score(), t)).finalize();
  auto internal = Internal(mod);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> uniform(-2.0, 2.0);
  std::uniform_int_distribution<int> index(0, 3);
  // t is read at (q, kv) of a 4 x 4 tensor; its elements are multiples of 2^-8 so that t +- h
  // with h = 2^-12 is exact in float32.
  std::vector<float> tensor(16);
  std::vector<flex::TensorRead> reads(1);
  reads[0].data = tensor.data(), reads[0].dtype = FUSEDATTN_DTYPE_FLOAT32;
  reads[0].stride_q = 4, reads[0].stride_kv = 1;
  for (int sample = 0; sample < 50; ++sample) {
    for (float& x : tensor) x = static_cast<float>(std::round(uniform(rng) * 256) / 256);
    flex::Point p = At(uniform(rng), index(rng), index(rng));
    auto value = [&](double s) { return Outputs(internal->forward(), At(s, p.q_idx, p.kv_idx), reads).score; };
    const double h = 1e-5;
    double fd_s = (value(p.score + h) - value(p.score - h)) / (2 * h);
    float& element = tensor[static_cast<size_t>(p.q_idx * 4 + p.kv_idx)];
    const float original = element, ht = 1.0f / 4096;
    element = original + ht;
    double up = value(p.score);
    element = original - ht;
    double down = value(p.score);
    element = original;
    double fd_t = (up - down) / (2.0 * ht);
    auto derived = Outputs(internal->backward(), p, reads);
    auto tolerance = [](double fd) { return 1e-5 * std::max(1.0, std::fabs(fd)); };
    EXPECT_NEAR(derived.d_score, fd_s, tolerance(fd_s))
        << m.name << " d/ds at s=" << p.score << " i=" << p.q_idx << " j=" << p.kv_idx;
    EXPECT_NEAR(derived.d_tensor[0], fd_t, tolerance(fd_t))
        << m.name << " d/dt at s=" << p.score << " t=" << original << " i=" << p.q_idx
        << " j=" << p.kv_idx;
  }
}

INSTANTIATE_TEST_SUITE_P(Modifiers, FlexDerivative, ::testing::ValuesIn(Modifiers()),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------------------------
// Hand-written backward graphs: used when given, and equal to the derived ones
// ---------------------------------------------------------------------------------------------

// The derived and the explicit program agree on random points: every output of `backward()`
// (which uses the explicit gradients) against `derived()`.
void ExpectExplicitMatchesDerived(const ScoreMod& mod, const char* what) {
  auto internal = Internal(mod);
  ASSERT_TRUE(internal->has_explicit_gradient()) << what;
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> uniform(-3.0, 3.0);
  std::vector<float> tensor(8);
  for (float& x : tensor) x = static_cast<float>(uniform(rng));
  std::vector<flex::TensorRead> reads(1);
  reads[0].data = tensor.data(), reads[0].dtype = FUSEDATTN_DTYPE_FLOAT32;
  reads[0].stride_h = 1;
  for (int sample = 0; sample < 100; ++sample) {
    flex::Point p = At(uniform(rng), sample % 7, sample % 5);
    p.head = sample % 8;
    auto given = Outputs(internal->backward(), p, reads);
    auto derived = Outputs(internal->derived(), p, reads);
    EXPECT_NEAR(given.d_score, derived.d_score, 1e-12 * std::max(1.0, std::fabs(derived.d_score)))
        << what << " d/ds at s=" << p.score;
    for (size_t k = 0; k < derived.d_tensor.size(); ++k)
      if (!std::isnan(derived.d_tensor[k]))
        EXPECT_NEAR(given.d_tensor[k], derived.d_tensor[k],
                    1e-12 * std::max(1.0, std::fabs(derived.d_tensor[k])))
            << what << " d/dtensor" << k << " at s=" << p.score;
  }
}

TEST(FlexExplicitBackward, SoftCapWrittenByHandEqualsTheDerivedOne) {
  ScoreMod mod;
  Expr s = mod.score();
  Expr t = tanh(s / 20.0);
  mod.set_score(20.0 * t);
  mod.set_gradient(s, 1.0 - t * t);  // d/ds 20 tanh(s/20) = 1 - tanh^2(s/20)
  mod.finalize();
  EXPECT_EQ(Line(mod, "d score/d s"), "sub(1, mul(tanh(div(s, 20)), tanh(div(s, 20)))) (given)");
  ExpectExplicitMatchesDerived(mod, "softcap");
}

TEST(FlexExplicitBackward, PerHeadTemperatureWrittenByHandEqualsTheDerivedOne) {
  ScoreMod mod;
  Expr s = mod.score();
  Expr temperature =
      mod.tensor("temperature", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_HEAD, true);
  Expr e = exp(temperature);
  mod.set_score(s * e);
  mod.set_gradient(s, e);          // d/ds s e^t = e^t
  mod.set_gradient(temperature, s * e);  // d/dt s e^t = s e^t
  mod.finalize();
  ExpectExplicitMatchesDerived(mod, "temperature");
}

TEST(FlexExplicitBackward, ADifferentHandWrittenDerivativeIsUsedAsGiven) {
  // A deliberately different "derivative" (a straight-through estimator for a hard clamp): the
  // backward program uses it, so it differs from the derived one.
  ScoreMod mod;
  Expr s = mod.score();
  mod.set_score(min(max(s, -1.0), 1.0));
  mod.set_gradient(s, mod.constant(1.0));
  mod.finalize();
  auto internal = Internal(mod);
  EXPECT_EQ(Outputs(internal->backward(), At(3.0)).d_score, 1.0);
  EXPECT_EQ(Outputs(internal->derived(), At(3.0)).d_score, 0.0);
}

}  // namespace
}  // namespace fusedattn
