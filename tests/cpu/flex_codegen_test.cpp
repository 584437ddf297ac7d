// The flash backend's score_mod code generator without a GPU: the generated policy for every op
// compiles with NVRTC into the flash kernels (CUBIN for sm_90a), the module cache is keyed by the
// graph's structure, and the cold compile time of each kernel is printed. Skips (saying why)
// where NVRTC cannot find the CUDA headers.
#ifdef FUSEDATTN_WITH_FLASH

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "backends/flash/jit.h"
#include "flex/codegen.h"
#include "flex_test_util.h"

namespace fusedattn {
namespace {

using flash::jit::Kernel;
using flash::jit::Variant;
using flex_test::Internal;

#define SKIP_WITHOUT_NVRTC()                                                   \
  do {                                                                         \
    Status s_ = flash::jit::Available();                                       \
    if (!s_.ok()) GTEST_SKIP() << s_.message();                                \
  } while (0)

// Every op of the graph language at least once, a tensor of each dtype, one with a gradient.
void BuildEveryOp(ScoreMod* mod) {
  Expr s = mod->score();
  Expr bias = mod->tensor("bias", FUSEDATTN_DTYPE_FLOAT32,
                          FUSEDATTN_SCORE_MOD_AXIS_HEAD | FUSEDATTN_SCORE_MOD_AXIS_Q |
                              FUSEDATTN_SCORE_MOD_AXIS_KV,
                          true);
  Expr half = mod->tensor("half", FUSEDATTN_DTYPE_FLOAT16, FUSEDATTN_SCORE_MOD_AXIS_HEAD);
  Expr bf = mod->tensor("bf", FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_SCORE_MOD_AXIS_Q);
  Expr doc = mod->tensor("doc", FUSEDATTN_DTYPE_INT32,
                         FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_KV);
  Expr i = mod->q_idx(), j = mod->kv_idx();
  Expr a = -abs(s) + exp(s / 8.0) - log(1.0 + sigmoid(s)) * tanh(s);
  Expr b = min(a, bias) + max(half * bf, mod->batch() - mod->head());
  Expr c = select(s > 0.0 && !(s <= -1.0), b, a * 0.5);
  mod->set_score(c + (mod->seqlen_q() - mod->seqlen_kv()) * 0.0 + bias);
  mod->set_mask((j <= i || ne(doc, 2.0)) && (i < 1000.0 || eq(doc, 1.0)) && j >= 0.0 &&
                i > -1.0);
  mod->finalize();
}

TEST(FlexCodegen, EveryOpEmitsOneLinePerNode) {
  ScoreMod mod;
  BuildEveryOp(&mod);
  auto internal = Internal(mod);
  const std::string policy = flash::jit::PolicySource(*internal);
  for (const char* want : {"fabsf(", "expf(", "logf(", "tanhf(", "FlexMin(", "FlexMax(", " ? ",
                           " && ", " || ", "__half2float", "__bfloat162float",
                           "static_cast<const int*>", "atomicAdd(", "static bool Mask("})
    EXPECT_NE(policy.find(want), std::string::npos) << want << "\n" << policy;
  // Constants are exact float32 bit patterns: 0.5f is 0x3f000000.
  EXPECT_NE(policy.find("__uint_as_float(0x3f000000u)"), std::string::npos) << policy;
}

TEST(FlexCodegen, MaskDependenceDecidesTheBlockMaskBroadcast) {
  ScoreMod causal, doc, head;
  causal.set_mask(causal.kv_idx() <= causal.q_idx()).finalize();
  Expr ids = doc.tensor("doc", FUSEDATTN_DTYPE_INT32,
                        FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_Q);
  doc.set_mask(eq(ids, 1.0)).finalize();
  head.set_mask(head.head() > 1.0).finalize();
  auto dep = [](const ScoreMod& m) {
    auto s = Internal(m);
    return flex::DependenceOf(s->forward().nodes, s->tensors(), s->forward().mask);
  };
  EXPECT_FALSE(dep(causal).batch);
  EXPECT_FALSE(dep(causal).head);
  EXPECT_TRUE(dep(doc).batch);
  EXPECT_FALSE(dep(doc).head);
  EXPECT_TRUE(dep(head).head);
}

// Every kernel (forward, backward, deterministic dQ) of every op compiles to CUBIN for sm_90a;
// the time of each is printed (cold: nothing cached).
TEST(FlexCodegen, EveryOpCompilesIntoEachKernelWithNvrtc) {
  SKIP_WITHOUT_NVRTC();
  ScoreMod mod;
  BuildEveryOp(&mod);
  auto internal = Internal(mod);
  for (Kernel kernel : {Kernel::kForward, Kernel::kBackward, Kernel::kBackwardDq}) {
    Variant v;
    v.kernel = kernel;
    v.dtype = kernel == Kernel::kBackward ? FUSEDATTN_DTYPE_FLOAT16 : FUSEDATTN_DTYPE_BFLOAT16;
    v.head_dim = 128;
    auto module = flash::jit::Compile(*internal, v);
    ASSERT_TRUE(module->status.ok()) << module->status.message();
    EXPECT_GT(module->cubin.size(), 1000u);
    EXPECT_FALSE(module->kernel_name.empty());
    EXPECT_EQ(module->mask_kernel_name, "fusedattn_flex_block_mask");
    std::printf("[ timing ] score_mod %s kernel (d128): codegen %.2f ms, NVRTC to CUBIN %.0f ms, "
                "%zu bytes\n",
                flash::jit::KernelName(kernel), module->codegen_ms, module->compile_ms,
                module->cubin.size());
    RecordProperty(std::string("compile_ms_") + flash::jit::KernelName(kernel),
                   std::to_string(module->compile_ms));
  }
}

// The examples (a soft-cap, a document mask, ALiBi slopes) compile for each head dim.
TEST(FlexCodegen, ExamplesCompileForEveryHeadDim) {
  SKIP_WITHOUT_NVRTC();
  ScoreMod softcap, alibi;
  softcap.set_score(30.0 * tanh(softcap.score() / 30.0)).finalize();
  Expr slope = alibi.tensor("slopes", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_HEAD);
  alibi.set_score(alibi.score() - slope * abs(alibi.q_idx_br() - alibi.kv_idx()));
  alibi.set_mask(alibi.kv_idx() <= alibi.q_idx_br()).finalize();
  for (int dim : {64, 256}) {
    for (const ScoreMod* m : {&softcap, &alibi}) {
      Variant v;
      v.kernel = Kernel::kForward;
      v.head_dim = dim;
      auto module = flash::jit::Compile(*Internal(*m), v);
      ASSERT_TRUE(module->status.ok()) << module->status.message();
      std::printf("[ timing ] forward d%d: NVRTC to CUBIN %.0f ms\n", dim, module->compile_ms);
    }
  }
}

// The module cache: equal graphs built twice share one entry; a constant one bit away is another
// graph and another entry (even though both round to the same float32).
TEST(FlexCodegen, ModuleCacheIsKeyedByTheGraphsStructure) {
  SKIP_WITHOUT_NVRTC();
  auto make = [](double cap, ScoreMod* mod) {
    mod->set_score(cap * tanh(mod->score() / cap)).finalize();
  };
  ScoreMod first, second, other;
  make(7.0, &first);
  make(7.0, &second);
  make(std::nextafter(7.0, 8.0), &other);
  flash::jit::ClearCache();
  const fusedattn_cache_stats before = flash::jit::CacheStats();
  Variant v;
  v.kernel = Kernel::kForward;
  v.head_dim = 64;
  auto a = flash::jit::GetModule(Internal(first), v);
  ASSERT_TRUE(a->status.ok()) << a->status.message();
  auto b = flash::jit::GetModule(Internal(second), v);
  EXPECT_EQ(a.get(), b.get()) << "an equal graph built again";
  EXPECT_EQ(flash::jit::CacheStats().entries, 1u);
  EXPECT_EQ(flash::jit::CacheStats().misses, before.misses + 1);
  auto c = flash::jit::GetModule(Internal(other), v);
  EXPECT_NE(a.get(), c.get());
  EXPECT_EQ(flash::jit::CacheStats().entries, 2u) << "a constant one bit away";
  // Warm: a lookup, no compile.
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int kLookups = 1000;
  for (int k = 0; k < kLookups; ++k) flash::jit::GetModule(Internal(second), v);
  const double us = std::chrono::duration<double, std::micro>(
                        std::chrono::steady_clock::now() - t0).count() / kLookups;
  std::printf("[ timing ] warm module lookup (incl. handle -> graph): %.2f us\n", us);
  // Another variant of the same graph (head dim) is another entry.
  v.head_dim = 128;
  auto d = flash::jit::GetModule(Internal(first), v);
  EXPECT_NE(a.get(), d.get());
  EXPECT_EQ(flash::jit::CacheStats().entries, 3u);
  flash::jit::ClearCache();
}

}  // namespace
}  // namespace fusedattn

#endif  // FUSEDATTN_WITH_FLASH
