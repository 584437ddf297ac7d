// Score modifiers on the flash backend (the graph compiled at run time with NVRTC into the fast
// kernels, src/backends/flash/jit.h) against the CPU reference, on a GPU (each test skips, saying
// why, without a CUDA device or NVRTC's headers).
//
// The seven examples, bf16 and fp16, forward and backward (flex_run.h's RunAndCompare,
// shared with flex_cudnn_test.cpp), the flash backend forced; a tensor's gradient (post-scale
// bias); rows a mask_mod hides entirely; the deterministic refusal; one small case for
// compute-sanitizer:
//
//   build/tests/fusedattn_gpu_tests --gtest_filter='*FlexFlash*'   (Dtypes/FlexFlashExamples.* too)
//   compute-sanitizer --tool memcheck build/tests/fusedattn_gpu_tests --gtest_filter='FlexFlashSanitize*'
#ifdef FUSEDATTN_WITH_FLASH

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backends/flash/jit.h"
#include "fusedattn/fusedattn.h"
#include "fusedattn/score_mod.hpp"
#include "gpu/flex_run.h"
#include "gpu/skip.h"
#include "testing/tensors.h"

namespace fusedattn::testing {
namespace {

#define SKIP_WITHOUT_FLASH_JIT()                           \
  do {                                                     \
    SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);     \
    Status s_ = flash::jit::Available();                   \
    if (!s_.ok()) GTEST_SKIP() << s_.message();            \
  } while (0)

// A training problem on CUDA tensors forced to this file's backend.
fusedattn_config Config(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t d,
                        fusedattn_dtype dtype) {
  return FlexConfig(FUSEDATTN_BACKEND_FLASH, b, hq, hkv, sq, skv, d, dtype);
}

class FlexFlashExamples : public ::testing::TestWithParam<fusedattn_dtype> {
 protected:
  fusedattn_dtype dtype() const { return GetParam(); }
  uint64_t seed() const { return dtype() == FUSEDATTN_DTYPE_BFLOAT16 ? 301 : 402; }
};

TEST_P(FlexFlashExamples, CausalByIndexComparison) {
  SKIP_WITHOUT_FLASH_JIT();
  ScoreMod mod;
  mod.set_mask(mod.kv_idx() <= mod.q_idx()).finalize();
  fusedattn_config c = Config(2, 4, 2, 256, 256, 64, dtype());
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = seed();
  RunAndCompare(c, {}, o);
}

TEST_P(FlexFlashExamples, TanhSoftCap30) {
  SKIP_WITHOUT_FLASH_JIT();
  ScoreMod mod;
  mod.set_score(30.0 * tanh(mod.score() / 30.0)).finalize();
  fusedattn_config c = Config(2, 4, 2, 128, 160, 128, dtype());
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = seed() + 1;
  o.input_range = 4.0;  // scores of tens: the tanh bends
  RunAndCompare(c, {}, o);
}

TEST_P(FlexFlashExamples, RelativePositionBias) {
  SKIP_WITHOUT_FLASH_JIT();
  ScoreMod mod;
  mod.set_score(mod.score() + 0.05 * (mod.q_idx() - mod.kv_idx())).finalize();
  fusedattn_config c = Config(2, 4, 4, 96, 96, 64, dtype());
  c.mask = FUSEDATTN_MASK_CAUSAL;
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = seed() + 2;
  RunAndCompare(c, {}, o);
}

TEST_P(FlexFlashExamples, Alibi) {
  SKIP_WITHOUT_FLASH_JIT();
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

// A post-scale bias from a tensor, with its gradient (float32 atomics into a sum, converted).
TEST_P(FlexFlashExamples, PostScaleBiasFromATensorWithItsGradient) {
  SKIP_WITHOUT_FLASH_JIT();
  ScoreMod mod;
  Expr bias = mod.tensor("bias", dtype(),
                         FUSEDATTN_SCORE_MOD_AXIS_HEAD | FUSEDATTN_SCORE_MOD_AXIS_Q |
                             FUSEDATTN_SCORE_MOD_AXIS_KV,
                         true);
  mod.set_score(mod.score() + bias).finalize();
  fusedattn_config c = Config(2, 4, 2, 96, 128, 64, dtype());
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = seed() + 4;
  RunAndCompare(c, {Uniform(dtype(), {4, 96, 128}, seed() + 40, -1.0, 1.0)}, o, false, nullptr,
                {HostTensor(dtype(), {4, 96, 128})});
}

TEST_P(FlexFlashExamples, DocumentMaskingFromPerTokenIds) {
  SKIP_WITHOUT_FLASH_JIT();
  ScoreMod mod;
  Expr doc_q = mod.tensor("doc_q", FUSEDATTN_DTYPE_INT32,
                          FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_Q);
  Expr doc_kv = mod.tensor("doc_kv", FUSEDATTN_DTYPE_INT32,
                           FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_KV);
  mod.set_mask(eq(doc_q, doc_kv) && mod.kv_idx() <= mod.q_idx()).finalize();
  const int64_t batch = 2, s = 384;
  fusedattn_config c = Config(batch, 4, 2, s, s, 64, dtype());
  c.score_mod = mod.get();
  HostTensor ids(FUSEDATTN_DTYPE_INT32, {batch, s});
  const int64_t bounds[2][2] = {{140, 300}, {17, 190}};  // where documents 1 and 2 start
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < s; ++i)
      ids.set(b * s + i, static_cast<double>((i >= bounds[b][0]) + (i >= bounds[b][1])));
  TensorOptions o;
  o.seed = seed() + 5;
  RunAndCompare(c, {ids, ids}, o);
}

// A causal sliding window of 32 by mask_mod: the block mask skips the tiles left of the band.
TEST_P(FlexFlashExamples, SlidingWindowByMaskMod) {
  SKIP_WITHOUT_FLASH_JIT();
  ScoreMod mod;
  mod.set_mask(mod.kv_idx() <= mod.q_idx() && mod.q_idx() - mod.kv_idx() < 32.0).finalize();
  fusedattn_config c = Config(2, 4, 2, 512, 512, 64, dtype());
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = seed() + 6;
  RunAndCompare(c, {}, o);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FlexFlashExamples,
                         ::testing::Values(FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_FLOAT16),
                         [](const ::testing::TestParamInfo<fusedattn_dtype>& info) {
                           return info.param == FUSEDATTN_DTYPE_BFLOAT16 ? "bf16" : "fp16";
                         });

TEST(FlexFlash, RowsAMaskModHidesEntirelyAreEmpty) {
  SKIP_WITHOUT_FLASH_JIT();
  ScoreMod mod;
  mod.set_score(2.0 * tanh(mod.score() / 2.0));
  mod.set_mask(mod.q_idx() >= 5.0 && mod.kv_idx() >= 1.0 && mod.kv_idx() <= mod.q_idx());
  mod.finalize();
  fusedattn_config c = Config(2, 4, 2, 64, 64, 128, FUSEDATTN_DTYPE_BFLOAT16);
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = 9;
  Outputs out;
  RunAndCompare(c, {}, o, false, &out);
  if (HasFatalFailure() || IsSkipped()) return;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t i = 0; i < 5; ++i) {
        EXPECT_EQ(out.fwd.lse.at({b, h, i}), -INFINITY) << b << " " << h << " " << i;
        EXPECT_EQ(out.fwd.o.at({b, i, h, 0}), 0.0);
        EXPECT_EQ(out.bwd.dq.at({b, i, h, 0}), 0.0);
      }
}

// Padding, GQA, a config window and a score next to the mask_mod, d256, deterministic dQ kernel.
TEST(FlexFlash, PaddingWindowD256Deterministic) {
  SKIP_WITHOUT_FLASH_JIT();
  ScoreMod mod;
  mod.set_score(mod.score() * 1.5);
  mod.set_mask(ne(mod.kv_idx(), 3.0));
  mod.finalize();
  fusedattn_config c = Config(3, 4, 2, 96, 128, 256, FUSEDATTN_DTYPE_FLOAT16);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  c.window_left = 40;
  c.deterministic = 1;
  c.score_mod = mod.get();
  TensorOptions o;
  o.seed = 12;
  RunAndCompare(c, {}, o);
}

TEST(FlexFlash, DeterministicWithATensorGradientIsRefused) {
  SKIP_WITHOUT_FLASH_JIT();
  ScoreMod mod;
  Expr bias = mod.tensor("bias", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_HEAD, true);
  mod.set_score(mod.score() + bias).finalize();
  fusedattn_config c = Config(1, 2, 2, 64, 64, 64, FUSEDATTN_DTYPE_BFLOAT16);
  c.deterministic = 1;
  c.score_mod = mod.get();
  fusedattn_backend backend;
  char msg[2048];
  ASSERT_EQ(fusedattn_get_backend(&c, &backend, msg, sizeof msg), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(std::string(msg).find("deterministic"), std::string::npos) << msg;
}

// Small enough for compute-sanitizer (memcheck, racecheck): a mask, a score, a tensor gradient.
TEST(FlexFlashSanitize, SmallDocumentMaskWithATensorGradient) {
  SKIP_WITHOUT_FLASH_JIT();
  ScoreMod mod;
  Expr doc = mod.tensor("doc", FUSEDATTN_DTYPE_INT32, FUSEDATTN_SCORE_MOD_AXIS_KV);
  Expr bias = mod.tensor("bias", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_HEAD, true);
  mod.set_score(2.0 * tanh(mod.score() / 2.0) + bias);
  mod.set_mask(ne(doc, 1.0) || mod.kv_idx() <= mod.q_idx());
  mod.finalize();
  fusedattn_config c = Config(1, 2, 1, 70, 150, 64, FUSEDATTN_DTYPE_BFLOAT16);
  c.score_mod = mod.get();
  HostTensor ids(FUSEDATTN_DTYPE_INT32, {150});
  for (int64_t j = 0; j < 150; ++j) ids.set(j, j >= 64 && j < 128 ? 1.0 : 0.0);
  HostTensor bias_values(FUSEDATTN_DTYPE_FLOAT32, {2});
  bias_values.set(0, 0.25);
  bias_values.set(1, -0.5);
  TensorOptions o;
  o.seed = 13;
  RunAndCompare(c, {ids, bias_values}, o, false, nullptr,
                {HostTensor(), HostTensor(FUSEDATTN_DTYPE_FLOAT32, {2})});
}

}  // namespace
}  // namespace fusedattn::testing

#endif  // FUSEDATTN_WITH_FLASH
