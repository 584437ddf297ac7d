// The cuDNN backend against the CPU reference, on a GPU (each test skips, saying why, without a
// CUDA device or without the cuDNN backend).
//
// Every case forces backend = cudnn on device tensors and runs the reference (backend =
// reference, device = CPU) on host copies of the same inputs: the forward's O and LSE are
// compared, then both backwards run from the reference's O and LSE and dQ, dK, dV (dbias, dsink)
// are compared, with the tolerances of shared/DESIGN.md and poisoned outputs (an element the
// reference writes and we do not, or the reverse, fails). Dropout cannot match the reference bit
// for bit (cuDNN draws its own Philox stream), so its tests check the statistics and that forward
// and backward use one mask.
//
// compute-sanitizer subset (memcheck): every kernel of the backend (prepare, forward and
// backward fix-ups, dbias fix-up, dsink), THD ragged offsets and dense calls run through ragged
// plans (cudnn_plans_test.cpp's sequence-length route), in a few cuDNN plans:
//   compute-sanitizer --tool memcheck build/tests/fusedattn_gpu_tests --gtest_filter='CudnnGrid/CudnnGridTest.Matches/bshd_causal_bf16_d64:CudnnGrid/CudnnGridTest.Matches/bshd_padding_uneven_zero_lengths:CudnnGrid/CudnnGridTest.Matches/thd_causal_gaps_packed_lse:CudnnGrid/CudnnGridTest.Matches/thd_learnable_sink_causal:CudnnGrid/CudnnGridTest.Matches/bshd_post_bias_1h_dbias_causal_fp16:CudnnStrides.AnLseLaidOutAsBatchSeqHeadsKeepsThePlanCheckBuilt:Structures/CudnnSeqlenRoute.NewLengthsOfABuiltStructureRunThroughOneRaggedPlan/causal_bottom_right_sq_gt_skv:Structures/CudnnSeqlenRoute.NewLengthsOfABuiltStructureRunThroughOneRaggedPlan/padding_causal'
// Compiled when the cuDNN backend is built (its test hooks live in it).
#ifdef FUSEDATTN_WITH_CUDNN

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backends/cudnn/cudnn_backend.h"
#include "gpu/cudnn_run.h"
#include "common/status.h"
#include "gpu/device_memory.h"
#include "gpu/skip.h"
#include "problem/problem.h"
#include "fusedattn/fusedattn.h"
#include "testing/scoped_env.h"
#include "testing/tensors.h"

namespace fusedattn::testing {
namespace {

// ------------------------------------------------------------------------------------------------
// The grid: formats, masks, windows, GQA, bias, sinks, THD, head dims, dtypes.
// ------------------------------------------------------------------------------------------------
struct GridCase {
  std::string name;
  fusedattn_config config;
  TensorOptions options;
  // cuDNN's documented dbias shape is [1, heads, sq, skv]; for others its refusal (with its
  // message) is a skip, not a failure. Whatever it accepts must match the reference.
  bool may_refuse = false;
};

std::vector<GridCase> Grid() {
  std::vector<GridCase> cases;
  auto add = [&](const std::string& name, fusedattn_config c, TensorOptions o = {},
                 bool may_refuse = false) {
    o.seed = cases.size() + 11;
    cases.push_back({name, c, o, may_refuse});
  };
  const auto bf16 = FUSEDATTN_DTYPE_BFLOAT16, fp16 = FUSEDATTN_DTYPE_FLOAT16;

  fusedattn_config c = Config(2, 4, 4, 128, 128, 64, bf16);
  add("bshd_nomask_bf16_d64", c);
  c.mask = FUSEDATTN_MASK_CAUSAL;
  add("bshd_causal_bf16_d64", c);
  c = Config(2, 4, 4, 96, 96, 128, fp16);
  SetFormats(&c, FUSEDATTN_FORMAT_SBHD);
  c.mask = FUSEDATTN_MASK_CAUSAL;
  add("sbhd_causal_fp16_d128", c);
  c = Config(1, 2, 2, 64, 64, 256, bf16);
  SetFormats(&c, FUSEDATTN_FORMAT_BHSD);
  add("bhsd_nomask_bf16_d256", c);
  c = Config(2, 4, 4, 64, 192, 64, bf16);
  SetFormats(&c, FUSEDATTN_FORMAT_BHSD);
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  add("bhsd_causal_bottom_right_sq_lt_skv", c);
  c = Config(2, 4, 4, 160, 64, 64, fp16);
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  add("bshd_causal_bottom_right_sq_gt_skv_empty_rows", c);
  c = Config(2, 4, 4, 96, 160, 64, bf16);
  c.mask = FUSEDATTN_MASK_CAUSAL;
  add("bshd_causal_top_left_sq_lt_skv_unseen_keys", c);
  c = Config(2, 4, 4, 128, 128, 64, bf16);
  c.window_left = 16, c.window_right = 8;
  add("bshd_window_16_8", c);
  c = Config(2, 4, 4, 96, 160, 64, bf16);
  c.mask = FUSEDATTN_MASK_CAUSAL, c.window_left = 20;
  add("bshd_causal_window_20", c);
  c = Config(2, 4, 4, 128, 200, 64, fp16);
  c.window_left = 32;
  add("bshd_window_left_32_bottom_right", c);
  c = Config(2, 8, 2, 128, 128, 64, bf16);
  c.mask = FUSEDATTN_MASK_CAUSAL;
  add("bshd_gqa_8_2_causal", c);
  c = Config(2, 8, 1, 64, 128, 128, fp16);
  add("bshd_mqa_8_1", c);
  c = Config(4, 4, 4, 96, 128, 64, bf16);
  c.mask = FUSEDATTN_MASK_PADDING;
  add("bshd_padding_uneven_zero_lengths", c);
  c = Config(4, 4, 2, 96, 96, 64, fp16);
  SetFormats(&c, FUSEDATTN_FORMAT_BHSD);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
  add("bhsd_padding_causal_gqa_fp16", c);
  c = Config(4, 4, 4, 64, 128, 64, bf16);
  SetFormats(&c, FUSEDATTN_FORMAT_SBHD);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  add("sbhd_padding_causal_bottom_right", c);
  c = Config(5, 4, 4, 96, 96, 64, bf16);
  SetFormats(&c, FUSEDATTN_FORMAT_THD);
  c.mask = FUSEDATTN_MASK_PADDING;
  add("thd_uneven_zero_lengths", c);
  {
    c = Config(4, 4, 4, 80, 80, 128, fp16);
    SetFormats(&c, FUSEDATTN_FORMAT_THD);
    c.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
    TensorOptions o;
    o.thd_gaps = true;
    o.lse_packed = true;
    add("thd_causal_gaps_packed_lse", c, o);
  }
  c = Config(3, 8, 2, 64, 128, 64, bf16);
  SetFormats(&c, FUSEDATTN_FORMAT_THD);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  add("thd_causal_bottom_right_gqa", c);
  c = Config(3, 4, 4, 64, 64, 64, bf16);
  SetFormats(&c, FUSEDATTN_FORMAT_THD);
  c.mask = FUSEDATTN_MASK_PADDING;
  c.window_left = 8, c.window_right = 4;
  add("thd_window_8_4", c);
  c = Config(2, 4, 4, 128, 128, 64, bf16);
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE, c.bias_heads = 4, c.bias_requires_grad = 1;
  add("bshd_post_bias_1h_dbias", c);
  c = Config(2, 4, 4, 64, 96, 64, fp16);
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE, c.bias_heads = 4, c.bias_requires_grad = 1;
  c.mask = FUSEDATTN_MASK_CAUSAL;
  add("bshd_post_bias_1h_dbias_causal_fp16", c);
  c = Config(3, 2, 2, 64, 64, 64, bf16);
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE, c.bias_heads = 2, c.bias_requires_grad = 1;
  c.mask = FUSEDATTN_MASK_PADDING;
  add("bshd_post_bias_1h_dbias_padding", c);
  c = Config(2, 4, 4, 64, 96, 64, fp16);
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE, c.bias_batch = 2, c.bias_requires_grad = 1;
  c.mask = FUSEDATTN_MASK_CAUSAL;
  add("bshd_post_bias_b1_dbias_causal_fp16", c, {}, true);
  c = Config(3, 2, 2, 64, 64, 64, bf16);
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE, c.bias_batch = 3, c.bias_heads = 2;
  c.bias_requires_grad = 1;
  c.mask = FUSEDATTN_MASK_PADDING;
  add("bshd_post_bias_bh_dbias_padding", c, {}, true);
  c = Config(2, 4, 4, 96, 96, 64, bf16);
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE, c.bias_batch = 2;
  c.mask = FUSEDATTN_MASK_CAUSAL;
  add("bshd_post_bias_b1_no_grad_causal", c);
  c = Config(2, 4, 4, 128, 128, 64, bf16);
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  add("bshd_learnable_sink", c);
  c = Config(2, 4, 4, 96, 96, 64, fp16);
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK, c.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
  add("bshd_learnable_sink_padding_causal", c);
  c = Config(3, 4, 2, 64, 64, 64, bf16);
  SetFormats(&c, FUSEDATTN_FORMAT_THD);
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK, c.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
  add("thd_learnable_sink_causal", c);
  c = Config(2, 4, 4, 128, 128, 64, bf16);
  c.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE, c.mask = FUSEDATTN_MASK_CAUSAL;
  add("bshd_off_by_one_causal", c);
  c = Config(2, 4, 4, 128, 128, 128, bf16);
  c.q_format = FUSEDATTN_FORMAT_BSHD, c.kv_format = FUSEDATTN_FORMAT_BHSD;
  c.o_format = FUSEDATTN_FORMAT_SBHD, c.do_format = FUSEDATTN_FORMAT_BHSD;
  c.dqkv_format = FUSEDATTN_FORMAT_SBHD;
  c.mask = FUSEDATTN_MASK_CAUSAL;
  add("mixed_formats_causal", c);
  c = Config(2, 4, 4, 128, 128, 64, bf16);
  c.attn_scale = 0.3;
  c.mask = FUSEDATTN_MASK_CAUSAL;
  c.deterministic = 1;
  add("bshd_deterministic_scale_0_3", c);
  c = Config(1, 2, 2, 256, 256, 256, fp16);
  c.mask = FUSEDATTN_MASK_CAUSAL;
  add("bshd_causal_fp16_d256", c);
  c = Config(2, 4, 4, 1, 128, 64, bf16);
  add("bshd_decode_sq_1", c);
  return cases;
}

void PrintTo(const GridCase& c, std::ostream* os) { *os << c.name; }

class CudnnGridTest : public ::testing::TestWithParam<GridCase> {};

TEST_P(CudnnGridTest, Matches) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  const GridCase& k = GetParam();
  if (k.may_refuse) {
    fusedattn_config c = k.config;
    c.is_training = 1;
    char msg[4096];
    fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
    if (fusedattn_get_backend(&c, &chosen, msg, sizeof msg) != FUSEDATTN_SUCCESS)
      GTEST_SKIP() << "cuDNN refuses this problem: " << msg;
  }
  RunOptions run;
  // cuDNN's backward refuses s_q = s_kv = 1 and decode shapes; sq = 1 runs forward only.
  run.backward = k.config.max_seqlen_q > 1;
  RunAndCompare(k.config, k.options, run);
}

INSTANTIATE_TEST_SUITE_P(CudnnGrid, CudnnGridTest, ::testing::ValuesIn(Grid()),
                         [](const ::testing::TestParamInfo<GridCase>& info) {
                           return info.param.name;
                         });

// ------------------------------------------------------------------------------------------------
// Strides: non-canonical but aligned strides build their own plan; misaligned ones cannot run on
// cuDNN: selection gives them to the next backend (flash), a forced cuDNN refuses them.
// ------------------------------------------------------------------------------------------------
TEST(CudnnStrides, PaddedRowsBuildTheirOwnPlanAndMatch) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  for (fusedattn_format f : {FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_THD}) {
    fusedattn_config c = Config(3, 4, 2, 64, 96, 64);
    SetFormats(&c, f);
    c.mask = f == FUSEDATTN_FORMAT_THD ? FUSEDATTN_MASK_PADDING_CAUSAL : FUSEDATTN_MASK_CAUSAL;
    RunOptions run;
    run.expect_no_new_plans = false;  // the padded layout is not the canonical one
    run.edit = [](ProblemTensors* t) { PadAllRows(t, 8); };  // 16 bytes: aligned
    SCOPED_TRACE(FormatName(f));
    const uint64_t misses = CacheStats().misses;
    RunAndCompare(c, {}, run);
    EXPECT_GT(CacheStats().misses, misses) << "the padded layout has a plan of its own";
  }
}

TEST(CudnnStrides, AnLseLaidOutAsBatchSeqHeadsKeepsThePlanCheckBuilt) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  fusedattn_config c = Config(2, 4, 4, 96, 96, 64);
  c.mask = FUSEDATTN_MASK_CAUSAL;
  RunOptions run;  // expect_no_new_plans: the LSE goes through scratch, the graph is the same
  run.edit = [](ProblemTensors* t) {
    const auto& shape = t->lse.shape();  // [batch, heads, seqlen_q]
    HostTensor lse(FUSEDATTN_DTYPE_FLOAT32, shape, {shape[1] * shape[2], 1, shape[1]},
                   shape[0] * shape[1] * shape[2]);
    lse.poison();
    t->lse = lse;
  };
  RunAndCompare(c, {}, run);
}

// Selection picks cuDNN for the problem; the call's rows are 6 bytes apart, which cuDNN cannot
// read: cuDNN answers NotSupported and selection runs the call on the next backend (flash), or,
// when none can, the error names the tensor. Forced, cuDNN is not replaced.
TEST(CudnnStrides, MisalignedRowsRunOnTheNextBackendThroughSelection) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  // Built in the call: an earlier test may have built this structure at another length, and a
  // background build would have selection pick flash first (README "Background builds").
  ScopedEnv env(&cudnn::ReloadSettings);
  env.set("FUSEDATTN_CUDNN_BACKGROUND_BUILD", "0");
  fusedattn_config c = Config(2, 4, 4, 64, 64, 64);
  c.backend = FUSEDATTN_BACKEND_AUTO;
  c.mask = FUSEDATTN_MASK_CAUSAL;
  c.is_training = 1;
  char msg[4096];
  fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
  ASSERT_EQ(fusedattn_get_backend(&c, &chosen, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  ASSERT_EQ(chosen, FUSEDATTN_BACKEND_CUDNN) << msg;
  char flash_reason[512];
  const bool flash = fusedattn_backend_available(FUSEDATTN_BACKEND_FLASH, flash_reason,
                                                 sizeof flash_reason) != 0;
  if (flash) {
    RunOptions run;
    run.expect_no_new_plans = false;
    run.edit = [](ProblemTensors* t) { PadAllRows(t, 3); };  // 6 bytes: not 16-byte aligned
    // The workspace must also cover flash's, which the size calls (cuDNN's) do not promise.
    run.extra_workspace = size_t{16} << 20;
    RunAndCompare(c, {}, run);  // forward and backward, on flash, against the reference
    return;
  }
  ProblemTensors host = MakeProblemTensors(c, {});
  PadAllRows(&host, 3);
  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(host, &error)) << error;
  size_t bytes = 0;
  ASSERT_EQ(fusedattn_fwd_workspace_size(&c, &bytes, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  DeviceBuffer workspace(bytes + (1 << 20));
  fusedattn_fwd_args fa = dev.fwd_args();
  EXPECT_EQ(fusedattn_fwd(&c, &fa, workspace.ptr, workspace.bytes, nullptr, msg, sizeof msg),
            FUSEDATTN_ERROR_NOT_SUPPORTED)
      << msg;
  EXPECT_NE(std::string(msg).find("cudnn: args.q"), std::string::npos) << msg;
}

TEST(CudnnStrides, MisalignedRowsOnAForcedCudnnAreRefusedNamingTheTensor) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  fusedattn_config c = Config(2, 4, 4, 64, 64, 64);  // forces cudnn
  ProblemTensors host = MakeProblemTensors(c, {});
  PadAllRows(&host, 3);
  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(host, &error)) << error;
  char msg[4096];
  size_t bytes = 0;
  ASSERT_EQ(fusedattn_fwd_workspace_size(&c, &bytes, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  DeviceBuffer workspace(bytes + (1 << 20));
  fusedattn_fwd_args fa = dev.fwd_args();
  EXPECT_EQ(fusedattn_fwd(&c, &fa, workspace.ptr, workspace.bytes, nullptr, msg, sizeof msg),
            FUSEDATTN_ERROR_NOT_SUPPORTED)
      << msg;
  EXPECT_NE(std::string(msg).find("forced backend cudnn"), std::string::npos) << msg;
  EXPECT_NE(std::string(msg).find("args.q"), std::string::npos) << msg;
  ProblemTensors out = host;
  ASSERT_TRUE(dev.download_outputs(&out, &error)) << error;
  for (int64_t e = 0; e < out.o.storage_elements(); ++e)
    ASSERT_TRUE(out.o.is_poison(e)) << "O was written at " << e;
}

TEST(CudnnBias, Float32BiasMatchesOrIsRefusedNamingFlash) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  fusedattn_config c = Config(2, 4, 4, 64, 64, 64);
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  TensorOptions options;
  options.bias_dtype = FUSEDATTN_DTYPE_FLOAT32;
  ProblemTensors host = MakeProblemTensors(c, options);
  ProblemTensors ref = host;
  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(host, &error)) << error;
  char msg[4096];
  size_t bytes = 0;
  ASSERT_EQ(fusedattn_fwd_workspace_size(&c, &bytes, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  DeviceBuffer workspace(bytes + (1 << 20));
  fusedattn_fwd_args fa = dev.fwd_args();
  fusedattn_status s =
      fusedattn_fwd(&c, &fa, workspace.ptr, workspace.bytes, nullptr, msg, sizeof msg);
  if (s == FUSEDATTN_SUCCESS) {
    fusedattn_config rc = ReferenceConfig(c);
    fusedattn_fwd_args ref_fa = ref.fwd_args();
    ASSERT_EQ(fusedattn_fwd(&rc, &ref_fa, nullptr, 0, nullptr, msg, sizeof msg),
              FUSEDATTN_SUCCESS)
        << msg;
    ProblemTensors out = host;
    ASSERT_TRUE(dev.download_outputs(&out, &error)) << error;
    Comparison o = Compare(out.o, ref.o);
    EXPECT_TRUE(o.ok(Tolerance(c.qkv_dtype))) << Describe("O", o);
  } else {
    EXPECT_EQ(s, FUSEDATTN_ERROR_NOT_SUPPORTED) << msg;
    EXPECT_NE(std::string(msg).find("flash"), std::string::npos) << msg;
  }
}

// ------------------------------------------------------------------------------------------------
// Refusals reach the diagnostic.
// ------------------------------------------------------------------------------------------------
TEST(CudnnRefusal, HeadDim512ReasonReachesTheDiagnostic) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  fusedattn_config c = Config(1, 2, 2, 64, 64, 512);
  c.is_training = 1;
  char msg[8192];
  fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
  fusedattn_status s = fusedattn_get_backend(&c, &chosen, msg, sizeof msg);
  EXPECT_EQ(s, FUSEDATTN_ERROR_NOT_SUPPORTED) << msg;
  EXPECT_NE(std::string(msg).find("cuDNN cannot build the"), std::string::npos) << msg;
  c.backend = FUSEDATTN_BACKEND_AUTO;
  s = fusedattn_get_backend(&c, &chosen, msg, sizeof msg);
  EXPECT_NE(chosen, FUSEDATTN_BACKEND_CUDNN);
  EXPECT_NE(std::string(msg).find("cudnn: cuDNN cannot build the"), std::string::npos) << msg;
}

TEST(CudnnRefusal, Float32ReasonNamesFlash) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  fusedattn_config c = Config(1, 2, 2, 64, 64, 64, FUSEDATTN_DTYPE_FLOAT32);
  char msg[4096];
  fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
  EXPECT_EQ(fusedattn_get_backend(&c, &chosen, msg, sizeof msg), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(std::string(msg).find("qkv_dtype = float32"), std::string::npos) << msg;
}

// ------------------------------------------------------------------------------------------------
// Dropout: cuDNN's own Philox stream, so statistics and forward/backward agreement.
// ------------------------------------------------------------------------------------------------
TEST(CudnnDropout, KeepsTheExpectedFractionAndScalesByOneOverKeep) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  const double p = 0.3;
  fusedattn_config c = Config(2, 4, 4, 128, 256, 64);
  c.dropout = p;
  ProblemTensors host = MakeProblemTensors(c, {});
  host.q.fill(0.0);  // every probability 1/skv
  host.v.fill(1.0);  // O = kept / (skv * (1 - p)) in every feature
  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(host, &error)) << error;
  char msg[4096];
  size_t bytes = 0;
  ASSERT_EQ(fusedattn_fwd_workspace_size(&c, &bytes, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  DeviceBuffer workspace(bytes);
  std::vector<double> first_rows;
  for (int run = 0; run < 2; ++run) {
    fusedattn_fwd_args fa = dev.fwd_args();
    fa.dropout_seed = 1000 + run;
    ASSERT_EQ(fusedattn_fwd(&c, &fa, workspace.ptr, workspace.bytes, nullptr, msg, sizeof msg),
              FUSEDATTN_SUCCESS)
        << msg;
    ProblemTensors out = host;
    ASSERT_TRUE(dev.download_outputs(&out, &error)) << error;
    std::vector<double> kept;  // per row: the fraction of keys kept
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < c.max_seqlen_q; ++i)
        for (int64_t h = 0; h < c.heads_q; ++h) kept.push_back(out.o.at({b, i, h, 0}) * (1 - p));
    double mean = 0, var = 0;
    for (double k : kept) mean += k;
    mean /= kept.size();
    for (double k : kept) var += (k - mean) * (k - mean);
    var /= kept.size();
    const double draws = static_cast<double>(kept.size()) * c.max_seqlen_kv;
    EXPECT_NEAR(mean, 1 - p, 6 * std::sqrt(p * (1 - p) / draws) + 4e-3) << "run " << run;
    const double row_var = p * (1 - p) / c.max_seqlen_kv;  // of one row's kept fraction
    EXPECT_GT(var, 0.5 * row_var) << "rows must draw independent masks";
    EXPECT_LT(var, 2.0 * row_var + 1e-5);
    if (run == 0) {
      first_rows = kept;
    } else {
      int64_t differ = 0;
      for (size_t r = 0; r < kept.size(); ++r) differ += kept[r] != first_rows[r];
      EXPECT_GT(differ, static_cast<int64_t>(kept.size() / 2)) << "another seed, another mask";
    }
  }
}

TEST(CudnnDropout, ForwardAndBackwardDrawTheSameMask) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  // With O = P'V and dV = P'^T dO for one mask P', sum <dV, V> = sum <dO, O> per (b, h).
  fusedattn_config c = Config(2, 4, 4, 128, 128, 64, FUSEDATTN_DTYPE_FLOAT16);
  c.dropout = 0.5;
  c.is_training = 1;
  std::vector<ProblemTensors> runs(1);  // the inputs, O of the forward, dV of its backward
  RunBackwardRepeatedly(c, &runs);
  if (HasFatalFailure()) return;
  const ProblemTensors& out = runs[0];
  double diff2 = 0, ref2 = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h) {
      double dv_v = 0, do_o = 0;
      for (int64_t j = 0; j < c.max_seqlen_kv; ++j)
        for (int64_t x = 0; x < c.head_dim_v; ++x)
          dv_v += out.dv.at({b, j, h, x}) * out.v.at({b, j, h, x});
      for (int64_t i = 0; i < c.max_seqlen_q; ++i)
        for (int64_t x = 0; x < c.head_dim_v; ++x)
          do_o += out.d_o.at({b, i, h, x}) * out.o.at({b, i, h, x});
      diff2 += (dv_v - do_o) * (dv_v - do_o);
      ref2 += do_o * do_o;
    }
  EXPECT_LT(std::sqrt(diff2 / ref2), 2e-2) << "sum <dV, V> != sum <dO, O>: different masks";
}

// ------------------------------------------------------------------------------------------------
// Determinism
// ------------------------------------------------------------------------------------------------
TEST(CudnnDeterministic, BackwardIsBitIdenticalRunToRun) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  fusedattn_config c = Config(2, 8, 2, 256, 256, 64);
  c.is_training = 1, c.deterministic = 1, c.mask = FUSEDATTN_MASK_CAUSAL;
  std::vector<ProblemTensors> runs(2);
  RunBackwardRepeatedly(c, &runs);
  if (HasFatalFailure()) return;
  for (auto member : {&ProblemTensors::dq, &ProblemTensors::dk, &ProblemTensors::dv}) {
    const HostTensor& a = runs[0].*member;
    const HostTensor& b = runs[1].*member;
    ASSERT_EQ(a.storage_bytes(), b.storage_bytes());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.storage_bytes()), 0);
  }
}

// ------------------------------------------------------------------------------------------------
// Plan cache: batch changes, eviction, threads.
// ------------------------------------------------------------------------------------------------
// These tests count plans exactly, so every problem builds its own: the sequence-length route
// (on by default) would run a structure's second length through a ragged plan and add its entries
// (cudnn_plans_test.cpp tests the route).
class CudnnCache : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("FUSEDATTN_PLAN_CACHE_SIZE");
    cudnn::ReloadPlanCacheCapacity();
    env_.set("FUSEDATTN_CUDNN_SEQLEN_ROUTE", "0");  // restored (and re-read) after the test
  }
  void TearDown() override {
    unsetenv("FUSEDATTN_PLAN_CACHE_SIZE");
    cudnn::ReloadPlanCacheCapacity();
  }
  ScopedEnv env_{&cudnn::ReloadSettings};
};

TEST(CudnnBatch, ChangingOnlyTheBatchSizeGivesRightResults) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  RunOptions run;
  run.expect_no_new_plans = false;
  for (int64_t batch : {2, 3, 1, 3}) {
    SCOPED_TRACE(Format("BSHD batch %lld", (long long)batch));
    fusedattn_config c = Config(batch, 4, 4, 64, 96, 64);
    c.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
    RunAndCompare(c, {}, run);
  }
}

TEST(CudnnBatch, ThdBatchesInOnePowerOfTwoShareAPlan) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  RunOptions run;
  run.expect_no_new_plans = false;
  uint64_t misses_at_5 = 0;
  for (int64_t batch : {5, 7, 8, 6, 9}) {
    SCOPED_TRACE(Format("THD batch %lld", (long long)batch));
    fusedattn_config c = Config(batch, 4, 4, 64, 64, 64);
    SetFormats(&c, FUSEDATTN_FORMAT_THD);
    c.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
    RunAndCompare(c, {}, run);
    if (batch == 5) misses_at_5 = CacheStats().misses;
    if (batch == 6) EXPECT_EQ(CacheStats().misses, misses_at_5) << "5..8 share the plans";
  }
}

TEST_F(CudnnCache, EvictsTheLeastRecentlyUsedPlanAndRebuildsIt) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  setenv("FUSEDATTN_PLAN_CACHE_SIZE", "2", 1);
  cudnn::ReloadPlanCacheCapacity();
  cudnn::ClearPlanCache();
  const fusedattn_cache_stats before = CacheStats();
  EXPECT_EQ(before.capacity, 2u);
  RunOptions run;
  run.backward = false;
  run.expect_no_new_plans = false;
  for (int64_t sq : {64, 80, 96, 64}) {  // three plans through a cache of two, then the first
    SCOPED_TRACE(Format("sq %lld", (long long)sq));
    RunAndCompare(Config(2, 2, 2, sq, 64, 64), {}, run);
  }
  const fusedattn_cache_stats after = CacheStats();
  EXPECT_EQ(after.entries, 2u);
  EXPECT_EQ(after.misses - before.misses, 4u);
  EXPECT_EQ(after.evictions - before.evictions, 2u);
}

TEST_F(CudnnCache, EightThreadsSelectAndRunConcurrently) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  cudnn::ClearPlanCache();
  std::vector<fusedattn_config> configs;
  for (int t = 0; t < 8; ++t) {
    fusedattn_config c = Config(2, 2 + 2 * (t % 2), 2, 64 + 16 * t, 64 + 8 * t, 64,
                                t % 3 == 0 ? FUSEDATTN_DTYPE_FLOAT16 : FUSEDATTN_DTYPE_BFLOAT16);
    c.is_training = 1;
    const fusedattn_mask masks[] = {FUSEDATTN_MASK_NONE, FUSEDATTN_MASK_CAUSAL,
                                    FUSEDATTN_MASK_PADDING, FUSEDATTN_MASK_PADDING_CAUSAL};
    c.mask = masks[t % 4];
    if (t >= 6) {
      SetFormats(&c, FUSEDATTN_FORMAT_THD);
      c.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
    }
    configs.push_back(c);
  }
  // References first (the CPU reference is the slow part).
  std::vector<ProblemTensors> inputs, refs;
  for (size_t t = 0; t < configs.size(); ++t) {
    TensorOptions o;
    o.seed = 100 + t;
    inputs.push_back(MakeProblemTensors(configs[t], o));
    refs.push_back(inputs.back());
    fusedattn_config rc = ReferenceConfig(configs[t]);
    fusedattn_fwd_args ref_fa = refs.back().fwd_args();
    char msg[4096];
    ASSERT_EQ(fusedattn_fwd(&rc, &ref_fa, nullptr, 0, nullptr, msg, sizeof msg),
              FUSEDATTN_SUCCESS)
        << msg;
  }
  const fusedattn_cache_stats before = CacheStats();
  std::vector<std::string> failures(configs.size());
  std::vector<std::thread> threads;
  for (size_t t = 0; t < configs.size(); ++t)
    threads.emplace_back([&, t] {
      const fusedattn_config& c = configs[t];
      char msg[4096];
      cudaStream_t stream = nullptr;
      cudaStreamCreate(&stream);
      DeviceProblem dev;
      std::string error;
      if (!dev.upload(inputs[t], &error)) {
        failures[t] = "upload: " + error;
        return;
      }
      for (int iteration = 0; iteration < 3 && failures[t].empty(); ++iteration) {
        fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
        size_t fb = 0, bb = 0;
        if (fusedattn_get_backend(&c, &chosen, msg, sizeof msg) != FUSEDATTN_SUCCESS ||
            chosen != FUSEDATTN_BACKEND_CUDNN ||
            fusedattn_fwd_workspace_size(&c, &fb, msg, sizeof msg) != FUSEDATTN_SUCCESS ||
            fusedattn_bwd_workspace_size(&c, &bb, msg, sizeof msg) != FUSEDATTN_SUCCESS) {
          failures[t] = std::string("selection: ") + msg;
          break;
        }
        DeviceBuffer workspace(std::max(fb, bb));
        fusedattn_fwd_args fa = dev.fwd_args();
        fusedattn_bwd_args ba = dev.bwd_args();
        if (fusedattn_fwd(&c, &fa, workspace.ptr, workspace.bytes, stream, msg, sizeof msg) !=
                FUSEDATTN_SUCCESS ||
            fusedattn_bwd(&c, &ba, workspace.ptr, workspace.bytes, stream, msg, sizeof msg) !=
                FUSEDATTN_SUCCESS) {
          failures[t] = std::string("run: ") + msg;
          break;
        }
        cudaStreamSynchronize(stream);
        ProblemTensors out = inputs[t];
        if (!dev.download_outputs(&out, &error)) {
          failures[t] = "download: " + error;
          break;
        }
        Comparison o = Compare(out.o, refs[t].o);
        Comparison lse = Compare(out.lse, refs[t].lse);
        if (!o.ok(Tolerance(c.qkv_dtype)) || !lse.ok(Tolerance(c.qkv_dtype)))
          failures[t] = Describe("O", o) + "; " + Describe("LSE", lse);
      }
      cudaStreamDestroy(stream);
    });
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < configs.size(); ++t)
    EXPECT_TRUE(failures[t].empty()) << "thread " << t << ": " << failures[t];
  const fusedattn_cache_stats after = CacheStats();
  // Each thread's problem has one forward and one backward plan, distinct from all others; each
  // was missed once (no other thread asks for it) and then hit: at least once by every
  // fusedattn_fwd and fusedattn_bwd (the workspace sizes are kept with the selection).
  EXPECT_EQ(after.misses - before.misses, 16u);
  EXPECT_EQ(after.entries, 16u);
  EXPECT_EQ(after.evictions - before.evictions, 0u);
  EXPECT_GE(after.hits - before.hits, 8u * 3u * 2u);
}

}  // namespace
}  // namespace fusedattn::testing

#endif  // FUSEDATTN_WITH_CUDNN
