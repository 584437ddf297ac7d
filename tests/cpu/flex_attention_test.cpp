// Score modifiers on the reference backend, forward and backward, each against the built-in
// feature it expresses (run on the same inputs): causal masks by index comparison, tanh soft-cap,
// a relative-position bias, ALiBi, a post-scale bias from a tensor, document masking from
// per-token document ids (against THD sequences), sliding windows by mask_mod. Then the whole
// backward with a learnable tensor against finite differences, and the fully masked rows a
// mask_mod or a score of -inf makes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fusedattn/score_mod.hpp"
#include "test_util.h"
#include "testing/tensors.h"

namespace fusedattn {
namespace {

using testing::HostTensor;
using testing::MakeProblemTensors;
using testing::ProblemTensors;
using testing::TensorOptions;

constexpr double kInf = std::numeric_limits<double>::infinity();
// Both runs compute in double and round once to float32: they may differ by a rounding.
constexpr double kSameTolerance = 1e-6;

constexpr uint32_t kB = FUSEDATTN_SCORE_MOD_AXIS_BATCH, kH = FUSEDATTN_SCORE_MOD_AXIS_HEAD,
                   kQ = FUSEDATTN_SCORE_MOD_AXIS_Q, kKV = FUSEDATTN_SCORE_MOD_AXIS_KV;

fusedattn_config BaseConfig() {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.is_training = 1;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.batch = 2, c.heads_q = 4, c.heads_kv = 2;
  c.max_seqlen_q = 6, c.max_seqlen_kv = 7, c.head_dim_qk = 8, c.head_dim_v = 5;
  c.return_max_logit = 1;
  return c;
}

// The score_mod side of a run: the graph and its tensors (gradients empty where not asked).
struct Flex {
  ScoreMod mod;
  std::vector<HostTensor> tensors, grads;
  // Adds a tensor of the graph: its declaration and its data.
  Expr Tensor(const std::string& name, HostTensor data, uint32_t axes, bool requires_grad = false) {
    Expr e = mod.tensor(name, data.dtype(), axes, requires_grad);
    HostTensor grad;
    if (requires_grad) {
      grad = HostTensor(data.dtype(), data.shape());
      grad.poison();
    }
    tensors.push_back(std::move(data));
    grads.push_back(std::move(grad));
    return e;
  }
};

// Forward, then backward when the config trains, on t (and flex's tensors): outputs land in t.
void RunCall(const fusedattn_config& c, ProblemTensors* t, Flex* flex, const std::string& what) {
  std::vector<fusedattn_tensor> tensors, grads;
  if (flex)
    for (size_t k = 0; k < flex->tensors.size(); ++k) {
      tensors.push_back(flex->tensors[k].desc());
      grads.push_back(flex->grads[k].desc());
    }
  fusedattn_fwd_args fa = t->fwd_args();
  fa.num_score_mod_tensors = static_cast<int64_t>(tensors.size());
  fa.score_mod_tensors = tensors.empty() ? nullptr : tensors.data();
  test::Result r = test::Forward(c, fa);
  ASSERT_TRUE(r.ok()) << what << " forward: " << test::StatusText(r);
  if (!c.is_training) return;
  fusedattn_bwd_args ba = t->bwd_args();
  ba.num_score_mod_tensors = fa.num_score_mod_tensors;
  ba.score_mod_tensors = fa.score_mod_tensors;
  ba.d_score_mod_tensors = grads.empty() ? nullptr : grads.data();
  r = test::Backward(c, ba);
  ASSERT_TRUE(r.ok()) << what << " backward: " << test::StatusText(r);
}

void ExpectSameOutputs(const ProblemTensors& flex, const ProblemTensors& builtin,
                       const std::string& what) {
  EXPECT_MATCHES("o", flex.o, builtin.o, kSameTolerance, what);
  EXPECT_MATCHES("lse", flex.lse, builtin.lse, kSameTolerance, what);
  if (!builtin.max_logit.empty())
    EXPECT_MATCHES("max_logit", flex.max_logit, builtin.max_logit, kSameTolerance, what);
  if (!builtin.config.is_training) return;
  EXPECT_MATCHES("dq", flex.dq, builtin.dq, kSameTolerance, what);
  EXPECT_MATCHES("dk", flex.dk, builtin.dk, kSameTolerance, what);
  EXPECT_MATCHES("dv", flex.dv, builtin.dv, kSameTolerance, what);
}

// Runs `builtin` on fresh random inputs, then `modified` (the same problem expressed with
// flex's graph) on the same inputs, and compares everything both compute. make_flex builds the
// graph given the built-in run's tensors (it may take their data, e.g. the bias).
void ExpectEquivalent(const std::string& what, const fusedattn_config& builtin,
                      fusedattn_config modified,
                      const std::function<void(Flex&, const ProblemTensors&)>& make_flex,
                      TensorOptions options = {}, ProblemTensors* builtin_out = nullptr,
                      Flex* flex_out = nullptr) {
  ProblemTensors a = MakeProblemTensors(builtin, options);
  RunCall(builtin, &a, nullptr, what + " (built-in)");
  Flex local;
  Flex& flex = flex_out ? *flex_out : local;
  make_flex(flex, a);
  flex.mod.finalize();
  modified.score_mod = flex.mod.get();
  ProblemTensors b = a;  // the same inputs
  b.config = modified;
  b.poison_outputs();
  if (modified.bias_type == FUSEDATTN_BIAS_NONE) b.bias = b.dbias = HostTensor();
  if (modified.bias_type != FUSEDATTN_BIAS_ALIBI) b.alibi_slopes = HostTensor();
  if (!modified.return_max_logit) b.max_logit = HostTensor();
  RunCall(modified, &b, &flex, what + " (score_mod)");
  ExpectSameOutputs(b, a, what + ", graph:\n" + flex.mod.describe());
  if (builtin_out) *builtin_out = std::move(a);
}

// ---------------------------------------------------------------------------------------------
// Causal masks by index comparison
// ---------------------------------------------------------------------------------------------

TEST(FlexAttention, CausalByIndexComparisonIsTheCausalMask) {
  fusedattn_config causal = BaseConfig();
  causal.mask = FUSEDATTN_MASK_CAUSAL;
  ExpectEquivalent("mask_mod q_idx >= kv_idx", causal, BaseConfig(), [](Flex& f, auto&) {
    f.mod.set_mask(f.mod.q_idx() >= f.mod.kv_idx());
  });
}

// Bottom-right alignment with per-sequence lengths (padding): q_idx_br = q_idx + sk - sq.
TEST(FlexAttention, BottomRightCausalByIndexWithPaddingIsTheBottomRightCausalMask) {
  fusedattn_config causal = BaseConfig();
  causal.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  fusedattn_config padding = BaseConfig();
  padding.mask = FUSEDATTN_MASK_PADDING;
  TensorOptions lengths;
  lengths.len_q = {6, 4}, lengths.len_kv = {5, 7};
  ExpectEquivalent(
      "mask_mod q_idx_br >= kv_idx", causal, padding,
      [](Flex& f, auto&) { f.mod.set_mask(f.mod.q_idx_br() >= f.mod.kv_idx()); }, lengths);
}

// The same through the score: select(causal, s, -inf). With more queries than keys the first rows
// see only -inf scores and are fully masked, as under the built-in mask.
TEST(FlexAttention, CausalByAnInfiniteScoreIsTheCausalMask) {
  fusedattn_config causal = BaseConfig();
  causal.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  causal.max_seqlen_q = 7, causal.max_seqlen_kv = 4;
  fusedattn_config none = causal;
  none.mask = FUSEDATTN_MASK_NONE;
  ProblemTensors builtin;
  ExpectEquivalent(
      "score select(q_idx_br >= kv_idx, s, -inf)", causal, none,
      [](Flex& f, auto&) {
        f.mod.set_score(select(f.mod.q_idx_br() >= f.mod.kv_idx(), f.mod.score(), -kInf));
      },
      {}, &builtin);
  EXPECT_EQ(builtin.lse.at({0, 0, 0}), -kInf);  // the comparison did include masked rows
}

// ---------------------------------------------------------------------------------------------
// The score pipeline
// ---------------------------------------------------------------------------------------------

TEST(FlexAttention, TanhSoftCapIsConfigSoftcap) {
  fusedattn_config softcap = BaseConfig();
  softcap.softcap = 0.75;
  softcap.attn_scale = 2.0;  // scores of a few units, so the cap bends them
  fusedattn_config plain = softcap;
  plain.softcap = 0;
  ExpectEquivalent("score 0.75 * tanh(s / 0.75)", softcap, plain, [](Flex& f, auto&) {
    f.mod.set_score(0.75 * tanh(f.mod.score() / 0.75));
  });
}

TEST(FlexAttention, TanhSoftCapWithDropoutIsConfigSoftcapWithDropout) {
  fusedattn_config softcap = BaseConfig();
  softcap.softcap = 1.5;
  softcap.dropout = 0.3;
  fusedattn_config plain = softcap;
  plain.softcap = 0;
  ExpectEquivalent("score 1.5 * tanh(s / 1.5), dropout", softcap, plain, [](Flex& f, auto&) {
    f.mod.set_score(1.5 * tanh(f.mod.score() / 1.5));
  });
}

// A post-scale bias tensor holding 0.3 (i - j) is the relative-position bias q_idx - kv_idx.
TEST(FlexAttention, RelativePositionBiasIsTheSameBiasAsATensor) {
  fusedattn_config biased = BaseConfig();
  biased.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  fusedattn_config plain = BaseConfig();
  ProblemTensors probe = MakeProblemTensors(biased, {});
  TensorOptions options;
  // The bias tensor MakeProblemTensors draws is replaced by the relative positions below, so
  // build the built-in run by hand.
  ProblemTensors a = probe;
  for (int64_t i = 0; i < biased.max_seqlen_q; ++i)
    for (int64_t j = 0; j < biased.max_seqlen_kv; ++j)
      a.bias.set(a.bias.offset_of({0, 0, i, j}), 0.3 * static_cast<double>(i - j));
  RunCall(biased, &a, nullptr, "built-in relative bias");
  Flex f;
  f.mod.set_score(f.mod.score() + 0.3 * (f.mod.q_idx() - f.mod.kv_idx())).finalize();
  plain.score_mod = f.mod.get();
  ProblemTensors b = a;
  b.config = plain;
  b.poison_outputs();
  b.bias = HostTensor();
  RunCall(plain, &b, &f, "score s + 0.3 (q_idx - kv_idx)");
  ExpectSameOutputs(b, a, "relative position bias");
}

TEST(FlexAttention, AlibiByIndexIsBiasTypeAlibi) {
  fusedattn_config alibi = BaseConfig();
  alibi.bias_type = FUSEDATTN_BIAS_ALIBI;
  fusedattn_config plain = BaseConfig();
  TensorOptions lengths;  // with padding, so that |i + sk - sq - j| uses each sequence's lengths
  lengths.len_q = {6, 3}, lengths.len_kv = {7, 5};
  alibi.mask = plain.mask = FUSEDATTN_MASK_PADDING;
  ExpectEquivalent(
      "score s - slope[h] |q_idx_br - kv_idx|", alibi, plain,
      [](Flex& f, const ProblemTensors& builtin) {
        Expr slope = f.Tensor("slopes", builtin.alibi_slopes, kH);
        f.mod.set_score(f.mod.score() - slope * abs(f.mod.q_idx_br() - f.mod.kv_idx()));
      },
      lengths);
}

// The bias as a tensor of the graph, with its gradient: equal to the built-in dbias.
TEST(FlexAttention, PostScaleBiasFromATensorIsThePostScaleBiasWithItsGradient) {
  for (int64_t bias_batch : {int64_t{1}, int64_t{2}}) {
    fusedattn_config biased = BaseConfig();
    biased.bias_type = FUSEDATTN_BIAS_POST_SCALE;
    biased.bias_batch = bias_batch, biased.bias_heads = 4, biased.bias_requires_grad = 1;
    biased.mask = FUSEDATTN_MASK_CAUSAL;
    fusedattn_config plain = BaseConfig();
    plain.mask = FUSEDATTN_MASK_CAUSAL;
    ProblemTensors builtin;
    Flex flex;
    std::string what = "score s + bias, bias_batch " + std::to_string(bias_batch);
    ExpectEquivalent(
        what, biased, plain,
        [bias_batch](Flex& f, const ProblemTensors& t) {
          // A broadcast batch is an axis the tensor leaves out: [heads, sq, skv].
          HostTensor data = t.bias;
          uint32_t axes = kH | kQ | kKV;
          if (bias_batch == 1) {
            data = HostTensor(FUSEDATTN_DTYPE_FLOAT32, {4, 6, 7});
            for (int64_t h = 0; h < 4; ++h)
              for (int64_t i = 0; i < 6; ++i)
                for (int64_t j = 0; j < 7; ++j) data.set(data.offset_of({h, i, j}), t.bias.at({0, h, i, j}));
          } else {
            axes |= kB;
          }
          f.mod.set_score(f.mod.score() + f.Tensor("bias", data, axes, true));
        },
        {}, &builtin, &flex);
    std::vector<double> want = builtin.dbias.to_vector(), got = flex.grads[0].to_vector();
    ASSERT_EQ(want.size(), got.size()) << what;
    double diff = 0, norm = 0;
    for (size_t n = 0; n < want.size(); ++n) {
      diff += (got[n] - want[n]) * (got[n] - want[n]);
      norm += want[n] * want[n];
    }
    EXPECT_LE(std::sqrt(diff / norm), kSameTolerance) << what << ": dbias vs d(bias tensor)";
  }
}

// ---------------------------------------------------------------------------------------------
// Masks by mask_mod
// ---------------------------------------------------------------------------------------------

// Packed documents in one sequence with a per-token document id, masked to their own document
// (and causally inside it), against the same tokens as THD sequences, one per document.
TEST(FlexAttention, DocumentMaskingFromDocumentIdsIsThdSequences) {
  const std::vector<int32_t> documents = {3, 1, 4, 2};  // lengths; 10 tokens
  const int64_t tokens = 10;
  fusedattn_config thd = BaseConfig();
  thd.batch = static_cast<int64_t>(documents.size());
  thd.max_seqlen_q = thd.max_seqlen_kv = 4;
  thd.q_format = thd.kv_format = thd.o_format = thd.do_format = thd.dqkv_format =
      FUSEDATTN_FORMAT_THD;
  thd.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
  thd.return_max_logit = 0;
  TensorOptions options;
  options.len_q = options.len_kv = documents;
  options.lse_packed = true;
  ProblemTensors a = MakeProblemTensors(thd, options);
  ASSERT_EQ(a.q.shape()[0], tokens);
  RunCall(thd, &a, nullptr, "THD documents");

  // One sequence of 10 tokens: BSHD [1, 10, h, d] has the layout of THD [10, h, d].
  fusedattn_config packed = BaseConfig();
  packed.batch = 1;
  packed.max_seqlen_q = packed.max_seqlen_kv = tokens;
  packed.return_max_logit = 0;
  ProblemTensors b = MakeProblemTensors(packed, {});
  auto copy = [](const HostTensor& from, HostTensor* to) {
    ASSERT_EQ(from.storage_bytes(), to->storage_bytes());
    std::memcpy(to->data(), from.data(), from.storage_bytes());
  };
  copy(a.q, &b.q), copy(a.k, &b.k), copy(a.v, &b.v), copy(a.d_o, &b.d_o);
  Flex f;
  HostTensor doc_q(FUSEDATTN_DTYPE_INT32, {1, tokens}), doc_kv(FUSEDATTN_DTYPE_INT32, {tokens});
  for (int64_t t = 0, d = 0, end = documents[0]; t < tokens; ++t) {
    if (t == end) end += documents[static_cast<size_t>(++d)];
    doc_q.set(t, static_cast<double>(d));
    doc_kv.set(t, static_cast<double>(d));
  }
  // Two declarations of the ids: one read at (batch, q), one at kv (broadcast over batch).
  Expr query_doc = f.Tensor("doc_q", doc_q, kB | kQ);
  Expr key_doc = f.Tensor("doc_kv", doc_kv, kKV);
  f.mod.set_mask(eq(query_doc, key_doc) && f.mod.q_idx() >= f.mod.kv_idx()).finalize();
  packed.score_mod = f.mod.get();
  RunCall(packed, &b, &f, "document mask");
  const std::string what = "document mask, graph:\n" + f.mod.describe();
  EXPECT_MATCHES("o", b.o, a.o, kSameTolerance, what);
  EXPECT_MATCHES("dq", b.dq, a.dq, kSameTolerance, what);
  EXPECT_MATCHES("dk", b.dk, a.dk, kSameTolerance, what);
  EXPECT_MATCHES("dv", b.dv, a.dv, kSameTolerance, what);
  for (int64_t t = 0; t < tokens; ++t)  // packed LSE [tokens, h] against [1, h, tokens]
    for (int64_t h = 0; h < thd.heads_q; ++h)
      EXPECT_NEAR(b.lse.at({0, h, t}), a.lse.at({t, h}), 1e-6) << what << " lse token " << t;
}

TEST(FlexAttention, SlidingWindowByMaskModIsTheWindow) {
  // Without a causal mask windows align bottom-right: keys j with -right <= d - j <= left.
  fusedattn_config window = BaseConfig();
  window.window_left = 2, window.window_right = 1;
  ExpectEquivalent("mask_mod window (2, 1)", window, BaseConfig(), [](Flex& f, auto&) {
    Expr distance = f.mod.q_idx_br() - f.mod.kv_idx();
    f.mod.set_mask(distance <= 2.0 && distance >= -1.0);
  });
}

// The mask_mod ANDs with the config's mask: a window by mask_mod on a causal config is the
// causal window.
TEST(FlexAttention, MaskModAndsWithTheConfigMask) {
  fusedattn_config causal_window = BaseConfig();
  causal_window.mask = FUSEDATTN_MASK_CAUSAL;
  causal_window.window_left = 1;
  fusedattn_config causal = BaseConfig();
  causal.mask = FUSEDATTN_MASK_CAUSAL;
  ExpectEquivalent("causal config + mask_mod q_idx - kv_idx <= 1", causal_window, causal,
                   [](Flex& f, auto&) { f.mod.set_mask(f.mod.q_idx() - f.mod.kv_idx() <= 1.0); });
}

// The score_mod sees the pipeline's final s: after the scale, the softcap and the post-scale
// bias. One query, two keys, worked out by hand: s_j = 2 (c tanh(scale q.k_j / c) + bias_j) + j.
TEST(FlexAttention, TheScoreModAppliesAfterTheBuiltInPipeline) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.batch = c.heads_q = c.heads_kv = 1;
  c.max_seqlen_q = 1, c.max_seqlen_kv = 2, c.head_dim_qk = 2, c.head_dim_v = 1;
  c.attn_scale = 0.5, c.softcap = 1.5;
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  Flex f;
  f.mod.set_score(2.0 * f.mod.score() + f.mod.kv_idx()).finalize();
  c.score_mod = f.mod.get();
  ProblemTensors t = MakeProblemTensors(c, {});
  const double q[2] = {0.5, -1.0}, k[2][2] = {{1.0, 0.25}, {-0.75, 0.5}}, v[2] = {2.0, -3.0};
  const double bias[2] = {0.125, -0.5};
  for (int x = 0; x < 2; ++x) t.q.set(t.q.offset_of({0, 0, 0, x}), q[x]);
  for (int j = 0; j < 2; ++j) {
    for (int x = 0; x < 2; ++x) t.k.set(t.k.offset_of({0, j, 0, x}), k[j][x]);
    t.v.set(t.v.offset_of({0, j, 0, 0}), v[j]);
    t.bias.set(t.bias.offset_of({0, 0, 0, j}), bias[j]);
  }
  RunCall(c, &t, &f, "pipeline order");
  double score[2], weight_sum = 0, out = 0;
  for (int j = 0; j < 2; ++j) {
    double qk = q[0] * k[j][0] + q[1] * k[j][1];
    score[j] = 2.0 * (1.5 * std::tanh(0.5 * qk / 1.5) + bias[j]) + j;
    weight_sum += std::exp(score[j]);
  }
  for (int j = 0; j < 2; ++j) out += std::exp(score[j]) / weight_sum * v[j];
  EXPECT_NEAR(t.o.at({0, 0, 0, 0}), out, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Fully masked rows
// ---------------------------------------------------------------------------------------------

// A mask_mod that hides every key of some rows: O = 0, LSE = -inf and zero gradients there, also
// with an extra softmax logit.
TEST(FlexAttention, RowsTheMaskModHidesEntirelyAreFullyMasked) {
  for (fusedattn_softmax softmax : {FUSEDATTN_SOFTMAX_VANILLA, FUSEDATTN_SOFTMAX_OFF_BY_ONE}) {
    fusedattn_config c = BaseConfig();
    c.softmax_type = softmax;
    Flex f;
    f.mod.set_mask(f.mod.q_idx() >= 3.0).finalize();  // rows 0..2 see nothing
    c.score_mod = f.mod.get();
    ProblemTensors t = MakeProblemTensors(c, {});
    RunCall(c, &t, &f, "mask_mod q_idx >= 3");
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t i = 0; i < c.max_seqlen_q; ++i) {
          EXPECT_EQ(t.lse.at({b, h, i}) == -kInf, i < 3) << "softmax " << softmax << " row " << i;
          if (i >= 3) continue;
          for (int64_t x = 0; x < c.head_dim_v; ++x) EXPECT_EQ(t.o.at({b, i, h, x}), 0.0);
          for (int64_t x = 0; x < c.head_dim_qk; ++x) EXPECT_EQ(t.dq.at({b, i, h, x}), 0.0);
        }
  }
}

// ---------------------------------------------------------------------------------------------
// The whole backward against finite differences, with learnable tensors
// ---------------------------------------------------------------------------------------------

// L = sum(O * dO) as a function of one float32 element; the inputs are multiples of 2^-10 so
// that x +- 2^-7 is exact (as in gradient_check_test.cpp).
TEST(FlexAttention, BackwardWithLearnableTensorsMatchesFiniteDifferences) {
  fusedattn_config c = BaseConfig();
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  c.return_max_logit = 0;
  c.attn_scale = 0.5;
  Flex f;
  // A per-head temperature and a relative bias shared by heads, both learnable; a soft-cap.
  HostTensor temperature(FUSEDATTN_DTYPE_FLOAT32, {4}), rel(FUSEDATTN_DTYPE_FLOAT32, {6, 7});
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> grid(-1024, 1024);
  for (int64_t n = 0; n < 4; ++n) temperature.set(n, grid(rng) / 2048.0);
  for (int64_t n = 0; n < 42; ++n) rel.set(n, grid(rng) / 1024.0);
  Expr t = f.Tensor("temperature", temperature, kH, true);
  Expr r = f.Tensor("rel", rel, kQ | kKV, true);
  Expr scaled = f.mod.score() * exp(t) + r;
  f.mod.set_score(3.0 * tanh(scaled / 3.0)).finalize();
  c.score_mod = f.mod.get();
  TensorOptions options;
  ProblemTensors base = MakeProblemTensors(c, options);
  for (HostTensor* x : {&base.q, &base.k, &base.v, &base.d_o})
    for (int64_t n = 0; n < x->storage_elements(); ++n) x->set(n, grid(rng) / 1024.0 * 1.5);
  ProblemTensors analytic = base;
  RunCall(c, &analytic, &f, "analytic");

  auto loss = [&](ProblemTensors t_in, Flex& flex) {
    fusedattn_config forward = c;
    forward.is_training = 0;
    t_in.config = forward;
    t_in.lse = HostTensor();
    RunCall(forward, &t_in, &flex, "loss");
    double sum = 0;
    std::vector<double> o = t_in.o.to_vector(), d_o = t_in.d_o.to_vector();
    for (size_t n = 0; n < o.size(); ++n) sum += o[n] * d_o[n];
    return sum;
  };
  const double eps = 1.0 / 128;
  auto check = [&](const char* name, HostTensor& input, const HostTensor& gradient,
                   int64_t element) {
    const double x = input.get(element);
    input.set(element, x + eps);
    double up = loss(base, f);
    input.set(element, x - eps);
    double down = loss(base, f);
    input.set(element, x);
    double fd = (up - down) / (2 * eps), got = gradient.get(element);
    EXPECT_NEAR(got, fd, 5e-4 * std::max(1.0, std::fabs(fd))) << name << "[" << element << "]";
  };
  for (int64_t n = 0; n < 4; ++n) check("temperature", f.tensors[0], f.grads[0], n);
  for (int64_t n = 0; n < 42; n += 5) check("rel", f.tensors[1], f.grads[1], n);
  for (int64_t n = 0; n < base.q.storage_elements(); n += 37) check("q", base.q, analytic.dq, n);
  for (int64_t n = 0; n < base.k.storage_elements(); n += 29) check("k", base.k, analytic.dk, n);
}

}  // namespace
}  // namespace fusedattn
