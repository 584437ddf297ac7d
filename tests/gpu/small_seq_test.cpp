// The small_seq backend (max_seqlen_q = 1, max_seqlen_kv <= 16) against the CPU reference.
//
// Each case builds every tensor of a problem with random inputs and poisoned outputs, runs the
// forward and the backward forced onto small_seq on the GPU and forced onto the reference on host
// copies, and compares every output (||out - ref|| / ||ref|| within the dtype's tolerance, no NaN,
// nothing left unwritten, nothing written that the reference leaves alone). Both backwards take
// the reference forward's O and LSE, so they differentiate the same point.
//
// compute-sanitizer subsets (scripts/gpu_run.sh picks them by name):
//   memcheck:  --gtest_filter='SmallSeqSanitize.*'  (small problems through every load/store
//              path, every workspace path, out-of-range cu_seqlens and offsets)
//   racecheck: --gtest_filter='SmallSeqRacecheck.*' (the block-wide sums in shared memory)
#include <gtest/gtest.h>

#ifdef FUSEDATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fusedattn/fusedattn.hpp"
#include "gpu/device_memory.h"
#include "testing/tensors.h"

using namespace fusedattn::testing;

namespace {

#define SKIP_WITHOUT_DEVICE() \
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device: small_seq runs on the GPU only"

const char* DtypeText(fusedattn_dtype dtype) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT32: return "float32";
    case FUSEDATTN_DTYPE_FLOAT16: return "float16";
    case FUSEDATTN_DTYPE_BFLOAT16: return "bfloat16";
    default: return "?";
  }
}

const char* FormatText(fusedattn_format format) {
  switch (format) {
    case FUSEDATTN_FORMAT_BSHD: return "BSHD";
    case FUSEDATTN_FORMAT_SBHD: return "SBHD";
    case FUSEDATTN_FORMAT_BHSD: return "BHSD";
    case FUSEDATTN_FORMAT_THD: return "THD";
  }
  return "?";
}

// A problem with one query token per sequence; the caller changes what the case is about.
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

std::string Describe(const fusedattn_config& c, const TensorOptions& o) {
  char text[512];
  std::snprintf(text, sizeof text,
                "b=%lld hq=%lld hkv=%lld skv=%lld d=%lld qkv:%s o_dtype:%s q:%s kv:%s o:%s do:%s dqkv:%s "
                "mask=%d window=(%lld,%lld) bias=%d(%lldx%lld%s) softmax=%d softcap=%g "
                "dropout=%g max_logit=%d padded_strides=%d thd_gaps=%d lse_packed=%d",
                (long long)c.batch, (long long)c.heads_q, (long long)c.heads_kv,
                (long long)c.max_seqlen_kv, (long long)c.head_dim_qk, DtypeText(c.qkv_dtype),
                DtypeText(c.o_dtype), FormatText(c.q_format), FormatText(c.kv_format),
                FormatText(c.o_format), FormatText(c.do_format), FormatText(c.dqkv_format),
                (int)c.mask, (long long)c.window_left, (long long)c.window_right,
                (int)c.bias_type, (long long)c.bias_batch, (long long)c.bias_heads,
                c.bias_requires_grad ? ",grad" : "", (int)c.softmax_type, c.softcap, c.dropout,
                c.return_max_logit, o.padded_strides, o.thd_gaps, o.lse_packed);
  return text;
}

void ExpectMatches(const char* what, const HostTensor& out, const HostTensor& ref,
                   double tolerance, const std::string& context) {
  if (ref.empty()) return;
  Comparison cmp = Compare(out, ref);
  EXPECT_TRUE(cmp.ok(tolerance)) << what << " differs from the reference (tolerance "
                                 << tolerance << "): " << cmp.describe() << "\n  case: "
                                 << context;
}

// Runs forward and backward of `config` on small_seq and on the reference and compares them.
void CheckAgainstReference(fusedattn_config config, const TensorOptions& options) {
  config.device = FUSEDATTN_DEVICE_CUDA;
  config.backend = FUSEDATTN_BACKEND_SMALL_SEQ;
  fusedattn_config ref_config = config;
  ref_config.device = FUSEDATTN_DEVICE_CPU;
  ref_config.backend = FUSEDATTN_BACKEND_REFERENCE;
  const std::string context = Describe(config, options);
  SCOPED_TRACE(context);

  ProblemTensors host = MakeProblemTensors(config, options);
  std::string error;

  // Forward.
  ProblemTensors ref = host;
  fusedattn::Forward(ref_config, ref.fwd_args());
  {
    DeviceProblem dev;
    ASSERT_TRUE(dev.upload(host, &error)) << error;
    DeviceBuffer workspace(fusedattn::FwdWorkspaceSize(config));
    fusedattn::Forward(config, dev.fwd_args(), workspace.ptr, workspace.bytes);
    ProblemTensors out = host;
    ASSERT_TRUE(dev.download_outputs(&out, &error)) << "forward: " << error;
    const double tol = Tolerance(config.qkv_dtype);
    ExpectMatches("forward O", out.o, ref.o, std::max(tol, Tolerance(config.o_dtype)), context);
    ExpectMatches("forward LSE", out.lse, ref.lse, tol, context);
    ExpectMatches("forward max_logit", out.max_logit, ref.max_logit, tol, context);
  }

  // Backward at the reference forward's O and LSE.
  ProblemTensors bwd = host;
  bwd.o = ref.o;
  bwd.lse = ref.lse;
  ProblemTensors bwd_ref = bwd;
  fusedattn::Backward(ref_config, bwd_ref.bwd_args());
  {
    DeviceProblem dev;
    ASSERT_TRUE(dev.upload(bwd, &error)) << error;
    DeviceBuffer workspace(fusedattn::BwdWorkspaceSize(config));
    ASSERT_TRUE(workspace.bytes == 0 || workspace.ptr != nullptr) << "cudaMalloc failed";
    fusedattn::Backward(config, dev.bwd_args(), workspace.ptr, workspace.bytes);
    ProblemTensors out = bwd;
    ASSERT_TRUE(dev.download_outputs(&out, &error)) << "backward: " << error;
    const double tol = Tolerance(config.qkv_dtype);
    ExpectMatches("backward dQ", out.dq, bwd_ref.dq, tol, context);
    ExpectMatches("backward dK", out.dk, bwd_ref.dk, tol, context);
    ExpectMatches("backward dV", out.dv, bwd_ref.dv, tol, context);
    ExpectMatches("backward dbias", out.dbias, bwd_ref.dbias, tol, context);
    ExpectMatches("backward dsink", out.dsink, bwd_ref.dsink, tol, context);
  }
}

// Padding masks with these per-sequence lengths.
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

TEST(SmallSeqSanitize, EveryLoadStoreAndWorkspacePathMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  // Small problems, one per path: vectorized and element-wise rows, each format, THD with gaps and
  // packed LSE, empty sequences, GQA (workspace coefficients, a group not aligned to blocks),
  // dsink and broadcast dbias (partial sums), dropout, an output dtype other than the inputs'.
  fusedattn_config c = SmallSeqConfig(3, 4, 4, 5, 64, FUSEDATTN_DTYPE_BFLOAT16);
  CheckAgainstReference(c, {});
  TensorOptions padded;
  padded.padded_strides = true;
  CheckAgainstReference(c, padded);
  c = SmallSeqConfig(4, 4, 2, 7, 128, FUSEDATTN_DTYPE_FLOAT32);
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

TEST(SmallSeq, IsChosenAutomaticallyForOneQueryAgainstSixteenKeys) {
  SKIP_WITHOUT_DEVICE();
  fusedattn_config c = SmallSeqConfig(30720, 8, 8, 16, 128, FUSEDATTN_DTYPE_BFLOAT16);
  c.device = FUSEDATTN_DEVICE_CUDA;
  EXPECT_EQ(fusedattn::GetBackend(c).backend, FUSEDATTN_BACKEND_SMALL_SEQ);
}

TEST(SmallSeq, RefusesSeventeenKeysSoAnotherBackendRunsThem) {
  SKIP_WITHOUT_DEVICE();
  fusedattn_config c = SmallSeqConfig(4, 8, 8, 17, 128, FUSEDATTN_DTYPE_BFLOAT16);
  c.device = FUSEDATTN_DEVICE_CUDA;
  fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
  char msg[4096] = "";
  // Either another backend runs it, or none does; small_seq's reason is listed in both cases.
  fusedattn_get_backend(&c, &chosen, msg, sizeof msg);
  EXPECT_NE(chosen, FUSEDATTN_BACKEND_SMALL_SEQ) << msg;
  EXPECT_NE(std::string(msg).find("small_seq: max_seqlen_kv = 17 > 16"), std::string::npos) << msg;
}

TEST(SmallSeq, MatchesReferenceForEveryHeadDimAndDtype) {
  SKIP_WITHOUT_DEVICE();
  for (fusedattn_dtype dtype : kDtypes)
    for (int64_t d : kHeadDims) CheckAgainstReference(SmallSeqConfig(3, 4, 4, 16, d, dtype), {});
}

TEST(SmallSeq, MatchesReferenceForEveryKeyCountUpToSixteen) {
  SKIP_WITHOUT_DEVICE();
  for (int64_t skv = 1; skv <= 16; ++skv)
    for (int64_t d : {64, 512})
      CheckAgainstReference(SmallSeqConfig(2, 2, 2, skv, d, FUSEDATTN_DTYPE_FLOAT32), {});
}

TEST(SmallSeq, MatchesReferenceForEmptyAndShortSequences) {
  SKIP_WITHOUT_DEVICE();
  // Query lengths 0 and 1, key lengths 0 .. 16: empty rows give O = 0, LSE = -inf and zero
  // gradients; key rows past a sequence get dK = dV = 0.
  std::vector<int32_t> len_q = {1, 0, 1, 1, 1, 0, 1, 1, 1, 1};
  std::vector<int32_t> len_kv = {16, 5, 0, 1, 2, 0, 7, 15, 3, 16};
  for (fusedattn_dtype dtype : kDtypes)
    for (int64_t d : kHeadDims) {
      fusedattn_config c = SmallSeqConfig(10, 4, 2, 16, d, dtype);
      c.mask = FUSEDATTN_MASK_PADDING;
      CheckAgainstReference(c, WithLengths(len_q, len_kv));
    }
}

// One head per sequence and an odd batch: the rows a warp's teams share belong to different
// sequences of different lengths (one team finishes its chunks before the other), and the last
// warp has teams without a row.
TEST(SmallSeq, MatchesReferenceWhenTeamsOfAWarpHaveDifferentLengths) {
  SKIP_WITHOUT_DEVICE();
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

TEST(SmallSeq, MatchesReferenceInEveryFormat) {
  SKIP_WITHOUT_DEVICE();
  for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_BFLOAT16})
    for (int64_t d : {64, 128}) {
      for (fusedattn_format f :
           {FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_SBHD, FUSEDATTN_FORMAT_BHSD}) {
        fusedattn_config c = SmallSeqConfig(5, 4, 2, 9, d, dtype);
        SetAllFormats(&c, f);
        CheckAgainstReference(c, {});
        c.mask = FUSEDATTN_MASK_PADDING;
        CheckAgainstReference(c, {});
      }
      // Every tensor in its own format.
      fusedattn_config mixed = SmallSeqConfig(5, 4, 2, 9, d, dtype);
      mixed.q_format = FUSEDATTN_FORMAT_BHSD;
      mixed.kv_format = FUSEDATTN_FORMAT_SBHD;
      mixed.o_format = FUSEDATTN_FORMAT_BSHD;
      mixed.do_format = FUSEDATTN_FORMAT_SBHD;
      mixed.dqkv_format = FUSEDATTN_FORMAT_BHSD;
      mixed.mask = FUSEDATTN_MASK_PADDING;
      CheckAgainstReference(mixed, {});
      // THD: packed, with gaps between sequences (seq_offsets), LSE packed or [b, h, 1].
      for (bool gaps : {false, true})
        for (bool lse_packed : {false, true}) {
          fusedattn_config c = SmallSeqConfig(7, 4, 2, 12, d, dtype);
          SetAllFormats(&c, FUSEDATTN_FORMAT_THD);
          TensorOptions o;
          o.thd_gaps = gaps;
          o.lse_packed = lse_packed;
          CheckAgainstReference(c, o);
        }
    }
}

TEST(SmallSeq, MatchesReferenceWithStridedLayouts) {
  SKIP_WITHOUT_DEVICE();
  // Rows padded by 3 elements: no 16-byte vector access is aligned, the element-wise path runs.
  TensorOptions padded;
  padded.padded_strides = true;
  for (fusedattn_dtype dtype : kDtypes)
    for (int64_t d : {64, 256}) {
      fusedattn_config c = SmallSeqConfig(4, 4, 2, 11, d, dtype);
      CheckAgainstReference(c, padded);
      SetAllFormats(&c, FUSEDATTN_FORMAT_THD);
      CheckAgainstReference(c, padded);
    }
}

TEST(SmallSeq, MatchesReferenceWithOutputDtypeOtherThanInputs) {
  SKIP_WITHOUT_DEVICE();
  for (auto [qkv, o] : {std::pair{FUSEDATTN_DTYPE_BFLOAT16, FUSEDATTN_DTYPE_FLOAT32},
                        std::pair{FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_FLOAT16}})
    for (int64_t d : {64, 128}) {
      fusedattn_config c = SmallSeqConfig(3, 4, 4, 8, d, qkv);
      c.o_dtype = o;
      CheckAgainstReference(c, {});
    }
}

TEST(SmallSeq, MatchesReferenceForGqaAndMqaGroups) {
  SKIP_WITHOUT_DEVICE();
  for (int64_t heads_kv : {8, 4, 2, 1})
    for (int64_t d : {64, 256}) {
      fusedattn_config c = SmallSeqConfig(5, 8, heads_kv, 13, d, FUSEDATTN_DTYPE_BFLOAT16);
      c.mask = FUSEDATTN_MASK_PADDING;
      CheckAgainstReference(c, {});
    }
  // A group of 3 (heads_q = 6, heads_kv = 2) does not line up with a block's four warps.
  CheckAgainstReference(SmallSeqConfig(5, 6, 2, 7, 128, FUSEDATTN_DTYPE_FLOAT32), {});
}

TEST(SmallSeq, MatchesReferenceForMasksAndWindows) {
  SKIP_WITHOUT_DEVICE();
  struct Mask {
    fusedattn_mask mask;
    int64_t left, right;
  };
  // Top-left causal at sq = 1 sees key 0 only; bottom-right sees every key; windows cut either.
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
      fusedattn_config c = SmallSeqConfig(6, 4, 2, 14, d, FUSEDATTN_DTYPE_FLOAT32);
      c.mask = m.mask;
      c.window_left = m.left;
      c.window_right = m.right;
      CheckAgainstReference(c, {});
    }
}

TEST(SmallSeq, MatchesReferenceForScoreModifiersAndSoftmaxVariants) {
  SKIP_WITHOUT_DEVICE();
  for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_BFLOAT16})
    for (int64_t d : {64, 512}) {
      fusedattn_config base = SmallSeqConfig(5, 4, 2, 10, d, dtype);
      base.mask = FUSEDATTN_MASK_PADDING;
      base.return_max_logit = 1;
      fusedattn_config c = base;
      c.softcap = 0.7;  // small enough to bend the scores
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

TEST(SmallSeq, MatchesReferenceForBiasAndItsGradient) {
  SKIP_WITHOUT_DEVICE();
  for (fusedattn_bias type : {FUSEDATTN_BIAS_PRE_SCALE, FUSEDATTN_BIAS_POST_SCALE})
    for (auto [bias_batch, bias_heads] :
         {std::pair<int64_t, int64_t>{5, 4}, {1, 4}, {5, 1}, {1, 1}})
      for (fusedattn_dtype bias_dtype : {FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_BFLOAT16}) {
        fusedattn_config c = SmallSeqConfig(5, 4, 2, 9, 128, FUSEDATTN_DTYPE_BFLOAT16);
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

TEST(SmallSeqRacecheck, MatchesReferenceForGradientsSummedOverManySequences) {
  SKIP_WITHOUT_DEVICE();
  // More terms per dsink / dbias element than one thread takes (64) or a block has threads
  // (512): the block-wide fixed-order sums with every thread busy.
  fusedattn_config c = SmallSeqConfig(600, 4, 2, 6, 64, FUSEDATTN_DTYPE_FLOAT32);
  c.mask = FUSEDATTN_MASK_PADDING;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  c.bias_batch = 1;
  c.bias_heads = 1;
  c.bias_requires_grad = 1;
  CheckAgainstReference(c, {});
}

TEST(SmallSeq, MatchesReferenceWithDropoutMaskBitForBit) {
  SKIP_WITHOUT_DEVICE();
  // The forward and backward draw the reference's Philox mask; in float32 a single differing bit
  // moves O far beyond the tolerance.
  for (fusedattn_dtype dtype : {FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_DTYPE_BFLOAT16})
    for (int64_t d : {64, 256}) {
      fusedattn_config c = SmallSeqConfig(6, 4, 2, 16, d, dtype);
      c.mask = FUSEDATTN_MASK_PADDING;
      c.dropout = 0.3;
      CheckAgainstReference(c, {});
      c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
      CheckAgainstReference(c, {});
    }
}

TEST(SmallSeq, MatchesReferenceForABatchOf30720) {
  SKIP_WITHOUT_DEVICE();
  // The user's shape (batch 30720, 8 heads), with fewer keys and a smaller head dim so that the
  // reference finishes quickly; random lengths cover every key count. The sink's gradient sums
  // over all 30720 sequences (the block-wide partial sums).
  fusedattn_config c = SmallSeqConfig(30720, 8, 8, 4, 64, FUSEDATTN_DTYPE_BFLOAT16);
  c.mask = FUSEDATTN_MASK_PADDING;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  CheckAgainstReference(c, {});
}

TEST(SmallSeq, BackwardIsDeterministic) {
  SKIP_WITHOUT_DEVICE();
  // GQA (workspace coefficients), dsink and a batch-broadcast dbias (fixed-order sums).
  fusedattn_config c = SmallSeqConfig(100, 8, 2, 16, 128, FUSEDATTN_DTYPE_FLOAT32);
  c.device = FUSEDATTN_DEVICE_CUDA;
  c.backend = FUSEDATTN_BACKEND_SMALL_SEQ;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  c.bias_batch = 1;
  c.bias_heads = 8;
  c.bias_requires_grad = 1;
  c.deterministic = 1;
  ProblemTensors host = MakeProblemTensors(c, {});
  std::string error;
  DeviceProblem dev;
  ASSERT_TRUE(dev.upload(host, &error)) << error;
  fusedattn::Forward(c, dev.fwd_args());
  DeviceBuffer workspace(fusedattn::BwdWorkspaceSize(c));
  ProblemTensors first = host, second = host;
  fusedattn::Backward(c, dev.bwd_args(), workspace.ptr, workspace.bytes);
  ASSERT_TRUE(dev.download_outputs(&first, &error)) << error;
  fusedattn::Backward(c, dev.bwd_args(), workspace.ptr, workspace.bytes);
  ASSERT_TRUE(dev.download_outputs(&second, &error)) << error;
  for (auto [name, a, b] : {std::tuple{"dQ", &first.dq, &second.dq},
                            std::tuple{"dK", &first.dk, &second.dk},
                            std::tuple{"dV", &first.dv, &second.dv},
                            std::tuple{"dbias", &first.dbias, &second.dbias},
                            std::tuple{"dsink", &first.dsink, &second.dsink}})
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->storage_bytes()), 0)
        << name << " differs between two runs";
}

TEST(SmallSeqSanitize, OutOfRangeSequenceLengthsAndOffsetsDoNotFault) {
  SKIP_WITHOUT_DEVICE();
  // cu_seqlens giving lengths above max_seqlen, negative lengths, and THD offsets past the
  // tensors' tokens: the kernels clamp (results for those sequences are undefined) and must
  // neither fault nor touch memory outside the tensors (run under compute-sanitizer to see).
  for (fusedattn_format format : {FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_THD}) {
    fusedattn_config c = SmallSeqConfig(4, 4, 2, 8, 128, FUSEDATTN_DTYPE_BFLOAT16);
    SetAllFormats(&c, format);
    c.mask = FUSEDATTN_MASK_PADDING;
    c.device = FUSEDATTN_DEVICE_CUDA;
    c.backend = FUSEDATTN_BACKEND_SMALL_SEQ;
    c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
    TensorOptions o;
    o.thd_gaps = format == FUSEDATTN_FORMAT_THD;
    ProblemTensors host = MakeProblemTensors(c, o);
    // Sequence 1: q length 5 and kv length 1000; sequence 2: negative lengths; sequence 3 runs
    // past the end.
    int32_t cu_q[] = {0, 1, 6, 3, 1 << 30};
    int32_t cu_kv[] = {0, 8, 1008, 2, 1 << 30};
    for (int i = 0; i < 5; ++i) {
      host.cu_seqlens_q.set(i, cu_q[i]);
      host.cu_seqlens_kv.set(i, cu_kv[i]);
    }
    if (!host.seq_offsets_q.empty()) {
      int32_t off[] = {0, 1 << 29, -50, 7, 9};
      for (int i = 0; i < 5; ++i) {
        host.seq_offsets_q.set(i, off[i]);
        host.seq_offsets_kv.set(i, off[i]);
      }
    }
    std::string error;
    DeviceProblem dev;
    ASSERT_TRUE(dev.upload(host, &error)) << error;
    fusedattn::Forward(c, dev.fwd_args());
    DeviceBuffer workspace(fusedattn::BwdWorkspaceSize(c));
    fusedattn::Backward(c, dev.bwd_args(), workspace.ptr, workspace.bytes);
    ProblemTensors out = host;
    ASSERT_TRUE(dev.download_outputs(&out, &error))
        << FormatText(format) << ": the kernels faulted: " << error;
  }
}
