// Score-modifier graphs through the public API (fusedattn_score_mod_* and score_mod.hpp):
// building, types, hash-consing, outputs, finalization, and the messages of every refusal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "fusedattn/score_mod.hpp"

namespace fusedattn {
namespace {

// Expects `body` to throw fusedattn::Error whose message contains every one of `mentions`.
template <typename Body>
void ExpectError(Body&& body, std::initializer_list<const char*> mentions) {
  try {
    body();
    ADD_FAILURE() << "no error; expected one mentioning " << *mentions.begin();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), FUSEDATTN_ERROR_INVALID_ARGUMENT) << e.what();
    for (const char* m : mentions)
      EXPECT_NE(std::string(e.what()).find(m), std::string::npos)
          << "message lacks '" << m << "': " << e.what();
  }
}

// The first line of describe() after "score: ".
std::string ScoreText(const ScoreMod& mod) {
  std::string text = mod.describe();
  size_t start = text.find("score: ") + 7;
  return text.substr(start, text.find('\n', start) - start);
}

TEST(FlexGraph, BuildingTheSameExpressionTwiceGivesTheSameNode) {
  ScoreMod mod;
  Expr a = tanh(mod.score() / 30.0) * 30.0;
  Expr b = tanh(mod.score() / 30.0) * 30.0;
  EXPECT_EQ(a.id(), b.id());
  EXPECT_EQ(mod.q_idx().id(), mod.q_idx().id());
  EXPECT_EQ(mod.constant(2.5).id(), mod.constant(2.5).id());
}

TEST(FlexGraph, OperandOrderMakesDifferentNodes) {
  ScoreMod mod;
  EXPECT_NE((mod.q_idx() - mod.kv_idx()).id(), (mod.kv_idx() - mod.q_idx()).id());
  EXPECT_NE((mod.q_idx() + mod.kv_idx()).id(), (mod.kv_idx() + mod.q_idx()).id());
}

TEST(FlexGraph, ConstantsAreDistinctBitForBit) {
  ScoreMod mod;
  const double one_ulp_up = std::nextafter(1.0, 2.0);
  EXPECT_NE(mod.constant(0.0).id(), mod.constant(-0.0).id());
  EXPECT_NE(mod.constant(1.0).id(), mod.constant(one_ulp_up).id());
  double nan_a, nan_b;
  uint64_t bits_a = 0x7FF8000000000001ull, bits_b = 0x7FF8000000000002ull;
  std::memcpy(&nan_a, &bits_a, 8);
  std::memcpy(&nan_b, &bits_b, 8);
  EXPECT_NE(mod.constant(nan_a).id(), mod.constant(nan_b).id());
  EXPECT_EQ(mod.constant(nan_a).id(), mod.constant(nan_a).id());
}

TEST(FlexGraph, BottomRightQueryIndexIsBuiltFromTheLengths) {
  ScoreMod mod;
  EXPECT_EQ(mod.q_idx_br().id(), (mod.q_idx() + (mod.seqlen_kv() - mod.seqlen_q())).id());
  mod.set_score(mod.score() + mod.q_idx_br()).finalize();
  EXPECT_EQ(ScoreText(mod), "add(s, add(q_idx, sub(seqlen_kv, seqlen_q)))");
}

TEST(FlexGraph, DescribeShowsOutputsAndTensors) {
  ScoreMod mod;
  Expr bias = mod.tensor("rel_bias", FUSEDATTN_DTYPE_BFLOAT16,
                         FUSEDATTN_SCORE_MOD_AXIS_HEAD | FUSEDATTN_SCORE_MOD_AXIS_Q |
                             FUSEDATTN_SCORE_MOD_AXIS_KV,
                         true);
  mod.set_score(mod.score() + bias);
  mod.set_mask(mod.q_idx() >= mod.kv_idx());
  mod.finalize();
  std::string text = mod.describe();
  EXPECT_NE(text.find("score: add(s, rel_bias)"), std::string::npos) << text;
  EXPECT_NE(text.find("mask: ge(q_idx, kv_idx)"), std::string::npos) << text;
  EXPECT_NE(text.find("tensor rel_bias: bfloat16 [head, q, kv] requires_grad"), std::string::npos)
      << text;
}

// ---------------------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------------------

TEST(FlexGraph, ArithmeticOnABooleanIsRefused) {
  ScoreMod mod;
  Expr causal = mod.q_idx() >= mod.kv_idx();
  ExpectError([&] { (void)(causal * 2.0); }, {"mul", "operand 0 is a boolean", "select(c, 1, 0)"});
}

TEST(FlexGraph, LogicOnNumbersIsRefused) {
  ScoreMod mod;
  ExpectError([&] { (void)(mod.q_idx() && mod.kv_idx()); },
              {"and", "operand 0 is a number but a boolean is expected"});
}

TEST(FlexGraph, SelectNeedsABooleanConditionAndBranchesOfOneType) {
  ScoreMod mod;
  ExpectError([&] { (void)select(mod.q_idx(), mod.score(), 0.0); },
              {"select", "operand 0 is a number"});
  Expr causal = mod.q_idx() >= mod.kv_idx();
  ExpectError([&] { (void)select(causal, causal, mod.score()); },
              {"select", "branches are a boolean and a number"});
}

TEST(FlexGraph, EqualityComparesTwoValuesOfOneType) {
  ScoreMod mod;
  Expr causal = mod.q_idx() >= mod.kv_idx();
  ExpectError([&] { (void)eq(causal, mod.q_idx()); }, {"eq", "a boolean and a number"});
  EXPECT_GE(eq(causal, causal).id(), 0);
}

// ---------------------------------------------------------------------------------------------
// The C API's argument checks
// ---------------------------------------------------------------------------------------------

struct CGraph {
  fusedattn_score_mod* g = nullptr;
  char msg[1024] = "";
  CGraph() { EXPECT_EQ(fusedattn_score_mod_create(&g), FUSEDATTN_SUCCESS); }
  ~CGraph() { fusedattn_score_mod_destroy(g); }
  int32_t Input(fusedattn_score_mod_variable which) {
    int32_t id = -1;
    EXPECT_EQ(fusedattn_score_mod_input(g, which, &id, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
    return id;
  }
};

TEST(FlexGraphApi, AnOperandThatIsNotANodeIsNamed) {
  CGraph c;
  int32_t s = c.Input(FUSEDATTN_SCORE_MOD_SCORE);
  int32_t operands[2] = {s, 42};
  int32_t id = -1;
  EXPECT_EQ(fusedattn_score_mod_op(c.g, FUSEDATTN_SCORE_MOD_ADD, 2, operands, &id, c.msg,
                                   sizeof c.msg),
            FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(c.msg).find("add: operand 1 = 42 is not a node of this graph"),
            std::string::npos)
      << c.msg;
}

TEST(FlexGraphApi, TheNumberOfOperandsMustMatchTheOp) {
  CGraph c;
  int32_t s = c.Input(FUSEDATTN_SCORE_MOD_SCORE);
  int32_t id = -1;
  EXPECT_EQ(fusedattn_score_mod_op(c.g, FUSEDATTN_SCORE_MOD_TANH, 2, &s, &id, c.msg, sizeof c.msg),
            FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(c.msg).find("tanh takes 1 operand but num_operands = 2"),
            std::string::npos)
      << c.msg;
}

TEST(FlexGraphApi, UnknownOpsAndInputsAreRefused) {
  CGraph c;
  int32_t s = c.Input(FUSEDATTN_SCORE_MOD_SCORE);
  int32_t id = -1;
  EXPECT_EQ(fusedattn_score_mod_op(c.g, static_cast<fusedattn_score_mod_opcode>(99), 1, &s, &id,
                                   c.msg, sizeof c.msg),
            FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(c.msg).find("op = 99 is not a fusedattn_score_mod_opcode"), std::string::npos)
      << c.msg;
  EXPECT_EQ(fusedattn_score_mod_input(c.g, static_cast<fusedattn_score_mod_variable>(8), &id, c.msg,
                                      sizeof c.msg),
            FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(c.msg).find("input = 8"), std::string::npos) << c.msg;
}

TEST(FlexGraphApi, NullArgumentsAreRefused) {
  int32_t id = -1;
  char msg[256];
  EXPECT_EQ(fusedattn_score_mod_create(nullptr), FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(fusedattn_score_mod_constant(nullptr, 1.0, &id, msg, sizeof msg),
            FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("graph is NULL"), std::string::npos) << msg;
  CGraph c;
  EXPECT_EQ(fusedattn_score_mod_constant(c.g, 1.0, nullptr, msg, sizeof msg),
            FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("node (the output pointer) is NULL"), std::string::npos) << msg;
  fusedattn_score_mod_destroy(nullptr);  // allowed
}

TEST(FlexGraph, TensorDeclarationsAreChecked) {
  ScoreMod mod;
  mod.tensor("doc", FUSEDATTN_DTYPE_INT32,
             FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_Q);
  ExpectError([&] { mod.tensor("doc", FUSEDATTN_DTYPE_INT32, FUSEDATTN_SCORE_MOD_AXIS_Q); },
              {"tensor 'doc' is declared twice"});
  ExpectError([&] { mod.tensor("", FUSEDATTN_DTYPE_FLOAT32, 0); }, {"tensor name is empty"});
  ExpectError([&] { mod.tensor("x", FUSEDATTN_DTYPE_FP8_E4M3, 0); },
              {"tensor 'x': dtype = 3", "float32, float16, bfloat16 or int32"});
  ExpectError([&] { mod.tensor("x", FUSEDATTN_DTYPE_FLOAT32, 0x10); }, {"tensor 'x': axes = 0x10"});
  ExpectError([&] { mod.tensor("x", FUSEDATTN_DTYPE_INT32, FUSEDATTN_SCORE_MOD_AXIS_Q, true); },
              {"tensor 'x': requires_grad = 1", "int32"});
}

// ---------------------------------------------------------------------------------------------
// Outputs and finalization
// ---------------------------------------------------------------------------------------------

TEST(FlexGraph, TheScoreIsANumberAndTheMaskABoolean) {
  ScoreMod mod;
  ExpectError([&] { mod.set_score(mod.q_idx() >= mod.kv_idx()); },
              {"fusedattn_score_mod_set_score", "is a boolean", "select(c, s, -inf)"});
  ExpectError([&] { mod.set_mask(mod.q_idx() - mod.kv_idx()); },
              {"fusedattn_score_mod_set_mask", "is a number but the mask is a boolean"});
}

TEST(FlexGraph, TheMaskMayNotReadTheScore) {
  ScoreMod mod;
  ExpectError([&] { mod.set_mask(mod.score() > 0.0 && mod.q_idx() >= mod.kv_idx()); },
              {"reads the score s", "only on the indices"});
}

TEST(FlexGraph, GradientsAreTakenWithRespectToTheScoreOrATensorThatRequiresOne) {
  ScoreMod mod;
  Expr s = mod.score();
  Expr fixed = mod.tensor("fixed", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_HEAD);
  ExpectError([&] { mod.set_gradient(mod.q_idx(), s); },
              {"wrt = node", "q_idx", "with respect to the score s or a tensor"});
  ExpectError([&] { mod.set_gradient(fixed, s); }, {"tensor 'fixed'", "requires_grad = 0"});
  ExpectError([&] { mod.set_gradient(s, s > 0.0); }, {"is a boolean but a derivative is a number"});
}

TEST(FlexGraph, AGraphWithoutOutputsCannotBeFinalized) {
  ScoreMod mod;
  (void)(mod.score() * 2.0);
  ExpectError([&] { mod.finalize(); }, {"fusedattn_score_mod_finalize", "has no output"});
}

TEST(FlexGraph, AFinalizedGraphNoLongerChanges) {
  ScoreMod mod;
  Expr s = mod.score();
  mod.set_score(s * 2.0).finalize();
  ExpectError([&] { (void)(s + 1.0); }, {"is finalized and can no longer change"});
  ExpectError([&] { mod.set_score(s); }, {"is finalized"});
  ExpectError([&] { mod.finalize(); }, {"is finalized"});
}

TEST(FlexGraph, OnlyFinalizedGraphsHaveAnIdentity) {
  ScoreMod a, b;
  a.set_score(a.score() * 2.0);
  b.set_score(b.score() * 2.0).finalize();
  uint64_t hash[2];
  EXPECT_EQ(fusedattn_score_mod_hash(a.get(), hash), FUSEDATTN_ERROR_INVALID_ARGUMENT);
  int32_t equal = 7;
  EXPECT_EQ(fusedattn_score_mod_equal(a.get(), b.get(), &equal), FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(equal, 7);
}

TEST(FlexGraph, ExpressionsOfDifferentGraphsDoNotMix) {
  ScoreMod a, b;
  ExpectError([&] { (void)(a.score() + b.score()); }, {"different graphs"});
  ExpectError([&] { a.set_score(b.score()); }, {"belongs to another graph"});
}

TEST(FlexGraph, ExpressionsSurviveMovingTheirGraph) {
  ScoreMod a;
  Expr s = a.score();
  ScoreMod b = std::move(a);
  b.set_score(s * 2.0).finalize();
  EXPECT_EQ(ScoreText(b), "mul(s, 2)");
}

}  // namespace
}  // namespace fusedattn
