// The flash backend's score_mod code generator without a GPU: the generated policy for every op
// compiles with NVRTC into the flash kernels (CUBIN for sm_90a; the mma.sync kernels, and the
// Hopper forward with ptxas's spill report), the module cache is keyed by the graph's structure,
// and the cold compile time of each kernel is printed. Skips (saying why)
// where NVRTC cannot find the CUDA headers.
#ifdef FUSEDATTN_WITH_FLASH

#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

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
  for (const char* want : {"fabsf(", "expf(", "logf(", "SoftcapTanh(", "FlexMin(", "FlexMax(", " ? ",
                           " && ", " || ", "__half2float", "__bfloat162float",
                           "static_cast<const int*>", "atomicAdd(", "static bool Mask("})
    EXPECT_NE(policy.find(want), std::string::npos) << want << "\n" << policy;
  // Constants are exact float32 bit patterns: 0.5f is 0x3f000000.
  EXPECT_NE(policy.find("__uint_as_float(0x3f000000u)"), std::string::npos) << policy;
}

// flash's kernels take the graph's tanh from the softcap's tanh.approx (SoftcapTanh) and divide by
// a constant as a multiply by its float32 reciprocal (fusedattn.h, "Score modifiers"); a division
// by anything else stays a division, and the generic emitter keeps tanhf and "/".
TEST(FlexCodegen, FlashTakesTheFastTanhAndMultipliesByAConstantsReciprocal) {
  ScoreMod mod;
  Expr s = mod.score();
  mod.set_score(30.0 * tanh(s / 30.0) + s / mod.kv_idx() + s / 0.0 + s / 1e-39).finalize();
  auto count = [](const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  const std::string policy = flash::jit::PolicySource(*Internal(mod));
  const size_t at = policy.find("static bool ForwardAt(");
  ASSERT_NE(at, std::string::npos) << policy;
  const std::string forward = policy.substr(at, policy.find("static bool Forward(", at) - at);
  EXPECT_EQ(count(forward, "SoftcapTanh("), 1) << forward;
  EXPECT_EQ(count(policy, "tanhf("), 0) << policy;
  // s / 30 is s times 1 / 30 rounded to float32 (0x3d088889); s / kv_idx (a variable), s / 0
  // (no reciprocal) and s / 1e-39 (a float32 denormal: its reciprocal overflows) stay divisions.
  EXPECT_EQ(count(forward, " * __uint_as_float(0x3d088889u)"), 1) << forward;
  EXPECT_EQ(count(forward, " / "), 3) << forward;
  EXPECT_EQ(count(forward, "0x7f800000u"), 0) << forward;  // no infinite multiplier

  flex::CudaNames generic;
  for (int k = 0; k < flex::kNumInputs; ++k) generic.inputs[k] = "x" + std::to_string(k);
  std::string plain;
  flex::EmitCudaNodes(Internal(mod)->forward(), Internal(mod)->tensors(), generic, &plain);
  EXPECT_EQ(count(plain, "tanhf("), 1) << plain;
  EXPECT_EQ(count(plain, " / "), 4) << plain;
  EXPECT_EQ(count(plain, "0x3d088889u"), 0) << plain;
}

// A tensor is read over the axes it declares (FlexAxesOffset<axes>): the others have stride 0, and
// leaving them out lets the compiler see one element per row (or key) of a tile.
TEST(FlexCodegen, TensorReadsUseOnlyTheDeclaredAxes) {
  ScoreMod mod;
  BuildEveryOp(&mod);
  const std::string policy = flash::jit::PolicySource(*Internal(mod));
  // bias: head | q | kv = 14; half: head = 2; bf: q = 4; doc: batch | kv = 9.
  for (const char* want :
       {"FlexAxesOffset<14u>(p.flex.tensors[0]", "FlexAxesOffset<2u>(p.flex.tensors[1]",
        "FlexAxesOffset<4u>(p.flex.tensors[2]", "FlexAxesOffset<9u>(p.flex.tensors[3]"})
    EXPECT_NE(policy.find(want), std::string::npos) << want << "\n" << policy;
  EXPECT_EQ(policy.find("FlexOffset(p.flex.tensors"), std::string::npos) << policy;
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

// The fusedattn.flex examples of issue 17 on the Hopper forward (wgmma + TMA, sm_90a): each graph
// compiles with NVRTC at d128, and one graph with every op into every tile the planner may choose
// (d64 with 64 and 128 keys per step, d128, d256), with no ptxas warning (a serialized wgmma
// would be C7510-C7519) and spills within the example's bound. Prints ptxas's registers (the
// launch's budget: setmaxnreg moves the consumers to 240, or 104 on d64's 64-key tile), the
// spills, whether the kernel kept the intra-warpgroup overlap, and the compile time.
struct HopperExample {
  const char* name;
  std::function<void(ScoreMod*)> build;
  int max_spill;  // bytes (stores + loads) the kernel may spill: see ExpectHopperCompiles
};
std::vector<HopperExample> HopperExamples() {
  return {
      {"relative_bias",
       [](ScoreMod* m) { m->set_score(m->score() + 0.05 * (m->q_idx() - m->kv_idx())); }, 16},
      {"softcap_tanh", [](ScoreMod* m) { m->set_score(30.0 * tanh(m->score() / 30.0)); }, 16},
      {"alibi_expression",
       [](ScoreMod* m) {
         Expr slope = m->tensor("slopes", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_HEAD);
         m->set_score(m->score() - slope * abs(m->q_idx_br() - m->kv_idx()));
       },
       16},
      {"sliding_window_mask",
       [](ScoreMod* m) {
         m->set_mask(m->kv_idx() <= m->q_idx() && m->q_idx() - m->kv_idx() < 256.0);
       },
       16},
      {"document_mask",
       [](ScoreMod* m) {
         Expr doc_q = m->tensor("doc_q", FUSEDATTN_DTYPE_INT32,
                                FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_Q);
         Expr doc_kv = m->tensor("doc_kv", FUSEDATTN_DTYPE_INT32,
                                 FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_KV);
         m->set_mask(eq(doc_q, doc_kv) && m->kv_idx() <= m->q_idx());
       },
       96},
      {"bias_tensor",
       [](ScoreMod* m) {
         Expr bias = m->tensor("bias", FUSEDATTN_DTYPE_BFLOAT16,
                               FUSEDATTN_SCORE_MOD_AXIS_HEAD | FUSEDATTN_SCORE_MOD_AXIS_Q |
                                   FUSEDATTN_SCORE_MOD_AXIS_KV);
         m->set_score(m->score() + bias);
       },
       160},
  };
}

// max_spill: the spill bytes (stores + loads) allowed. ptxas spills a value or two (one reload
// per step) in some kernels with the overlap, and a few loop invariants in graphs that read
// tensors per element (the kernel without the overlap then; jit.h, Module::sm90_overlap); the
// bounds are a little above what nvcc 13.0 gives (printed; the README lists them), so that a
// change that makes the kernels spill more shows here.
void ExpectHopperCompiles(const ScoreMod& mod, const char* name, Variant v, int max_spill = 0) {
  auto module = flash::jit::Compile(*Internal(mod), v);
  ASSERT_TRUE(module->status.ok()) << name << ": " << module->status.message();
  EXPECT_GT(module->cubin.size(), 1000u);
  const flash::jit::PtxasReport& r = module->ptxas;
  EXPECT_TRUE(r.found) << name << ": no ptxas report for " << module->kernel_name << " in\n"
                       << module->log;
  EXPECT_LE(r.spill_stores + r.spill_loads, max_spill)
      << name << " d" << v.head_dim << "/" << v.keys_per_step << "\n" << module->log;
  EXPECT_TRUE(r.warnings.empty()) << name << " d" << v.head_dim << "/" << v.keys_per_step << ": "
                                  << r.warnings;
  std::printf("[ ptxas  ] Hopper score_mod forward %-20s %s d%-3d %3d keys/step: %d registers, "
              "%d/%d bytes spilled (stores/loads), %s, NVRTC %.0f ms, %zu bytes\n",
              name, v.dtype == FUSEDATTN_DTYPE_FLOAT16 ? "fp16" : "bf16", v.head_dim,
              v.keys_per_step, r.registers, r.spill_stores, r.spill_loads,
              module->sm90_overlap ? "overlap" : "no overlap", module->compile_ms,
              module->cubin.size());
}

TEST(FlexCodegen, HopperForwardExamplesCompileForSm90a) {
  SKIP_WITHOUT_NVRTC();
  for (const HopperExample& example : HopperExamples()) {
    ScoreMod mod;
    example.build(&mod);
    mod.finalize();
    Variant v;
    v.kernel = Kernel::kForwardSm90;
    v.dtype = FUSEDATTN_DTYPE_BFLOAT16;
    v.head_dim = 128;
    v.keys_per_step = 128;
    ExpectHopperCompiles(mod, example.name, v, example.max_spill);
  }
}

// Every op (tensors of each dtype, a mask, a gradient that the forward does not need) into every
// Hopper tile, both dtypes across them.
TEST(FlexCodegen, HopperForwardCompilesEveryOpIntoEveryTile) {
  SKIP_WITHOUT_NVRTC();
  ScoreMod mod;
  BuildEveryOp(&mod);
  // d64's 64-key tile has 104 registers per consumer thread (80 at launch; two blocks per SM),
  // and the graph's code twice (the interior tiles' path and the boundary tiles'): ptxas spills
  // 364 bytes there.
  const int tiles[4][3] = {{64, 64, 400}, {64, 128, 32}, {128, 128, 32}, {256, 80, 32}};
  for (int k = 0; k < 4; ++k) {
    Variant v;
    v.kernel = Kernel::kForwardSm90;
    v.dtype = k % 2 ? FUSEDATTN_DTYPE_FLOAT16 : FUSEDATTN_DTYPE_BFLOAT16;
    v.head_dim = tiles[k][0];
    v.keys_per_step = tiles[k][1];
    ExpectHopperCompiles(mod, "every_op", v, tiles[k][2]);
  }
}

// A Hopper forward of a shape it has no tile of, or for another architecture, is refused with a
// message (no compile).
TEST(FlexCodegen, HopperForwardRefusesShapesWithoutATile) {
  SKIP_WITHOUT_NVRTC();
  ScoreMod mod;
  mod.set_score(mod.score() * 2.0).finalize();
  Variant v;
  v.kernel = Kernel::kForwardSm90;
  v.head_dim = 128;
  v.keys_per_step = 64;
  auto module = flash::jit::Compile(*Internal(mod), v);
  EXPECT_FALSE(module->status.ok());
  EXPECT_NE(module->status.message().find("no Hopper score_mod forward"), std::string::npos)
      << module->status.message();
  v.keys_per_step = 128;
  v.arch = 80;
  EXPECT_FALSE(flash::jit::Compile(*Internal(mod), v)->status.ok());
}

// The block mask of a Hopper module is computed on its own tile (128 query rows, keys_per_step
// keys), and the source names the Hopper kernel with the kScoreMod policy.
TEST(FlexCodegen, HopperForwardBlockMaskUsesItsTile) {
  ScoreMod mod;
  mod.set_mask(mod.kv_idx() <= mod.q_idx()).finalize();
  Variant v;
  v.kernel = Kernel::kForwardSm90;
  v.head_dim = 64;
  v.keys_per_step = 128;
  int m = 0, n = 0;
  flash::jit::TileShape(v, &m, &n);
  EXPECT_EQ(m, 128);
  EXPECT_EQ(n, 128);
  // ceil(1000 / 128) x ceil(5000 / 128) bytes: the mask reads neither the batch nor the head.
  EXPECT_EQ(flash::jit::BlockMaskBytes(*Internal(mod), v, 2, 4, 1000, 5000), 8u * 40u);
  v.head_dim = 256;
  v.keys_per_step = 80;
  EXPECT_EQ(flash::jit::BlockMaskBytes(*Internal(mod), v, 2, 4, 1000, 5000), 8u * 63u);
  const std::string source = flash::jit::KernelSource(*Internal(mod), v);
  EXPECT_NE(source.find("backends/flash/fwd_kernel_sm90.cuh"), std::string::npos);
  EXPECT_NE(source.find("CUtensorMap"), std::string::npos);
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
