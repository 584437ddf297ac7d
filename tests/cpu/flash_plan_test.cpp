// The flash planner (src/backends/flash/planner.h), on the CPU: which kernel runs a problem on given
// tensors and device — path, instance, variant, schedule, dQ and dbias handling, workspace — and
// the reason for every refusal. The device is described, not present, so these run without a GPU.
#ifdef FUSEDATTN_WITH_FLASH

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backends/flash/decode.h"
#include "backends/flash/jit.h"
#include "backends/flash/planner.h"
#include "backends/flash/schedule.h"
#include "backends/flash/sm90_tile.h"
#include "fusedattn/score_mod.hpp"
#include "problem/problem.h"

namespace fusedattn::flash {
namespace {

DeviceFacts H100() {
  DeviceFacts d;
  d.compute_capability = 90, d.sm_count = 132, d.smem_per_block = 227 * 1024;
  d.smem_per_sm = 228 * 1024, d.reserved_smem_per_block = 1024;
  d.sm90a_kernels = true, d.wgmma_allowed = true;
  return d;
}
DeviceFacts A100() {
  DeviceFacts d = H100();
  d.compute_capability = 80, d.sm_count = 108, d.smem_per_block = 163 * 1024;
  d.smem_per_sm = 164 * 1024;
  return d;
}
DeviceFacts L40() {  // sm_89: 99 KB of shared memory per block
  DeviceFacts d = H100();
  d.compute_capability = 89, d.sm_count = 142, d.smem_per_block = 99 * 1024;
  d.smem_per_sm = 100 * 1024;
  return d;
}

fusedattn_config Config(int64_t d = 128) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 2, c.heads_q = 4, c.heads_kv = 2, c.max_seqlen_q = 256, c.max_seqlen_kv = 256;
  c.head_dim_qk = c.head_dim_v = d;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  c.device = FUSEDATTN_DEVICE_CUDA;
  return c;
}

fusedattn_config Thd(fusedattn_config c) {
  c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
  return c;
}

Problem Make(const fusedattn_config& c) {
  Problem p;
  Status s = MakeProblem(&c, true, &p);
  EXPECT_TRUE(s.ok()) << s.message();
  return p;
}

ForwardPlan Forward(const fusedattn_config& c, const DeviceFacts& d = H100()) {
  Problem p = Make(c);
  return PlanForward(p, DenseFwdTensors(p), d);
}
BackwardPlan Backward(fusedattn_config c, const DeviceFacts& d = H100()) {
  c.is_training = 1;
  Problem p = Make(c);
  return PlanBackward(p, DenseBwdTensors(p), d);
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

size_t Aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// ---- Forward: which path ----

// The forward plan of `c`: the Hopper kernel at instance d with `variant`, no refusal on the way.
void ExpectHopperForward(const fusedattn_config& c, int64_t d, KernelVariant variant) {
  ForwardPlan plan = Forward(c);
  ASSERT_TRUE(plan.status.ok()) << plan.status.message();
  EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
  EXPECT_EQ(plan.instance, d);
  EXPECT_EQ(plan.variant, variant);
  EXPECT_TRUE(plan.why.empty()) << plan.why;
}

TEST(FlashPlanForward, PlainD128OnH100RunsTheHopperKernel) {
  ForwardPlan plan = Forward(Config(128));
  ASSERT_TRUE(plan.status.ok()) << plan.status.message();
  EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
  EXPECT_EQ(plan.instance, 128);
  EXPECT_EQ(plan.variant, KernelVariant::kPlain);
  EXPECT_EQ(plan.schedule, TileSchedule::kPlainGrid);
  EXPECT_EQ(plan.workspace.total, 0u);
  EXPECT_TRUE(plan.why.empty()) << plan.why;
}

TEST(FlashPlanForward, HeadDimsArePaddedToTheNextInstance) {
  auto instance = [](int64_t dqk, int64_t dv) {
    fusedattn_config c = Config();
    c.head_dim_qk = dqk, c.head_dim_v = dv;
    return Forward(c).instance;
  };
  EXPECT_EQ(instance(40, 40), 64);
  EXPECT_EQ(instance(64, 64), 64);
  EXPECT_EQ(instance(96, 96), 128);
  EXPECT_EQ(instance(192, 128), 256);
  EXPECT_EQ(instance(256, 256), 256);
}

TEST(FlashPlanForward, D256RunsTheHopperForward) {
  ForwardPlan plan = Forward(Config(256));
  EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
  EXPECT_EQ(plan.instance, 256);
}

TEST(FlashPlanForward, D64TakesTheLongKeyTileFromFourThousandKeys) {
  fusedattn_config c = Config(64);
  c.max_seqlen_kv = 4095;
  EXPECT_EQ(Forward(c).keys_per_step, 64);  // two blocks per SM: short sequences need the overlap
  c.max_seqlen_kv = 4096;
  EXPECT_EQ(Forward(c).path, KernelPath::kHopperWgmma);
  EXPECT_EQ(Forward(c).keys_per_step, 128);
  EXPECT_EQ(Forward(Config(128)).keys_per_step, 128);
  EXPECT_EQ(Forward(Config(256)).keys_per_step, 80);
  DeviceFacts mma_sync_only = H100();
  mma_sync_only.wgmma_allowed = false;
  EXPECT_EQ(Forward(c, mma_sync_only).keys_per_step, 0);  // no Hopper tile off the Hopper kernel
}

TEST(FlashPlanBackward, D256RunsMmaSyncBecauseTheHopperBackwardHasNoSuchInstance) {
  BackwardPlan plan = Backward(Config(256));
  EXPECT_EQ(plan.path, KernelPath::kMmaSync);
  EXPECT_EQ(plan.instance, 256);
  EXPECT_TRUE(Contains(plan.why, "instances 64 and 128")) << plan.why;
}

TEST(FlashPlanBackward, ThdAtD256ReservesNoScheduleForItsMmaSyncBackward) {
  BackwardPlan plan = Backward(Thd(Config(256)));
  EXPECT_FALSE(plan.workspace.has_schedule);
  EXPECT_TRUE(Forward(Thd(Config(256))).workspace.has_schedule);
}

// Dropout runs on the Hopper forward's dropout variant at every forward instance, with the plain
// score or with softcap and/or ALiBi, through the masks, GQA, sinks, max_logit and THD.
TEST(FlashPlanForward, DropoutTakesTheDropoutVariantOfTheHopperForward) {
  for (int64_t d : {64, 128, 256}) {
    fusedattn_config plain = Config(d), causal = Config(d), softcap = Config(d),
                     alibi = Config(d), both = Config(d), sink = Config(d);
    for (fusedattn_config* c : {&plain, &causal, &softcap, &alibi, &both, &sink})
      c->dropout = 0.1;
    causal.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    causal.window_left = 64;
    softcap.softcap = 30.0;
    alibi.bias_type = FUSEDATTN_BIAS_ALIBI;
    both.softcap = 5.0;
    both.bias_type = FUSEDATTN_BIAS_ALIBI;
    both.return_max_logit = 1;
    sink.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    sink.heads_kv = 1;
    for (const fusedattn_config& c : {plain, causal, softcap, alibi, both, sink})
      ExpectHopperForward(c, d, KernelVariant::kDropout);
    ForwardPlan thd = Forward(Thd(plain));
    EXPECT_EQ(thd.path, KernelPath::kHopperWgmma);
    EXPECT_EQ(thd.variant, KernelVariant::kDropout);
    EXPECT_EQ(thd.schedule, TileSchedule::kThdHeavyFirst);
  }
  // d64 from 4096 keys: the long-key tile, as without dropout.
  fusedattn_config long_keys = Config(64);
  long_keys.max_seqlen_kv = 4096;
  long_keys.dropout = 0.5;
  const ForwardPlan plan = Forward(long_keys);
  EXPECT_EQ(plan.variant, KernelVariant::kDropout);
  EXPECT_EQ(plan.keys_per_step, 128);
}

// What the dropout variant does not take, each with the reason the plan gives.
TEST(FlashPlanForward, DropoutOffTheHopperForwardSaysWhy) {
  fusedattn_config bias = Config();
  bias.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  bias.dropout = 0.1;
  ForwardPlan plan = Forward(bias);
  ASSERT_TRUE(plan.status.ok()) << plan.status.message();
  EXPECT_EQ(plan.path, KernelPath::kMmaSync);
  EXPECT_EQ(plan.variant, KernelVariant::kFull);
  EXPECT_EQ(plan.why, "hopper forward: no bias tensor with dropout (dropout runs there alone or "
                      "with softcap and ALiBi, bias tensors without dropout)");
  fusedattn_config c = Config();
  c.dropout = 0.1;
  plan = Forward(c, A100());
  EXPECT_EQ(plan.path, KernelPath::kMmaSync);
  EXPECT_EQ(plan.variant, KernelVariant::kFull);
  EXPECT_EQ(plan.why, "hopper kernels: the device is not sm_90");
  DeviceFacts no_wgmma = H100();
  no_wgmma.wgmma_allowed = false;
  EXPECT_EQ(Forward(c, no_wgmma).path, KernelPath::kMmaSync);
  fusedattn_config negative = c;
  negative.attn_scale = -0.1;
  plan = Forward(negative);
  EXPECT_EQ(plan.path, KernelPath::kMmaSync);
  EXPECT_EQ(plan.why, "hopper forward: attn_scale > 0 only");
  fusedattn_config float32 = c;
  float32.qkv_dtype = float32.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  EXPECT_EQ(Forward(float32).path, KernelPath::kSimple);
  // Keys TMA cannot describe (cp.async reads them; TMA strides are unsigned).
  Problem p = Make(c);
  FwdTensors tensors = DenseFwdTensors(p);
  tensors.k.stride_s = -tensors.k.stride_s;
  plan = PlanForward(p, tensors, H100());
  EXPECT_EQ(plan.path, KernelPath::kMmaSync);
  EXPECT_TRUE(Contains(plan.why, "TMA cannot describe")) << plan.why;
}

// The rule both the planner and the launchers apply (sm90_tile.h): dropout is the forward's
// dropout policy, with softcap and ALiBi or neither, never with a bias tensor, and no backward's.
TEST(FlashPlanForward, Sm90ScoresForGivesDropoutItsOwnForwardPolicy) {
  for (bool alibi : {false, true})
    for (bool softcap : {false, true}) {
      Sm90Scores scores = Sm90Scores::kPlain;
      EXPECT_TRUE(Sm90ScoresFor(false, alibi, softcap, true, /*forward=*/true, &scores));
      EXPECT_EQ(scores, Sm90Scores::kDropout);
      EXPECT_FALSE(Sm90ScoresFor(false, alibi, softcap, true, /*forward=*/false, &scores));
      EXPECT_TRUE(Sm90ScoresFor(false, alibi, softcap, false, /*forward=*/true, &scores));
      EXPECT_EQ(scores, alibi || softcap ? Sm90Scores::kSoftcapAlibi : Sm90Scores::kPlain);
    }
  Sm90Scores scores = Sm90Scores::kPlain;
  EXPECT_FALSE(Sm90ScoresFor(true, false, false, true, /*forward=*/true, &scores));
  EXPECT_FALSE(Sm90ScoresFor(true, false, true, true, /*forward=*/true, &scores));
  EXPECT_TRUE(Sm90ScoresFor(true, false, false, false, /*forward=*/true, &scores));
  EXPECT_EQ(scores, Sm90Scores::kBias);
}

TEST(FlashPlanForward, BiasTensorsTakeTheBiasVariantOfTheHopperForward) {
  for (int64_t d : {64, 128, 256}) {
    fusedattn_config pre = Config(d), post = Config(d), broadcast = Config(d);
    pre.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
    pre.softcap = 30.0;
    pre.mask = FUSEDATTN_MASK_CAUSAL;
    post.bias_type = FUSEDATTN_BIAS_POST_SCALE;
    post.bias_batch = post.batch, post.bias_heads = post.heads_q;
    broadcast.bias_type = FUSEDATTN_BIAS_POST_SCALE;
    broadcast.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE;
    for (const fusedattn_config& c : {pre, post, broadcast})
      ExpectHopperForward(c, d, KernelVariant::kBias);
  }
}

TEST(FlashPlanForward, BiasOffHopperTakesTheFullVariantOnMmaSync) {
  fusedattn_config c = Config();
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  ForwardPlan a100 = Forward(c, A100());
  EXPECT_EQ(a100.path, KernelPath::kMmaSync);
  EXPECT_EQ(a100.variant, KernelVariant::kFull);
}

TEST(FlashPlanBackward, BiasRunsTheMmaSyncBackward) {
  fusedattn_config c = Config();
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  BackwardPlan plan = Backward(c);
  EXPECT_EQ(plan.path, KernelPath::kMmaSync);
  EXPECT_EQ(plan.variant, KernelVariant::kFull);
  EXPECT_EQ(plan.why, "hopper backward: no bias tensor or dropout (softcap and ALiBi run there)");
}

TEST(FlashPlanForward, SoftcapAndAlibiTakeTheSoftcapAlibiVariantOfTheHopperForward) {
  for (int64_t d : {64, 128, 256}) {
    fusedattn_config softcap = Config(d), alibi = Config(d), both = Config(d);
    softcap.softcap = 30.0;
    alibi.bias_type = FUSEDATTN_BIAS_ALIBI;
    both.softcap = 30.0;
    both.bias_type = FUSEDATTN_BIAS_ALIBI;
    both.mask = FUSEDATTN_MASK_CAUSAL;
    both.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    for (const fusedattn_config& c : {softcap, alibi, both})
      ExpectHopperForward(c, d, KernelVariant::kSoftcapAlibi);
  }
}

TEST(FlashPlanForward, VariantsOnThdTakeTheHeavyFirstSchedule) {
  for (fusedattn_bias bias : {FUSEDATTN_BIAS_ALIBI, FUSEDATTN_BIAS_PRE_SCALE}) {
    fusedattn_config c = Thd(Config());
    c.bias_type = bias;
    ForwardPlan plan = Forward(c);
    EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
    EXPECT_EQ(plan.variant, bias == FUSEDATTN_BIAS_ALIBI ? KernelVariant::kSoftcapAlibi
                                                         : KernelVariant::kBias);
    EXPECT_EQ(plan.schedule, TileSchedule::kThdHeavyFirst);
  }
}

TEST(FlashPlanForward, SoftcapAndAlibiOffHopperTakeTheFullVariantOnMmaSync) {
  fusedattn_config c = Config();
  c.softcap = 30.0;
  c.bias_type = FUSEDATTN_BIAS_ALIBI;
  ForwardPlan a100 = Forward(c, A100());
  EXPECT_EQ(a100.path, KernelPath::kMmaSync);
  EXPECT_EQ(a100.variant, KernelVariant::kFull);
  c.attn_scale = -0.125;
  ForwardPlan negative = Forward(c);
  EXPECT_EQ(negative.path, KernelPath::kMmaSync);
  EXPECT_EQ(negative.variant, KernelVariant::kFull);
  EXPECT_TRUE(Contains(negative.why, "attn_scale > 0 only")) << negative.why;
}

TEST(FlashPlanBackward, SoftcapAndAlibiTakeTheSoftcapAlibiVariantOfTheHopperBackward) {
  for (int64_t d : {64, 128}) {
    fusedattn_config softcap = Config(d), alibi = Config(d), both = Config(d);
    softcap.softcap = 30.0;
    alibi.bias_type = FUSEDATTN_BIAS_ALIBI;
    both.softcap = 30.0;
    both.bias_type = FUSEDATTN_BIAS_ALIBI;
    both.mask = FUSEDATTN_MASK_CAUSAL;
    both.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    for (const fusedattn_config& c : {softcap, alibi, both}) {
      BackwardPlan plan = Backward(c);
      ASSERT_TRUE(plan.status.ok()) << plan.status.message();
      EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
      EXPECT_EQ(plan.instance, d);
      EXPECT_EQ(plan.variant, KernelVariant::kSoftcapAlibi);
      EXPECT_EQ(plan.dq, DqMode::kAtomicThenConvert);
      EXPECT_EQ(plan.workspace.dq_accum_dim, d);
      EXPECT_TRUE(plan.why.empty()) << plan.why;
    }
  }
}

TEST(FlashPlanBackward, SoftcapAlibiThdTakesTheHeavyFirstSchedule) {
  fusedattn_config c = Thd(Config());
  c.softcap = 30.0;
  BackwardPlan plan = Backward(c);
  EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
  EXPECT_EQ(plan.variant, KernelVariant::kSoftcapAlibi);
  EXPECT_EQ(plan.schedule, TileSchedule::kThdHeavyFirst);
}

TEST(FlashPlanBackward, BiasTensorsAndDropoutTakeTheFullVariantOnMmaSync) {
  fusedattn_config pre = Config(), post = Config(), bias_dropout = Config();
  pre.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
  post.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  post.softcap = 30.0;
  bias_dropout.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  bias_dropout.dropout = 0.1;
  for (const fusedattn_config& c : {pre, post, bias_dropout}) {
    BackwardPlan plan = Backward(c);
    ASSERT_TRUE(plan.status.ok()) << plan.status.message();
    EXPECT_EQ(plan.variant, KernelVariant::kFull);
    EXPECT_EQ(plan.path, KernelPath::kMmaSync);
    EXPECT_EQ(plan.why, "hopper backward: no bias tensor or dropout (softcap and ALiBi run there)");
  }
}

// Training with dropout on sm_90: the Hopper forward (dropout variant) and the mma.sync backward,
// which draws the same mask; its reason says so, in both modes.
TEST(FlashPlanBackward, DropoutRunsTheMmaSyncBackwardAfterTheHopperForward) {
  for (int64_t d : {64, 128}) {
    fusedattn_config dropout = Config(d), softcap_dropout = Config(d);
    dropout.dropout = 0.1;
    softcap_dropout.softcap = 30.0;
    softcap_dropout.bias_type = FUSEDATTN_BIAS_ALIBI;
    softcap_dropout.dropout = 0.1;
    for (fusedattn_config c : {dropout, softcap_dropout})
      for (int deterministic : {0, 1}) {
        c.deterministic = deterministic;
        EXPECT_EQ(Forward(c).variant, KernelVariant::kDropout);
        BackwardPlan plan = Backward(c);
        ASSERT_TRUE(plan.status.ok()) << plan.status.message();
        EXPECT_EQ(plan.path, KernelPath::kMmaSync);
        EXPECT_EQ(plan.variant, KernelVariant::kFull);
        EXPECT_EQ(plan.dq, deterministic ? DqMode::kDeterministic : DqMode::kAtomicThenConvert);
        EXPECT_EQ(plan.why, "hopper backward: no dropout (the Hopper forward runs it; this "
                            "backward draws the same mask)");
      }
  }
}

TEST(FlashPlanBackward, DeterministicSoftcapAlibiTakesTheDeterministicHopperBackward) {
  for (int64_t d : {64, 128}) {
    fusedattn_config c = Config(d);
    c.softcap = 30.0;
    c.bias_type = FUSEDATTN_BIAS_ALIBI;
    c.deterministic = 1;
    BackwardPlan plan = Backward(c);
    EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
    EXPECT_EQ(plan.variant, KernelVariant::kSoftcapAlibi);
    EXPECT_EQ(plan.dq, DqMode::kFixedOrderThenConvert);
    EXPECT_TRUE(plan.why.empty()) << plan.why;
  }
}

TEST(FlashPlanBackward, SoftcapAndAlibiOffHopperTakeTheFullVariantOnMmaSync) {
  fusedattn_config c = Config(64);  // d128's backward tiles do not fit an A100
  c.softcap = 30.0;
  c.bias_type = FUSEDATTN_BIAS_ALIBI;
  BackwardPlan a100 = Backward(c, A100());
  EXPECT_EQ(a100.path, KernelPath::kMmaSync);
  EXPECT_EQ(a100.variant, KernelVariant::kFull);
}

TEST(FlashPlanForward, SinksAndWindowsStayOnThePlainHopperKernel) {
  fusedattn_config c = Config();
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  c.window_left = 32;
  ForwardPlan plan = Forward(c);
  EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
  EXPECT_EQ(plan.variant, KernelVariant::kPlain);
}

TEST(FlashPlanForward, NegativeScaleRunsMmaSync) {
  fusedattn_config c = Config();
  c.attn_scale = -0.125;
  ForwardPlan plan = Forward(c);
  EXPECT_EQ(plan.path, KernelPath::kMmaSync);
  EXPECT_TRUE(Contains(plan.why, "attn_scale > 0")) << plan.why;
}

TEST(FlashPlanForward, ThdWithAPackedLseTakesTheHeavyFirstScheduleFromTheWorkspace) {
  ForwardPlan plan = Forward(Thd(Config()));
  EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
  EXPECT_EQ(plan.schedule, TileSchedule::kThdHeavyFirst);
  EXPECT_TRUE(plan.workspace.has_schedule);
  EXPECT_EQ(plan.workspace.schedule, 0u);
  EXPECT_EQ(plan.workspace.total, Aligned(ScheduleBytes(2)));
}

TEST(FlashPlanForward, ThdWithABatchHeadsSeqLseKeepsThePlainGrid) {
  fusedattn_config c = Thd(Config());
  c.return_lse = 1;
  Problem p = Make(c);
  FwdTensors t = DenseFwdTensors(p);
  t.lse_packed = false;
  t.lse.stride_s = 1, t.lse.stride_h = c.max_seqlen_q, t.lse.stride_b = c.heads_q * c.max_seqlen_q;
  ForwardPlan plan = PlanForward(p, t, H100());
  EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
  EXPECT_EQ(plan.schedule, TileSchedule::kPlainGrid);
  EXPECT_EQ(plan.workspace.total, Aligned(ScheduleBytes(2)))
      << "the workspace depends on the problem alone";
}

TEST(FlashPlanForward, ThdOffHopperNeedsNoWorkspace) {
  ForwardPlan plan = Forward(Thd(Config(128)), A100());
  EXPECT_EQ(plan.path, KernelPath::kMmaSync);
  EXPECT_EQ(plan.workspace.total, 0u);
}

TEST(FlashPlanForward, FloatingPoint32RunsTheSimpleKernels) {
  fusedattn_config c = Config();
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  ForwardPlan plan = Forward(c);
  EXPECT_EQ(plan.path, KernelPath::kSimple);
  EXPECT_EQ(plan.instance, 0);
  EXPECT_TRUE(Contains(plan.why, "float16/bfloat16")) << plan.why;
}

TEST(FlashPlanForward, MixedDtypesRunTheSimpleKernels) {
  fusedattn_config c = Config();
  c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  EXPECT_EQ(Forward(c).path, KernelPath::kSimple);
}

TEST(FlashPlanForward, HeadDimsNotMultiplesOf8OrAbove256RunTheSimpleKernels) {
  fusedattn_config odd = Config(), wide = Config();
  odd.head_dim_qk = odd.head_dim_v = 36;
  wide.head_dim_qk = wide.head_dim_v = 320;
  for (const fusedattn_config& c : {odd, wide}) {
    ForwardPlan plan = Forward(c);
    EXPECT_EQ(plan.path, KernelPath::kSimple);
    EXPECT_TRUE(Contains(plan.why, "multiples of 8 up to 256")) << plan.why;
  }
}

TEST(FlashPlanForward, StridedHeadDimRunsTheSimpleKernels) {
  Problem p = Make(Config());
  FwdTensors t = DenseFwdTensors(p);
  t.k.stride_d = 2, t.k.stride_h *= 2, t.k.stride_s *= 2, t.k.stride_b *= 2;
  ForwardPlan plan = PlanForward(p, t, H100());
  EXPECT_EQ(plan.path, KernelPath::kSimple);
  EXPECT_TRUE(Contains(plan.why, "16-byte aligned")) << plan.why;
}

TEST(FlashPlanForward, RowsNotSixteenByteAlignedRunTheSimpleKernels) {
  Problem p = Make(Config());
  FwdTensors t = DenseFwdTensors(p);
  t.v.data = reinterpret_cast<void*>(uintptr_t{0x10008});  // 8-byte aligned base
  EXPECT_EQ(PlanForward(p, t, H100()).path, KernelPath::kSimple);
  t = DenseFwdTensors(p);
  t.q.stride_s += 4;  // rows 8 bytes apart from 16-byte multiples
  EXPECT_EQ(PlanForward(p, t, H100()).path, KernelPath::kSimple);
}

TEST(FlashPlanForward, StridesTmaCannotDescribeRunMmaSync) {
  Problem p = Make(Config());
  FwdTensors t = DenseFwdTensors(p);
  t.k.stride_s = -t.k.stride_s;  // cp.async reads it, TMA strides are unsigned
  ForwardPlan plan = PlanForward(p, t, H100());
  EXPECT_EQ(plan.path, KernelPath::kMmaSync);
  EXPECT_TRUE(Contains(plan.why, "TMA")) << plan.why;
}

TEST(FlashPlanForward, FlashWgmmaZeroRunsMmaSync) {
  DeviceFacts d = H100();
  d.wgmma_allowed = false;
  ForwardPlan plan = Forward(Config(), d);
  EXPECT_EQ(plan.path, KernelPath::kMmaSync);
  EXPECT_TRUE(Contains(plan.why, "FUSEDATTN_FLASH_WGMMA=0")) << plan.why;
}

TEST(FlashPlanForward, ABuildWithoutSm90aRunsMmaSync) {
  DeviceFacts d = H100();
  d.sm90a_kernels = false;
  ForwardPlan plan = Forward(Config(), d);
  EXPECT_EQ(plan.path, KernelPath::kMmaSync);
  EXPECT_TRUE(Contains(plan.why, "no sm_90a kernels")) << plan.why;
}

TEST(FlashPlanForward, NonHopperGpusRunMmaSync) {
  ForwardPlan plan = Forward(Config(), A100());
  EXPECT_EQ(plan.path, KernelPath::kMmaSync);
  EXPECT_TRUE(Contains(plan.why, "not sm_90")) << plan.why;
  EXPECT_EQ(Forward(Thd(Config()), A100()).workspace.total, 0u) << "no schedule off Hopper";
}

TEST(FlashPlanForward, TilesThatDoNotFitTheGpusSharedMemoryRunTheSimpleKernels) {
  ForwardPlan plan = Forward(Config(256), L40());  // the d256 forward takes 132 KB
  EXPECT_EQ(plan.path, KernelPath::kSimple);
  EXPECT_TRUE(Contains(plan.why, "shared memory")) << plan.why;
}

// ---- Forward: refusals ----

TEST(FlashPlanRefusal, CpuTensors) {
  fusedattn_config c = Config();
  c.device = FUSEDATTN_DEVICE_CPU;
  Problem p;
  ASSERT_TRUE(MakeProblem(&c, false, &p).ok());
  ForwardPlan plan = PlanForward(p, DenseFwdTensors(p), H100());
  EXPECT_EQ(plan.status.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(plan.path, KernelPath::kNone);
  EXPECT_TRUE(Contains(plan.status.message(), "CUDA tensors only")) << plan.status.message();
}

TEST(FlashPlanRefusal, PagedKvNeitherTheDecodeKernelNorTheHopperForwardRuns) {
  fusedattn_config c = Config(96);  // the decode kernel has instances 64 and 128
  c.page_size = 48;                 // the Hopper forward takes powers of two from 16
  c.max_seqlen_q = 1;
  c.mask = FUSEDATTN_MASK_PADDING;
  Problem p;
  Status made = MakeProblem(&c, true, &p);
  ASSERT_TRUE(made.ok()) << made.message();
  ForwardPlan plan = PlanForward(p, DenseFwdTensors(p), H100());
  EXPECT_EQ(plan.status.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  const std::string& why = plan.status.message();
  EXPECT_TRUE(Contains(why, "runs on flash's decode kernel or its Hopper forward")) << why;
  EXPECT_TRUE(Contains(why, "{64, 128}")) << why;
  EXPECT_TRUE(Contains(why, "the Hopper forward reads paged K/V with page sizes that are powers "
                            "of two of at least 16")) << why;
  EXPECT_TRUE(Contains(why, "but page_size = 48")) << why;
}

fusedattn_config PagedDecode() {
  fusedattn_config c = Config(128);  // batch 2, heads 4 / 2, 256 keys: 4 tiles of 64
  c.page_size = 16;
  c.max_seqlen_q = 1;
  c.mask = FUSEDATTN_MASK_PADDING;
  return c;
}

// The decode kernel's fit and split count come from the DeviceFacts the plan is given, not from
// the device the process sees (the same plans with or without a GPU).
TEST(FlashPlanForward, PagedKvRunsOnTheDecodeKernel) {
  ForwardPlan plan = Forward(PagedDecode());
  ASSERT_TRUE(plan.status.ok()) << plan.status.message();
  EXPECT_EQ(plan.path, KernelPath::kDecode);
  EXPECT_EQ(plan.instance, 128);
}

TEST(FlashPlanRefusal, PagedKvBeforeComputeCapability80) {
  DeviceFacts turing = H100();
  turing.compute_capability = 75;
  ForwardPlan plan = Forward(PagedDecode(), turing);
  EXPECT_EQ(plan.status.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_TRUE(Contains(plan.status.message(), "runs on flash's decode kernel or its Hopper forward"))
      << plan.status.message();
  EXPECT_TRUE(Contains(plan.status.message(), "compute capability 8.0")) << plan.status.message();
  EXPECT_TRUE(Contains(plan.status.message(), "not sm_90")) << plan.status.message();
}

TEST(FlashPlanForward, ShortQueriesAgainstContiguousKvRunOnTheDecodeKernel) {
  fusedattn_config c = Config(128);
  c.max_seqlen_q = 1;
  EXPECT_EQ(Forward(c).path, KernelPath::kDecode);
  DeviceFacts turing = H100();
  turing.compute_capability = 75;
  EXPECT_NE(Forward(c, turing).path, KernelPath::kDecode);  // the others run it there
}

TEST(FlashPlanForward, DecodeSplitsFillTheDevicesSms) {
  // 4 blocks (2 sequences x 2 kv heads) and 4 key tiles: on the H100's 132 SMs (two 107 KB
  // blocks each) one split per tile; on a device of one SM the 4 blocks fill it already.
  const Problem p = Make(PagedDecode());
  EXPECT_EQ(Forward(PagedDecode()).decode_splits, 4);
  EXPECT_GT(PlanFwdWorkspace(p, H100()).decode_bytes, 0u);  // the splits' partials
  DeviceFacts one_sm = H100();
  one_sm.sm_count = 1;
  EXPECT_EQ(Forward(PagedDecode(), one_sm).decode_splits, 1);
  EXPECT_EQ(PlanFwdWorkspace(p, one_sm).decode_bytes, 0u);
}

// The decode kernel's programmatic launches need its griddepcontrol waits, which only the sm_90a
// instances have: a newer GPU runs the compute_80 PTX without them, an sm_80 GPU has neither.
TEST(FlashPlanForward, DecodeLaunchesProgrammaticallyOnSm90Only) {
  const Problem p = Make(PagedDecode());
  EXPECT_TRUE(PlanDecode(p, H100()).programmatic_launch);
  EXPECT_FALSE(PlanDecode(p, A100()).programmatic_launch);
  DeviceFacts blackwell = H100();
  blackwell.compute_capability = 100;
  blackwell.sm90a_kernels = false;
  EXPECT_FALSE(PlanDecode(p, blackwell).programmatic_launch);
}

// Issue 21's weak points: one sequence, GQA 32/8, a long cache. Eight (sequence, kv head) pairs
// cannot fill the H100's 132 SMs x 2 blocks (d128: 107 KB of shared memory a block) or x 3 (d64
// with 16 rows: 77 KB), so the keys are split until every slot streams about the same number
// of key tiles: 32 splits of 1024 keys fill 256 of 264 slots at d128 (FlashAttention's 0.85
// rule took 29 splits of 1152 keys, 232 blocks), 47 of 704 fill 376 of 396 at d64.
fusedattn_config LongDecode(int64_t skv, int64_t d, int64_t hq, int64_t sq, int64_t page_size) {
  fusedattn_config c = Config(d);
  c.batch = 1, c.heads_q = hq, c.heads_kv = 8, c.max_seqlen_q = sq, c.max_seqlen_kv = skv;
  if (page_size > 0)  // per-sequence key lengths, as PagedDecode
    c.mask = sq > 1 ? FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT : FUSEDATTN_MASK_PADDING;
  else
    c.mask = sq > 1 ? FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT : FUSEDATTN_MASK_NONE;
  c.page_size = page_size;
  return c;
}

struct DecodeSplitPoint {
  int64_t skv, d, hq, sq, page_size;
  int splits, keys_per_split, blocks, blocks_per_sm;
};

TEST(FlashPlanForward, DecodeSplitsFillEveryBlockSlotAtBatchOne) {
  const DecodeSplitPoint points[] = {
      {4096, 128, 32, 1, 0, 32, 128, 256, 2},      {32768, 128, 32, 1, 0, 32, 1024, 256, 2},
      {32768, 128, 32, 1, 16, 32, 1024, 256, 2},   {131072, 128, 32, 1, 64, 32, 4096, 256, 2},
      {32768, 128, 64, 4, 0, 32, 1024, 256, 2},    // 32 rows a block (64/8 x sq 4)
      {32768, 64, 32, 1, 0, 47, 704, 376, 3},      {131072, 64, 32, 4, 16, 47, 2816, 376, 3},
  };
  for (const DecodeSplitPoint& x : points) {
    SCOPED_TRACE("skv " + std::to_string(x.skv) + " d" + std::to_string(x.d) + " hq " +
                 std::to_string(x.hq) + " sq " + std::to_string(x.sq) + " page " +
                 std::to_string(x.page_size));
    const ForwardPlan plan = Forward(LongDecode(x.skv, x.d, x.hq, x.sq, x.page_size));
    ASSERT_TRUE(plan.status.ok()) << plan.status.message();
    ASSERT_EQ(plan.path, KernelPath::kDecode);
    EXPECT_EQ(plan.decode_splits, x.splits);
    EXPECT_EQ(plan.decode_keys_per_split, x.keys_per_split);
    EXPECT_EQ(plan.decode_blocks, x.blocks);
    EXPECT_EQ(plan.decode_blocks_per_sm, x.blocks_per_sm);
    EXPECT_TRUE(Contains(DescribeForwardPlan(plan),
                         std::to_string(x.splits) + " splits of " +
                             std::to_string(x.keys_per_split) + " keys"))
        << DescribeForwardPlan(plan);
  }
}

// The slots come from the DeviceFacts: an A100 (164 KB per SM) holds one d128 block per SM.
TEST(FlashPlanForward, DecodeSplitsFollowTheDevicesSlots) {
  const ForwardPlan plan = Forward(LongDecode(32768, 128, 32, 1, 16), A100());
  ASSERT_EQ(plan.path, KernelPath::kDecode);
  EXPECT_EQ(plan.decode_blocks_per_sm, 1);
  EXPECT_LE(plan.decode_blocks, 108);
  EXPECT_GE(plan.decode_blocks, 100);
}

// The split rule itself: the busiest slot's tiles (waves x (tiles per split + 1)); the fewest
// splits within 5% of the least; no splitting when the batch fills the slots or there are none.
TEST(FlashPlanForward, DecodeSplitRule) {
  EXPECT_EQ(DecodeSplitsFor(512, 8, 264), 32);    // b1 hkv8 skv32768 d128
  EXPECT_EQ(DecodeSplitsFor(512, 64, 264), 4);    // b8: 256 blocks of 128 tiles
  EXPECT_EQ(DecodeSplitsFor(2048, 64, 264), 4);   // b8 skv131072: more splits gain < 5%
  EXPECT_EQ(DecodeSplitsFor(8, 8, 264), 8);       // one tile a split
  EXPECT_EQ(DecodeSplitsFor(1, 8, 264), 1);       // one tile
  EXPECT_EQ(DecodeSplitsFor(100000, 1, 264), 122);  // within 5% of 128 (the combine's limit)
  EXPECT_EQ(DecodeSplitsFor(512, 264, 264), 1);   // the batch fills the slots
  EXPECT_EQ(DecodeSplitsFor(512, 8, 0), 1);       // no device
}

// ---- Paged K/V: chunked prefill on the Hopper forward ----

// Chunked prefill: THD queries (up to 512 new tokens per sequence) against a paged cache of up
// to 4096 keys, bottom-right causal.
fusedattn_config PagedPrefill(int64_t d = 128, int64_t page_size = 16) {
  fusedattn_config c = Config(d);
  c.q_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
  c.kv_format = FUSEDATTN_FORMAT_BSHD;  // the pools' layout
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  c.max_seqlen_q = 512, c.max_seqlen_kv = 4096;
  c.page_size = page_size;
  return c;
}

TEST(FlashPlanForward, PagedChunkedPrefillRunsTheHopperForwardsPagedInstance) {
  ForwardPlan plan = Forward(PagedPrefill());
  ASSERT_TRUE(plan.status.ok()) << plan.status.message();
  EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
  EXPECT_TRUE(plan.paged);
  EXPECT_EQ(plan.instance, 128);
  EXPECT_EQ(plan.variant, KernelVariant::kPlain);
  EXPECT_EQ(plan.schedule, TileSchedule::kThdHeavyFirst);  // the heaviest sequences first
  EXPECT_TRUE(plan.workspace.has_schedule);
  const std::string text = DescribeForwardPlan(plan);
  EXPECT_TRUE(Contains(text, "hopper-wgmma d128 plain, thd-heavy-first schedule")) << text;
  EXPECT_TRUE(Contains(text, "128 keys per step, paged K/V")) << text;
}

TEST(FlashPlanForward, PagedDecodeUpTo16QueryRowsStaysOnTheDecodeKernel) {
  fusedattn_config c = PagedPrefill();
  for (int64_t sq : {1, 4, 16}) {
    c.max_seqlen_q = sq;
    ForwardPlan plan = Forward(c);
    EXPECT_EQ(plan.path, KernelPath::kDecode) << "max_seqlen_q " << sq;
    EXPECT_FALSE(plan.paged);
  }
  c.max_seqlen_q = 17;
  ForwardPlan plan = Forward(c);
  EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
  EXPECT_TRUE(plan.paged);
}

TEST(FlashPlanForward, PagedFewQueryRowsTheDecodeKernelRefusesRunOnTheHopperForward) {
  fusedattn_config c = PagedPrefill(96);  // the decode kernel has d64 and d128 only
  c.max_seqlen_q = 1;
  ForwardPlan plan = Forward(c);
  EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
  EXPECT_TRUE(plan.paged);
  EXPECT_EQ(plan.instance, 128);
}

TEST(FlashPlanForward, PagedPowerOfTwoPageSizesFrom16RunTheHopperForwardAtD64AndD128) {
  for (int64_t d : {64, 128})
    for (int64_t page : {16, 32, 64, 128, 256, 4096}) {
      ForwardPlan plan = Forward(PagedPrefill(d, page));
      EXPECT_EQ(plan.path, KernelPath::kHopperWgmma) << "d" << d << " page " << page;
      EXPECT_TRUE(plan.paged);
      EXPECT_EQ(plan.instance, d);
    }
}

TEST(FlashPlanRefusal, PagedPrefillPageSizesTheHopperForwardDoesNotTake) {
  for (int64_t page : {1, 8, 24, 48, 100}) {
    ForwardPlan plan = Forward(PagedPrefill(128, page));
    EXPECT_EQ(plan.status.code(), FUSEDATTN_ERROR_NOT_SUPPORTED) << "page " << page;
    const std::string& why = plan.status.message();
    EXPECT_TRUE(Contains(why, "max_seqlen_q <= 16")) << why;  // the decode kernel's reason
    EXPECT_TRUE(Contains(why, "powers of two of at least 16")) << why;
    EXPECT_TRUE(Contains(why, Format("but page_size = %lld", (long long)page))) << why;
    EXPECT_EQ(PlanCheck(Make(PagedPrefill(128, page)), H100()).message(), why);
  }
}

TEST(FlashPlanForward, PagedSoftcapAndAlibiTakeThePagedSoftcapAlibiInstance) {
  fusedattn_config c = PagedPrefill(64);
  c.softcap = 30.0;
  EXPECT_EQ(Forward(c).variant, KernelVariant::kSoftcapAlibi);
  c.softcap = 0.0;
  c.bias_type = FUSEDATTN_BIAS_ALIBI;
  ForwardPlan plan = Forward(c);
  EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
  EXPECT_TRUE(plan.paged);
  EXPECT_EQ(plan.variant, KernelVariant::kSoftcapAlibi);
}

TEST(FlashPlanRefusal, PagedPrefillWhatTheHopperForwardHasNot) {
  struct Case {
    std::string name, reason;
    std::function<void(fusedattn_config&)> apply;
    DeviceFacts device = H100();
  };
  std::vector<Case> cases = {
      {"d256", "instances 64 and 128", [](fusedattn_config& c) {
         c.head_dim_qk = c.head_dim_v = 256;
       }},
      {"float32", "float16/bfloat16", [](fusedattn_config& c) {
         c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
       }},
      {"dropout", "no bias tensor or dropout", [](fusedattn_config& c) { c.dropout = 0.1; }},
      {"bias", "no bias tensor or dropout", [](fusedattn_config& c) {
         c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
       }},
      {"negative scale", "attn_scale > 0", [](fusedattn_config& c) { c.attn_scale = -1.0; }},
      {"A100", "not sm_90", [](fusedattn_config&) {}, A100()},
  };
  DeviceFacts no_wgmma = H100();
  no_wgmma.wgmma_allowed = false;
  cases.push_back({"FUSEDATTN_FLASH_WGMMA=0", "hopper kernels", [](fusedattn_config&) {},
                   no_wgmma});
  for (const Case& k : cases) {
    fusedattn_config c = PagedPrefill();
    k.apply(c);
    ForwardPlan plan = Forward(c, k.device);
    EXPECT_EQ(plan.status.code(), FUSEDATTN_ERROR_NOT_SUPPORTED) << k.name;
    EXPECT_TRUE(Contains(plan.status.message(), k.reason)) << k.name << ": "
                                                             << plan.status.message();
  }
}

TEST(FlashPlanRefusal, PagedPoolsTmaCannotDescribe) {
  Problem p = Make(PagedPrefill());
  FwdTensors t = DenseFwdTensors(p);
  EXPECT_TRUE(PlanForward(p, t, H100()).status.ok());
  t.v.stride_b += 4;  // 8 bytes: not a 16-byte multiple
  ForwardPlan plan = PlanForward(p, t, H100());
  EXPECT_EQ(plan.status.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_TRUE(Contains(plan.status.message(), "TMA cannot describe q or the k/v page pools"))
      << plan.status.message();
}

TEST(FlashPlanRefusal, HeadDimsWhoseSimpleKernelsDoNotFitSharedMemory) {
  fusedattn_config c = Config();
  c.head_dim_qk = c.head_dim_v = 1024;
  ForwardPlan plan = Forward(c);
  EXPECT_EQ(plan.status.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_TRUE(Contains(plan.status.message(), "bytes of shared memory per block"))
      << plan.status.message();
}

TEST(FlashPlanRefusal, MoreThreadBlocksThanAGridHolds) {
  fusedattn_config c = Config(64);
  c.batch = 4096, c.heads_q = c.heads_kv = 1024, c.max_seqlen_q = c.max_seqlen_kv = 16384;
  ForwardPlan plan = Forward(c);
  EXPECT_EQ(plan.status.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_TRUE(Contains(plan.status.message(), "thread blocks")) << plan.status.message();
}

// A finalized score_mod graph, kept alive for the test's problems.
ScoreMod& Softcap() {
  static ScoreMod* mod = [] {
    auto* m = new ScoreMod();
    m->set_score(30.0 * tanh(m->score() / 30.0));
    m->finalize();
    return m;
  }();
  return *mod;
}

TEST(FlashPlanRefusal, ScoreModGraphsNeedTheTensorCoreDtypesAndHeadDims) {
  fusedattn_config c = Config();
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.score_mod = Softcap().get();
  ForwardPlan plan = Forward(c);
  EXPECT_EQ(plan.status.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_TRUE(Contains(plan.status.message(), "tensor-core kernels only")) << plan.status.message();
}

TEST(FlashPlanRefusal, ScoreModGraphsNeedComputeCapability80) {
  fusedattn_config c = Config();
  c.score_mod = Softcap().get();
  DeviceFacts turing = H100();
  turing.compute_capability = 75;
  ForwardPlan plan = Forward(c, turing);
  EXPECT_EQ(plan.status.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_TRUE(Contains(plan.status.message(), "compute capability 8.0")) << plan.status.message();
}

TEST(FlashPlanRefusal, ScoreModGraphsWhoseTilesDoNotFitSharedMemory) {
  fusedattn_config c = Config(128);
  c.score_mod = Softcap().get();
  c.is_training = 1;  // the d128 backward takes 173 KB, the A100 gives 163
  ForwardPlan plan = Forward(c, A100());
  EXPECT_EQ(plan.status.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_TRUE(Contains(plan.status.message(), "bytes of shared memory per block, more than"))
      << plan.status.message();
}

TEST(FlashPlanRefusal, ScoreModGraphsOnTensorsTheTensorCoresCannotRead) {
  fusedattn_config c = Config();
  c.score_mod = Softcap().get();
  Problem p = Make(c);
  FwdTensors t = DenseFwdTensors(p);
  t.q.stride_d = 2;
  ForwardPlan plan = PlanForward(p, t, H100());
  if (!jit::Available().ok()) GTEST_SKIP() << jit::Available().message();
  EXPECT_EQ(plan.status.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_TRUE(Contains(plan.status.message(), "16-byte aligned")) << plan.status.message();
}

TEST(FlashPlanForward, ScoreModGraphsRunTheJitKernelsWithTheirBlockMaskInTheWorkspace) {
  if (!jit::Available().ok()) GTEST_SKIP() << jit::Available().message();
  fusedattn_config c = Config();
  c.score_mod = Softcap().get();
  ForwardPlan plan = Forward(c, A100());
  ASSERT_TRUE(plan.status.ok()) << plan.status.message();
  EXPECT_EQ(plan.path, KernelPath::kScoreModJit);
  EXPECT_EQ(plan.instance, 128);
  EXPECT_EQ(plan.variant, KernelVariant::kFull);
  EXPECT_EQ(plan.workspace.total, Aligned(plan.workspace.block_mask_bytes));
  EXPECT_TRUE(Contains(plan.why, "hopper kernels: the device is not sm_90")) << plan.why;
}

// ---- score_mod graphs on the Hopper forward (hopper-score_mod-jit) ----

// A mask_mod (sliding window) and a score_mod reading a tensor, kept alive for the tests.
ScoreMod& WindowMask() {
  static ScoreMod* mod = [] {
    auto* m = new ScoreMod();
    m->set_mask(m->kv_idx() <= m->q_idx() && m->q_idx() - m->kv_idx() < 256.0);
    m->finalize();
    return m;
  }();
  return *mod;
}
ScoreMod& TensorBias() {
  static ScoreMod* mod = [] {
    auto* m = new ScoreMod();
    Expr bias = m->tensor("bias", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_HEAD);
    m->set_score(m->score() + bias);
    m->finalize();
    return m;
  }();
  return *mod;
}

TEST(FlashPlanForward, ScoreModGraphsOnH100RunTheHopperForwardCompiledWithTheGraph) {
  if (!jit::Available().ok()) GTEST_SKIP() << jit::Available().message();
  for (ScoreMod* mod : {&Softcap(), &WindowMask(), &TensorBias()}) {
    fusedattn_config c = Config(128);
    c.score_mod = mod->get();
    ForwardPlan plan = Forward(c);
    ASSERT_TRUE(plan.status.ok()) << plan.status.message();
    EXPECT_EQ(plan.path, KernelPath::kHopperScoreModJit);
    EXPECT_EQ(plan.instance, 128);
    EXPECT_EQ(plan.variant, KernelVariant::kScoreMod);
    EXPECT_EQ(plan.keys_per_step, 128);
    EXPECT_EQ(plan.schedule, TileSchedule::kPlainGrid);
    EXPECT_TRUE(plan.why.empty()) << plan.why;
  }
}

TEST(FlashPlanForward, ScoreModOnTheHopperForwardTakesTheTileOfItsHeadDimAndKeys) {
  if (!jit::Available().ok()) GTEST_SKIP() << jit::Available().message();
  auto keys = [](int64_t d, int64_t skv, int64_t dqk = 0) {
    fusedattn_config c = Config(d);
    if (dqk > 0) c.head_dim_qk = dqk;
    c.max_seqlen_kv = skv;
    c.score_mod = Softcap().get();
    ForwardPlan plan = Forward(c);
    EXPECT_EQ(plan.path, KernelPath::kHopperScoreModJit) << d << " " << skv;
    return std::make_pair(plan.instance, plan.keys_per_step);
  };
  EXPECT_EQ(keys(64, 256), std::make_pair(64, 64));
  EXPECT_EQ(keys(64, 4096), std::make_pair(64, 128));  // d64's long-key tile
  EXPECT_EQ(keys(40, 300), std::make_pair(64, 64));
  EXPECT_EQ(keys(128, 256), std::make_pair(128, 128));
  EXPECT_EQ(keys(96, 5000), std::make_pair(128, 128));
  EXPECT_EQ(keys(256, 256), std::make_pair(256, 80));
  EXPECT_EQ(keys(128, 256, 192), std::make_pair(256, 80));
}

TEST(FlashPlanForward, ScoreModGqaThdPaddingSinksAndAnyScaleRunTheHopperForward) {
  if (!jit::Available().ok()) GTEST_SKIP() << jit::Available().message();
  fusedattn_config thd = Thd(Config()), gqa = Config(), sink = Config(), negative = Config();
  gqa.heads_q = 8, gqa.heads_kv = 1;
  sink.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE;
  negative.attn_scale = -0.1;  // the policy scales before the graph: any scale
  for (fusedattn_config c : {thd, gqa, sink, negative}) {
    c.score_mod = WindowMask().get();
    ForwardPlan plan = Forward(c);
    ASSERT_TRUE(plan.status.ok()) << plan.status.message();
    EXPECT_EQ(plan.path, KernelPath::kHopperScoreModJit);
    EXPECT_EQ(plan.schedule, TileSchedule::kPlainGrid);  // no THD schedule for score_mod
    EXPECT_FALSE(plan.workspace.has_schedule);
  }
}

TEST(FlashPlanForward, ScoreModWithTheConfigsOwnModifiersOrDropoutStaysOnMmaSync) {
  if (!jit::Available().ok()) GTEST_SKIP() << jit::Available().message();
  fusedattn_config dropout = Config(), softcap = Config(), alibi = Config(), bias = Config();
  dropout.dropout = 0.1;
  softcap.softcap = 30.0;
  alibi.bias_type = FUSEDATTN_BIAS_ALIBI;
  bias.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  for (fusedattn_config c : {dropout, softcap, alibi, bias}) {
    c.score_mod = Softcap().get();
    ForwardPlan plan = Forward(c);
    ASSERT_TRUE(plan.status.ok()) << plan.status.message();
    EXPECT_EQ(plan.path, KernelPath::kScoreModJit);
    EXPECT_EQ(plan.variant, KernelVariant::kFull);
    EXPECT_TRUE(Contains(plan.why, "hopper score_mod forward: no dropout, bias tensor, ALiBi or "
                                   "softcap in the config"))
        << plan.why;
  }
}

TEST(FlashPlanForward, ScoreModOffHopperRunsTheMmaSyncJitKernelSayingWhy) {
  if (!jit::Available().ok()) GTEST_SKIP() << jit::Available().message();
  fusedattn_config c = Config();
  c.score_mod = Softcap().get();
  DeviceFacts off = H100(), no_build = H100();
  off.wgmma_allowed = false;  // FUSEDATTN_FLASH_WGMMA=0
  no_build.sm90a_kernels = false;
  const std::pair<DeviceFacts, const char*> cases[] = {
      {off, "FUSEDATTN_FLASH_WGMMA=0"},
      {no_build, "this build has no sm_90a kernels"},
      {A100(), "the device is not sm_90"},
      {L40(), "the device is not sm_90"}};
  for (const auto& [device, why] : cases) {
    ForwardPlan plan = Forward(c, device);
    ASSERT_TRUE(plan.status.ok()) << plan.status.message();
    EXPECT_EQ(plan.path, KernelPath::kScoreModJit);
    EXPECT_EQ(plan.keys_per_step, 0);
    EXPECT_TRUE(Contains(plan.why, why)) << plan.why;
  }
}

TEST(FlashPlanForward, ScoreModOnTensorsTmaCannotDescribeRunsTheMmaSyncJitKernel) {
  if (!jit::Available().ok()) GTEST_SKIP() << jit::Available().message();
  fusedattn_config c = Config();
  c.score_mod = Softcap().get();
  Problem p = Make(c);
  FwdTensors t = DenseFwdTensors(p);
  t.k.stride_s = -t.k.stride_s;  // cp.async reads it, TMA strides are unsigned
  ForwardPlan plan = PlanForward(p, t, H100());
  ASSERT_TRUE(plan.status.ok()) << plan.status.message();
  EXPECT_EQ(plan.path, KernelPath::kScoreModJit);
  EXPECT_TRUE(Contains(plan.why, "TMA cannot describe")) << plan.why;
  // The workspace is the plan's whichever forward runs.
  EXPECT_EQ(plan.workspace.total, PlanFwdWorkspace(p, H100()).total);
}

TEST(FlashPlanForward, ScoreModBlockMaskWorkspaceHoldsEitherForwardsTiles) {
  if (!jit::Available().ok()) GTEST_SKIP() << jit::Available().message();
  fusedattn_config c = Config(256);
  c.max_seqlen_q = 1000, c.max_seqlen_kv = 5000;
  c.score_mod = WindowMask().get();  // reads neither batch nor head: one mask for all
  ForwardPlan plan = Forward(c);
  ASSERT_EQ(plan.path, KernelPath::kHopperScoreModJit);
  // mma.sync: 128 x 64 tiles (8 x 79 bytes); Hopper d256: 128 x 80 (8 x 63 bytes).
  EXPECT_EQ(plan.workspace.block_mask_bytes, 8u * 79u);
  EXPECT_EQ(plan.workspace.total, Aligned(8u * 79u));
  EXPECT_EQ(Forward(c, A100()).workspace.block_mask_bytes, 8u * 79u);
}

TEST(FlashPlanBackward, ScoreModBackwardStaysOnTheMmaSyncJitKernelSayingSo) {
  if (!jit::Available().ok()) GTEST_SKIP() << jit::Available().message();
  fusedattn_config c = Config();
  c.score_mod = WindowMask().get();
  BackwardPlan plan = Backward(c);
  ASSERT_TRUE(plan.status.ok()) << plan.status.message();
  EXPECT_EQ(plan.path, KernelPath::kScoreModJit);
  EXPECT_EQ(plan.variant, KernelVariant::kFull);
  EXPECT_EQ(plan.dq, DqMode::kAtomicThenConvert);
  EXPECT_TRUE(Contains(plan.why, "hopper backward: no score_mod graphs")) << plan.why;
  EXPECT_TRUE(Backward(c, A100()).why.empty()) << Backward(c, A100()).why;
}

// ---- Backward ----

TEST(FlashPlanBackward, PlainD128OnH100RunsTheHopperKeyBlockKernelWithAtomicDq) {
  BackwardPlan plan = Backward(Config(128));
  ASSERT_TRUE(plan.status.ok()) << plan.status.message();
  EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
  EXPECT_EQ(plan.instance, 128);
  EXPECT_EQ(plan.dq, DqMode::kAtomicThenConvert);
  EXPECT_EQ(plan.dbias, DbiasPlan::kNone);
  const size_t rows = 2 * 4 * 256;
  EXPECT_EQ(plan.workspace.dq_accum_dim, 128);
  EXPECT_EQ(plan.workspace.dq_accum, Aligned(rows * 4));
  EXPECT_EQ(plan.workspace.total, Aligned(rows * 4) + Aligned(rows * 128 * 4));
}

TEST(FlashPlanBackward, DeterministicD64AndD128RunTheHopperBackwardWithFixedOrderDq) {
  for (int64_t d : {64, 128}) {
    fusedattn_config c = Config(d);
    c.deterministic = 1;
    BackwardPlan plan = Backward(c);
    ASSERT_TRUE(plan.status.ok()) << plan.status.message();
    EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
    EXPECT_EQ(plan.instance, d);
    EXPECT_EQ(plan.variant, KernelVariant::kPlain);
    EXPECT_EQ(plan.dq, DqMode::kFixedOrderThenConvert);
    EXPECT_TRUE(plan.why.empty()) << plan.why;
    // delta, the dQ accumulator, then the order flags: a ticket counter and one flag per
    // (sequence, query head, 64 query rows).
    const size_t rows = 2 * 4 * 256;
    EXPECT_EQ(plan.workspace.dq_accum_dim, d);
    EXPECT_EQ(plan.workspace.dq_accum, Aligned(rows * 4));
    EXPECT_EQ(plan.workspace.dq_order, Aligned(rows * 4) + Aligned(rows * d * 4));
    EXPECT_EQ(plan.workspace.dq_order_bytes, (1 + 2 * 4 * (256 / 64)) * 4u);
    EXPECT_EQ(plan.workspace.total, plan.workspace.dq_order + Aligned(plan.workspace.dq_order_bytes));
  }
}

TEST(FlashPlanBackward, DeterministicCausalGqaAndWindowsStayOnTheHopperBackward) {
  fusedattn_config causal = Config(), window = Config();
  causal.mask = FUSEDATTN_MASK_CAUSAL;
  window.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  window.window_left = 64;
  for (fusedattn_config c : {causal, window}) {
    c.deterministic = 1;
    BackwardPlan plan = Backward(c);
    EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
    EXPECT_EQ(plan.dq, DqMode::kFixedOrderThenConvert);
  }
}

TEST(FlashPlanBackward, DeterministicModeOffTheHopperBackwardRunsTheMmaSyncDqKernel) {
  fusedattn_config d256 = Config(256), dropout = Config(), a100 = Config(64);
  dropout.dropout = 0.1;
  for (fusedattn_config* c : {&d256, &dropout, &a100}) c->deterministic = 1;
  for (const BackwardPlan& plan :
       {Backward(d256), Backward(dropout), Backward(a100, A100())}) {
    ASSERT_TRUE(plan.status.ok()) << plan.status.message();
    EXPECT_EQ(plan.path, KernelPath::kMmaSync);
    EXPECT_EQ(plan.dq, DqMode::kDeterministic);
    // Neither an accumulator nor order flags: the dQ kernel writes dQ.
    EXPECT_EQ(plan.workspace.dq_accum_dim, 0);
    EXPECT_EQ(plan.workspace.dq_order_bytes, 0u);
  }
}

TEST(FlashPlanBackward, DeterministicTensorsTmaCannotDescribeRunTheMmaSyncDqKernel) {
  fusedattn_config c = Config();
  c.deterministic = 1;
  c.is_training = 1;
  Problem p = Make(c);
  BwdTensors t = DenseBwdTensors(p);
  t.k.stride_s = -t.k.stride_s;  // cp.async reads it, TMA strides are unsigned
  BackwardPlan plan = PlanBackward(p, t, H100());
  EXPECT_EQ(plan.path, KernelPath::kMmaSync);
  EXPECT_EQ(plan.dq, DqMode::kDeterministic);
  EXPECT_TRUE(Contains(plan.why, "TMA cannot describe")) << plan.why;
}

TEST(FlashPlanBackward, ThdTakesTheHeavyFirstScheduleOfKeyTilesLastInTheWorkspace) {
  BackwardPlan plan = Backward(Thd(Config()));
  EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
  EXPECT_EQ(plan.schedule, TileSchedule::kThdHeavyFirst);
  EXPECT_EQ(plan.workspace.schedule + Aligned(ScheduleBytes(2)), plan.workspace.total);
}

TEST(FlashPlanBackward, DeterministicThdTakesTheHeavyFirstSchedule) {
  fusedattn_config c = Thd(Config());
  c.deterministic = 1;
  BackwardPlan plan = Backward(c);
  EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
  EXPECT_EQ(plan.dq, DqMode::kFixedOrderThenConvert);
  EXPECT_TRUE(plan.workspace.has_schedule);
  EXPECT_EQ(plan.schedule, TileSchedule::kThdHeavyFirst);
}

TEST(FlashPlanBackward, DbiasIsStoredUnlessBroadcast) {
  fusedattn_config c = Config();
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  c.bias_batch = 2, c.bias_heads = 4;
  c.bias_requires_grad = 1;
  BackwardPlan plan = Backward(c);
  EXPECT_EQ(plan.dbias, DbiasPlan::kStore);
  EXPECT_EQ(plan.path, KernelPath::kMmaSync);
  EXPECT_EQ(plan.variant, KernelVariant::kFull);
}

TEST(FlashPlanBackward, ABroadcastFloat32DbiasIsAddedAtomicallyOtherwiseReduced) {
  fusedattn_config c = Config();
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  c.bias_batch = 1, c.bias_heads = 4;
  c.bias_requires_grad = 1;
  c.is_training = 1;
  Problem p = Make(c);
  BwdTensors t = DenseBwdTensors(p);
  t.dbias.dtype = FUSEDATTN_DTYPE_FLOAT32;
  EXPECT_EQ(PlanBackward(p, t, H100()).dbias, DbiasPlan::kAtomic);
  t.dbias.dtype = FUSEDATTN_DTYPE_BFLOAT16;
  EXPECT_EQ(PlanBackward(p, t, H100()).dbias, DbiasPlan::kReduce);
  c.deterministic = 1;
  Problem deterministic = Make(c);
  t.dbias.dtype = FUSEDATTN_DTYPE_FLOAT32;
  EXPECT_EQ(PlanBackward(deterministic, t, H100()).dbias, DbiasPlan::kReduce);
}

TEST(FlashPlanBackward, TilesThatDoNotFitRunTheSimpleKernelsWhichWriteDqDirectly) {
  // The d128 backward takes 173 KB; the A100 gives 163 KB (its forward still runs mma.sync).
  BackwardPlan plan = Backward(Config(128), A100());
  EXPECT_EQ(plan.path, KernelPath::kSimple);
  EXPECT_EQ(plan.dq, DqMode::kDirect);
  EXPECT_EQ(plan.workspace.dq_accum_dim, 0);
  EXPECT_EQ(Forward(Config(128), A100()).path, KernelPath::kMmaSync);
}

TEST(FlashPlanBackward, ADoTensorTheTensorCoresCannotReadRunsTheSimpleKernels) {
  fusedattn_config c = Config();
  c.is_training = 1;
  Problem p = Make(c);
  BwdTensors t = DenseBwdTensors(p);
  t.d_o.stride_s += 4;
  BackwardPlan plan = PlanBackward(p, t, H100());
  EXPECT_EQ(plan.path, KernelPath::kSimple);
  EXPECT_TRUE(Contains(plan.why, "dO")) << plan.why;
}

// ---- One decision for check, workspace and run ----

TEST(FlashPlan, CheckIsTheStatusOfThePlansForDenseTensors) {
  fusedattn_config refused = Config(), accepted = Config();
  refused.head_dim_qk = refused.head_dim_v = 1024;
  refused.is_training = accepted.is_training = 1;
  for (const fusedattn_config& c : {refused, accepted}) {
    Problem p = Make(c);
    Status check = PlanCheck(p, H100());
    EXPECT_EQ(check.code(), PlanForward(p, DenseFwdTensors(p), H100()).status.code());
    EXPECT_EQ(check.code(), PlanBackward(p, DenseBwdTensors(p), H100()).status.code());
    EXPECT_EQ(check.message(), PlanForward(p, DenseFwdTensors(p), H100()).status.message());
  }
}

TEST(FlashPlan, TheWorkspaceIsTheSameForEveryLayoutOfTheTensors) {
  fusedattn_config c = Thd(Config());
  c.is_training = 1;
  Problem p = Make(c);
  BwdTensors strided = DenseBwdTensors(p);
  strided.q.stride_d = 2;
  EXPECT_EQ(PlanBackward(p, strided, H100()).path, KernelPath::kSimple);
  EXPECT_EQ(PlanBackward(p, strided, H100()).workspace.total,
            PlanBwdWorkspace(p, H100()).total);
  EXPECT_EQ(PlanForward(p, DenseFwdTensors(p), H100()).workspace.total,
            PlanFwdWorkspace(p, H100()).total);
}

TEST(FlashPlan, ExplainNamesPathInstanceVariantScheduleAndWorkspace) {
  EXPECT_EQ(DescribeForwardPlan(Forward(Thd(Config()))),
            "forward: hopper-wgmma d128 plain, thd-heavy-first schedule, 128 keys per step, "
            "workspace 256 B");
  fusedattn_config c = Config(256);
  c.softcap = 30.0;
  EXPECT_EQ(DescribeBackwardPlan(Backward(c)),
            "backward: mma.sync d256 full, dQ atomic+convert, workspace " +
                std::to_string(Backward(c).workspace.total) +
                " B (hopper backward: instances 64 and 128 only (this is 256))");
  fusedattn_config alibi = Config(64);
  alibi.bias_type = FUSEDATTN_BIAS_ALIBI;
  EXPECT_EQ(DescribeForwardPlan(Forward(alibi)),
            "forward: hopper-wgmma d64 softcap-alibi, 64 keys per step, workspace 0 B");
  EXPECT_EQ(DescribeBackwardPlan(Backward(alibi)),
            "backward: hopper-wgmma d64 softcap-alibi, dQ atomic+convert, workspace " +
                std::to_string(Backward(alibi).workspace.total) + " B");
  fusedattn_config deterministic = Config();
  deterministic.deterministic = 1;
  EXPECT_EQ(DescribeBackwardPlan(Backward(deterministic)),
            "backward: hopper-wgmma d128 plain, dQ fixed-order+convert, workspace " +
                std::to_string(Backward(deterministic).workspace.total) + " B");
  fusedattn_config bias = Config(128);
  bias.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  EXPECT_EQ(DescribeForwardPlan(Forward(bias)),
            "forward: hopper-wgmma d128 bias, 128 keys per step, workspace 0 B");
  bias.dropout = 0.1;
  EXPECT_EQ(DescribeForwardPlan(Forward(bias)),
            "forward: mma.sync d128 full, workspace 0 B (hopper forward: no bias tensor with "
            "dropout (dropout runs there alone or with softcap and ALiBi, bias tensors without "
            "dropout))");
  fusedattn_config dropout = Config(128);
  dropout.dropout = 0.1;
  EXPECT_EQ(DescribeForwardPlan(Forward(dropout)),
            "forward: hopper-wgmma d128 dropout, 128 keys per step, workspace 0 B");
  EXPECT_EQ(DescribeBackwardPlan(Backward(dropout)),
            "backward: mma.sync d128 full, dQ atomic+convert, workspace " +
                std::to_string(Backward(dropout).workspace.total) +
                " B (hopper backward: no dropout (the Hopper forward runs it; this backward draws "
                "the same mask))");
  if (jit::Available().ok()) {
    fusedattn_config flex = Config(128);
    flex.score_mod = WindowMask().get();
    const ForwardPlan flex_plan = Forward(flex);
    EXPECT_EQ(DescribeForwardPlan(flex_plan),
              "forward: hopper-score_mod-jit d128 score_mod, 128 keys per step, workspace " +
                  std::to_string(flex_plan.workspace.total) + " B");
    EXPECT_EQ(DescribeBackwardPlan(Backward(flex)),
              "backward: score_mod-jit d128 full, dQ atomic+convert, workspace " +
                  std::to_string(Backward(flex).workspace.total) +
                  " B (hopper backward: no score_mod graphs (the forward runs them there))");
  }
  fusedattn_config big = Config();
  big.head_dim_qk = big.head_dim_v = 1024;
  EXPECT_TRUE(Contains(DescribeForwardPlan(Forward(big)), "forward: refused: head_dim_qk = 1024"));
}

// ---- FP8 (e4m3) forward: the Hopper forward's FP8 instance (README "Hopper forward: FP8") ----

fusedattn_config Fp8(fusedattn_config c = Config()) {
  c.qkv_dtype = FUSEDATTN_DTYPE_FP8_E4M3;
  c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  c.do_dtype = c.dqkv_dtype = FUSEDATTN_DTYPE_FP8_E4M3;  // (read when there is a backward)
  return c;
}

TEST(FlashPlanFp8, DenseForwardsRunTheHopperFp8InstanceWithVTransposedInTheWorkspace) {
  for (fusedattn_mask mask : {FUSEDATTN_MASK_NONE, FUSEDATTN_MASK_CAUSAL,
                              FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT})
    for (fusedattn_format format :
         {FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_SBHD, FUSEDATTN_FORMAT_BHSD})
      for (fusedattn_dtype o : {FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_FLOAT16,
                                FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_FP8_E4M3}) {
        fusedattn_config c = Fp8();
        c.mask = mask;
        c.q_format = c.kv_format = c.o_format = format;
        c.o_dtype = o;
        c.max_seqlen_kv = 300;  // V^T rows padded to 384 keys
        c.return_lse = 1;
        const ForwardPlan plan = Forward(c);
        ASSERT_TRUE(plan.status.ok()) << plan.status.message();
        EXPECT_EQ(plan.path, KernelPath::kHopperWgmma);
        EXPECT_EQ(plan.variant, KernelVariant::kFp8);
        EXPECT_EQ(plan.instance, 128);
        EXPECT_EQ(plan.keys_per_step, 128);
        // [batch 2][heads_kv 2][128][384] bytes.
        EXPECT_EQ(plan.workspace.fp8_values_bytes, size_t{2 * 2 * 128 * 384});
        EXPECT_EQ(plan.workspace.total, Aligned(2 * 2 * 128 * 384));
        EXPECT_TRUE(Contains(DescribeForwardPlan(plan), "hopper-wgmma d128 fp8"))
            << DescribeForwardPlan(plan);
        // The workspace size query (selection asks before it sees tensors) is the plan's.
        EXPECT_EQ(PlanFwdWorkspace(Make(c), H100()).total, plan.workspace.total);
      }
}

TEST(FlashPlanFp8, GqaMqaWindowsSmallerHeadDimsAndTailsRunThere) {
  std::vector<std::pair<const char*, std::function<void(fusedattn_config&)>>> cases = {
      {"gqa", [](fusedattn_config& c) { c.heads_q = 8, c.heads_kv = 2; }},
      {"mqa", [](fusedattn_config& c) { c.heads_q = 8, c.heads_kv = 1; }},
      {"window", [](fusedattn_config& c) { c.window_left = 64, c.window_right = 0; }},
      {"d64", [](fusedattn_config& c) { c.head_dim_qk = c.head_dim_v = 64; }},
      {"d96/64", [](fusedattn_config& c) { c.head_dim_qk = 96, c.head_dim_v = 64; }},
      {"sq 1 skv 601", [](fusedattn_config& c) { c.max_seqlen_q = 1, c.max_seqlen_kv = 601; }},
  };
  for (auto& [name, change] : cases) {
    fusedattn_config c = Fp8();
    change(c);
    const ForwardPlan plan = Forward(c);
    ASSERT_TRUE(plan.status.ok()) << name << ": " << plan.status.message();
    EXPECT_EQ(plan.variant, KernelVariant::kFp8) << name;
    EXPECT_EQ(plan.workspace.fp8_values_bytes,
              static_cast<size_t>(c.batch * c.heads_kv * 128 *
                                  ((c.max_seqlen_kv + 127) / 128 * 128)))
        << name;
  }
}

TEST(FlashPlanFp8, RefusesWhatItsForwardHasNotNamingIt) {
  struct Refusal {
    const char* name;
    std::function<void(fusedattn_config&)> change;
    const char* mentions;
    DeviceFacts device = H100();
  };
  std::vector<Refusal> refusals = {
      {"training", [](fusedattn_config& c) { c.is_training = 1; }, "config.is_training = 1"},
      {"dropout", [](fusedattn_config& c) { c.dropout = 0.1; }, "dropout = 0.1"},
      {"bias", [](fusedattn_config& c) { c.bias_type = FUSEDATTN_BIAS_POST_SCALE; },
       "bias_type = "},
      {"alibi", [](fusedattn_config& c) { c.bias_type = FUSEDATTN_BIAS_ALIBI; }, "bias_type = "},
      {"softcap", [](fusedattn_config& c) { c.softcap = 30; }, "softcap = 30"},
      {"sinks", [](fusedattn_config& c) { c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK; },
       "softmax other than vanilla"},
      {"off-by-one", [](fusedattn_config& c) { c.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE; },
       "softmax other than vanilla"},
      {"padding", [](fusedattn_config& c) { c.mask = FUSEDATTN_MASK_PADDING_CAUSAL; },
       "padding masks"},
      {"thd", [](fusedattn_config& c) { c = Thd(c); }, "THD"},
      {"d256", [](fusedattn_config& c) { c.head_dim_qk = c.head_dim_v = 256; },
       "head_dim_qk = 256"},
      {"d72", [](fusedattn_config& c) { c.head_dim_qk = c.head_dim_v = 72; }, "head_dim_qk = 72"},
      {"negative scale", [](fusedattn_config& c) { c.attn_scale = -0.1; }, "attn_scale"},
      {"A100", [](fusedattn_config&) {}, "the device is not sm_90", A100()},
  };
  DeviceFacts no_sm90a = H100();
  no_sm90a.sm90a_kernels = false;
  refusals.push_back({"no sm_90a", [](fusedattn_config&) {}, "no sm_90a kernels", no_sm90a});
  DeviceFacts env_off = H100();
  env_off.wgmma_allowed = false;
  refusals.push_back({"FUSEDATTN_FLASH_WGMMA=0", [](fusedattn_config&) {}, "FUSEDATTN_FLASH_WGMMA=0",
                      env_off});
  for (const Refusal& r : refusals) {
    fusedattn_config c = Fp8();
    r.change(c);
    Problem p = Make(c);
    const Status check = PlanCheck(p, r.device);
    ASSERT_FALSE(check.ok()) << r.name;
    EXPECT_EQ(check.code(), FUSEDATTN_ERROR_NOT_SUPPORTED) << r.name;
    EXPECT_TRUE(Contains(check.message(), r.mentions)) << r.name << ": " << check.message();
    // Every refusal says what runs, and that the FP8 backward is not flash's.
    EXPECT_TRUE(Contains(check.message(), "flash's FP8 forward runs on its Hopper kernel"))
        << r.name << ": " << check.message();
    EXPECT_TRUE(Contains(check.message(), "the FP8 backward: none in flash")) << r.name;
    const ForwardPlan plan = PlanForward(p, DenseFwdTensors(p), r.device);
    EXPECT_FALSE(plan.status.ok()) << r.name;
    EXPECT_TRUE(Contains(DescribeForwardPlan(plan), "forward: refused: ")) << r.name;
  }
}

TEST(FlashPlanFp8, TheBackwardIsRefused) {
  const BackwardPlan plan = Backward(Fp8());
  ASSERT_FALSE(plan.status.ok());
  EXPECT_TRUE(Contains(plan.status.message(), "the FP8 backward: none in flash"))
      << plan.status.message();
}

TEST(FlashPlanFp8, TensorsTmaCannotDescribeAreRefused) {
  fusedattn_config c = Fp8();
  Problem p = Make(c);
  FwdTensors t = DenseFwdTensors(p);
  t.k.data = reinterpret_cast<void*>(uintptr_t{4096 + 8});  // not 16-byte aligned
  ForwardPlan plan = PlanForward(p, t, H100());
  EXPECT_FALSE(plan.status.ok());
  EXPECT_TRUE(Contains(plan.status.message(), "16-byte aligned")) << plan.status.message();
  t = DenseFwdTensors(p);
  t.v.stride_s += 8;  // rows 8 bytes apart from the next 16-byte boundary
  plan = PlanForward(p, t, H100());
  EXPECT_FALSE(plan.status.ok());
  // 16-byte strides in bytes (e4m3 elements are bytes): d = 16 with 1 head is a 16-byte row.
  c.head_dim_qk = c.head_dim_v = 16, c.heads_q = c.heads_kv = 1;
  EXPECT_TRUE(Forward(c).status.ok()) << Forward(c).status.message();
}

TEST(FlashPlanFp8, ValueKeyPermutationIsTheRegisterOrderOfP) {
  // A permutation of every 32-key block.
  std::vector<int> seen(kSm90Fp8KeyBlock, 0);
  for (int column = 0; column < kSm90Fp8KeyBlock; ++column) {
    const int key = Sm90Fp8ValueKeyOfColumn(column);
    ASSERT_GE(key, 0);
    ASSERT_LT(key, kSm90Fp8KeyBlock);
    ++seen[key];
  }
  for (int key = 0; key < kSm90Fp8KeyBlock; ++key) EXPECT_EQ(seen[key], 1) << key;
  // Lane t (t = lane % 4) holds the S accumulator's keys 8 nt + 2 t + c of each 8-key slice nt
  // (wgmma.cuh); the m64nNk32 A fragment's K positions 4 t + i (registers 0, 1) and 16 + 4 t + i
  // (registers 2, 3), i < 4 (PTX ISA). pack_p puts slices (0, 1) of the chunk in the first and
  // (2, 3) in the second: K position 4 t + i holds the key of slice i / 2, element i % 2.
  for (int t = 0; t < 4; ++t)
    for (int half = 0; half < 2; ++half)
      for (int i = 0; i < 4; ++i) {
        const int nt = 2 * half + i / 2, c = i % 2;
        const int accumulator_key = 8 * nt + 2 * t + c;
        EXPECT_EQ(Sm90Fp8ValueKeyOfColumn(16 * half + 4 * t + i), accumulator_key)
            << "t " << t << " half " << half << " i " << i;
      }
  static_assert(Sm90Fp8ValueKeyOfColumn(0) == 0 && Sm90Fp8ValueKeyOfColumn(2) == 8 &&
                    Sm90Fp8ValueKeyOfColumn(4) == 2 && Sm90Fp8ValueKeyOfColumn(16) == 16,
                "usable at compile time");
  EXPECT_EQ(Sm90Fp8ValueKeys(1), 128);
  EXPECT_EQ(Sm90Fp8ValueKeys(128), 128);
  EXPECT_EQ(Sm90Fp8ValueKeys(129), 256);
  EXPECT_EQ(Sm90Fp8ValueBytes(2, 3, 300), 2 * 3 * 128 * 384);
}

TEST(FlashPlanFp8, TheFp8TileIsOneSwizzleBlockPerRow) {
  using Tile = Sm90FwdTile<128, false, 1>;
  static_assert(Tile::kColBlocks == 1 && Tile::kBoxCols == 128 && Tile::kKeysPerValueMma == 32,
                "d128 e4m3: one 128-byte block, boxes of 128 columns, k32");
  static_assert(Tile::kQBytes == 128 * 128 && Tile::kKvBytes == 128 * 128, "bytes");
  static_assert(Sm90FwdTile<128>::kBoxCols == 64 && Sm90FwdTile<128>::kKeysPerValueMma == 16,
                "16-bit tiles unchanged");
  EXPECT_LE(Tile::kSmemBytes, 227 * 1024);
}

// ---- Dropout positions (context parallelism) ----

// A call placed in a larger problem's dropout mask (config.dropout_*, fusedattn.h "Dropout
// mask") is refused: the kernels number rows and keys from the call's own positions. The
// reference runs it; the same problem at its own positions runs here.
TEST(FlashPlanCheck, RefusesDropoutPositionsNamingThemAndTheReference) {
  fusedattn_config c = Config();
  c.dropout = 0.1, c.is_training = 1;
  ASSERT_TRUE(PlanCheck(Make(c), H100()).ok()) << "dropout at the call's own positions runs";
  for (auto edit : {+[](fusedattn_config* c) { c->dropout_key_offset = 256; },
                    +[](fusedattn_config* c) { c->dropout_row_offset = 256, c->dropout_rows = 512; },
                    +[](fusedattn_config* c) { c->dropout_head_offset = 4, c->dropout_heads = 8; },
                    +[](fusedattn_config* c) { c->dropout_batch_offset = 1; }}) {
    fusedattn_config placed = c;
    edit(&placed);
    const Status s = PlanCheck(Make(placed), H100());
    EXPECT_EQ(s.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
    EXPECT_TRUE(Contains(s.message(), "dropout positions (context parallelism")) << s.message();
    EXPECT_TRUE(Contains(s.message(), "the reference runs them")) << s.message();
  }
}

// Without dropout the positions change nothing (the problem normalizes them away): no refusal.
TEST(FlashPlanCheck, TakesDropoutPositionsWithoutDropout) {
  fusedattn_config c = Config();
  c.dropout_key_offset = 256, c.dropout_row_offset = 256, c.dropout_rows = 512;
  EXPECT_TRUE(PlanCheck(Make(c), H100()).ok());
}

}  // namespace
}  // namespace fusedattn::flash

#endif  // FUSEDATTN_WITH_FLASH
