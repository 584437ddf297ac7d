// The small_seq kernels, compiled as host C++ and run by the warp emulator, against the CPU
// reference: the kernels' indexing, masks, softmax and gradients checked where there is no GPU
// (CI). The backend's host side (small_seq_backend.cpp) runs unchanged; host memory stands in for
// device memory. Built in builds without CUDA (-DFUSEDATTN_CUDA=OFF); with
// -DFUSEDATTN_EMULATION_SANITIZE=ON, AddressSanitizer reports every access outside a tensor's
// storage and UBSan (with the shims' alignment checks) every misaligned vector access, which
// would fault on a GPU.
//
// What this cannot see: real GPU scheduling, memory ordering between warps, performance. The GPU
// tests (tests/gpu/small_seq_test.cpp) run the same comparisons on the device.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "backends/small_seq/small_seq.h"
#include "fusedattn/fusedattn.hpp"
#include "select/backend.h"
#include "testing/tensors.h"

namespace fusedattn {
Backend* SmallSeqBackend();  // small_seq_backend.cpp (not registered for selection here)
}

using namespace fusedattn::testing;

namespace {

fusedattn_config SmallSeqConfig(int64_t batch, int64_t heads_q, int64_t heads_kv,
                                int64_t seqlen_kv, int64_t head_dim, fusedattn_dtype dtype) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.is_training = 1;
  c.batch = batch;
  c.heads_q = heads_q;
  c.heads_kv = heads_kv;
  c.max_seqlen_q = 1;
  c.max_seqlen_kv = seqlen_kv;
  c.head_dim_qk = head_dim;
  c.head_dim_v = head_dim;
  c.qkv_dtype = c.o_dtype = dtype;
  return c;
}

void SetAllFormats(fusedattn_config* c, fusedattn_format format) {
  c->q_format = c->kv_format = c->o_format = c->do_format = c->dqkv_format = format;
}

std::string Describe(const fusedattn::Problem& problem, const TensorOptions& o) {
  return problem.describe() +
         fusedattn::Format(" bias=%lldx%lld%s o_dtype=%d dq:%d do:%d o:%d max_logit=%d "
                           "padded_strides=%d thd_gaps=%d lse_packed=%d",
                           (long long)problem.config.bias_batch,
                           (long long)problem.config.bias_heads,
                           problem.config.bias_requires_grad ? ",grad" : "",
                           (int)problem.config.o_dtype, (int)problem.config.dqkv_format,
                           (int)problem.config.do_format, (int)problem.config.o_format,
                           problem.config.return_max_logit, o.padded_strides, o.thd_gaps,
                           o.lse_packed);
}

void ExpectMatches(const char* what, const HostTensor& out, const HostTensor& ref,
                   double tolerance, const std::string& context) {
  if (ref.empty()) return;
  Comparison cmp = Compare(out, ref);
  EXPECT_TRUE(cmp.ok(tolerance)) << what << " differs from the reference (tolerance "
                                 << tolerance << "): " << cmp.describe() << "\n  case: "
                                 << context;
}

// Forward and backward of `config` through the small_seq backend (emulated kernels) and the
// reference; the backwards both take the reference forward's O and LSE.
void CheckAgainstReference(fusedattn_config config, const TensorOptions& options) {
  fusedattn_config ref_config = config;
  ref_config.device = FUSEDATTN_DEVICE_CPU;
  ref_config.backend = FUSEDATTN_BACKEND_REFERENCE;
  config.device = FUSEDATTN_DEVICE_CUDA;
  fusedattn::Problem problem;
  fusedattn::Status made = fusedattn::MakeProblem(&config, /*has_cuda_device=*/true, &problem);
  ASSERT_TRUE(made.ok()) << made.message();
  const std::string context = Describe(problem, options);
  SCOPED_TRACE(context);
  fusedattn::Status accepted = fusedattn::small_seq::CheckProblem(problem);
  ASSERT_TRUE(accepted.ok()) << accepted.message();
  fusedattn::Backend* backend = fusedattn::SmallSeqBackend();

  ProblemTensors host = MakeProblemTensors(config, options);
  const double tol = Tolerance(config.qkv_dtype);

  ProblemTensors ref = host;
  fusedattn::Forward(ref_config, ref.fwd_args());
  {
    ProblemTensors out = host;
    fusedattn_fwd_args args = out.fwd_args();
    fusedattn::FwdTensors tensors;
    fusedattn::Status s = fusedattn::MakeFwdTensors(problem, &args, &tensors);
    ASSERT_TRUE(s.ok()) << s.message();
    size_t bytes = 0;
    ASSERT_TRUE(backend->fwd_workspace_size(problem, &bytes).ok());
    std::vector<unsigned char> workspace(bytes);
    s = backend->forward(problem, tensors, workspace.data(), bytes, nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    ExpectMatches("forward O", out.o, ref.o, std::max(tol, Tolerance(config.o_dtype)), context);
    ExpectMatches("forward LSE", out.lse, ref.lse, tol, context);
    ExpectMatches("forward max_logit", out.max_logit, ref.max_logit, tol, context);
  }

  ProblemTensors bwd = host;
  bwd.o = ref.o;
  bwd.lse = ref.lse;
  ProblemTensors bwd_ref = bwd;
  fusedattn::Backward(ref_config, bwd_ref.bwd_args());
  {
    ProblemTensors out = bwd;
    fusedattn_bwd_args args = out.bwd_args();
    fusedattn::BwdTensors tensors;
    fusedattn::Status s = fusedattn::MakeBwdTensors(problem, &args, &tensors);
    ASSERT_TRUE(s.ok()) << s.message();
    size_t bytes = 0;
    ASSERT_TRUE(backend->bwd_workspace_size(problem, &bytes).ok());
    std::vector<unsigned char> workspace(bytes);
    s = backend->backward(problem, tensors, workspace.data(), bytes, nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    ExpectMatches("backward dQ", out.dq, bwd_ref.dq, tol, context);
    ExpectMatches("backward dK", out.dk, bwd_ref.dk, tol, context);
    ExpectMatches("backward dV", out.dv, bwd_ref.dv, tol, context);
    ExpectMatches("backward dbias", out.dbias, bwd_ref.dbias, tol, context);
    ExpectMatches("backward dsink", out.dsink, bwd_ref.dsink, tol, context);
  }
}

TensorOptions WithLengths(std::vector<int32_t> len_q, std::vector<int32_t> len_kv) {
  TensorOptions o;
  o.len_q = std::move(len_q);
  o.len_kv = std::move(len_kv);
  return o;
}

const fusedattn_dtype kDtypes[] = {FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_FLOAT16,
                                   FUSEDATTN_DTYPE_BFLOAT16};
const int64_t kHeadDims[] = {64, 128, 256, 512};

}  // namespace

TEST(SmallSeqEmulated, MatchesReferenceForEveryHeadDimAndDtype) {
  for (fusedattn_dtype dtype : kDtypes)
    for (int64_t d : kHeadDims) CheckAgainstReference(SmallSeqConfig(2, 2, 2, 16, d, dtype), {});
}

TEST(SmallSeqEmulated, MatchesReferenceForEveryKeyCountUpToSixteen) {
  for (int64_t skv = 1; skv <= 16; ++skv)
    for (int64_t d : {64, 512})
      for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_BFLOAT16})
        CheckAgainstReference(SmallSeqConfig(2, 1, 1, skv, d, dtype), {});
}

TEST(SmallSeqEmulated, MatchesReferenceForEmptyAndShortSequences) {
  std::vector<int32_t> len_q = {1, 0, 1, 1, 1, 0, 1, 1};
  std::vector<int32_t> len_kv = {16, 5, 0, 1, 2, 0, 7, 15};
  for (fusedattn_dtype dtype : kDtypes)
    for (int64_t d : kHeadDims) {
      fusedattn_config c = SmallSeqConfig(8, 2, 1, 16, d, dtype);
      c.mask = FUSEDATTN_MASK_PADDING;
      CheckAgainstReference(c, WithLengths(len_q, len_kv));
    }
}

// One head per sequence and an odd batch: the rows a warp's teams share belong to different
// sequences of different lengths (0 to 16, so one team finishes chunks before the other), and
// the last warp has teams without a row.
TEST(SmallSeqEmulated, MatchesReferenceWhenTeamsOfAWarpHaveDifferentLengths) {
  std::vector<int32_t> len_q = {1, 1, 1, 1, 0, 1, 1};
  std::vector<int32_t> len_kv = {16, 1, 0, 9, 4, 2, 13};
  for (fusedattn_dtype dtype : kDtypes)
    for (int64_t d : {64, 128}) {
      fusedattn_config c = SmallSeqConfig(7, 1, 1, 16, d, dtype);
      c.mask = FUSEDATTN_MASK_PADDING;
      CheckAgainstReference(c, WithLengths(len_q, len_kv));
      c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
      CheckAgainstReference(c, WithLengths(len_q, len_kv));
    }
}

TEST(SmallSeqEmulated, MatchesReferenceInEveryFormat) {
  for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_BFLOAT16})
    for (int64_t d : {64, 128}) {
      for (fusedattn_format f :
           {FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_SBHD, FUSEDATTN_FORMAT_BHSD}) {
        fusedattn_config c = SmallSeqConfig(3, 2, 1, 9, d, dtype);
        SetAllFormats(&c, f);
        CheckAgainstReference(c, {});
        c.mask = FUSEDATTN_MASK_PADDING;
        CheckAgainstReference(c, {});
      }
      fusedattn_config mixed = SmallSeqConfig(3, 2, 1, 9, d, dtype);
      mixed.q_format = FUSEDATTN_FORMAT_BHSD;
      mixed.kv_format = FUSEDATTN_FORMAT_SBHD;
      mixed.o_format = FUSEDATTN_FORMAT_BSHD;
      mixed.do_format = FUSEDATTN_FORMAT_SBHD;
      mixed.dqkv_format = FUSEDATTN_FORMAT_BHSD;
      mixed.mask = FUSEDATTN_MASK_PADDING;
      CheckAgainstReference(mixed, {});
      for (bool gaps : {false, true})
        for (bool lse_packed : {false, true}) {
          fusedattn_config c = SmallSeqConfig(5, 2, 1, 12, d, dtype);
          SetAllFormats(&c, FUSEDATTN_FORMAT_THD);
          TensorOptions o;
          o.thd_gaps = gaps;
          o.lse_packed = lse_packed;
          CheckAgainstReference(c, o);
        }
    }
}

TEST(SmallSeqEmulated, MatchesReferenceWithStridedLayouts) {
  TensorOptions padded;
  padded.padded_strides = true;
  for (fusedattn_dtype dtype : kDtypes)
    for (int64_t d : {64, 256}) {
      fusedattn_config c = SmallSeqConfig(3, 2, 1, 11, d, dtype);
      CheckAgainstReference(c, padded);
      SetAllFormats(&c, FUSEDATTN_FORMAT_THD);
      CheckAgainstReference(c, padded);
    }
}

TEST(SmallSeqEmulated, MatchesReferenceWithOutputDtypeOtherThanInputs) {
  for (auto [qkv, o] : {std::pair{FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_FLOAT32},
                        std::pair{FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_FLOAT16}})
    for (int64_t d : {64, 128}) {
      fusedattn_config c = SmallSeqConfig(3, 2, 2, 8, d, qkv);
      c.o_dtype = o;
      CheckAgainstReference(c, {});
    }
}

TEST(SmallSeqEmulated, MatchesReferenceForGqaAndMqaGroups) {
  for (int64_t heads_kv : {8, 4, 2, 1})
    for (int64_t d : {64, 256}) {
      fusedattn_config c = SmallSeqConfig(3, 8, heads_kv, 13, d, FUSEDATTN_DTYPE_BFLOAT16);
      c.mask = FUSEDATTN_MASK_PADDING;
      CheckAgainstReference(c, {});
    }
  CheckAgainstReference(SmallSeqConfig(3, 6, 2, 7, 128, FUSEDATTN_DTYPE_FLOAT32), {});
}

TEST(SmallSeqEmulated, MatchesReferenceForMasksAndWindows) {
  struct Mask {
    fusedattn_mask mask;
    int64_t left, right;
  };
  const Mask masks[] = {{FUSEDATTN_MASK_CAUSAL, -1, -1},
                        {FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT, -1, -1},
                        {FUSEDATTN_MASK_PADDING_CAUSAL, -1, -1},
                        {FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT, -1, -1},
                        {FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT, 3, 0},
                        {FUSEDATTN_MASK_PADDING, 5, -1},
                        {FUSEDATTN_MASK_NONE, 0, 2},
                        {FUSEDATTN_MASK_NONE, 2, 0},
                        {FUSEDATTN_MASK_PADDING_CAUSAL, 4, 0}};
  for (const Mask& m : masks)
    for (int64_t d : {64, 128}) {
      fusedattn_config c = SmallSeqConfig(4, 2, 1, 14, d, FUSEDATTN_DTYPE_FLOAT32);
      c.mask = m.mask;
      c.window_left = m.left;
      c.window_right = m.right;
      CheckAgainstReference(c, {});
    }
}

TEST(SmallSeqEmulated, MatchesReferenceForScoreModifiersAndSoftmaxVariants) {
  for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_BFLOAT16})
    for (int64_t d : {64, 512}) {
      fusedattn_config base = SmallSeqConfig(4, 2, 1, 10, d, dtype);
      base.mask = FUSEDATTN_MASK_PADDING;
      base.return_max_logit = 1;
      fusedattn_config c = base;
      c.softcap = 0.7;
      c.attn_scale = 1.3;
      CheckAgainstReference(c, {});
      c = base;
      c.bias_type = FUSEDATTN_BIAS_ALIBI;
      CheckAgainstReference(c, {});
      c = base;
      c.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE;
      CheckAgainstReference(c, {});
      c = base;
      c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
      CheckAgainstReference(c, {});
      c.softcap = 2.0;
      c.bias_type = FUSEDATTN_BIAS_ALIBI;
      c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
      c.window_left = 6;
      CheckAgainstReference(c, {});
    }
}

TEST(SmallSeqEmulated, MatchesReferenceForBiasAndItsGradient) {
  for (fusedattn_bias type : {FUSEDATTN_BIAS_PRE_SCALE, FUSEDATTN_BIAS_POST_SCALE})
    for (auto [bias_batch, bias_heads] :
         {std::pair<int64_t, int64_t>{3, 4}, {1, 4}, {3, 1}, {1, 1}})
      for (fusedattn_dtype bias_dtype : {FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_BFLOAT16}) {
        fusedattn_config c = SmallSeqConfig(3, 4, 2, 9, 128, FUSEDATTN_DTYPE_BFLOAT16);
        c.mask = FUSEDATTN_MASK_PADDING;
        c.bias_type = type;
        c.bias_batch = bias_batch;
        c.bias_heads = bias_heads;
        c.bias_requires_grad = 1;
        c.softcap = type == FUSEDATTN_BIAS_PRE_SCALE ? 1.5 : 0.0;
        TensorOptions o;
        o.bias_dtype = bias_dtype;
        CheckAgainstReference(c, o);
      }
}

TEST(SmallSeqEmulated, MatchesReferenceForGradientsSummedOverManySequences) {
  // More terms per dsink / dbias element than one thread takes (64) or a block has threads
  // (512): the block-wide fixed-order sums with every thread busy.
  fusedattn_config c = SmallSeqConfig(600, 2, 1, 6, 64, FUSEDATTN_DTYPE_FLOAT32);
  c.mask = FUSEDATTN_MASK_PADDING;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  c.bias_batch = 1;
  c.bias_heads = 1;
  c.bias_requires_grad = 1;
  CheckAgainstReference(c, {});
}

TEST(SmallSeqEmulated, MatchesReferenceWithDropoutMaskBitForBit) {
  for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_BFLOAT16})
    for (int64_t d : {64, 256}) {
      fusedattn_config c = SmallSeqConfig(4, 2, 1, 16, d, dtype);
      c.mask = FUSEDATTN_MASK_PADDING;
      c.dropout = 0.3;
      CheckAgainstReference(c, {});
      c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
      CheckAgainstReference(c, {});
    }
}

TEST(SmallSeqEmulated, OutOfRangeSequenceLengthsAndOffsetsStayInsideTheTensors) {
  // Lengths above max_seqlen, negative lengths, THD offsets past the tokens: the kernels clamp.
  // Under FUSEDATTN_EMULATION_SANITIZE, AddressSanitizer reports any access outside a tensor.
  for (fusedattn_format format : {FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_THD})
    for (bool gaps : {false, true}) {
      fusedattn_config c = SmallSeqConfig(4, 4, 2, 8, 128, FUSEDATTN_DTYPE_BFLOAT16);
      SetAllFormats(&c, format);
      c.mask = FUSEDATTN_MASK_PADDING;
      c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
      c.device = FUSEDATTN_DEVICE_CUDA;
      TensorOptions o;
      o.thd_gaps = gaps && format == FUSEDATTN_FORMAT_THD;
      ProblemTensors t = MakeProblemTensors(c, o);
      const int32_t cu_q[] = {0, 1, 6, 3, 1 << 30};
      const int32_t cu_kv[] = {0, 8, 1008, 2, 1 << 30};
      for (int i = 0; i < 5; ++i) {
        t.cu_seqlens_q.set(i, cu_q[i]);
        t.cu_seqlens_kv.set(i, cu_kv[i]);
      }
      if (!t.seq_offsets_q.empty()) {
        const int32_t offsets[] = {0, 1 << 29, -50, 7, 9};
        for (int i = 0; i < 5; ++i) {
          t.seq_offsets_q.set(i, offsets[i]);
          t.seq_offsets_kv.set(i, offsets[i]);
        }
      }
      fusedattn::Problem problem;
      ASSERT_TRUE(fusedattn::MakeProblem(&c, true, &problem).ok());
      fusedattn::Backend* backend = fusedattn::SmallSeqBackend();
      fusedattn_fwd_args fwd = t.fwd_args();
      fusedattn::FwdTensors fwd_tensors;
      ASSERT_TRUE(fusedattn::MakeFwdTensors(problem, &fwd, &fwd_tensors).ok());
      EXPECT_TRUE(backend->forward(problem, fwd_tensors, nullptr, 0, nullptr).ok());
      fusedattn_bwd_args bwd = t.bwd_args();
      fusedattn::BwdTensors bwd_tensors;
      ASSERT_TRUE(fusedattn::MakeBwdTensors(problem, &bwd, &bwd_tensors).ok());
      size_t bytes = 0;
      ASSERT_TRUE(backend->bwd_workspace_size(problem, &bytes).ok());
      std::vector<unsigned char> workspace(bytes);
      EXPECT_TRUE(
          backend->backward(problem, bwd_tensors, workspace.data(), bytes, nullptr).ok());
    }
}

TEST(SmallSeqEmulated, MatchesReferenceWithManyFeaturesAtOnce) {
  // The GPU memcheck subset's cases (SmallSeqSanitize in tests/gpu/small_seq_test.cpp).
  fusedattn_config c = SmallSeqConfig(4, 4, 2, 7, 128, FUSEDATTN_DTYPE_FLOAT32);
  c.mask = FUSEDATTN_MASK_PADDING;
  c.q_format = FUSEDATTN_FORMAT_BHSD;
  c.kv_format = FUSEDATTN_FORMAT_SBHD;
  c.dqkv_format = FUSEDATTN_FORMAT_SBHD;
  c.o_dtype = FUSEDATTN_DTYPE_FLOAT16;
  CheckAgainstReference(c, WithLengths({1, 0, 1, 1}, {7, 3, 0, 1}));
  c = SmallSeqConfig(4, 6, 2, 9, 256, FUSEDATTN_DTYPE_FLOAT16);
  SetAllFormats(&c, FUSEDATTN_FORMAT_THD);
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  c.bias_type = FUSEDATTN_BIAS_PRE_SCALE;
  c.bias_batch = 1;
  c.bias_heads = 6;
  c.bias_requires_grad = 1;
  c.dropout = 0.25;
  TensorOptions thd;
  thd.thd_gaps = true;
  thd.lse_packed = true;
  CheckAgainstReference(c, thd);
  c = SmallSeqConfig(2, 2, 1, 16, 512, FUSEDATTN_DTYPE_FLOAT32);
  c.return_max_logit = 1;
  CheckAgainstReference(c, {});
}
