// score_mod graphs on flash's Hopper forward (fwd_kernel_sm90.cuh compiled by NVRTC with the graph
// as its Mod policy, jit.h Kernel::kForwardSm90; planner path hopper-score_mod-jit) against the
// CPU reference, on a GPU. Each test skips, saying why, without a CUDA device or NVRTC's headers;
// on a device that is not sm_90 (or with FUSEDATTN_FLASH_WGMMA=0) the cases still run, on the
// mma.sync score_mod kernel, and only the path checks are left out.
//
//  * FlexFlashHopper/FlexFlashHopperCase.*: the fusedattn.flex examples (relative bias, softcap
//    by tanh, ALiBi as an expression over a slopes tensor, a sliding window and a document mask
//    by mask_mod with block sparsity, a bias tensor read by the graph) with causal and not, GQA,
//    THD with gaps, padding with NaN in every row past a sequence's length, sequences ending
//    mid-tile, sinks, rows the mask_mod hides entirely, d64 (both tiles), d128 and d256, bf16 and
//    fp16: O, LSE and max_logit against the reference (shared/DESIGN.md's tolerances, poisoned
//    outputs), and on an sm_90 device the check that the call's plan is the Hopper score_mod
//    forward (flash::PlanForwardCall: what the backend runs).
//  * FlexFlashHopper.*: the dispatch rule on the device, the Hopper forward's O and LSE into the
//    (mma.sync) score_mod backward, a forward with the overlap turned off by ptxas's spills.
//  * FlexFlashHopperSanitize.*: small cases for compute-sanitizer:
//      compute-sanitizer --tool memcheck build/tests/fusedattn_gpu_tests --gtest_filter='FlexFlashHopperSanitize*'
//      compute-sanitizer --tool racecheck build/tests/fusedattn_gpu_tests --gtest_filter='FlexFlashHopperSanitize*'
#ifdef FUSEDATTN_WITH_FLASH

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/flash/jit.h"
#include "backends/flash/planner.h"
#include "backends/flash/sm90.h"
#include "fusedattn/fusedattn.h"
#include "fusedattn/score_mod.hpp"
#include "gpu/device_memory.h"
#include "gpu/expect_close.h"
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

// Whether score_mod forwards on this device and build are expected to take the Hopper kernel.
bool HopperExpected() {
  const flash::DeviceFacts d = flash::CurrentDeviceFacts();
  return d.sm90a_kernels && d.wgmma_allowed && d.compute_capability == 90;
}

// A training problem (LSE, and the max logit) on CUDA tensors, forced to flash; RunForward runs
// its forward, and its backward only when asked.
fusedattn_config Config(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t d,
                        fusedattn_dtype dtype) {
  fusedattn_config c = FlexConfig(FUSEDATTN_BACKEND_FLASH, b, hq, hkv, sq, skv, d, dtype);
  c.return_max_logit = 1;
  return c;
}

void SetFormat(fusedattn_config* c, fusedattn_format f) {
  c->q_format = c->kv_format = c->o_format = c->do_format = c->dqkv_format = f;
}

// NaN in every element of q, k and v rows past their sequence's length (BSHD with a padding
// mask): the kernel must never let them into a visible result (flash_wgmma_test.cpp's rule).
void PoisonPaddingRows(ProblemTensors* t) {
  const auto& c = t->config;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto poison = [&](HostTensor& x, const std::vector<int32_t>& lens, int64_t seqlen,
                    int64_t heads, int64_t dim) {
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t s = lens[b]; s < seqlen; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t e = 0; e < dim; ++e) x.set(x.offset_of({b, s, h, e}), nan);
  };
  poison(t->q, t->len_q, c.max_seqlen_q, c.heads_q, c.head_dim_qk);
  poison(t->k, t->len_kv, c.max_seqlen_kv, c.heads_kv, c.head_dim_qk);
  poison(t->v, t->len_kv, c.max_seqlen_kv, c.heads_kv, c.head_dim_v);
}

// The plan of a call (what the backend runs).
flash::ForwardPlan PlanOf(const fusedattn_config& c, const fusedattn_fwd_args& a) {
  flash::ForwardPlan plan;
  Status s = flash::PlanForwardCall(c, a, &plan);
  EXPECT_TRUE(s.ok()) << s.message();
  return plan;
}

struct RunOptions {
  TensorOptions tensors;
  bool nan_in_padding = false;   // BSHD padding problems: NaN in the rows past each length
  bool expect_hopper = true;     // on an sm_90 device, the plan must be the Hopper forward
  bool backward = false;         // then the score_mod backward from this forward's O and LSE
};

// One forward of `config` (its score_mod and the tensors `aux`) on flash against the reference:
// O, LSE, max logit. With backward, dQ, dK and dV of the backward that runs from this forward's
// O and LSE, against the reference's.
void RunForward(fusedattn_config config, const std::vector<HostTensor>& aux,
                const RunOptions& options, ProblemTensors* result = nullptr) {
  char msg[4096];
  fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
  ASSERT_EQ(fusedattn_get_backend(&config, &chosen, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  ASSERT_EQ(chosen, FUSEDATTN_BACKEND_FLASH);

  ProblemTensors host = MakeProblemTensors(config, options.tensors);
  if (options.nan_in_padding) PoisonPaddingRows(&host);
  ProblemTensors ref = host;
  fusedattn_config ref_config = config;
  ref_config.device = FUSEDATTN_DEVICE_CPU;
  ref_config.backend = FUSEDATTN_BACKEND_REFERENCE;
  std::vector<fusedattn_tensor> host_aux;
  for (const HostTensor& t : aux) host_aux.push_back(t.desc());
  fusedattn_fwd_args ref_fa = ref.fwd_args();
  ref_fa.num_score_mod_tensors = static_cast<int64_t>(aux.size());
  ref_fa.score_mod_tensors = host_aux.data();
  ASSERT_EQ(fusedattn_fwd(&ref_config, &ref_fa, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << "reference forward: " << msg;

  size_t fwd_bytes = 0, bwd_bytes = 0;
  ASSERT_EQ(fusedattn_fwd_workspace_size(&config, &fwd_bytes, msg, sizeof msg), FUSEDATTN_SUCCESS)
      << msg;
  if (options.backward)
    ASSERT_EQ(fusedattn_bwd_workspace_size(&config, &bwd_bytes, msg, sizeof msg),
              FUSEDATTN_SUCCESS)
        << msg;
  DeviceBuffer workspace(std::max(fwd_bytes, bwd_bytes));
  ASSERT_TRUE(workspace.bytes == 0 || workspace.ptr != nullptr);
  std::vector<std::unique_ptr<DeviceCopy>> copies;
  std::vector<fusedattn_tensor> device_aux;
  for (const HostTensor& t : aux) {
    copies.push_back(std::make_unique<DeviceCopy>(t));
    ASSERT_NE(copies.back()->ptr, nullptr) << "cudaMalloc failed";
    device_aux.push_back(t.desc_at(copies.back()->ptr));
  }
  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(host, &error)) << error;
  fusedattn_fwd_args fa = dev.fwd_args();
  fa.num_score_mod_tensors = static_cast<int64_t>(aux.size());
  fa.score_mod_tensors = device_aux.data();

  const flash::ForwardPlan plan = PlanOf(config, fa);
  if (HopperExpected() && options.expect_hopper) {
    EXPECT_EQ(plan.path, flash::KernelPath::kHopperScoreModJit) << DescribeForwardPlan(plan);
    EXPECT_EQ(plan.variant, flash::KernelVariant::kScoreMod);
    EXPECT_EQ(plan.keys_per_step,
              flash::Sm90ForwardKeysPerStep(plan.instance, config.max_seqlen_kv));
  } else {
    EXPECT_NE(plan.path, flash::KernelPath::kHopperScoreModJit) << DescribeForwardPlan(plan);
  }

  ASSERT_EQ(fusedattn_fwd(&config, &fa, workspace.ptr, workspace.bytes, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
  ProblemTensors out = host;
  ASSERT_TRUE(dev.download_outputs(&out, &error)) << error;
  const double tol = Tolerance(config.qkv_dtype);
  ExpectClose("O", out.o, ref.o, tol);
  ExpectClose("LSE", out.lse, ref.lse, tol);
  ExpectClose("max_logit", out.max_logit, ref.max_logit, tol);
  if (result != nullptr) *result = out;
  if (!options.backward) return;

  // The backward from this forward's O and LSE (left on the device by the forward).
  fusedattn_bwd_args ba = dev.bwd_args();
  ba.num_score_mod_tensors = static_cast<int64_t>(aux.size());
  ba.score_mod_tensors = device_aux.data();
  flash::BackwardPlan bwd_plan;
  ASSERT_TRUE(flash::PlanBackwardCall(config, ba, &bwd_plan).ok());
  EXPECT_EQ(bwd_plan.path, flash::KernelPath::kScoreModJit) << DescribeBackwardPlan(bwd_plan);
  ASSERT_EQ(fusedattn_bwd(&config, &ba, workspace.ptr, workspace.bytes, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
  ProblemTensors grads = host;
  ASSERT_TRUE(dev.download_outputs(&grads, &error)) << error;
  fusedattn_bwd_args ref_ba = ref.bwd_args();
  ref_ba.num_score_mod_tensors = static_cast<int64_t>(aux.size());
  ref_ba.score_mod_tensors = host_aux.data();
  ASSERT_EQ(fusedattn_bwd(&ref_config, &ref_ba, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << "reference backward: " << msg;
  ExpectClose("dQ", grads.dq, ref.dq, tol);
  ExpectClose("dK", grads.dk, ref.dk, tol);
  ExpectClose("dV", grads.dv, ref.dv, tol);
}

// ---- The graphs ----

void RelativeBias(ScoreMod* m) { m->set_score(m->score() + 0.05 * (m->q_idx() - m->kv_idx())); }
void SoftcapTanh(ScoreMod* m) { m->set_score(30.0 * tanh(m->score() / 30.0)); }
void AlibiExpression(ScoreMod* m) {  // one tensor: the slopes [heads]
  Expr slope = m->tensor("slopes", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_HEAD);
  m->set_score(m->score() - slope * abs(m->q_idx_br() - m->kv_idx()));
}
void SlidingWindow(ScoreMod* m) {  // causal, 100 keys
  m->set_mask(m->kv_idx() <= m->q_idx() && m->q_idx() - m->kv_idx() < 100.0);
}
void DocumentMask(ScoreMod* m) {  // two tensors: document ids [batch, q] and [batch, kv]
  Expr doc_q = m->tensor("doc_q", FUSEDATTN_DTYPE_INT32,
                         FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_Q);
  Expr doc_kv = m->tensor("doc_kv", FUSEDATTN_DTYPE_INT32,
                          FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_KV);
  m->set_mask(eq(doc_q, doc_kv) && m->kv_idx() <= m->q_idx());
}
void BiasTensor(ScoreMod* m) {  // one tensor: a float32 bias [heads, q, kv]
  Expr bias = m->tensor("bias", FUSEDATTN_DTYPE_FLOAT32,
                        FUSEDATTN_SCORE_MOD_AXIS_HEAD | FUSEDATTN_SCORE_MOD_AXIS_Q |
                            FUSEDATTN_SCORE_MOD_AXIS_KV);
  m->set_score(m->score() + bias);
}
void HidesEarlyRows(ScoreMod* m) {  // rows below 200 see nothing: their query tile is skipped
  m->set_score(2.0 * tanh(m->score() / 2.0));
  m->set_mask(m->q_idx() >= 200.0 && m->kv_idx() <= m->q_idx());
}

HostTensor Slopes(int64_t heads) {
  HostTensor slopes(FUSEDATTN_DTYPE_FLOAT32, {heads});
  for (int64_t h = 0; h < heads; ++h) slopes.set(h, std::exp2(-8.0 * (h + 1) / heads));
  return slopes;
}
// Document ids [batch, s]: documents of uneven lengths (a new one every 37 * (b + 2) tokens).
HostTensor DocumentIds(int64_t batch, int64_t s) {
  HostTensor ids(FUSEDATTN_DTYPE_INT32, {batch, s});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < s; ++i) ids.set(b * s + i, static_cast<double>(i / (37 * (b + 2))));
  return ids;
}

// ---- The cases ----

struct Case {
  std::string name;
  std::function<void(ScoreMod*)> graph;
  fusedattn_config config;
  std::vector<HostTensor> aux;
  RunOptions options;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  uint64_t seed = 700;
  auto add = [&](std::string name, std::function<void(ScoreMod*)> graph, fusedattn_config c,
                 std::vector<HostTensor> aux = {}, RunOptions o = {}) {
    o.tensors.seed = ++seed;
    cases.push_back({std::move(name), std::move(graph), c, std::move(aux), o});
  };
  for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_FLOAT16}) {
    const std::string t = dtype == FUSEDATTN_DTYPE_BFLOAT16 ? "_bf16" : "_fp16";
    for (int64_t d : {64, 128, 256}) {
      const std::string dn = "_d" + std::to_string(d);
      {  // causal, keys ending mid-tile
        fusedattn_config c = Config(2, 4, 4, 300, 300, d, dtype);
        c.mask = FUSEDATTN_MASK_CAUSAL;
        add("relative_bias_causal" + dn + t, RelativeBias, c);
      }
      {  // not causal, GQA, sq < skv
        fusedattn_config c = Config(2, 8, 2, 130, 333, d, dtype);
        add("relative_bias_gqa" + dn + t, RelativeBias, c);
      }
      {
        fusedattn_config c = Config(2, 4, 2, 130, 160, d, dtype);
        RunOptions o;
        o.tensors.input_range = 4.0;  // scores of tens: the tanh bends
        add("softcap_tanh" + dn + t, SoftcapTanh, c, {}, o);
      }
      {
        fusedattn_config c = Config(2, 4, 2, 77, 300, d, dtype);
        c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
        add("alibi_expression_causal_bottom_right" + dn + t, AlibiExpression, c, {Slopes(4)});
      }
      {  // block sparsity: most key tiles of a query tile hidden
        fusedattn_config c = Config(1, 2, 1, 1000, 1000, d, dtype);
        add("sliding_window_mask" + dn + t, SlidingWindow, c);
      }
      {  // block sparsity from per-sequence tensors (the block mask per batch)
        fusedattn_config c = Config(2, 4, 2, 700, 700, d, dtype);
        add("document_mask" + dn + t, DocumentMask, c, {DocumentIds(2, 700), DocumentIds(2, 700)});
      }
      {  // a tensor over (head, q, kv) read per element
        fusedattn_config c = Config(2, 4, 2, 200, 260, d, dtype);
        c.mask = FUSEDATTN_MASK_CAUSAL;
        add("bias_tensor_causal" + dn + t, BiasTensor, c,
            {Uniform(FUSEDATTN_DTYPE_FLOAT32, {4, 200, 260}, seed + 1000, -1.0, 1.0)});
      }
      {  // padding: uneven lengths, NaN past them, lengths ending mid-tile
        fusedattn_config c = Config(3, 4, 2, 300, 333, d, dtype);
        c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
        RunOptions o;
        o.nan_in_padding = true;
        o.tensors.len_q = {300, 129, 1};
        o.tensors.len_kv = {333, 200, 63};
        add("softcap_tanh_padding_nan" + dn + t, SoftcapTanh, c, {}, o);
      }
      {  // THD with gaps between the sequences, packed LSE, a mask_mod
        fusedattn_config c = Config(3, 4, 2, 260, 260, d, dtype);
        SetFormat(&c, FUSEDATTN_FORMAT_THD);
        c.mask = FUSEDATTN_MASK_PADDING;
        RunOptions o;
        o.tensors.thd_gaps = true;
        o.tensors.lse_packed = true;
        o.tensors.len_q = {260, 97, 0};
        o.tensors.len_kv = {260, 130, 64};
        add("sliding_window_mask_thd" + dn + t, SlidingWindow, c, {}, o);
      }
      {  // a learnable sink, rows the mask_mod hides entirely (their query tile skipped)
        fusedattn_config c = Config(1, 4, 4, 400, 400, d, dtype);
        c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
        add("hidden_rows_with_sink" + dn + t, HidesEarlyRows, c);
      }
    }
    {  // d64's long-key tile (from 4096 keys), a window from the config next to the graph
      fusedattn_config c = Config(1, 2, 1, 130, 4200, 64, dtype);
      c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
      c.window_left = 1500;
      add("alibi_expression_long_keys_window_d64" + t, AlibiExpression, c, {Slopes(2)});
    }
    {  // head dims padded to an instance: 96 on d128, 192/128 on d256; a negative scale
      fusedattn_config c = Config(2, 2, 2, 150, 150, 96, dtype);
      c.attn_scale = -0.1;
      add("relative_bias_d96_negative_scale" + t, RelativeBias, c);
      fusedattn_config e = Config(1, 2, 2, 150, 150, 128, dtype);
      e.head_dim_qk = 192;
      add("softcap_tanh_d192_128" + t, SoftcapTanh, e);
    }
  }
  return cases;
}

class FlexFlashHopperCase : public ::testing::TestWithParam<Case> {};

TEST_P(FlexFlashHopperCase, MatchesTheReference) {
  SKIP_WITHOUT_FLASH_JIT();
  const Case& k = GetParam();
  ScoreMod mod;
  k.graph(&mod);
  mod.finalize();
  fusedattn_config c = k.config;
  c.score_mod = mod.get();
  RunForward(c, k.aux, k.options);
}

INSTANTIATE_TEST_SUITE_P(FlexFlashHopper, FlexFlashHopperCase, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The dispatch rule on this device: a graph alone runs the Hopper forward (on sm_90); with the
// config's own softcap, ALiBi, a bias tensor or dropout next to it, the mma.sync score_mod kernel;
// the backward always the mma.sync score_mod kernel. Both forwards match the reference.
TEST(FlexFlashHopper, PathIsTakenExactlyWhenItShouldBe) {
  SKIP_WITHOUT_FLASH_JIT();
  ScoreMod mod;
  RelativeBias(&mod);
  mod.finalize();
  fusedattn_config plain = Config(2, 4, 2, 200, 200, 128, FUSEDATTN_DTYPE_BFLOAT16);
  plain.score_mod = mod.get();
  RunOptions hopper;
  RunForward(plain, {}, hopper);
  fusedattn_config softcap = plain;
  softcap.softcap = 20.0;
  RunOptions mma_sync;
  mma_sync.expect_hopper = false;
  RunForward(softcap, {}, mma_sync);
  fusedattn_config alibi = plain;
  alibi.bias_type = FUSEDATTN_BIAS_ALIBI;
  RunForward(alibi, {}, mma_sync);
  // The backward's plan names why the Hopper kernels do not run it.
  fusedattn_config training = plain;
  training.is_training = 1;
  ProblemTensors host = MakeProblemTensors(training, {});
  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(host, &error)) << error;
  flash::BackwardPlan plan;
  ASSERT_TRUE(flash::PlanBackwardCall(training, dev.bwd_args(), &plan).ok());
  EXPECT_EQ(plan.path, flash::KernelPath::kScoreModJit);
  if (HopperExpected())
    EXPECT_NE(plan.why.find("hopper backward: no score_mod graphs"), std::string::npos) << plan.why;
}

// The Hopper forward's O and LSE into the (mma.sync) score_mod backward: the backward
// recomputes the same P from that LSE (dQ, dK, dV against the reference's).
TEST(FlexFlashHopper, ForwardThenTheScoreModBackward) {
  SKIP_WITHOUT_FLASH_JIT();
  for (auto graph : {&SoftcapTanh, &SlidingWindow}) {
    for (int64_t d : {64, 128}) {
      ScoreMod mod;
      graph(&mod);
      mod.finalize();
      fusedattn_config c = Config(2, 4, 2, 300, 280, d, FUSEDATTN_DTYPE_BFLOAT16);
      c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
      c.score_mod = mod.get();
      RunOptions o;
      o.backward = true;
      o.tensors.seed = 900 + d;
      RunForward(c, {}, o);
    }
  }
}

// A graph whose Hopper kernel ptxas compiles without the intra-warpgroup overlap (jit.h,
// Module::sm90_overlap: the kernel with the overlap spilled more) runs right too: the document
// mask at d128 (which one this is is printed; the test checks the results either way).
TEST(FlexFlashHopper, DocumentMaskWithAndWithoutTheOverlap) {
  SKIP_WITHOUT_FLASH_JIT();
  ScoreMod mod;
  DocumentMask(&mod);
  mod.finalize();
  fusedattn_config c = Config(2, 4, 4, 1000, 1000, 128, FUSEDATTN_DTYPE_BFLOAT16);
  c.score_mod = mod.get();
  RunOptions o;
  o.tensors.seed = 77;
  RunForward(c, {DocumentIds(2, 1000), DocumentIds(2, 1000)}, o);
  flash::jit::Variant v;
  v.kernel = flash::jit::Kernel::kForwardSm90;
  v.head_dim = 128;
  v.keys_per_step = 128;
  std::shared_ptr<const flex::ScoreMod> internal;
  ASSERT_TRUE(flex::FinalizedOf(mod.get(), "mod", &internal).ok());
  auto module = flash::jit::GetModule(internal, v);
  ASSERT_TRUE(module->status.ok()) << module->status.message();
  std::printf("[ info   ] document mask d128: %s, ptxas %d/%d bytes spilled\n",
              module->sm90_overlap ? "overlap" : "no overlap", module->ptxas.spill_stores,
              module->ptxas.spill_loads);
}

// Small enough for compute-sanitizer (memcheck, racecheck): block sparsity with per-batch
// tensors, a tensor read per element, keys and queries ending mid-tile, padding, THD, the d64
// tiles, d128 and d256.
TEST(FlexFlashHopperSanitize, SmallCases) {
  SKIP_WITHOUT_FLASH_JIT();
  {
    ScoreMod mod;
    DocumentMask(&mod);
    mod.finalize();
    for (int64_t d : {64, 128, 256}) {
      fusedattn_config c = Config(2, 2, 1, 150, 150, d, FUSEDATTN_DTYPE_BFLOAT16);
      c.score_mod = mod.get();
      RunOptions o;
      o.tensors.seed = 31 + d;
      RunForward(c, {DocumentIds(2, 150), DocumentIds(2, 150)}, o);
    }
  }
  {
    ScoreMod mod;
    BiasTensor(&mod);
    mod.finalize();
    fusedattn_config c = Config(2, 2, 2, 70, 150, 128, FUSEDATTN_DTYPE_FLOAT16);
    c.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
    c.score_mod = mod.get();
    RunOptions o;
    o.tensors.seed = 41;
    o.tensors.len_q = {70, 5};
    o.tensors.len_kv = {150, 66};
    o.nan_in_padding = true;
    RunForward(c, {Uniform(FUSEDATTN_DTYPE_FLOAT32, {2, 70, 150}, 42, -1.0, 1.0)}, o);
  }
  {
    ScoreMod mod;
    SlidingWindow(&mod);
    mod.finalize();
    fusedattn_config c = Config(2, 2, 1, 200, 200, 64, FUSEDATTN_DTYPE_BFLOAT16);
    SetFormat(&c, FUSEDATTN_FORMAT_THD);
    c.mask = FUSEDATTN_MASK_PADDING;
    c.score_mod = mod.get();
    RunOptions o;
    o.tensors.seed = 43;
    o.tensors.thd_gaps = true;
    o.tensors.lse_packed = true;
    o.tensors.len_q = {200, 65};
    o.tensors.len_kv = {130, 200};
    RunForward(c, {}, o);
  }
}

}  // namespace
}  // namespace fusedattn::testing

#endif  // FUSEDATTN_WITH_FLASH
