// The cuDNN backend's planning of score_mods, on the CPU: which path a graph takes (a band
// mask_mod becomes cuDNN's native band, combined with the config's mask; everything else goes
// through the callbacks), what the callback spec carries, the refusals (each names the feature
// and the reference backend), and the plan key (equal graphs built twice share a plan,
// different ones never do). Compiled when the cuDNN backend is built; needs no GPU.
#ifdef FUSEDATTN_WITH_CUDNN

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "backends/cudnn/plan_spec.h"
#include "flex/score_mod.h"
#include "fusedattn/score_mod.hpp"
#include "problem/problem.h"
#include "testing/tensors.h"

namespace fusedattn::cudnn {
namespace {

const DeviceInfo kDevice{0, 90, 91900};

fusedattn_config BaseConfig() {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 3, c.heads_q = 4, c.heads_kv = 2, c.max_seqlen_q = 16, c.max_seqlen_kv = 24;
  c.head_dim_qk = 64, c.head_dim_v = 64;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  c.device = FUSEDATTN_DEVICE_CUDA;
  c.is_training = 1;
  return c;
}

Problem MakeCuda(const fusedattn_config& c) {
  Problem p;
  Status s = MakeProblem(&c, true, &p);
  EXPECT_TRUE(s.ok()) << s.message();
  return p;
}

// A finalized graph, kept alive for the test's problems.
ScoreMod& Mod(const std::function<void(ScoreMod&)>& build) {
  static std::vector<ScoreMod*>* keep = new std::vector<ScoreMod*>();
  keep->push_back(new ScoreMod());
  build(*keep->back());
  keep->back()->finalize();
  return *keep->back();
}

Problem WithMod(fusedattn_config c, const ScoreMod& mod) {
  c.score_mod = mod.get();
  return MakeCuda(c);
}

void SoftCap(ScoreMod& m) { m.set_score(30.0 * tanh(m.score() / 30.0)); }
void CausalByIndex(ScoreMod& m) { m.set_mask(m.kv_idx() <= m.q_idx()); }

TEST(CudnnScoreModPath, BandMaskModsBecomeTheNativeBandEverythingElseTheCallbacks) {
  fusedattn_config c = BaseConfig();
  EXPECT_EQ(ScoreModPathOf(MakeCuda(c)), ScoreModPath::kNone);
  EXPECT_EQ(ScoreModPathOf(WithMod(c, Mod(CausalByIndex))), ScoreModPath::kNativeBand);
  EXPECT_EQ(ScoreModPathOf(WithMod(c, Mod(SoftCap))), ScoreModPath::kCallback);
  EXPECT_EQ(ScoreModPathOf(WithMod(c, Mod([](ScoreMod& m) {
              CausalByIndex(m);
              SoftCap(m);
            }))),
            ScoreModPath::kCallback)
      << "a score output needs the callback, and cuDNN takes no band next to one";
  EXPECT_EQ(ScoreModPathOf(WithMod(c, Mod([](ScoreMod& m) {
              Expr doc = m.tensor("doc", FUSEDATTN_DTYPE_INT32,
                                  FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_Q);
              m.set_mask(ne(doc, 0.0));
            }))),
            ScoreModPath::kCallback)
      << "not a band";
}

TEST(CudnnScoreModPath, CallbackGraphsAreBuiltPerShapeBandGraphsShareKernels) {
  // A callback holds the sequence lengths as graph constants: no dynamic shapes for it.
  const Problem soft = WithMod(BaseConfig(), Mod(SoftCap));
  Status s = DynamicShapeRefusal(ForwardSpec(soft, CanonicalFwdTensors(soft)));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("score_mod"), std::string::npos) << s.message();
  EXPECT_FALSE(DynamicShapeRefusal(BackwardSpec(soft, CanonicalBwdTensors(soft))).ok());
  // A band mask_mod runs as a plain problem: dynamic shapes apply.
  const Problem band = EffectiveProblem(WithMod(BaseConfig(), Mod(CausalByIndex)));
  EXPECT_TRUE(DynamicShapeRefusal(ForwardSpec(band, CanonicalFwdTensors(band))).ok());
}

TEST(CudnnScoreModPath, TheNativeBandIsTheIntersectionWithTheConfigsMask) {
  // A window of 4 by mask_mod, alone and with the config's causal mask.
  ScoreMod& window = Mod([](ScoreMod& m) {
    m.set_mask(m.q_idx_br() - m.kv_idx() < 4.0 && m.kv_idx() - m.q_idx_br() <= 6.0);
  });
  fusedattn_config c = BaseConfig();
  Problem alone = EffectiveProblem(WithMod(c, window));
  EXPECT_FALSE(alone.has_score_mod());
  EXPECT_EQ(alone.config.score_mod, nullptr);
  EXPECT_EQ(alone.window_left, 3);
  EXPECT_EQ(alone.window_right, 6);
  EXPECT_TRUE(alone.bottom_right);

  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  Problem both = EffectiveProblem(WithMod(c, window));
  EXPECT_FALSE(both.has_score_mod());
  EXPECT_EQ(both.window_left, 3);
  EXPECT_EQ(both.window_right, 0);
  EXPECT_TRUE(both.bottom_right);

  c.mask = FUSEDATTN_MASK_CAUSAL;  // top-left, with sq != skv: another diagonal
  EXPECT_EQ(ScoreModPathOf(WithMod(c, window)), ScoreModPath::kCallback);
  c.max_seqlen_kv = c.max_seqlen_q;  // now the two diagonals coincide
  Problem same = EffectiveProblem(WithMod(c, window));
  EXPECT_FALSE(same.has_score_mod());
  EXPECT_EQ(same.window_left, 3);
  EXPECT_EQ(same.window_right, 0);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL;  // per-sequence lengths: they may differ again
  EXPECT_EQ(ScoreModPathOf(WithMod(c, window)), ScoreModPath::kCallback);
}

TEST(CudnnScoreModPath, ABandMaskModSharesThePlanOfTheEqualConfigMask) {
  fusedattn_config c = BaseConfig();
  Problem by_mod = EffectiveProblem(WithMod(c, Mod(CausalByIndex)));
  fusedattn_config causal = c;
  causal.mask = FUSEDATTN_MASK_CAUSAL;
  Problem by_config = MakeCuda(causal);
  EXPECT_EQ(MakePlanKey(ForwardSpec(by_mod, CanonicalFwdTensors(by_mod)), kDevice),
            MakePlanKey(ForwardSpec(by_config, CanonicalFwdTensors(by_config)), kDevice));
  EXPECT_EQ(MakePlanKey(BackwardSpec(by_mod, CanonicalBwdTensors(by_mod)), kDevice),
            MakePlanKey(BackwardSpec(by_config, CanonicalBwdTensors(by_config)), kDevice));
}

TEST(CudnnScoreModSpec, TheCallbacksCarryTheConfigsMaskAndTheTensors) {
  ScoreMod& mod = Mod([](ScoreMod& m) {
    Expr bias = m.tensor("bias", FUSEDATTN_DTYPE_FLOAT32,
                         FUSEDATTN_SCORE_MOD_AXIS_HEAD | FUSEDATTN_SCORE_MOD_AXIS_KV);
    Expr doc = m.tensor("doc", FUSEDATTN_DTYPE_INT32,
                        FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_Q);
    m.set_score(m.score() + bias);
    m.set_mask(ne(doc, 0.0));
  });
  fusedattn_config c = BaseConfig();
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT, c.window_left = 5;
  c.is_training = 0;
  Problem p = WithMod(c, mod);
  ASSERT_EQ(ScoreModPathOf(p), ScoreModPath::kCallback);
  for (Direction direction : {Direction::kForward, Direction::kBackward}) {
    SCOPED_TRACE(direction == Direction::kForward ? "forward" : "backward");
    SdpaGraphSpec s = direction == Direction::kForward
                          ? ForwardSpec(p, CanonicalFwdTensors(p))
                          : BackwardSpec(p, CanonicalBwdTensors(p));
    ASSERT_NE(s.score_mod, nullptr);
    EXPECT_FALSE(s.padding) << "cuDNN's padding mask is off next to a callback";
    EXPECT_FALSE(s.has_left_bound || s.has_right_bound || s.bottom_right);
    EXPECT_EQ(s.mod_band.left, 5);
    EXPECT_EQ(s.mod_band.right, 0);
    EXPECT_TRUE(s.mod_band.bottom_right);
    EXPECT_TRUE(s.mod_seq_lens);
    EXPECT_TRUE(s.stats) << "the fix-up finds rows a score_mod hid from the stats";
    ASSERT_EQ(s.aux.size(), 2u);
    EXPECT_EQ(s.aux[0].dtype, FUSEDATTN_DTYPE_FLOAT32);
    // bias has no q axis but a kv axis: the q extent with stride 0 (see the next test).
    const int64_t bias_dim[4] = {1, 4, 16, 24}, bias_stride[4] = {96, 24, 0, 1};
    const int64_t doc_dim[4] = {3, 1, 16, 1}, doc_stride[4] = {16, 16, 1, 1};
    for (int d = 0; d < 4; ++d) {
      EXPECT_EQ(s.aux[0].desc.dim[d], bias_dim[d]) << d;
      EXPECT_EQ(s.aux[0].desc.stride[d], bias_stride[d]) << d;
      EXPECT_EQ(s.aux[1].desc.dim[d], doc_dim[d]) << d;
      EXPECT_EQ(s.aux[1].desc.stride[d], doc_stride[d]) << d;
    }
    EXPECT_EQ(s.aux[1].dtype, FUSEDATTN_DTYPE_INT32);
  }
}

// cuDNN 9.19's backward misreads a tensor without q_idx but with batch or kv_idx when its q
// extent is 1 (measured on H100): such tensors get the q extent with stride 0 instead, and
// training with them is left to cuDNN.
TEST(CudnnScoreModSpec, AKeySideTensorGetsTheQueryExtentWithStrideZero) {
  ScoreMod& mod = Mod([](ScoreMod& m) {
    Expr doc = m.tensor("doc_kv", FUSEDATTN_DTYPE_INT32,
                        FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_KV);
    m.set_mask(ne(doc, 0.0));
    m.set_score(m.score() * 2.0);
  });
  fusedattn_config c = BaseConfig();
  Problem p = WithMod(c, mod);
  ASSERT_EQ(ScoreModPathOf(p), ScoreModPath::kCallback);
  EXPECT_TRUE(PreCheck(p).ok()) << PreCheck(p).message();
  SdpaGraphSpec s = BackwardSpec(p, CanonicalBwdTensors(p));
  ASSERT_EQ(s.aux.size(), 1u);
  const int64_t dim[4] = {3, 1, 16, 24}, stride[4] = {24, 24, 0, 1};
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(s.aux[0].desc.dim[d], dim[d]) << d;
    EXPECT_EQ(s.aux[0].desc.stride[d], stride[d]) << d;
  }
}

TEST(CudnnScoreModSpec, RealContiguousTensorsHitThePlanCheckBuilt) {
  ScoreMod& mod = Mod([](ScoreMod& m) {
    Expr doc = m.tensor("doc", FUSEDATTN_DTYPE_INT32,
                        FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_KV);
    m.set_score(tanh(m.score()));
    m.set_mask(ne(doc, 2.0));
  });
  fusedattn_config c = BaseConfig();
  c.score_mod = mod.get();
  Problem p = MakeCuda(c);
  testing::ProblemTensors host = testing::MakeProblemTensors(c, {});
  testing::HostTensor doc(FUSEDATTN_DTYPE_INT32, {3, 24});
  fusedattn_tensor docs[] = {doc.desc()};
  fusedattn_fwd_args fa = host.fwd_args();
  fa.num_score_mod_tensors = 1, fa.score_mod_tensors = docs;
  FwdTensors fwd;
  Status s = MakeFwdTensors(p, &fa, &fwd);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(MakePlanKey(ForwardSpec(p, fwd), kDevice),
            MakePlanKey(ForwardSpec(p, CanonicalFwdTensors(p)), kDevice));
  fusedattn_bwd_args ba = host.bwd_args();
  ba.num_score_mod_tensors = 1, ba.score_mod_tensors = docs;
  BwdTensors bwd;
  s = MakeBwdTensors(p, &ba, &bwd);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(MakePlanKey(BackwardSpec(p, bwd), kDevice),
            MakePlanKey(BackwardSpec(p, CanonicalBwdTensors(p)), kDevice));
}

TEST(CudnnScoreModCallPlan, StatsAreStagedAndRowsAScoreModHidFixed) {
  fusedattn_config c = BaseConfig();
  c.is_training = 0;  // even without an LSE to return
  Problem p = WithMod(c, Mod(SoftCap));
  CallPlan fwd = ForwardCallPlan(p, CanonicalFwdTensors(p));
  EXPECT_TRUE(fwd.stage_stats);
  EXPECT_TRUE(fwd.fixup);
  EXPECT_TRUE(fwd.empty_by_stats);
  EXPECT_FALSE(fwd.const_lengths);
  EXPECT_NE(ForwardScratch(p, fwd).stats, Scratch::kNone);
  c.is_training = 1;
  p = WithMod(c, Mod(SoftCap));
  CallPlan bwd = BackwardCallPlan(p, CanonicalBwdTensors(p));
  EXPECT_TRUE(bwd.stage_stats) << "LSE = -inf rows become +inf for cuDNN";
  EXPECT_TRUE(bwd.prep);
  // Without a score_mod nothing changes.
  fusedattn_config plain = BaseConfig();
  plain.is_training = 0;
  Problem q = MakeCuda(plain);
  EXPECT_FALSE(ForwardCallPlan(q, CanonicalFwdTensors(q)).empty_by_stats);
  EXPECT_FALSE(ForwardCallPlan(q, CanonicalFwdTensors(q)).stage_stats);
}

TEST(CudnnScoreModPreCheck, RefusalsNameTheFeatureAndTheReference) {
  struct Case {
    const char* name;
    std::function<void(fusedattn_config*)> edit;
    std::function<void(ScoreMod&)> build;
    const char* field;
  };
  const std::vector<Case> cases = {
      {"softcap", [](fusedattn_config* c) { c->softcap = 30.0; }, SoftCap, "softcap = 30"},
      {"post-scale bias", [](fusedattn_config* c) { c->bias_type = FUSEDATTN_BIAS_POST_SCALE; },
       SoftCap, "bias_type = post_scale"},
      {"pre-scale bias", [](fusedattn_config* c) { c->bias_type = FUSEDATTN_BIAS_PRE_SCALE; },
       SoftCap, "bias_type = pre_scale"},
      {"alibi", [](fusedattn_config* c) { c->bias_type = FUSEDATTN_BIAS_ALIBI; }, SoftCap,
       "bias_type = alibi"},
      {"THD",
       [](fusedattn_config* c) {
         c->q_format = c->kv_format = c->o_format = c->do_format = c->dqkv_format =
             FUSEDATTN_FORMAT_THD;
       },
       SoftCap, "THD"},
      {"max logit", [](fusedattn_config* c) { c->return_max_logit = 1; }, SoftCap,
       "return_max_logit"},
      {"tensor gradient", [](fusedattn_config*) {},
       [](ScoreMod& m) {
         m.set_score(m.score() + m.tensor("rel", FUSEDATTN_DTYPE_FLOAT32,
                                          FUSEDATTN_SCORE_MOD_AXIS_Q |
                                              FUSEDATTN_SCORE_MOD_AXIS_KV,
                                          true));
       },
       "'rel' requires_grad"},
      {"padding", [](fusedattn_config* c) { c->mask = FUSEDATTN_MASK_PADDING; }, SoftCap,
       "misreads the per-sequence lengths"},
      {"nine tensors", [](fusedattn_config*) {},
       [](ScoreMod& m) {
         Expr s = m.score();
         for (int k = 0; k < 9; ++k)
           s = s + m.tensor("t" + std::to_string(k), FUSEDATTN_DTYPE_FLOAT32,
                            FUSEDATTN_SCORE_MOD_AXIS_HEAD);
         m.set_score(s);
       },
       "9 tensors"},
  };
  for (const Case& k : cases) {
    fusedattn_config c = BaseConfig();
    k.edit(&c);
    Problem p = WithMod(c, Mod(k.build));
    Status s = PreCheck(EffectiveProblem(p));
    EXPECT_EQ(s.code(), FUSEDATTN_ERROR_NOT_SUPPORTED) << k.name;
    EXPECT_NE(s.message().find(k.field), std::string::npos) << k.name << ": " << s.message();
    EXPECT_NE(s.message().find("score_mod"), std::string::npos) << k.name << ": " << s.message();
    EXPECT_NE(s.message().find("reference"), std::string::npos) << k.name << ": " << s.message();
  }
}

TEST(CudnnScoreModPreCheck, LeavesWhatThePipelineOrderAllowsToCudnn) {
  std::vector<fusedattn_config> configs;
  fusedattn_config c = BaseConfig();
  configs.push_back(c);
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT, c.window_left = 5;
  configs.push_back(c);
  c = BaseConfig();
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK, c.dropout = 0.1;  // both after the scores
  configs.push_back(c);
  for (const auto& config : configs) {
    Status s = PreCheck(WithMod(config, Mod(SoftCap)));
    EXPECT_TRUE(s.ok()) << s.message();
  }
  // A band mask_mod leaves a plain problem: the general rules apply (THD is fine there).
  c = BaseConfig();
  c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
  Status s = PreCheck(EffectiveProblem(WithMod(c, Mod(CausalByIndex))));
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(CudnnScoreModKey, EqualGraphsShareAPlanDifferentOnesNever) {
  fusedattn_config c = BaseConfig();
  auto key_of = [&](const ScoreMod& mod, Direction direction = Direction::kForward) {
    Problem p = WithMod(c, mod);
    return direction == Direction::kForward
               ? MakePlanKey(ForwardSpec(p, CanonicalFwdTensors(p)), kDevice)
               : MakePlanKey(BackwardSpec(p, CanonicalBwdTensors(p)), kDevice);
  };
  auto cap = [](double value) {
    return [value](ScoreMod& m) { m.set_score(value * tanh(m.score() / value)); };
  };
  const PlanKey a = key_of(Mod(cap(30.0)));
  EXPECT_EQ(a, key_of(Mod(cap(30.0)))) << "built twice, independently";
  EXPECT_EQ(a.hash, key_of(Mod(cap(30.0))).hash);
  EXPECT_EQ(key_of(Mod(cap(30.0)), Direction::kBackward),
            key_of(Mod(cap(30.0)), Direction::kBackward));
  EXPECT_FALSE(a == key_of(Mod(cap(std::nextafter(30.0, 31.0))))) << "the constant's last bit";
  EXPECT_FALSE(a == key_of(Mod([](ScoreMod& m) { m.set_score(30.0 * tanh(m.score() * 30.0)); })))
      << "another operation";
  Problem plain = MakeCuda(c);
  EXPECT_FALSE(a == MakePlanKey(ForwardSpec(plain, CanonicalFwdTensors(plain)), kDevice))
      << "no score_mod";
  // An explicit gradient changes only the backward.
  ScoreMod& explicit_grad = Mod([](ScoreMod& m) {
    Expr t = tanh(m.score() / 30.0);
    m.set_score(30.0 * t);
    m.set_gradient(m.score(), 1.0 - t * t);
  });
  EXPECT_FALSE(key_of(Mod(cap(30.0)), Direction::kBackward) ==
               key_of(explicit_grad, Direction::kBackward));

  // The tensors: dtype and layout are part of the key.
  auto with_tensor = [](fusedattn_dtype dtype) {
    return [dtype](ScoreMod& m) {
      m.set_score(m.score() + m.tensor("bias", dtype, FUSEDATTN_SCORE_MOD_AXIS_Q |
                                                          FUSEDATTN_SCORE_MOD_AXIS_KV));
    };
  };
  const PlanKey f32 = key_of(Mod(with_tensor(FUSEDATTN_DTYPE_FLOAT32)));
  EXPECT_EQ(f32, key_of(Mod(with_tensor(FUSEDATTN_DTYPE_FLOAT32))));
  EXPECT_FALSE(f32 == key_of(Mod(with_tensor(FUSEDATTN_DTYPE_BFLOAT16)))) << "dtype";
  Problem p = WithMod(c, Mod(with_tensor(FUSEDATTN_DTYPE_FLOAT32)));
  FwdTensors strided = CanonicalFwdTensors(p);
  strided.score_mod_tensors[0].stride_q *= 2;
  EXPECT_FALSE(f32 == MakePlanKey(ForwardSpec(p, strided), kDevice)) << "strides";
}

TEST(CudnnScoreModKey, TheLargestScoreModSpecFitsTheKey) {
  ScoreMod& mod = Mod([](ScoreMod& m) {
    Expr s = m.score();
    for (int k = 0; k < kMaxScoreModTensors; ++k)
      s = s + m.tensor("t" + std::to_string(k), FUSEDATTN_DTYPE_FLOAT32,
                       FUSEDATTN_SCORE_MOD_AXIS_HEAD);
    m.set_score(s);
  });
  fusedattn_config c = BaseConfig();
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT, c.window_left = 3;
  c.dropout = 0.1, c.deterministic = 1;
  Problem p = WithMod(c, mod);
  ASSERT_TRUE(PreCheck(p).ok()) << PreCheck(p).message();
  PlanKey key = MakePlanKey(BackwardSpec(p, CanonicalBwdTensors(p)), kDevice);
  EXPECT_LE(key.used, PlanKey::kWords);
}

}  // namespace
}  // namespace fusedattn::cudnn

#endif  // FUSEDATTN_WITH_CUDNN
