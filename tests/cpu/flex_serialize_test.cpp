// The text form of score-modifier graphs (fusedattn_score_mod_serialize / _deserialize): a round
// trip gives an equal graph (equal hash, equal description), and malformed text is refused with
// the line named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "fusedattn/score_mod.hpp"

namespace fusedattn {
namespace {

void ExpectRoundTrip(const ScoreMod& mod) {
  std::string text = mod.serialize();
  ScoreMod back = ScoreMod::deserialize(text);
  EXPECT_TRUE(back.equals(mod)) << text;
  EXPECT_EQ(back.hash(), mod.hash());
  EXPECT_EQ(back.describe(), mod.describe());
  EXPECT_EQ(back.serialize(), text) << "the text of the copy differs";
}

TEST(FlexSerialize, SoftCapRoundTrips) {
  ScoreMod mod;
  mod.set_score(tanh(mod.score() / 30.0) * 30.0).finalize();
  ExpectRoundTrip(mod);
}

TEST(FlexSerialize, MaskWithBottomRightIndexAndTensorsRoundTrips) {
  ScoreMod mod;
  Expr doc_q = mod.tensor("doc ids (query side)", FUSEDATTN_DTYPE_INT32,
                          FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_Q);
  Expr bias = mod.tensor("bias\nwith a newline", FUSEDATTN_DTYPE_BFLOAT16,
                         FUSEDATTN_SCORE_MOD_AXIS_HEAD, /*requires_grad=*/true);
  mod.set_score(mod.score() + bias);
  mod.set_mask((mod.q_idx_br() >= mod.kv_idx()) && eq(doc_q, 3.0));
  mod.finalize();
  ExpectRoundTrip(mod);
}

TEST(FlexSerialize, ExplicitGradientsRoundTrip) {
  ScoreMod mod;
  Expr t = mod.tensor("slope", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_HEAD, true);
  Expr s = mod.score();
  mod.set_score(s * t);
  mod.set_gradient(s, t);
  mod.set_gradient(t, s);
  mod.finalize();
  ExpectRoundTrip(mod);
  EXPECT_NE(mod.describe().find("(given)"), std::string::npos) << mod.describe();
}

TEST(FlexSerialize, ConstantsKeepEveryBit) {
  ScoreMod mod;
  double nan_with_payload;
  uint64_t bits = 0x7FF8000000000123ull;
  std::memcpy(&nan_with_payload, &bits, 8);
  Expr e = mod.score() * std::nextafter(1.0, 2.0) + mod.constant(-0.0);
  e = select(e > mod.constant(nan_with_payload), e,
             mod.constant(-std::numeric_limits<double>::infinity()));
  mod.set_score(e).finalize();
  ExpectRoundTrip(mod);
}

TEST(FlexSerialize, DifferentGraphsHaveDifferentTexts) {
  ScoreMod a, b;
  a.set_score(a.score() * 2.0).finalize();
  b.set_score(b.score() * 3.0).finalize();
  EXPECT_NE(a.serialize(), b.serialize());
}

TEST(FlexSerialize, AGraphNotFinalizedIsRefused) {
  ScoreMod mod;
  mod.set_score(mod.score() * 2.0);
  EXPECT_THROW(mod.serialize(), Error);
}

TEST(FlexSerialize, MalformedTextNamesTheLine) {
  ScoreMod mod;
  mod.set_score(mod.score() * 2.0).finalize();
  std::string good = mod.serialize();
  struct Case {
    std::string text, mention;
  } cases[] = {
      {"", "header"},
      {"something else\n", "header"},
      {"fusedattn_score_mod 1\ninput 0\nop mul 0 7\nscore 1\n", "item 3"},
      {"fusedattn_score_mod 1\ninput 0\nop frobnicate 0 0\n", "unknown operation"},
      {"fusedattn_score_mod 1\ninput 99\n", "input"},
      {"fusedattn_score_mod 1\nconst 1x2\n", "const"},
      {"fusedattn_score_mod 1\ninput 0\nscore 0 extra\n", "unexpected words"},
      {"fusedattn_score_mod 1\ntensor 1 2 0 zz\n", "tensor"},
      {"fusedattn_score_mod 1\ninput 0\n", "no output"},
  };
  for (const Case& c : cases) {
    try {
      ScoreMod::deserialize(c.text);
      ADD_FAILURE() << "accepted: " << c.text;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), FUSEDATTN_ERROR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find(c.mention), std::string::npos)
          << "'" << c.mention << "' not in: " << e.what();
    }
  }
  EXPECT_NO_THROW(ScoreMod::deserialize(good));
}

TEST(FlexSerialize, TheCApiSizesTheBufferAndRefusesAShortOne) {
  ScoreMod mod;
  mod.set_score(mod.score() * 2.0).finalize();
  size_t needed = 0;
  ASSERT_EQ(fusedattn_score_mod_serialize(mod.get(), nullptr, 0, &needed), FUSEDATTN_SUCCESS);
  ASSERT_GT(needed, 1u);
  std::string short_buffer(needed - 1, 'x');
  EXPECT_EQ(fusedattn_score_mod_serialize(mod.get(), short_buffer.data(), short_buffer.size(),
                                          nullptr),
            FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(short_buffer, std::string(needed - 1, 'x')) << "wrote into a short buffer";
  fusedattn_score_mod* out = reinterpret_cast<fusedattn_score_mod*>(&needed);
  EXPECT_EQ(fusedattn_score_mod_deserialize(nullptr, &out, nullptr, 0),
            FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
}

}  // namespace
}  // namespace fusedattn
