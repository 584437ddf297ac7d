// Small examples worked out by hand from the text of fusedattn.h, through the public API: which
// keys each query sees under every mask and window (written out as pictures), and the numbers of
// the score pipeline (pre/post-scale bias, softcap, ALiBi) and of the softmax variants.
//
// The brute-force oracle encodes the same reading of the spec; these examples pin that reading to
// the spec's words with values a reader can check on paper.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "brute_force.h"
#include "test_util.h"
#include "testing/tensors.h"

namespace fusedattn {
namespace {

using testing::HostTensor;
using testing::MakeProblemTensors;
using testing::ProblemTensors;
using testing::TensorOptions;

// ---------------------------------------------------------------------------------------------
// Visibility pictures. With q = 0 every visible score is 0, and with V one-hot (v[j, x] = 1 when
// x = j) O[i, j] > 0 exactly when query i sees key j. Row i of a picture is query i; '1' marks a
// visible key. One sequence (batch 1) unless lengths are given.
// ---------------------------------------------------------------------------------------------
std::vector<std::string> Visibility(fusedattn_mask mask, int64_t sq, int64_t skv,
                                    int64_t window_left = -1, int64_t window_right = -1,
                                    std::vector<int32_t> len_q = {},
                                    std::vector<int32_t> len_kv = {}) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.batch = len_q.empty() ? 1 : static_cast<int64_t>(len_q.size());
  c.heads_q = c.heads_kv = 1;
  c.max_seqlen_q = sq, c.max_seqlen_kv = skv;
  c.head_dim_qk = 1, c.head_dim_v = skv;
  c.mask = mask;
  c.window_left = window_left, c.window_right = window_right;
  TensorOptions o;
  o.len_q = len_q, o.len_kv = len_kv;
  ProblemTensors t = MakeProblemTensors(c, o);
  t.q.fill(0.0);
  t.v.fill(0.0);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t j = 0; j < skv; ++j) t.v.set(t.v.offset_of({b, j, 0, j}), 1.0);
  test::Result r = test::Forward(c, t.fwd_args());
  EXPECT_TRUE(r.ok()) << test::StatusText(r);
  std::vector<std::string> picture;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < sq; ++i) {
      std::string row;
      for (int64_t j = 0; j < skv; ++j) row += t.o.at({b, i, 0, j}) > 0 ? '1' : '0';
      picture.push_back(row);
    }
  return picture;
}

using Picture = std::vector<std::string>;

// CAUSAL aligns the diagonal to the top left: d = i.
TEST(MaskPicture, CausalIsTopLeft) {
  EXPECT_EQ(Visibility(FUSEDATTN_MASK_CAUSAL, 3, 5), (Picture{"10000",  //
                                                              "11000",  //
                                                              "11100"}));
}

// CAUSAL_BOTTOM_RIGHT aligns it to the end of the keys: d = i + sk - sq.
TEST(MaskPicture, CausalBottomRightWithMoreKeysSeesThePrefix) {
  EXPECT_EQ(Visibility(FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT, 3, 5), (Picture{"11100",  //
                                                                           "11110",  //
                                                                           "11111"}));
}

// With more queries than keys the first sq - sk rows see nothing (fully masked rows).
TEST(MaskPicture, CausalBottomRightWithMoreQueriesMasksTheFirstRows) {
  EXPECT_EQ(Visibility(FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT, 5, 3), (Picture{"000",  //
                                                                           "000",  //
                                                                           "100",  //
                                                                           "110",  //
                                                                           "111"}));
}

// Top-left causal with more queries than keys: the last rows see every key.
TEST(MaskPicture, CausalWithMoreQueriesSeesEverythingInTheLastRows) {
  EXPECT_EQ(Visibility(FUSEDATTN_MASK_CAUSAL, 5, 3), (Picture{"100",  //
                                                              "110",  //
                                                              "111",  //
                                                              "111",  //
                                                              "111"}));
}

// A window without a causal mask is aligned bottom-right: keys j in [d - left, d + right].
TEST(MaskPicture, WindowWithoutCausalIsBottomRight) {
  EXPECT_EQ(Visibility(FUSEDATTN_MASK_NONE, 3, 5, /*left=*/1, /*right=*/0), (Picture{"01100",  //
                                                                                     "00110",  //
                                                                                     "00011"}));
}

TEST(MaskPicture, WindowRightOnlyWithoutCausal) {
  EXPECT_EQ(Visibility(FUSEDATTN_MASK_NONE, 3, 5, /*left=*/-1, /*right=*/1), (Picture{"11110",  //
                                                                                      "11111",  //
                                                                                      "11111"}));
}

// A window on a top-left causal mask keeps the top-left diagonal.
TEST(MaskPicture, CausalWithLeftWindowIsABandOnTheTopLeftDiagonal) {
  EXPECT_EQ(Visibility(FUSEDATTN_MASK_CAUSAL, 4, 5, /*left=*/1), (Picture{"10000",  //
                                                                          "11000",  //
                                                                          "01100",  //
                                                                          "00110"}));
}

// window_right = 0 on a causal mask means the same as -1.
TEST(MaskPicture, CausalWithWindowRightZeroIsCausal) {
  EXPECT_EQ(Visibility(FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT, 3, 5, -1, 0),
            Visibility(FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT, 3, 5, -1, -1));
}

// Padding masks take each sequence's own lengths; rows past the length see nothing, and
// bottom-right alignment uses the sequence's lengths, not the maxima.
TEST(MaskPicture, PaddingUsesEachSequencesLengths) {
  EXPECT_EQ(Visibility(FUSEDATTN_MASK_PADDING, 3, 5, -1, -1, {3, 2}, {5, 3}),
            (Picture{"11111", "11111", "11111",     // sequence 0: 3 x 5
                     "11100", "11100", "00000"}));  // sequence 1: 2 x 3
}

TEST(MaskPicture, PaddingCausalIsTopLeftPerSequence) {
  EXPECT_EQ(Visibility(FUSEDATTN_MASK_PADDING_CAUSAL, 3, 5, -1, -1, {3, 2}, {5, 4}),
            (Picture{"10000", "11000", "11100",  //
                     "10000", "11000", "00000"}));
}

TEST(MaskPicture, PaddingCausalBottomRightAlignsToEachSequencesEnd) {
  EXPECT_EQ(Visibility(FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT, 3, 5, -1, -1, {3, 2}, {5, 4}),
            (Picture{"11100", "11110", "11111",  //
                     "11100", "11110", "00000"}));
}

// ---------------------------------------------------------------------------------------------
// Numbers. One query, one head, head_dim_qk = 1 so q.k is a product; V one-hot so O is the
// probability vector.
// ---------------------------------------------------------------------------------------------
struct Tiny {
  fusedattn_config config;
  ProblemTensors t;
};

// q = [q0], k = [k_j], V one-hot; bias tensor (when used) of shape [1, 1, 1, skv].
Tiny MakeTiny(double q0, const std::vector<double>& keys, fusedattn_config c) {
  c.device = FUSEDATTN_DEVICE_CPU;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.batch = 1, c.heads_q = c.heads_kv = 1, c.max_seqlen_q = 1;
  c.max_seqlen_kv = static_cast<int64_t>(keys.size());
  c.head_dim_qk = 1, c.head_dim_v = c.max_seqlen_kv;
  c.return_lse = 1, c.return_max_logit = 1;
  Tiny tiny{c, MakeProblemTensors(c, {})};
  tiny.t.q.set(0, q0);
  tiny.t.v.fill(0.0);
  for (size_t j = 0; j < keys.size(); ++j) {
    tiny.t.k.set(static_cast<int64_t>(j), keys[j]);
    tiny.t.v.set(tiny.t.v.offset_of({0, static_cast<int64_t>(j), 0, static_cast<int64_t>(j)}), 1.0);
  }
  return tiny;
}

// Runs the forward and checks O (= p), LSE and max_logit against the hand-computed values.
void ExpectSoftmax(Tiny& tiny, const std::vector<double>& p, double lse, double max_logit) {
  test::Result r = test::Forward(tiny.config, tiny.t.fwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  for (size_t j = 0; j < p.size(); ++j)
    EXPECT_NEAR(tiny.t.o.at({0, 0, 0, static_cast<int64_t>(j)}), p[j], 1e-6) << "p_" << j;
  EXPECT_NEAR(tiny.t.lse.at({0, 0, 0}), lse, 1e-6) << "LSE";
  EXPECT_NEAR(tiny.t.max_logit.at({0}), max_logit, 1e-6) << "max_logit";
}

// Scores s = (1, 0): p = (e, 1) / (e + 1), LSE = log(e + 1).
TEST(SoftmaxExample, Vanilla) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.attn_scale = 1.0;
  Tiny tiny = MakeTiny(1.0, {1.0, 0.0}, c);
  const double e = std::exp(1.0);
  ExpectSoftmax(tiny, {e / (e + 1), 1 / (e + 1)}, std::log(e + 1), 1.0);
}

// An extra logit fixed at 0 joins the denominator: p = (e, 1) / (e + 1 + 1).
TEST(SoftmaxExample, OffByOne) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.attn_scale = 1.0;
  c.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE;
  Tiny tiny = MakeTiny(1.0, {1.0, 0.0}, c);
  const double e = std::exp(1.0);
  ExpectSoftmax(tiny, {e / (e + 2), 1 / (e + 2)}, std::log(e + 2), 1.0);
}

// The head's sink logit joins the denominator: p = (e, 1) / (e^sink + e + 1).
TEST(SoftmaxExample, LearnableSink) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.attn_scale = 1.0;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  Tiny tiny = MakeTiny(1.0, {1.0, 0.0}, c);
  tiny.t.sink_logits.set(0, 0.5);
  const double e = std::exp(1.0), d = std::exp(0.5) + e + 1;
  ExpectSoftmax(tiny, {e / d, 1 / d}, std::log(d), 1.0);
}

// attn_scale = 0 means 1 / sqrt(head_dim_qk); with head_dim_qk = 1 that is 1, so use q.k = 4 and
// head_dim_qk = 4 instead: q = k_0 = (1, 1, 1, 1), k_1 = 0, scale 1/2 gives s = (2, 0).
TEST(ScoreExample, DefaultScaleIsOneOverSqrtHeadDim) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.batch = c.heads_q = c.heads_kv = c.max_seqlen_q = 1;
  c.max_seqlen_kv = 2, c.head_dim_qk = 4, c.head_dim_v = 2, c.return_lse = 1;
  ProblemTensors t = MakeProblemTensors(c, {});
  t.q.fill(1.0);
  t.k.fill(0.0);
  for (int64_t x = 0; x < 4; ++x) t.k.set(t.k.offset_of({0, 0, 0, x}), 1.0);
  t.v.fill(0.0);
  t.v.set(t.v.offset_of({0, 0, 0, 0}), 1.0), t.v.set(t.v.offset_of({0, 1, 0, 1}), 1.0);
  ASSERT_TRUE(test::Forward(c, t.fwd_args()).ok());
  const double e2 = std::exp(2.0);
  EXPECT_NEAR(t.o.at({0, 0, 0, 0}), e2 / (e2 + 1), 1e-6);
  EXPECT_NEAR(t.lse.at({0, 0, 0}), std::log(e2 + 1), 1e-6);
}

// Pre-scale bias is added before the scale, post-scale after: with scale 1/2, q.k = (1, 0) and
// bias (1, 0): pre gives s = (1/2 (1 + 1), 0) = (1, 0), post gives s = (1/2 + 1, 0) = (1.5, 0).
TEST(ScoreExample, PreScaleBiasIsScaledAndPostScaleBiasIsNot) {
  for (fusedattn_bias bias : {FUSEDATTN_BIAS_PRE_SCALE, FUSEDATTN_BIAS_POST_SCALE}) {
    fusedattn_config c = FUSEDATTN_CONFIG_INIT;
    c.attn_scale = 0.5;
    c.bias_type = bias;
    Tiny tiny = MakeTiny(1.0, {1.0, 0.0}, c);
    tiny.t.bias.set(tiny.t.bias.offset_of({0, 0, 0, 0}), 1.0);
    tiny.t.bias.set(tiny.t.bias.offset_of({0, 0, 0, 1}), 0.0);
    const double s0 = bias == FUSEDATTN_BIAS_PRE_SCALE ? 1.0 : 1.5, e = std::exp(s0);
    SCOPED_TRACE(bias == FUSEDATTN_BIAS_PRE_SCALE ? "pre_scale" : "post_scale");
    ExpectSoftmax(tiny, {e / (e + 1), 1 / (e + 1)}, std::log(e + 1), s0);
  }
}

// Softcap bends the scaled score (pre-scale bias included) and post-scale bias is added after:
// s = 2 tanh((q.k + pre) / 2) + post; here q.k = 3, pre = 1, post = 0.25, scale 1, softcap 2.
TEST(ScoreExample, SoftcapAppliesBetweenPreAndPostScaleBias) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.attn_scale = 1.0;
  c.softcap = 2.0;
  c.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
  Tiny pre = MakeTiny(3.0, {1.0, 0.0}, c);
  pre.t.bias.set(0, 1.0), pre.t.bias.set(1, 0.0);
  const double s_pre = 2 * std::tanh(4.0 / 2), e_pre = std::exp(s_pre);
  ExpectSoftmax(pre, {e_pre / (e_pre + 1), 1 / (e_pre + 1)}, std::log(e_pre + 1), s_pre);

  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  Tiny post = MakeTiny(3.0, {1.0, 0.0}, c);
  post.t.bias.set(0, 0.25), post.t.bias.set(1, 0.0);
  const double s_post = 2 * std::tanh(3.0 / 2) + 0.25, e_post = std::exp(s_post);
  ExpectSoftmax(post, {e_post / (e_post + 1), 1 / (e_post + 1)}, std::log(e_post + 1), s_post);
}

// ALiBi subtracts slope * |i + sk - sq - j|: for the one query (i = 0) of a sequence with 3 keys
// the distances are (2, 1, 0), so with q = 0 and slope 0.5 the scores are (-1, -0.5, 0); max_logit
// is the largest final score, after ALiBi.
TEST(ScoreExample, AlibiPenalizesTheDistanceFromTheBottomRightDiagonal) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.bias_type = FUSEDATTN_BIAS_ALIBI;
  Tiny tiny = MakeTiny(0.0, {1.0, 1.0, 1.0}, c);
  tiny.t.alibi_slopes.set(0, 0.5);
  const double a = std::exp(-1.0), b = std::exp(-0.5), d = a + b + 1;
  ExpectSoftmax(tiny, {a / d, b / d, 1 / d}, std::log(d), 0.0);
}

// The extra logit of off-by-one / sink does not count for max_logit, which is over visible keys.
TEST(ScoreExample, MaxLogitIgnoresTheSinkLogit) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.attn_scale = 1.0;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  Tiny tiny = MakeTiny(1.0, {-1.0, -2.0}, c);
  tiny.t.sink_logits.set(0, 3.0);
  const double a = std::exp(-1.0), b = std::exp(-2.0), d = std::exp(3.0) + a + b;
  ExpectSoftmax(tiny, {a / d, b / d}, std::log(d), -1.0);
}

}  // namespace
}  // namespace fusedattn
