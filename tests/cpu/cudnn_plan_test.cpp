// The cuDNN backend's planning, on the CPU: the band helper agrees with the problem's mask rule,
// up-front refusals name the field and another backend, the graph spec of real (contiguous)
// tensors is the one check() builds, keys separate what changes a graph and nothing else, and the
// scratch layout is sound. Compiled when the cuDNN backend is built; needs no GPU.
#ifdef FUSEDATTN_WITH_CUDNN

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/band.h"
#include "backends/cudnn/plan_spec.h"
#include "problem/problem.h"
#include "testing/tensors.h"

namespace fusedattn::cudnn {
namespace {

fusedattn_config BaseConfig() {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 3, c.heads_q = 4, c.heads_kv = 2, c.max_seqlen_q = 16, c.max_seqlen_kv = 24;
  c.head_dim_qk = 64, c.head_dim_v = 64;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  c.device = FUSEDATTN_DEVICE_CPU;  // planning only; the views are the same on either device
  return c;
}

Problem MakeOk(const fusedattn_config& c) {
  Problem p;
  Status s = MakeProblem(&c, false, &p);
  EXPECT_TRUE(s.ok()) << s.message();
  return p;
}

// Problem for a CUDA device (PreCheck refuses CPU problems).
Problem MakeCuda(fusedattn_config c) {
  c.device = FUSEDATTN_DEVICE_CUDA;
  Problem p;
  Status s = MakeProblem(&c, true, &p);
  EXPECT_TRUE(s.ok()) << s.message();
  return p;
}

// The spec of a problem's graph for the canonical tensors, in one direction.
SdpaGraphSpec SpecOf(const fusedattn_config& config, Direction direction = Direction::kForward) {
  Problem p = MakeCuda(config);
  return direction == Direction::kForward ? ForwardSpec(p, CanonicalFwdTensors(p))
                                          : BackwardSpec(p, CanonicalBwdTensors(p));
}

// The machine the on-disk keys are tested for.
MachineIdentity H100Identity() {
  MachineIdentity m;
  m.gpu_name = "NVIDIA H100 80GB HBM3", m.gpu_uuid = "0a1b2c3d4e5f60718293a4b5c6d7e8f9";
  m.sm_count = 132, m.compute_capability = 90, m.driver_version = 13000;
  m.cudnn_version = 91900, m.frontend_version = 13200, m.fusedattn_version = "0.1.0";
  return m;
}

void SetThd(fusedattn_config* c) {
  c->q_format = c->kv_format = c->o_format = c->do_format = c->dqkv_format =
      FUSEDATTN_FORMAT_THD;
}

TEST(CudnnBand, AgreesWithTheProblemsMaskRuleOnEveryRowAndKey) {
  const fusedattn_mask masks[] = {FUSEDATTN_MASK_NONE, FUSEDATTN_MASK_CAUSAL,
                                  FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT};
  const int64_t windows[] = {-1, 0, 1, 3};
  for (fusedattn_mask mask : masks)
    for (int64_t left : windows)
      for (int64_t right : windows) {
        fusedattn_config c = BaseConfig();
        c.mask = mask;
        c.window_left = left;
        c.window_right = mask == FUSEDATTN_MASK_NONE ? right : (right > 0 ? 0 : right);
        Problem p = MakeOk(c);
        Band band = BandOf(p);
        for (int64_t lq = 0; lq <= 7; ++lq)
          for (int64_t lkv = 0; lkv <= 7; ++lkv) {
            std::vector<bool> seen(lkv, false);
            bool any_empty = false;
            for (int64_t i = 0; i < lq + 2; ++i) {
              int64_t lo = 0, hi = 0, blo = 0, bhi = 0;
              p.visible_keys(i, lq, lkv, &lo, &hi);
              band.keys_of_row(i, lq, lkv, &blo, &bhi);
              SCOPED_TRACE(Format("mask=%s left=%lld right=%lld lq=%lld lkv=%lld i=%lld",
                                  MaskName(mask), (long long)left, (long long)c.window_right,
                                  (long long)lq, (long long)lkv, (long long)i));
              EXPECT_EQ(lo >= hi, band.row_empty(i, lq, lkv));
              if (lo < hi) EXPECT_EQ(std::make_pair(lo, hi), std::make_pair(blo, bhi));
              if (i < lq) any_empty |= lo >= hi;
              for (int64_t j = lo; j < hi && i < lq; ++j) seen[j] = true;
            }
            bool any_unseen = false;
            for (int64_t j = 0; j < lkv; ++j) {
              EXPECT_EQ(!seen[j], band.key_unseen(j, lq, lkv))
                  << MaskName(mask) << " left=" << left << " right=" << c.window_right
                  << " lq=" << lq << " lkv=" << lkv << " j=" << j;
              any_unseen |= !seen[j];
            }
            EXPECT_EQ(any_empty, band.any_row_empty(lq, lkv));
            EXPECT_EQ(any_unseen, band.any_key_unseen(lq, lkv));
          }
      }
}

TEST(CudnnPreCheck, RefusesWhatCudnnSdpaLacksNamingFieldAndFlash) {
  struct Case {
    const char* name;
    void (*edit)(fusedattn_config*);
    const char* field;
  };
  const Case cases[] = {
      {"float32", [](fusedattn_config* c) { c->qkv_dtype = c->o_dtype = FUSEDATTN_DTYPE_FLOAT32; },
       "qkv_dtype = float32"},
      {"mixed o dtype", [](fusedattn_config* c) { c->o_dtype = FUSEDATTN_DTYPE_FLOAT16; },
       "o_dtype = float16"},
      {"pre-scale bias", [](fusedattn_config* c) { c->bias_type = FUSEDATTN_BIAS_PRE_SCALE; },
       "bias_type = pre_scale"},
      {"alibi", [](fusedattn_config* c) { c->bias_type = FUSEDATTN_BIAS_ALIBI; },
       "bias_type = alibi"},
      {"softcap", [](fusedattn_config* c) { c->softcap = 30.0; }, "softcap = 30"},
      {"max logit", [](fusedattn_config* c) { c->return_max_logit = 1; }, "return_max_logit"},
      {"head dim 12", [](fusedattn_config* c) { c->head_dim_qk = c->head_dim_v = 12; },
       "head_dim_qk = 12"},
  };
  for (const Case& k : cases) {
    fusedattn_config c = BaseConfig();
    k.edit(&c);
    Status s = PreCheck(MakeCuda(c));
    EXPECT_EQ(s.code(), FUSEDATTN_ERROR_NOT_SUPPORTED) << k.name;
    EXPECT_NE(s.message().find(k.field), std::string::npos) << k.name << ": " << s.message();
    EXPECT_NE(s.message().find("flash"), std::string::npos) << k.name << ": " << s.message();
  }
}

// cuDNN draws dropout from its own stream: a call placed in a larger problem's mask (config
// dropout_*, context parallelism) is refused, naming the positions and the reference.
TEST(CudnnPreCheck, RefusesDropoutPositionsNamingThemAndTheReference) {
  fusedattn_config c = BaseConfig();
  c.dropout = 0.1, c.is_training = 1;
  EXPECT_TRUE(PreCheck(MakeCuda(c)).ok()) << "dropout at the call's own positions runs";
  c.dropout_head_offset = 4, c.dropout_heads = 8, c.dropout_key_offset = 24;
  Status s = PreCheck(MakeCuda(c));
  EXPECT_EQ(s.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(s.message().find("dropout positions (context parallelism"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("own random stream"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("the reference runs them"), std::string::npos) << s.message();
}

TEST(CudnnPreCheck, LeavesSupportedFeaturesToCudnn) {
  std::vector<fusedattn_config> configs;
  fusedattn_config c = BaseConfig();
  configs.push_back(c);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT, c.window_left = 5;
  configs.push_back(c);
  c = BaseConfig();
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE, c.bias_requires_grad = 1, c.is_training = 1;
  configs.push_back(c);
  c = BaseConfig();
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK, c.dropout = 0.1;
  configs.push_back(c);
  c = BaseConfig();
  SetThd(&c);
  c.head_dim_qk = c.head_dim_v = 256;
  configs.push_back(c);
  for (const auto& config : configs) {
    Status s = PreCheck(MakeCuda(config));
    EXPECT_TRUE(s.ok()) << s.message();
  }
}

TEST(CudnnPreCheck, RefusesCpuProblems) {
  Status s = PreCheck(MakeOk(BaseConfig()));
  EXPECT_EQ(s.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(s.message().find("CUDA"), std::string::npos) << s.message();
}

// The spec built from real contiguous tensors (as MakeProblemTensors makes them) equals the one
// check() builds from the problem alone: the common call hits the plan check() built.
TEST(CudnnSpec, ContiguousTensorsGiveTheSpecCheckBuilds) {
  const fusedattn_format formats[] = {FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_SBHD,
                                      FUSEDATTN_FORMAT_BHSD, FUSEDATTN_FORMAT_THD};
  for (fusedattn_format q_format : formats)
    for (fusedattn_format kv_format : formats)
      for (int variant = 0; variant < 3; ++variant) {
        if ((q_format == FUSEDATTN_FORMAT_THD) != (kv_format == FUSEDATTN_FORMAT_THD)) continue;
        fusedattn_config c = BaseConfig();
        c.q_format = c.o_format = c.do_format = q_format;
        c.kv_format = c.dqkv_format = kv_format;
        c.is_training = 1;
        if (q_format == FUSEDATTN_FORMAT_THD) c.mask = FUSEDATTN_MASK_PADDING;
        if (variant == 1) {
          c.bias_type = FUSEDATTN_BIAS_POST_SCALE, c.bias_heads = c.heads_q,
          c.bias_requires_grad = 1;
        }
        if (variant == 2) c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK, c.dropout = 0.2;
        SCOPED_TRACE(Format("q %s kv %s variant %d", FormatName(q_format), FormatName(kv_format),
                            variant));
        testing::TensorOptions options;
        options.bias_dtype = c.qkv_dtype;
        testing::ProblemTensors host = testing::MakeProblemTensors(c, options);
        Problem p = MakeOk(c);
        FwdTensors ft;
        fusedattn_fwd_args fa = host.fwd_args();
        ASSERT_TRUE(MakeFwdTensors(p, &fa, &ft).ok());
        BwdTensors bt;
        fusedattn_bwd_args ba = host.bwd_args();
        ASSERT_TRUE(MakeBwdTensors(p, &ba, &bt).ok());
        DeviceInfo device{0, 90, 91900};
        EXPECT_EQ(MakePlanKey(ForwardSpec(p, ft), device),
                  MakePlanKey(ForwardSpec(p, CanonicalFwdTensors(p)), device));
        EXPECT_EQ(MakePlanKey(BackwardSpec(p, bt), device),
                  MakePlanKey(BackwardSpec(p, CanonicalBwdTensors(p)), device));
      }
}

TEST(CudnnSpec, MapsMasksToCudnnBoundsAndAlignment) {
  {  // causal top-left with a window: keys j > i - (left + 1), j <= i
    fusedattn_config c = BaseConfig();
    c.mask = FUSEDATTN_MASK_CAUSAL, c.window_left = 4;
    Problem p = MakeCuda(c);
    SdpaGraphSpec s = ForwardSpec(p, CanonicalFwdTensors(p));
    EXPECT_TRUE(s.has_left_bound);
    EXPECT_EQ(s.left_bound, 5);
    EXPECT_TRUE(s.has_right_bound);
    EXPECT_EQ(s.right_bound, 0);
    EXPECT_FALSE(s.bottom_right);
    EXPECT_FALSE(s.padding);
  }
  {  // a non-causal window aligns bottom-right when sq != skv
    fusedattn_config c = BaseConfig();
    c.window_left = 2, c.window_right = 3;
    Problem p = MakeCuda(c);
    SdpaGraphSpec s = ForwardSpec(p, CanonicalFwdTensors(p));
    EXPECT_TRUE(s.bottom_right);
    EXPECT_EQ(s.left_bound, 3);
    EXPECT_EQ(s.right_bound, 3);
  }
  {  // ... and top-left (the same diagonal) when sq == skv without padding
    fusedattn_config c = BaseConfig();
    c.max_seqlen_kv = c.max_seqlen_q;
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    Problem p = MakeCuda(c);
    SdpaGraphSpec s = ForwardSpec(p, CanonicalFwdTensors(p));
    EXPECT_FALSE(s.bottom_right);
    EXPECT_EQ(s.right_bound, 0);
  }
  {  // a window wider than sq + skv hides nothing: no bound
    fusedattn_config c = BaseConfig();
    c.window_left = c.max_seqlen_q + c.max_seqlen_kv;
    c.window_right = 1000;
    Problem p = MakeCuda(c);
    SdpaGraphSpec s = ForwardSpec(p, CanonicalFwdTensors(p));
    EXPECT_FALSE(s.has_left_bound || s.has_right_bound);
  }
  {  // no band: no bounds at all
    Problem p = MakeCuda(BaseConfig());
    SdpaGraphSpec s = ForwardSpec(p, CanonicalFwdTensors(p));
    EXPECT_FALSE(s.has_left_bound || s.has_right_bound || s.padding);
  }
  {  // bottom-right causal with sq > skv: cuDNN's padded kernels with all-maximum lengths
    fusedattn_config c = BaseConfig();
    c.max_seqlen_q = 32, c.max_seqlen_kv = 8;
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    Problem p = MakeCuda(c);
    SdpaGraphSpec s = ForwardSpec(p, CanonicalFwdTensors(p));
    EXPECT_TRUE(s.padding);
    EXPECT_TRUE(s.bottom_right);
    CallPlan call = ForwardCallPlan(p, CanonicalFwdTensors(p));
    EXPECT_TRUE(call.const_lengths);
    EXPECT_TRUE(call.prep);
    EXPECT_TRUE(call.fixup) << "the first 24 rows see no key";
  }
}

TEST(CudnnCallPlan, PlainProblemsRunTheGraphAlone) {
  fusedattn_config c = BaseConfig();
  c.is_training = 1;
  for (fusedattn_mask mask : {FUSEDATTN_MASK_NONE, FUSEDATTN_MASK_CAUSAL}) {
    c.mask = mask;
    c.max_seqlen_kv = c.max_seqlen_q;
    Problem p = MakeCuda(c);
    CallPlan f = ForwardCallPlan(p, CanonicalFwdTensors(p));
    EXPECT_FALSE(f.prep || f.fixup || f.stage_stats) << MaskName(mask);
    CallPlan b = BackwardCallPlan(p, CanonicalBwdTensors(p));
    EXPECT_FALSE(b.prep || b.fixup || b.stage_stats || b.fixup_dbias || b.dsink)
        << MaskName(mask);
    EXPECT_EQ(WorkspaceBytes(ForwardScratch(p, f).bytes, 0), 0u);
  }
}

TEST(CudnnCallPlan, PaddingAndThdPrepareFixAndStage) {
  fusedattn_config c = BaseConfig();
  c.is_training = 1, c.mask = FUSEDATTN_MASK_PADDING;
  Problem p = MakeCuda(c);
  CallPlan f = ForwardCallPlan(p, CanonicalFwdTensors(p));
  EXPECT_TRUE(f.prep && f.fixup && f.stage_stats && f.padding);
  CallPlan b = BackwardCallPlan(p, CanonicalBwdTensors(p));
  EXPECT_TRUE(b.prep && b.fixup && b.stage_stats);
  SetThd(&c);
  Problem thd = MakeCuda(c);
  Scratch s = BackwardScratch(thd, BackwardCallPlan(thd, CanonicalBwdTensors(thd)));
  for (int slot = 0; slot < kRaggedSlots; ++slot) EXPECT_NE(s.ragged[slot], Scratch::kNone);
}

TEST(CudnnCallPlan, ForwardStagesAnLseThatIsNotPackedBhsdKeepingTheGraph) {
  fusedattn_config c = BaseConfig();
  c.is_training = 1;
  c.max_seqlen_kv = c.max_seqlen_q;
  Problem p = MakeCuda(c);
  FwdTensors t = CanonicalFwdTensors(p);
  EXPECT_FALSE(ForwardCallPlan(p, t).stage_stats);
  FwdTensors strided = t;
  strided.lse.stride_h = 1, strided.lse.stride_s = c.heads_q;  // [batch, seq, heads] in memory
  CallPlan call = ForwardCallPlan(p, strided);
  EXPECT_TRUE(call.stage_stats && call.fixup);
  DeviceInfo device{0, 90, 91900};
  EXPECT_EQ(MakePlanKey(ForwardSpec(p, t), device), MakePlanKey(ForwardSpec(p, strided), device));
}

TEST(CudnnCallPlan, BackwardStagesAnLseThatIsNotPackedBhsd) {
  fusedattn_config c = BaseConfig();
  c.is_training = 1;
  c.max_seqlen_kv = c.max_seqlen_q;
  Problem p = MakeCuda(c);
  BwdTensors t = CanonicalBwdTensors(p);
  EXPECT_FALSE(BackwardCallPlan(p, t).stage_stats);
  t.lse.stride_h = 1, t.lse.stride_s = c.heads_q;  // [batch, seq, heads] in memory
  EXPECT_TRUE(BackwardCallPlan(p, t).stage_stats);
}

TEST(CudnnKey, SeparatesWhatChangesTheGraph) {
  DeviceInfo device{0, 90, 91900};
  fusedattn_config c = BaseConfig();
  c.is_training = 1;
  Problem base = MakeCuda(c);
  PlanKey key = MakePlanKey(ForwardSpec(base, CanonicalFwdTensors(base)), device);
  auto key_of = [&](const fusedattn_config& config) {
    Problem p = MakeCuda(config);
    return MakePlanKey(ForwardSpec(p, CanonicalFwdTensors(p)), device);
  };
  EXPECT_EQ(key, key_of(c));
  fusedattn_config other = c;
  other.batch = 4;
  EXPECT_FALSE(key == key_of(other)) << "batch";
  other = c, other.head_dim_qk = other.head_dim_v = 128;
  EXPECT_FALSE(key == key_of(other)) << "head dim";
  other = c, other.attn_scale = 0.5;
  EXPECT_FALSE(key == key_of(other)) << "scale";
  other = c, other.dropout = 0.1;
  EXPECT_FALSE(key == key_of(other)) << "dropout";
  other = c, other.is_training = 0;
  EXPECT_FALSE(key == key_of(other)) << "stats";
  other = c, other.backend = FUSEDATTN_BACKEND_CUDNN;
  EXPECT_EQ(key, key_of(other)) << "forcing the backend does not change the graph";
  other = c, other.deterministic = 1;
  EXPECT_EQ(key, key_of(other)) << "the forward is deterministic anyway";
  EXPECT_FALSE(key == MakePlanKey(ForwardSpec(base, CanonicalFwdTensors(base)),
                                  DeviceInfo{1, 90, 91900}))
      << "device";
  EXPECT_FALSE(key == MakePlanKey(ForwardSpec(base, CanonicalFwdTensors(base)),
                                  DeviceInfo{0, 90, 91400}))
      << "cuDNN version";
  FwdTensors strided = CanonicalFwdTensors(base);
  strided.q.stride_s *= 3;  // q inside an interleaved QKV buffer
  EXPECT_FALSE(key == MakePlanKey(ForwardSpec(base, strided), device)) << "strides";
}

TEST(CudnnKey, ThdBatchesWithinOnePowerOfTwoShareAGraph) {
  DeviceInfo device{0, 90, 91900};
  fusedattn_config c = BaseConfig();
  SetThd(&c);
  auto key_of = [&](int64_t batch) {
    fusedattn_config config = c;
    config.batch = batch;
    Problem p = MakeCuda(config);
    return MakePlanKey(ForwardSpec(p, CanonicalFwdTensors(p)), device);
  };
  EXPECT_EQ(key_of(5), key_of(8));
  EXPECT_EQ(key_of(5), key_of(7));
  EXPECT_FALSE(key_of(8) == key_of(9));
  EXPECT_FALSE(key_of(4) == key_of(5));
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  c.bias_batch = 5;
  c.batch = 5;
  EXPECT_EQ(GraphBatch(MakeCuda(c)), 5) << "a per-sequence bias pins the batch";
  c.bias_batch = 1;
  EXPECT_EQ(GraphBatch(MakeCuda(c)), 8);
  fusedattn_config bshd = BaseConfig();
  bshd.batch = 5;
  EXPECT_EQ(GraphBatch(MakeCuda(bshd)), 5);
}

// ------------------------------------------------------------------------------------------------
// Batch chunks
// ------------------------------------------------------------------------------------------------
// The chunks a call runs, as first sequence and plan batch each.
std::vector<std::pair<int64_t, int64_t>> ChunksOf(const BatchChunks& chunks) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int i = 0; i < chunks.count; ++i) out.emplace_back(chunks.first[i], chunks.batch[i]);
  return out;
}
using Chunks = std::vector<std::pair<int64_t, int64_t>>;

TEST(CudnnBatchChunks, SumBuiltBatchesExactlyWithTheFewestLaunches) {
  EXPECT_EQ(ChunksOf(ChooseBatchChunks(5, {4, 1}, 8)), (Chunks{{0, 4}, {4, 1}}));
  EXPECT_EQ(ChunksOf(ChooseBatchChunks(8, {1}, 8)),
            (Chunks{{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}, {7, 1}}));
  EXPECT_EQ(ChunksOf(ChooseBatchChunks(6, {1, 2, 3}, 8)), (Chunks{{0, 3}, {3, 3}}));
  EXPECT_EQ(ChunksOf(ChooseBatchChunks(13, {1, 4, 8}, 8)), (Chunks{{0, 8}, {8, 4}, {12, 1}}));
  EXPECT_EQ(ChooseBatchChunks(9, {1}, 8).count, 0) << "nine launches are more than eight";
  EXPECT_EQ(ChooseBatchChunks(9, {1}, 4).count, 0);
  EXPECT_EQ(ChooseBatchChunks(3, {3, 5}, 8).count, 0) << "no plan smaller than the batch";
  EXPECT_EQ(ChooseBatchChunks(4, {}, 8).count, 0);
  EXPECT_EQ(ChooseBatchChunks(4, {2}, 1).count, 0) << "off";
}

TEST(CudnnBatchChunks, OverlapTheLastChunkOnlyForAnEighthOfTheBatchAtMost) {
  // 2 + 2 + 2 + 2 over 7 would compute one sequence twice, more than 7 / 8 (0): no chunks.
  // 6 + 6 + 6 over 17 computes one twice, within 17 / 8 (2): the last chunk starts at 11.
  EXPECT_EQ(ChooseBatchChunks(7, {2}, 8).count, 0);
  EXPECT_EQ(ChunksOf(ChooseBatchChunks(17, {6}, 8)), (Chunks{{0, 6}, {6, 6}, {11, 6}}));
  EXPECT_EQ(ChooseBatchChunks(5, {4}, 8).count, 0) << "4 + 4 over 5 computes 3 twice";
  // Exact sums win over overlap even with more launches.
  EXPECT_EQ(ChunksOf(ChooseBatchChunks(17, {6, 1}, 8)),
            (Chunks{{0, 6}, {6, 6}, {12, 1}, {13, 1}, {14, 1}, {15, 1}, {16, 1}}));
}

TEST(CudnnBatchChunks, LengthArraysOfChunksStartOn16Bytes) {
  const BatchChunks chunks = ChooseBatchChunks(13, {1, 4, 8}, 8);
  EXPECT_EQ(chunks.seq_len_offset(0), 0);
  EXPECT_EQ(chunks.seq_len_offset(1), 8);
  EXPECT_EQ(chunks.seq_len_offset(2), 12);
  const BatchChunks ones = ChooseBatchChunks(3, {1}, 8);
  EXPECT_EQ(ones.seq_len_offset(2), 8) << "each array rounded up to four ints";
}

// The spec a smaller batch's plan was built with is the chunked call's spec with that batch: the
// cache finds the plan by it.
TEST(CudnnBatchChunks, ASmallerBatchsSpecIsTheCallsSpecWithThatBatch) {
  DeviceInfo device{0, 90, 91900};
  for (fusedattn_format format : {FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_BHSD}) {
    fusedattn_config c = BaseConfig();
    c.is_training = 1;
    c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = format;
    c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
    c.bias_batch = 3, c.bias_heads = 4;
    c.bias_requires_grad = 1;
    fusedattn_config two = c;
    two.batch = two.bias_batch = 2;
    Problem p3 = MakeCuda(c), p2 = MakeCuda(two);
    EXPECT_EQ(MakePlanKey(WithBatch(ForwardSpec(p3, CanonicalFwdTensors(p3)), 2), device),
              MakePlanKey(ForwardSpec(p2, CanonicalFwdTensors(p2)), device))
        << "forward, format " << format;
    EXPECT_EQ(MakePlanKey(WithBatch(BackwardSpec(p3, CanonicalBwdTensors(p3)), 2), device),
              MakePlanKey(BackwardSpec(p2, CanonicalBwdTensors(p2)), device))
        << "backward, format " << format;
  }
  // SBHD's sequence stride holds the batch: a smaller batch's plan reads other strides.
  fusedattn_config c = BaseConfig();
  c.q_format = c.kv_format = c.o_format = FUSEDATTN_FORMAT_SBHD;
  fusedattn_config two = c;
  two.batch = 2;
  Problem p3 = MakeCuda(c), p2 = MakeCuda(two);
  EXPECT_FALSE(MakePlanKey(WithBatch(ForwardSpec(p3, CanonicalFwdTensors(p3)), 2), device) ==
               MakePlanKey(ForwardSpec(p2, CanonicalFwdTensors(p2)), device));
}

TEST(CudnnBatchChunks, SlicesStepOverWholeSequencesAndABroadcastBiasStays) {
  fusedattn_config c = BaseConfig();  // BSHD, sq 16, skv 24, hq 4, hkv 2, d 64, bf16
  c.is_training = 1;
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  c.bias_batch = 1, c.bias_heads = 4;
  Problem p = MakeCuda(c);
  const SequenceBytes fwd = SequenceBytesOf(ForwardSpec(p, CanonicalFwdTensors(p)));
  EXPECT_EQ(fwd.q, 16 * 4 * 64 * 2);
  EXPECT_EQ(fwd.k, 24 * 2 * 64 * 2);
  EXPECT_EQ(fwd.o, 16 * 4 * 64 * 2);
  EXPECT_EQ(fwd.stats, 4 * 16 * 4);
  EXPECT_EQ(fwd.bias, 0) << "broadcast over the batch";
  EXPECT_EQ(fwd.dq, 0) << "the forward has no gradients";
  const SequenceBytes bwd = SequenceBytesOf(BackwardSpec(p, CanonicalBwdTensors(p)));
  EXPECT_EQ(bwd.dk, 24 * 2 * 64 * 2);
  EXPECT_EQ(bwd.d_o, 16 * 4 * 64 * 2);
  c.bias_batch = 3;
  Problem per_sequence = MakeCuda(c);
  EXPECT_EQ(SequenceBytesOf(ForwardSpec(per_sequence, CanonicalFwdTensors(per_sequence))).bias,
            4 * 16 * 24 * 2);
}

// A refusal whose message names the reason.
#define EXPECT_THAT_MESSAGE(status, text)                                        \
  do {                                                                           \
    const Status s_ = (status);                                                  \
    EXPECT_FALSE(s_.ok()) << "expected a refusal naming: " << (text);            \
    EXPECT_NE(s_.message().find(text), std::string::npos) << s_.message();      \
  } while (0)

TEST(CudnnBatchChunks, RefusedWhereSequencesAreNotIndependentOrSlicesMisaligned) {
  fusedattn_config c = BaseConfig();
  c.batch = 8;
  c.is_training = 1;
  auto refusal = [&](const fusedattn_config& config, Direction direction) {
    return BatchChunkRefusal(SpecOf(config, direction));
  };
  EXPECT_TRUE(refusal(c, Direction::kForward).ok());
  EXPECT_TRUE(refusal(c, Direction::kBackward).ok());
  fusedattn_config other = c;
  other.dropout = 0.1;
  EXPECT_THAT_MESSAGE(refusal(other, Direction::kForward), "dropout");
  other = c;
  SetThd(&other);
  EXPECT_THAT_MESSAGE(refusal(other, Direction::kForward), "THD");
  other = c;
  other.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  other.bias_batch = 1, other.bias_heads = 1;
  EXPECT_TRUE(refusal(other, Direction::kForward).ok()) << "the forward reads it only";
  other.bias_requires_grad = 1;
  EXPECT_THAT_MESSAGE(refusal(other, Direction::kBackward), "summed over the batch");
  other.bias_batch = 8;
  EXPECT_TRUE(refusal(other, Direction::kBackward).ok()) << "a per-sequence bias gradient";
  // Alignment of each chunk's slices.
  const BatchChunks three_fives = ChooseBatchChunks(8, {3, 5}, 8);  // 5 + 3
  EXPECT_TRUE(BatchChunkAlignment(SpecOf(c, Direction::kBackward), three_fives).ok());
  other = c;
  other.max_seqlen_q = 3, other.heads_q = other.heads_kv = 1;  // LSE rows of 12 bytes
  EXPECT_THAT_MESSAGE(BatchChunkAlignment(SpecOf(other, Direction::kForward), three_fives),
                      "LSE");
}

TEST(CudnnBatchChunks, OnUnlessTheVariableTurnsThemOff) {
  std::string off;
  EXPECT_EQ(ParseMaxBatchChunks(nullptr, &off), kMaxBatchChunks);
  EXPECT_TRUE(off.empty());
  EXPECT_EQ(ParseMaxBatchChunks("4", &off), 4);
  EXPECT_EQ(ParseMaxBatchChunks("100", &off), kMaxBatchChunks) << "capped: scratch is sized for it";
  EXPECT_EQ(ParseMaxBatchChunks("1", &off), 1);
  EXPECT_NE(off.find("off"), std::string::npos) << off;
  EXPECT_EQ(ParseMaxBatchChunks("0", &off), 1);
  EXPECT_EQ(ParseMaxBatchChunks("many", &off), 1);
  EXPECT_NE(off.find("not a count"), std::string::npos) << off;
}

// ------------------------------------------------------------------------------------------------
// Sequence-length route
// ------------------------------------------------------------------------------------------------
TEST(CudnnSeqlenRoute, ExtentsArePowersOfTwoFromSixteen) {
  EXPECT_EQ(RouteSeqlenExtent(1), 16);
  EXPECT_EQ(RouteSeqlenExtent(16), 16);
  EXPECT_EQ(RouteSeqlenExtent(17), 32);
  EXPECT_EQ(RouteSeqlenExtent(100), 128);
  EXPECT_EQ(RouteSeqlenExtent(128), 128);
  EXPECT_EQ(RouteSeqlenExtent(129), 256);
  fusedattn_config c = BaseConfig();  // batch 3, sq 16, skv 24
  EXPECT_EQ(RouteExtentsOf(MakeCuda(c)), (RouteExtents{4, 16, 32}));
  c.batch = 1, c.max_seqlen_q = 1, c.max_seqlen_kv = 1000;
  EXPECT_EQ(RouteExtentsOf(MakeCuda(c)), (RouteExtents{1, 16, 1024}));
}

TEST(CudnnSeqlenRoute, CandidatesAreTheOwnExtentsThenTheNextPowerOfTwoPerAxis) {
  fusedattn_config c = BaseConfig();
  c.batch = 2, c.max_seqlen_q = 100, c.max_seqlen_kv = 200;
  const std::vector<RouteExtents> all = RouteCandidates(MakeCuda(c));
  ASSERT_EQ(all.size(), 8u);
  EXPECT_EQ(all.front(), (RouteExtents{2, 128, 256})) << "the own extents first";
  EXPECT_EQ(all.back(), (RouteExtents{4, 256, 512}));
  for (size_t i = 1; i < all.size(); ++i) {
    EXPECT_LE(all[i - 1].batch * (all[i - 1].seqlen_q + all[i - 1].seqlen_kv),
              all[i].batch * (all[i].seqlen_q + all[i].seqlen_kv))
        << "fewest rows first";
    EXPECT_LE(all[i].seqlen_q, 4 * c.max_seqlen_q);
    EXPECT_LE(all[i].batch, 4 * c.batch);
  }
  // Extents whose ragged offsets would pass int32 are left out (64 heads of 256: 2^14 elements a
  // row, so at most 2^17 - 1 rows a graph).
  c.batch = 1, c.heads_q = c.heads_kv = 64, c.head_dim_qk = c.head_dim_v = 256;
  c.max_seqlen_q = c.max_seqlen_kv = 100000;  // 131072 * 64 * 256 = 2^31: beyond int32
  EXPECT_TRUE(RouteCandidates(MakeCuda(c)).empty());
  c.max_seqlen_q = c.max_seqlen_kv = 60000;  // its own 65536 rows fit, twice that not
  const std::vector<RouteExtents> fit = RouteCandidates(MakeCuda(c));
  ASSERT_EQ(fit.size(), 1u);
  EXPECT_EQ(fit[0], (RouteExtents{1, 65536, 65536}));
}

// The heart of the route: every dense call within a ragged plan's extents asks for that one plan
// (equal keys), forward and backward, for any batch and lengths up to them, with sq != skv and
// either alignment; and it is the plan of a THD problem with those extents.
TEST(CudnnSeqlenRoute, DenseCallsWithinTheExtentsShareTheRaggedPlan) {
  const DeviceInfo device{0, 90, 91900};
  for (fusedattn_mask mask : {FUSEDATTN_MASK_NONE, FUSEDATTN_MASK_CAUSAL,
                              FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT, FUSEDATTN_MASK_PADDING_CAUSAL}) {
    SCOPED_TRACE(MaskName(mask));
    fusedattn_config c = BaseConfig();  // heads 4 / 2, d 64
    c.is_training = 1, c.mask = mask;
    const RouteExtents e{4, 128, 256};
    auto keys = [&](int64_t batch, int64_t sq, int64_t skv) {
      fusedattn_config x = c;
      x.batch = batch, x.max_seqlen_q = sq, x.max_seqlen_kv = skv;
      const Problem p = MakeCuda(x);
      EXPECT_TRUE(SeqlenRouteRefusal(p, ForwardSpec(p, CanonicalFwdTensors(p))).ok());
      const Problem r = RoutedProblem(p, e);
      return std::make_pair(MakePlanKey(ForwardSpec(r, CanonicalFwdTensors(p)), device),
                            MakePlanKey(BackwardSpec(r, CanonicalBwdTensors(p)), device));
    };
    const auto first = keys(3, 100, 200);
    for (const auto& other : {keys(4, 128, 256), keys(1, 17, 30), keys(2, 128, 129)}) {
      EXPECT_EQ(other.first, first.first);
      EXPECT_EQ(other.second, first.second);
    }
    // A THD problem of those extents (graph batch 4, buckets 128 and 256) has that plan too.
    fusedattn_config thd = c;
    SetThd(&thd);
    thd.batch = 3, thd.max_seqlen_q = 128, thd.max_seqlen_kv = 256;
    const Problem t = EffectiveProblem(MakeCuda(thd));
    EXPECT_EQ(MakePlanKey(ForwardSpec(t, CanonicalFwdTensors(t)), device), first.first);
  }
}

TEST(CudnnSeqlenRoute, TheThdFormKeepsTheBandAndPlansForTheExtents) {
  fusedattn_config c = BaseConfig();
  c.is_training = 1, c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT, c.window_left = 5;
  const Problem p = MakeCuda(c);
  const RouteExtents e{4, 32, 32};
  const Problem r = RoutedProblem(p, e);
  EXPECT_TRUE(r.thd && r.padding);
  EXPECT_EQ(r.config.mask, FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT);
  EXPECT_EQ(r.band(), p.band()) << "the same band, per sequence";
  EXPECT_EQ(GraphBatch(r), 4);
  const SdpaGraphSpec s = ForwardSpec(r, CanonicalFwdTensors(p));
  EXPECT_TRUE(s.ragged && s.padding && s.bottom_right);
  EXPECT_EQ(s.seqlen_q, 32);
  EXPECT_EQ(s.seqlen_kv, 32);
  EXPECT_EQ(s.q.stride[2], c.heads_q * c.head_dim_qk) << "the dense tensors' token stride";
  // The routed call stages its LSE (the graph's stats are [4, heads, 32]) and writes the rows our
  // semantics decide; its scratch holds the ragged offsets and stats of the graph's extents.
  const CallPlan call = ForwardCallPlan(r, CanonicalFwdTensors(p));
  EXPECT_TRUE(call.prep && call.padding && call.stage_stats && call.fixup);
  EXPECT_FALSE(call.const_lengths);
  const Scratch scratch = ForwardScratch(r, call);
  EXPECT_NE(scratch.ragged[kRaggedQ], Scratch::kNone);
  EXPECT_GE(scratch.bytes, sizeof(float) * 4 * c.heads_q * 32);
  const CallPlan bwd = BackwardCallPlan(r, CanonicalBwdTensors(p));
  EXPECT_TRUE(bwd.prep && bwd.stage_stats && bwd.fixup);
}

TEST(CudnnSeqlenRoute, RefusedWhereADenseTensorIsNoRaggedOneOrTheGraphHasTheLengths) {
  fusedattn_config c = BaseConfig();
  c.is_training = 1, c.mask = FUSEDATTN_MASK_CAUSAL;
  auto refusal = [](const fusedattn_config& config, Direction direction = Direction::kForward) {
    const Problem p = MakeCuda(config);
    return SeqlenRouteRefusal(p, direction == Direction::kForward
                                     ? ForwardSpec(p, CanonicalFwdTensors(p))
                                     : BackwardSpec(p, CanonicalBwdTensors(p)));
  };
  EXPECT_TRUE(refusal(c).ok());
  EXPECT_TRUE(refusal(c, Direction::kBackward).ok());
  fusedattn_config other = c;
  other.mask = FUSEDATTN_MASK_PADDING;  // padded BSHD: lengths from cu_seqlens
  EXPECT_TRUE(refusal(other).ok());
  other = c, other.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  EXPECT_TRUE(refusal(other, Direction::kBackward).ok());
  other = c;
  SetThd(&other);
  EXPECT_THAT_MESSAGE(refusal(other), "THD");
  other = c, other.q_format = other.kv_format = other.o_format = FUSEDATTN_FORMAT_SBHD;
  other.do_format = other.dqkv_format = FUSEDATTN_FORMAT_SBHD;
  EXPECT_THAT_MESSAGE(refusal(other), "q_format = SBHD");
  other = c, other.dqkv_format = FUSEDATTN_FORMAT_BHSD;
  EXPECT_THAT_MESSAGE(refusal(other, Direction::kBackward), "dqkv_format = BHSD");
  other.is_training = 0;
  EXPECT_TRUE(refusal(other).ok()) << "an inference problem reads no gradient layout";
  other = c, other.dropout = 0.1;
  EXPECT_THAT_MESSAGE(refusal(other), "dropout");
  other = c, other.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  other.bias_batch = 1, other.bias_heads = 1;
  EXPECT_THAT_MESSAGE(refusal(other), "bias");
  // Tensors: sequences that overlap, and offsets beyond int32.
  const Problem p = MakeCuda(c);
  FwdTensors t = CanonicalFwdTensors(p);
  t.k.stride_b = t.k.stride_s * (c.max_seqlen_kv - 1);
  EXPECT_THAT_MESSAGE(SeqlenRouteRefusal(p, ForwardSpec(p, t)), "sequences of k overlap");
  t = CanonicalFwdTensors(p);
  t.v.stride_b = int64_t{1} << 30;  // batch 3 of them: beyond int32 offsets
  EXPECT_THAT_MESSAGE(SeqlenRouteRefusal(p, ForwardSpec(p, t)), "v spans");
}

// The ragged offsets of a routed dense tensor step over whole sequences: its batch stride (padded
// rows included), or for a batch of one its rows.
TEST(CudnnSeqlenRoute, RaggedOffsetsStepOverWholeSequences) {
  TensorView v;
  v.stride_d = 1, v.stride_h = 64, v.stride_s = 4 * 64, v.stride_b = 40 * 4 * 64;
  EXPECT_EQ(RouteSequenceStep(v, 3, 32), 40 * 4 * 64) << "rows padded to 40";
  EXPECT_EQ(RouteSequenceStep(v, 1, 32), 32 * 4 * 64);
}

TEST(CudnnSeqlenRoute, OnByDefaultEagerOrOffByTheVariable) {
  std::string off;
  EXPECT_EQ(ParseSeqlenRoute(nullptr, &off), SeqlenRouteMode::kOn);
  EXPECT_TRUE(off.empty());
  EXPECT_EQ(ParseSeqlenRoute("", &off), SeqlenRouteMode::kOn);
  EXPECT_EQ(ParseSeqlenRoute("1", &off), SeqlenRouteMode::kOn);
  EXPECT_EQ(ParseSeqlenRoute("Eager", &off), SeqlenRouteMode::kEager);
  EXPECT_EQ(ParseSeqlenRoute("0", &off), SeqlenRouteMode::kOff);
  EXPECT_NE(off.find("every sequence length builds plans of its own"), std::string::npos) << off;
  EXPECT_EQ(ParseSeqlenRoute("sometimes", &off), SeqlenRouteMode::kOff);
  EXPECT_NE(off.find("is not 1, eager or 0"), std::string::npos) << off;
}

TEST(CudnnBackgroundBuild, OnByDefaultOffByTheVariable) {
  std::string off;
  EXPECT_TRUE(ParseBackgroundBuild(nullptr, &off));
  EXPECT_TRUE(off.empty());
  EXPECT_TRUE(ParseBackgroundBuild("", &off));
  EXPECT_TRUE(ParseBackgroundBuild("1", &off));
  EXPECT_FALSE(ParseBackgroundBuild("0", &off));
  EXPECT_NE(off.find("built in the call that needs them"), std::string::npos) << off;
  EXPECT_FALSE(ParseBackgroundBuild("later", &off));
  EXPECT_NE(off.find("is not 1 or 0"), std::string::npos) << off;
}

TEST(CudnnBackgroundBuild, DeterministicAndDropoutProblemsBuildInTheCall) {
  fusedattn_config c = BaseConfig();
  EXPECT_TRUE(BackgroundBuildRefusal(MakeOk(c)).ok());
  c.deterministic = 1;
  Status s = BackgroundBuildRefusal(MakeOk(c));
  EXPECT_NE(s.message().find("deterministic"), std::string::npos) << s.message();
  c.deterministic = 0;
  c.dropout = 0.1f;
  s = BackgroundBuildRefusal(MakeOk(c));
  EXPECT_NE(s.message().find("dropout"), std::string::npos) << s.message();
}

TEST(CudnnThdBuckets, FourStepsPerOctaveAbove64) {
  EXPECT_EQ(ThdSeqlenBucket(1), 1);
  EXPECT_EQ(ThdSeqlenBucket(16), 16);
  EXPECT_EQ(ThdSeqlenBucket(17), 32);
  EXPECT_EQ(ThdSeqlenBucket(64), 64);
  EXPECT_EQ(ThdSeqlenBucket(65), 80);
  EXPECT_EQ(ThdSeqlenBucket(97), 112);
  EXPECT_EQ(ThdSeqlenBucket(112), 112);
  EXPECT_EQ(ThdSeqlenBucket(1000), 1024);
  EXPECT_EQ(ThdSeqlenBucket(1025), 1280);
  for (int64_t n = 1; n <= 20000; ++n) {
    const int64_t b = ThdSeqlenBucket(n);
    ASSERT_GE(b, n);
    ASSERT_LE(b * 4, n * 5 + 60) << n << " -> " << b << ": at most a quarter more (or 16 rows)";
  }
}

TEST(CudnnThdBuckets, ThdProblemsPlanForTheBucketUnlessATensorHasTheExtent) {
  fusedattn_config c = BaseConfig();  // max_seqlen_q 16, max_seqlen_kv 24
  SetThd(&c);
  c.max_seqlen_q = 100, c.max_seqlen_kv = 200;
  const Problem widened = EffectiveProblem(MakeCuda(c));
  EXPECT_EQ(widened.config.max_seqlen_q, 112);
  EXPECT_EQ(widened.config.max_seqlen_kv, 224);
  fusedattn_config other = c;
  other.max_seqlen_q = 105, other.max_seqlen_kv = 210;
  DeviceInfo device{0, 90, 91900};
  auto key_of = [&](const Problem& p) {
    return MakePlanKey(ForwardSpec(p, CanonicalFwdTensors(p)), device);
  };
  EXPECT_EQ(key_of(widened), key_of(EffectiveProblem(MakeCuda(other)))) << "one bucket, one plan";
  other = c, other.dropout = 0.1;
  EXPECT_EQ(EffectiveProblem(MakeCuda(other)).config.max_seqlen_q, 100) << "dropout";
  other = c, other.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  EXPECT_EQ(EffectiveProblem(MakeCuda(other)).config.max_seqlen_q, 100) << "a bias tensor";
  other = BaseConfig(), other.max_seqlen_q = 100;
  EXPECT_EQ(EffectiveProblem(MakeCuda(other)).config.max_seqlen_q, 100) << "dense layouts";
}

TEST(CudnnKey, TheLargestSpecFitsTheKey) {
  fusedattn_config c = BaseConfig();
  SetThd(&c);
  c.is_training = 1, c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT, c.window_left = 3;
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE, c.bias_requires_grad = 1, c.dropout = 0.1;
  c.deterministic = 1;
  Problem p = MakeCuda(c);
  PlanKey key = MakePlanKey(BackwardSpec(p, CanonicalBwdTensors(p)), DeviceInfo{0, 90, 91900});
  EXPECT_LE(key.used, PlanKey::kWords);
}

// FUSEDATTN_CUDNN_DYNAMIC_SHAPES: per-shape plans unless it asks for dynamic shapes, which are
// experimental (they gave wrong results on cuDNN 9.19, 2026-11-24) and need a recent cuDNN.
TEST(CudnnDynamicShapesSetting, PerShapePlansUnlessAskedForAndTheCudnnHasThem) {
  const int64_t v919 = 91900;
  using Mode = DynamicShapesMode;
  DynamicShapesSetting unset = ParseDynamicShapes(nullptr, v919);
  EXPECT_EQ(unset.mode, Mode::kOff);
  EXPECT_NE(unset.off_reason.find("by default"), std::string::npos) << unset.off_reason;
  EXPECT_NE(unset.off_reason.find("experimental"), std::string::npos) << unset.off_reason;
  EXPECT_NE(unset.off_reason.find("wrong results"), std::string::npos) << unset.off_reason;
  EXPECT_NE(unset.off_reason.find("FUSEDATTN_CUDNN_DYNAMIC_SHAPES=1"), std::string::npos)
      << unset.off_reason;
  EXPECT_EQ(ParseDynamicShapes("", v919).mode, Mode::kOff);
  for (const char* off : {"0", "off", "OFF", "false", "no", "2", "dynamic", "1 "}) {
    SCOPED_TRACE(off);
    const DynamicShapesSetting s = ParseDynamicShapes(off, v919);
    EXPECT_EQ(s.mode, Mode::kOff);
    EXPECT_NE(s.off_reason.find(std::string("'") + off + "'"), std::string::npos) << s.off_reason;
  }
  for (const char* on : {"1", "on", "On", "true", "yes"}) {
    SCOPED_TRACE(on);
    const DynamicShapesSetting s = ParseDynamicShapes(on, v919);
    EXPECT_EQ(s.mode, Mode::kOn);
    EXPECT_TRUE(s.off_reason.empty()) << s.off_reason;
  }
  EXPECT_EQ(ParseDynamicShapes("no-override", v919).mode, Mode::kOnWithoutOverrides);
  EXPECT_EQ(ParseDynamicShapes("NO-OVERRIDE", v919).mode, Mode::kOnWithoutOverrides);
  // Execute-time shapes need cuDNN 9.18 (variant-pack overrides); the kernel cache alone 9.5.
  const DynamicShapesSetting old = ParseDynamicShapes("1", 91700);
  EXPECT_EQ(old.mode, Mode::kOff);
  EXPECT_NE(old.off_reason.find("9.18.0"), std::string::npos) << old.off_reason;
  EXPECT_NE(old.off_reason.find("9.17.0"), std::string::npos) << old.off_reason;
  EXPECT_EQ(ParseDynamicShapes("no-override", 91700).mode, Mode::kOnWithoutOverrides);
  EXPECT_EQ(ParseDynamicShapes("no-override", 90400).mode, Mode::kOff);
}

// Dynamic shapes (FUSEDATTN_CUDNN_DYNAMIC_SHAPES=1): the graphs of one structure (all shapes of a
// problem) share a kernel cache, keyed by everything but batch and sequence lengths.
TEST(CudnnStructureKey, SharedByShapesAndSeparatingEverythingElse) {
  const DeviceInfo device{0, 90, 91900};
  for (fusedattn_format f : {FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_SBHD, FUSEDATTN_FORMAT_BHSD,
                             FUSEDATTN_FORMAT_THD}) {
    SCOPED_TRACE(FormatName(f));
    fusedattn_config c = BaseConfig();
    c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = f;
    c.mask = f == FUSEDATTN_FORMAT_THD ? FUSEDATTN_MASK_PADDING_CAUSAL : FUSEDATTN_MASK_CAUSAL;
    c.is_training = 1;
    auto keys_of = [&](const fusedattn_config& config) {
      Problem p = MakeCuda(config);
      return std::make_pair(
          MakeStructureKey(ForwardSpec(p, CanonicalFwdTensors(p)), device),
          MakeStructureKey(BackwardSpec(p, CanonicalBwdTensors(p)), device));
    };
    const auto base = keys_of(c);
    EXPECT_FALSE(base.first == base.second) << "forward and backward";
    for (int64_t batch : {1, 2, 5, 8}) {
      for (int64_t sq : {16, 40, 128}) {
        fusedattn_config other = c;
        other.batch = batch, other.max_seqlen_q = sq, other.max_seqlen_kv = sq + 8;
        EXPECT_EQ(base, keys_of(other)) << "batch " << batch << " seqlen " << sq;
      }
    }
    fusedattn_config other = c;
    other.head_dim_qk = other.head_dim_v = 128;
    EXPECT_FALSE(base == keys_of(other)) << "head dim";
    other = c, other.heads_kv = 4;
    EXPECT_FALSE(base == keys_of(other)) << "GQA groups";
    other = c, other.qkv_dtype = other.o_dtype = FUSEDATTN_DTYPE_FLOAT16;
    EXPECT_FALSE(base == keys_of(other)) << "dtype";
    other = c, other.window_left = 7;
    EXPECT_FALSE(base == keys_of(other)) << "window";
    other = c, other.dropout = 0.25;
    EXPECT_FALSE(base == keys_of(other)) << "dropout";
    other = c, other.attn_scale = 0.5;
    EXPECT_FALSE(base == keys_of(other)) << "scale";
  }
  fusedattn_config c = BaseConfig();
  Problem p = MakeCuda(c);
  const SdpaGraphSpec spec = ForwardSpec(p, CanonicalFwdTensors(p));
  const PlanKey key = MakeStructureKey(spec, device);
  EXPECT_FALSE(key == MakeStructureKey(spec, DeviceInfo{1, 90, 91900})) << "device";
  EXPECT_FALSE(key == MakeStructureKey(spec, DeviceInfo{0, 90, 91400})) << "cuDNN version";
  fusedattn_config sbhd = c;
  sbhd.q_format = sbhd.kv_format = sbhd.o_format = FUSEDATTN_FORMAT_SBHD;
  Problem ps = MakeCuda(sbhd);
  EXPECT_FALSE(key == MakeStructureKey(ForwardSpec(ps, CanonicalFwdTensors(ps)), device))
      << "layout";
  FwdTensors padded = CanonicalFwdTensors(p);
  padded.q.stride_s += 8, padded.q.stride_b = padded.q.stride_s * c.max_seqlen_q;
  EXPECT_FALSE(key == MakeStructureKey(ForwardSpec(p, padded), device)) << "padded rows";
}

// The on-disk kernel cache's key: one per structure and machine; another cuDNN, GPU (model or
// board), driver, cudnn-frontend or fusedattn never reads the file.
TEST(CudnnDiskKey, NamesTheMachineAndTheStructure) {
  const MachineIdentity m = H100Identity();
  fusedattn_config c = BaseConfig();
  c.mask = FUSEDATTN_MASK_CAUSAL;
  const std::string key = KernelCacheDiskKey(SpecOf(c), m);
  EXPECT_NE(key.find("cudnn 91900"), std::string::npos) << key;
  EXPECT_NE(key.find(m.gpu_uuid), std::string::npos) << key;
  fusedattn_config other_shape = c;
  other_shape.batch = 7, other_shape.max_seqlen_q = other_shape.max_seqlen_kv = 200;
  EXPECT_EQ(key, KernelCacheDiskKey(SpecOf(other_shape), m)) << "another shape, same file";
  fusedattn_config other = c;
  other.mask = FUSEDATTN_MASK_NONE;
  EXPECT_NE(key, KernelCacheDiskKey(SpecOf(other), m)) << "another structure";
  auto differs = [&](MachineIdentity changed, const char* what) {
    EXPECT_NE(key, KernelCacheDiskKey(SpecOf(c), changed)) << what;
  };
  MachineIdentity x = m;
  x.cudnn_version = 91400, differs(x, "cuDNN version");
  x = m, x.gpu_uuid = "ffffffffffffffffffffffffffffffff", differs(x, "another board");
  x = m, x.gpu_name = "NVIDIA H200", differs(x, "GPU model");
  x = m, x.sm_count = 114, differs(x, "SM count");
  x = m, x.compute_capability = 100, differs(x, "architecture");
  x = m, x.driver_version = 12080, differs(x, "driver");
  x = m, x.frontend_version = 13300, differs(x, "cudnn-frontend");
  x = m, x.fusedattn_version = "0.2.0", differs(x, "fusedattn");
  // The device ordinal is not part of it: CUDA_VISIBLE_DEVICES renumbers GPUs between processes.
  Problem p = MakeCuda(c);
  EXPECT_EQ(KernelCacheDiskKey(ForwardSpec(p, CanonicalFwdTensors(p)), m), key);
}

TEST(CudnnPlanDiskKey, NamesTheGpuModelAndEveryWordOfThePlan) {
  const MachineIdentity m = H100Identity();
  fusedattn_config c = BaseConfig();
  c.mask = FUSEDATTN_MASK_CAUSAL;
  c.is_training = 1;
  const std::string key = PlanDiskKey(SpecOf(c, Direction::kForward), m);
  EXPECT_NE(key.find("cudnn plan"), std::string::npos) << key;
  EXPECT_NE(key.find("NVIDIA H100 80GB HBM3"), std::string::npos) << key;
  EXPECT_EQ(key, PlanDiskKey(SpecOf(c, Direction::kForward), m)) << "stable";
  EXPECT_NE(key, PlanDiskKey(SpecOf(c, Direction::kBackward), m)) << "direction";
  fusedattn_config other = c;
  other.batch = 7;
  EXPECT_NE(key, PlanDiskKey(SpecOf(other, Direction::kForward), m)) << "a plan per shape";
  other = c, other.max_seqlen_kv = 200;
  EXPECT_NE(key, PlanDiskKey(SpecOf(other, Direction::kForward), m)) << "sequence length";
  other = c, other.mask = FUSEDATTN_MASK_NONE;
  EXPECT_NE(key, PlanDiskKey(SpecOf(other, Direction::kForward), m)) << "mask";
  auto differs = [&](MachineIdentity changed, const char* what) {
    EXPECT_NE(key, PlanDiskKey(SpecOf(c, Direction::kForward), changed)) << what;
  };
  MachineIdentity x = m;
  x.cudnn_version = 91400, differs(x, "cuDNN version");
  x = m, x.gpu_name = "NVIDIA H200", differs(x, "GPU model");
  x = m, x.sm_count = 114, differs(x, "SM count");
  x = m, x.compute_capability = 100, differs(x, "architecture");
  x = m, x.driver_version = 12080, differs(x, "driver");
  x = m, x.frontend_version = 13300, differs(x, "cudnn-frontend");
  x = m, x.fusedattn_version = "0.2.0", differs(x, "fusedattn");
  // A plan is compiled for a GPU model, not a board: the GPUs of one machine share the files.
  x = m, x.gpu_uuid = "ffffffffffffffffffffffffffffffff";
  EXPECT_EQ(key, PlanDiskKey(SpecOf(c, Direction::kForward), x)) << "another board";
}

TEST(CudnnScratch, RegionsAreAlignedAndDisjoint) {
  fusedattn_config c = BaseConfig();
  SetThd(&c);
  c.is_training = 1, c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  Problem p = MakeCuda(c);
  CallPlan call = BackwardCallPlan(p, CanonicalBwdTensors(p));
  Scratch s = BackwardScratch(p, call);
  std::vector<std::pair<size_t, size_t>> regions;  // [offset, end)
  const int64_t batch = GraphBatch(p);
  auto add = [&](size_t offset, size_t bytes) {
    ASSERT_NE(offset, Scratch::kNone);
    EXPECT_EQ(offset % kWorkspaceAlignment, 0u);
    regions.emplace_back(offset, offset + bytes);
  };
  add(s.seq_len_q, 4 * batch);
  add(s.seq_len_kv, 4 * batch);
  for (int slot = 0; slot < kRaggedSlots; ++slot) add(s.ragged[slot], 4 * (batch + 1));
  add(s.stats, 4 * batch * c.heads_q * c.max_seqlen_q);
  add(s.dsink_partials, 4 * kDsinkChunks * c.heads_q);
  std::sort(regions.begin(), regions.end());
  for (size_t i = 0; i + 1 < regions.size(); ++i)
    EXPECT_LE(regions[i].second, regions[i + 1].first);
  EXPECT_LE(regions.back().second, s.bytes);
  EXPECT_GE(WorkspaceBytes(s.bytes, 1000), s.bytes + 1000 + kWorkspaceAlignment);
}

TEST(CudnnRuntimeLayout, NamesTheTensorCudnnCannotTake) {
  TensorView v;
  v.dtype = FUSEDATTN_DTYPE_BFLOAT16;
  v.data = reinterpret_cast<void*>(uintptr_t{4096});
  v.stride_d = 1, v.stride_h = 64, v.stride_s = 4 * 64, v.stride_b = 16 * 4 * 64;
  EXPECT_TRUE(CheckRuntimeLayout("args.q", v, 2, 4, 16, 64, false).ok());
  TensorView bad = v;
  bad.stride_d = 2;
  EXPECT_NE(CheckRuntimeLayout("args.q", bad, 2, 4, 16, 64, false).message().find("args.q"),
            std::string::npos);
  bad = v;
  bad.stride_s = 4 * 64 + 3;
  Status s = CheckRuntimeLayout("args.k", bad, 2, 4, 16, 64, false);
  EXPECT_EQ(s.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(s.message().find("args.k has sequence stride"), std::string::npos) << s.message();
  bad = v;
  bad.data = reinterpret_cast<void*>(uintptr_t{4098});
  EXPECT_NE(CheckRuntimeLayout("args.v", bad, 2, 4, 16, 64, false).message().find("aligned"),
            std::string::npos);
  bad = v;
  bad.stride_b = 0, bad.num_tokens = (int64_t{1} << 31) / 64;  // THD beyond int32 offsets
  EXPECT_FALSE(CheckRuntimeLayout("args.q", bad, 1, 4, 16, 64, true).ok());
  // Inputs broadcast over an axis (stride 0, which validation allows): a graph reads no repeated
  // elements (its stride would be taken for a packed one, past the tensor).
  bad = v;
  bad.stride_b = 0;
  EXPECT_NE(CheckRuntimeLayout("args.k", bad, 2, 4, 16, 64, false).message().find(
                "args.k has batch stride 0"),
            std::string::npos);
  EXPECT_TRUE(CheckRuntimeLayout("args.k", bad, 1, 4, 16, 64, false).ok()) << "one sequence";
  bad = v;
  bad.stride_h = 0;
  EXPECT_NE(CheckRuntimeLayout("args.v", bad, 2, 4, 16, 64, false).message().find(
                "args.v has head stride 0"),
            std::string::npos);
  EXPECT_TRUE(CheckRuntimeLayout("args.v", bad, 2, 1, 16, 64, false).ok()) << "one head";
}

}  // namespace
}  // namespace fusedattn::cudnn

#endif  // FUSEDATTN_WITH_CUDNN
