// Score modifiers on the cuDNN backend against the CPU reference, on a GPU (each test skips,
// saying why, without a CUDA device or without the cuDNN backend).
//
// The seven examples (causal by index comparison, tanh soft-cap, relative-position bias,
// ALiBi, post-scale bias from a tensor, document masking from per-token ids, a sliding window by
// mask_mod), each in bf16 and fp16, forward and backward: the cuDNN backend forced on device
// tensors, the reference on host copies of the same fresh random inputs, outputs poisoned
// beforehand, ||out - ref|| / ||ref|| within shared/DESIGN.md's tolerances. As in
// cudnn_test.cpp, both backwards start from the reference's O and LSE. Further cases cover what
// the callbacks evaluate besides the graph (a padding mask, a bottom-right band) and rows a
// mask_mod hides entirely (O = 0, LSE = -inf, zero gradients).
//
//   build/tests/fusedattn_gpu_tests --gtest_filter='FlexCudnn*'
#ifdef FUSEDATTN_WITH_CUDNN

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fusedattn/fusedattn.h"
#include "fusedattn/score_mod.hpp"
#include "gpu/skip.h"
#include "testing/tensors.h"
#include "gpu/flex_run.h"

namespace fusedattn::testing {
namespace {

// A training problem on CUDA tensors forced to this file's backend.
fusedattn_config Config(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t d,
                        fusedattn_dtype dtype) {
  return FlexConfig(FUSEDATTN_BACKEND_CUDNN, b, hq, hkv, sq, skv, d, dtype);
}

// cuDNN (forced in c) refuses c with a message holding `reason`, and automatic selection takes
// flash (the test is skipped when flash cannot run here).
void ExpectCudnnRefusesAndSelectionTakesFlash(fusedattn_config c, const char* reason) {
  char msg[4096];
  fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
  EXPECT_EQ(fusedattn_get_backend(&c, &chosen, msg, sizeof msg), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(std::string(msg).find(reason), std::string::npos) << msg;
  char unavailable[512];
  if (!fusedattn_backend_available(FUSEDATTN_BACKEND_FLASH, unavailable, sizeof unavailable))
    GTEST_SKIP() << unavailable;
  c.backend = FUSEDATTN_BACKEND_AUTO;
  ASSERT_EQ(fusedattn_get_backend(&c, &chosen, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  EXPECT_EQ(chosen, FUSEDATTN_BACKEND_FLASH) << msg;
}

// ------------------------------------------------------------------------------------------------
// The seven examples, bf16 and fp16.
// ------------------------------------------------------------------------------------------------
class FlexCudnnExamples : public ::testing::TestWithParam<fusedattn_dtype> {
 protected:
  fusedattn_dtype dtype() const { return GetParam(); }
  uint64_t seed() const { return dtype() == FUSEDATTN_DTYPE_BFLOAT16 ? 101 : 202; }
};

// Causal by index comparison: a band, so cuDNN's native causal mask (tiles skipped).
TEST_P(FlexCudnnExamples, CausalByIndexComparison) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  ScoreMod mod;
  mod.set_mask(mod.kv_idx() <= mod.q_idx()).finalize();
  fusedattn_config c = Config(2, 4, 2, 128, 128, 64, dtype());
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = seed();
  RunAndCompare(c, {}, o);
}

TEST_P(FlexCudnnExamples, TanhSoftCap) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  ScoreMod mod;
  mod.set_score(2.0 * tanh(mod.score() / 2.0)).finalize();  // small cap: the tanh bends
  fusedattn_config c = Config(2, 4, 2, 128, 160, 64, dtype());
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = seed() + 1;
  o.input_range = 2.0;
  RunAndCompare(c, {}, o);
}

TEST_P(FlexCudnnExamples, RelativePositionBias) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  ScoreMod mod;
  mod.set_score(mod.score() + 0.05 * (mod.q_idx() - mod.kv_idx())).finalize();
  fusedattn_config c = Config(2, 4, 4, 96, 96, 64, dtype());
  c.mask = FUSEDATTN_MASK_CAUSAL;  // evaluated in the callback with the graph
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = seed() + 2;
  RunAndCompare(c, {}, o);
}

// ALiBi with per-head slopes from a tensor, bottom-right aligned, and the config's bottom-right
// causal mask (sq < skv: the diagonal is not the main one).
TEST_P(FlexCudnnExamples, Alibi) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  ScoreMod mod;
  Expr slope = mod.tensor("slopes", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_HEAD);
  mod.set_score(mod.score() - slope * abs(mod.q_idx_br() - mod.kv_idx())).finalize();
  fusedattn_config c = Config(2, 4, 2, 64, 160, 64, dtype());
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  c.score_mod = mod.get();
  HostTensor slopes(FUSEDATTN_DTYPE_FLOAT32, {4});
  for (int64_t h = 0; h < 4; ++h) slopes.set(h, std::exp2(-8.0 * (h + 1) / 4.0));
  TensorOptions o;
  o.seed = seed() + 3;
  RunAndCompare(c, {slopes}, o);
}

TEST_P(FlexCudnnExamples, PostScaleBiasFromATensor) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  ScoreMod mod;
  Expr bias = mod.tensor("bias", dtype(),
                         FUSEDATTN_SCORE_MOD_AXIS_HEAD | FUSEDATTN_SCORE_MOD_AXIS_Q |
                             FUSEDATTN_SCORE_MOD_AXIS_KV);
  mod.set_score(mod.score() + bias).finalize();
  fusedattn_config c = Config(2, 4, 2, 96, 128, 64, dtype());
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = seed() + 4;
  RunAndCompare(c, {Uniform(dtype(), {4, 96, 128}, seed() + 40, -1.0, 1.0)}, o);
}

// Document masking: per-token document ids (three documents per sequence, of uneven lengths),
// causal inside each document. The key-side ids go to cuDNN with a stride-0 q axis, without which
// its backward misreads them (plan_spec.cpp, AuxDescs).
ScoreMod DocumentMask() {
  ScoreMod mod;
  Expr doc_q = mod.tensor("doc_q", FUSEDATTN_DTYPE_INT32,
                          FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_Q);
  Expr doc_kv = mod.tensor("doc_kv", FUSEDATTN_DTYPE_INT32,
                           FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_KV);
  mod.set_mask(eq(doc_q, doc_kv) && mod.kv_idx() <= mod.q_idx()).finalize();
  return mod;
}

// is_training: 0 (forward) or 1 (forward and backward).
void RunDocumentMask(fusedattn_dtype dtype, int is_training, uint64_t seed) {
  ScoreMod mod = DocumentMask();
  const int64_t batch = 2, s = 128;
  fusedattn_config c = Config(batch, 4, 2, s, s, 64, dtype);
  c.is_training = is_training;
  c.score_mod = mod.get();
  HostTensor ids(FUSEDATTN_DTYPE_INT32, {batch, s});
  const int64_t bounds[2][2] = {{40, 100}, {17, 90}};  // where documents 1 and 2 start
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < s; ++i)
      ids.set(b * s + i, static_cast<double>((i >= bounds[b][0]) + (i >= bounds[b][1])));
  TensorOptions o;
  o.seed = seed;
  RunAndCompare(c, {ids, ids}, o);
}

TEST_P(FlexCudnnExamples, DocumentMaskingFromPerTokenIdsForInference) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  RunDocumentMask(dtype(), 0, seed() + 5);
}

TEST_P(FlexCudnnExamples, DocumentMaskingFromPerTokenIdsInTraining) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  RunDocumentMask(dtype(), 1, seed() + 6);
}

// A causal sliding window of 16 by mask_mod: a band, so cuDNN's native band (tiles skipped).
TEST_P(FlexCudnnExamples, SlidingWindowByMaskMod) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  ScoreMod mod;
  mod.set_mask(mod.kv_idx() <= mod.q_idx() && mod.q_idx() - mod.kv_idx() < 16.0).finalize();
  fusedattn_config c = Config(2, 4, 2, 128, 128, 64, dtype());
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = seed() + 6;
  RunAndCompare(c, {}, o);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FlexCudnnExamples,
                         ::testing::Values(FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_FLOAT16),
                         [](const ::testing::TestParamInfo<fusedattn_dtype>& info) {
                           return info.param == FUSEDATTN_DTYPE_BFLOAT16 ? "bf16" : "fp16";
                         });

// ------------------------------------------------------------------------------------------------
// What the callbacks evaluate besides the graph, and rows a mask_mod hides entirely.
// ------------------------------------------------------------------------------------------------
// cuDNN misreads the per-sequence lengths in a callback (plan_spec.cpp): check() says so, and
// selection takes flash, which runs it against the reference.
TEST(FlexCudnn, SoftCapWithAPaddingMaskIsRefusedWithTheReasonAndRunsOnFlash) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  ScoreMod mod;
  mod.set_score(3.0 * tanh(mod.score() / 3.0)).finalize();
  fusedattn_config c = Config(4, 4, 2, 96, 128, 64, FUSEDATTN_DTYPE_BFLOAT16);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  c.score_mod = mod.get();
  ExpectCudnnRefusesAndSelectionTakesFlash(c, "misreads the per-sequence lengths");
  if (HasFatalFailure() || IsSkipped()) return;
  c.backend = FUSEDATTN_BACKEND_FLASH;
  TensorOptions o;
  o.seed = 7;
  o.input_range = 2.0;
  RunAndCompare(c, {}, o);
}

TEST(FlexCudnn, AWindowByMaskModNextToAScoreGoesThroughTheCallback) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  ScoreMod mod;
  mod.set_score(mod.score() * 1.5);
  mod.set_mask(mod.kv_idx() <= mod.q_idx_br() && mod.q_idx_br() - mod.kv_idx() <= 20.0);
  mod.finalize();
  fusedattn_config c = Config(2, 4, 2, 64, 128, 64, FUSEDATTN_DTYPE_FLOAT16);
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = 8;
  RunAndCompare(c, {}, o);
}

TEST(FlexCudnn, RowsAMaskModHidesEntirelyAreEmpty) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  ScoreMod mod;
  // Rows 0..4 see no key; the rest see every key up to the diagonal but the first.
  mod.set_score(2.0 * tanh(mod.score() / 2.0));
  mod.set_mask(mod.q_idx() >= 5.0 && mod.kv_idx() >= 1.0 && mod.kv_idx() <= mod.q_idx());
  mod.finalize();
  fusedattn_config c = Config(2, 4, 2, 64, 64, 64, FUSEDATTN_DTYPE_BFLOAT16);
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = 9;
  Outputs out;
  RunAndCompare(c, {}, o, false, &out);
  if (HasFatalFailure() || IsSkipped()) return;
  // BSHD O [b, s, h, d], LSE [b, h, s]: spot-check the definition itself.
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t i = 0; i < 5; ++i) {
        EXPECT_EQ(out.fwd.lse.at({b, h, i}), -INFINITY) << b << " " << h << " " << i;
        EXPECT_EQ(out.fwd.o.at({b, i, h, 0}), 0.0);
        EXPECT_EQ(out.bwd.dq.at({b, i, h, 0}), 0.0);
      }
}

TEST(FlexCudnn, ScoreModWithALearnableSink) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  ScoreMod mod;
  mod.set_score(2.0 * tanh(mod.score() / 2.0)).finalize();
  fusedattn_config c = Config(2, 4, 2, 64, 96, 64, FUSEDATTN_DTYPE_BFLOAT16);
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = 10;
  RunAndCompare(c, {}, o, /*may_refuse=*/true);
}

// The library's derived backward and a hand-written one give the same gradients on cuDNN.
TEST(FlexCudnn, DerivedBackwardEqualsAnExplicitOne) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  ScoreMod derived, explicit_grad;
  derived.set_score(2.0 * tanh(derived.score() / 2.0)).finalize();
  {
    Expr t = tanh(explicit_grad.score() / 2.0);
    explicit_grad.set_score(2.0 * t);
    explicit_grad.set_gradient(explicit_grad.score(), 1.0 - t * t);
    explicit_grad.finalize();
  }
  ASSERT_FALSE(derived.equals(explicit_grad)) << "an explicit gradient is part of the graph";
  for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_FLOAT16}) {
    SCOPED_TRACE(dtype == FUSEDATTN_DTYPE_BFLOAT16 ? "bf16" : "fp16");
    fusedattn_config c = Config(2, 4, 2, 96, 96, 64, dtype);
    c.mask = FUSEDATTN_MASK_CAUSAL;
    TensorOptions o;
    o.seed = 11;
    o.input_range = 2.0;
    Outputs a, b;
    c.score_mod = derived.get();
    RunAndCompare(c, {}, o, false, &a);
    c.score_mod = explicit_grad.get();
    RunAndCompare(c, {}, o, false, &b);
    if (HasFatalFailure()) return;
    const double tol = Tolerance(dtype);
    for (auto [name, x, y] : {std::make_tuple("dQ", &a.bwd.dq, &b.bwd.dq),
                              std::make_tuple("dK", &a.bwd.dk, &b.bwd.dk),
                              std::make_tuple("dV", &a.bwd.dv, &b.bwd.dv)}) {
      Comparison cmp = Compare(*y, *x);
      EXPECT_TRUE(cmp.ok(tol)) << name << " explicit vs derived: " << cmp.describe();
    }
  }
}

// Selection now picks cuDNN for a score_mod on CUDA (the reference is never chosen
// automatically).
TEST(FlexCudnn, SelectionPicksCudnnForAScoreMod) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  ScoreMod mod;
  mod.set_score(30.0 * tanh(mod.score() / 30.0)).finalize();
  fusedattn_config c = Config(2, 4, 2, 128, 128, 64, FUSEDATTN_DTYPE_BFLOAT16);
  c.backend = FUSEDATTN_BACKEND_AUTO;
  c.score_mod = mod.get();
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  char msg[8192];
  ASSERT_EQ(fusedattn_get_backend(&c, &backend, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  EXPECT_EQ(backend, FUSEDATTN_BACKEND_CUDNN) << msg;
}

// A graph built twice hits the plan the first one built; another graph builds its own.
TEST(FlexCudnn, EqualGraphsBuiltTwiceShareThePlan) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  auto make = [](double cap, ScoreMod* mod) {
    mod->set_score(cap * tanh(mod->score() / cap)).finalize();
  };
  ScoreMod first, second, other;
  make(7.0, &first);
  make(7.0, &second);
  make(std::nextafter(7.0, 8.0), &other);
  fusedattn_config c = Config(1, 2, 2, 64, 64, 64, FUSEDATTN_DTYPE_BFLOAT16);
  c.is_training = 0;
  char msg[2048];
  fusedattn_backend backend;
  auto misses = [] {
    fusedattn_cache_stats s{};
    fusedattn_get_cache_stats(FUSEDATTN_BACKEND_CUDNN, &s);
    return s.misses;
  };
  c.score_mod = first.get();
  ASSERT_EQ(fusedattn_get_backend(&c, &backend, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  const uint64_t after_first = misses();
  c.score_mod = second.get();
  ASSERT_EQ(fusedattn_get_backend(&c, &backend, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  EXPECT_EQ(misses(), after_first) << "an equal graph built again";
  c.score_mod = other.get();
  ASSERT_EQ(fusedattn_get_backend(&c, &backend, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  EXPECT_EQ(misses(), after_first + 1) << "a constant one bit away";
}


}  // namespace
}  // namespace fusedattn::testing

#endif  // FUSEDATTN_WITH_CUDNN
