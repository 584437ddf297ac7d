// Every validation error path of src/problem/problem.cpp (and the reference's checks of
// cu_seqlens / seq_offsets contents): each case starts from a valid problem, breaks one field, and
// asserts the status code, that the message names the field and the bad value, and that nothing
// was written (every output keeps the poison MakeProblemTensors put there).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/cuda_util.h"
#include "test_util.h"
#include "testing/tensors.h"

namespace fusedattn {
namespace {

using testing::HostTensor;
using testing::MakeProblemTensors;
using testing::ProblemTensors;
using testing::TensorOptions;

// ---------------------------------------------------------------------------------------------
// Valid starting points.
// ---------------------------------------------------------------------------------------------
enum class Base {
  kFull,   // BSHD bf16, GQA, padding_causal, post-scale bias with dbias, learnable sink,
           // LSE and max_logit
  kAlibi,  // BSHD float16, causal, ALiBi, off-by-one: no cu_seqlens, no bias tensor
  kThd,    // THD with seq_offsets gaps, padding, vanilla
};

struct Problem {
  fusedattn_config config;
  ProblemTensors tensors;
};

Problem MakeValid(Base base) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.batch = 2, c.heads_q = 4, c.heads_kv = 2, c.max_seqlen_q = 5, c.max_seqlen_kv = 7;
  c.head_dim_qk = 8, c.head_dim_v = 8;
  c.is_training = 1;
  TensorOptions o;
  o.len_q = {5, 3}, o.len_kv = {7, 4};
  switch (base) {
    case Base::kFull:
      c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
      c.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
      c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
      c.bias_batch = 2, c.bias_heads = 4, c.bias_requires_grad = 1;
      c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
      c.return_max_logit = 1;
      break;
    case Base::kAlibi:
      c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT16;
      c.mask = FUSEDATTN_MASK_CAUSAL;
      c.bias_type = FUSEDATTN_BIAS_ALIBI;
      c.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE;
      break;
    case Base::kThd:
      c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
      c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
      c.mask = FUSEDATTN_MASK_PADDING;
      o.thd_gaps = true;
      break;
  }
  return {c, MakeProblemTensors(c, o)};
}

std::vector<std::string> Missing(const std::string& message,
                                 const std::vector<std::string>& mentions) {
  std::vector<std::string> missing;
  for (const auto& m : mentions)
    if (message.find(m) == std::string::npos) missing.push_back(m);
  return missing;
}

std::string Join(const std::vector<std::string>& parts) {
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "'" : ", '") + p + "'";
  return s;
}

// The outputs of the call are untouched.
void ExpectFwdOutputsUntouched(const ProblemTensors& t) {
  EXPECT_TRUE(test::AllPoison(t.o)) << "O was written";
  EXPECT_TRUE(test::AllPoison(t.lse)) << "LSE was written";
  EXPECT_TRUE(test::AllPoison(t.max_logit)) << "max_logit was written";
}
void ExpectBwdOutputsUntouched(const ProblemTensors& t) {
  EXPECT_TRUE(test::AllPoison(t.dq)) << "dQ was written";
  EXPECT_TRUE(test::AllPoison(t.dk)) << "dK was written";
  EXPECT_TRUE(test::AllPoison(t.dv)) << "dV was written";
  EXPECT_TRUE(test::AllPoison(t.dbias)) << "dBias was written";
  EXPECT_TRUE(test::AllPoison(t.dsink)) << "dSink was written";
}

// EXPECT_REJECTED(result, code, mentions): the status is `code` and the message contains every
// string of `mentions` (a std::vector<std::string> or a braced list).
#define EXPECT_REJECTED(result, code, ...)                                               \
  do {                                                                                   \
    const test::Result& r_ = (result);                                                   \
    EXPECT_EQ(r_.status, code) << test::StatusText(r_);                                  \
    const std::vector<std::string> mentions_ = __VA_ARGS__;                              \
    auto missing_ = Missing(r_.message, mentions_);                                      \
    EXPECT_TRUE(missing_.empty()) << "the message \"" << r_.message                      \
                                  << "\" does not mention " << Join(missing_);           \
  } while (0)

// ---------------------------------------------------------------------------------------------
// The starting points are valid: forward and backward succeed.
// ---------------------------------------------------------------------------------------------
class ValidBase : public ::testing::TestWithParam<Base> {};

TEST_P(ValidBase, RunsForwardAndBackward) {
  Problem p = MakeValid(GetParam());
  test::Result r = test::Forward(p.config, p.tensors.fwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  r = test::Backward(p.config, p.tensors.bwd_args());
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
}

INSTANTIATE_TEST_SUITE_P(Bases, ValidBase,
                         ::testing::Values(Base::kFull, Base::kAlibi, Base::kThd),
                         [](const auto& info) {
                           switch (info.param) {
                             case Base::kFull: return std::string("Full");
                             case Base::kAlibi: return std::string("Alibi");
                             case Base::kThd: return std::string("Thd");
                           }
                           return std::string("?");
                         });

// ---------------------------------------------------------------------------------------------
// Config fields. Every entry point validates the config first; each is checked.
// ---------------------------------------------------------------------------------------------
struct ConfigCase {
  std::string name;
  Base base;
  std::function<void(fusedattn_config&)> breaks;
  fusedattn_status code;
  std::vector<std::string> mentions;
};

std::vector<ConfigCase> ConfigCases() {
  const auto invalid = FUSEDATTN_ERROR_INVALID_ARGUMENT;
  const auto full = Base::kFull;
  return {
      {"StructSizeMismatch", full, [](auto& c) { c.struct_size += 8; }, invalid,
       {"config.struct_size", std::to_string(sizeof(fusedattn_config) + 8),
        std::to_string(sizeof(fusedattn_config))}},
      {"IsTrainingNotBool", full, [](auto& c) { c.is_training = 2; }, invalid,
       {"config.is_training = 2"}},
      {"BatchZero", full, [](auto& c) { c.batch = 0; }, invalid, {"config.batch = 0"}},
      {"BatchAboveLimit", full, [](auto& c) { c.batch = int64_t{1} << 31; }, invalid,
       {"config.batch = 2147483648", "limit"}},
      {"HeadsQNegative", full, [](auto& c) { c.heads_q = -4; }, invalid,
       {"config.heads_q = -4"}},
      {"HeadsKvZero", full, [](auto& c) { c.heads_kv = 0; }, invalid, {"config.heads_kv = 0"}},
      {"HeadsKvDoesNotDivideHeadsQ", full, [](auto& c) { c.heads_kv = 3; }, invalid,
       {"config.heads_kv = 3", "heads_q = 4"}},
      {"MaxSeqlenQZero", full, [](auto& c) { c.max_seqlen_q = 0; }, invalid,
       {"config.max_seqlen_q = 0"}},
      {"MaxSeqlenKvNegative", full, [](auto& c) { c.max_seqlen_kv = -7; }, invalid,
       {"config.max_seqlen_kv = -7"}},
      {"HeadDimQkZero", full, [](auto& c) { c.head_dim_qk = 0; }, invalid,
       {"config.head_dim_qk = 0"}},
      {"HeadDimVZero", full, [](auto& c) { c.head_dim_v = 0; }, invalid,
       {"config.head_dim_v = 0"}},
      {"ProblemTooLargeToAddress", full,
       [](auto& c) {
         c.batch = int64_t{1} << 30, c.heads_q = c.heads_kv = int64_t{1} << 30;
         c.bias_batch = c.batch, c.bias_heads = c.heads_q;
       },
       invalid, {"too large", "batch=1073741824", "heads_q=1073741824"}},
      {"ODtypeFp8NeedsFp8Attention", full, [](auto& c) { c.o_dtype = FUSEDATTN_DTYPE_FP8_E5M2; },
       invalid, {"config.o_dtype = fp8_e5m2", "FP8 attention"}},
      {"QkvDtypeInt32", full, [](auto& c) { c.qkv_dtype = FUSEDATTN_DTYPE_INT32; }, invalid,
       {"config.qkv_dtype = int32"}},
      {"QkvDtypeUnknown", full, [](auto& c) { c.qkv_dtype = static_cast<fusedattn_dtype>(99); },
       invalid, {"config.qkv_dtype = 99"}},
      {"ODtypeUnknown", full, [](auto& c) { c.o_dtype = static_cast<fusedattn_dtype>(-1); },
       invalid, {"config.o_dtype = -1"}},
      {"QFormatUnknown", full, [](auto& c) { c.q_format = static_cast<fusedattn_format>(4); },
       invalid, {"config.q_format = 4"}},
      {"KvFormatUnknown", full, [](auto& c) { c.kv_format = static_cast<fusedattn_format>(-1); },
       invalid, {"config.kv_format = -1"}},
      {"OFormatUnknown", full, [](auto& c) { c.o_format = static_cast<fusedattn_format>(17); },
       invalid, {"config.o_format = 17"}},
      {"DoFormatUnknown", full, [](auto& c) { c.do_format = static_cast<fusedattn_format>(5); },
       invalid, {"config.do_format = 5"}},
      {"DqkvFormatUnknown", full,
       [](auto& c) { c.dqkv_format = static_cast<fusedattn_format>(9); }, invalid,
       {"config.dqkv_format = 9"}},
      {"ThdMixedWithOtherFormats", Base::kThd,
       [](auto& c) { c.o_format = FUSEDATTN_FORMAT_BSHD; }, invalid,
       {"config.o_format = BSHD", "THD"}},
      {"MaskUnknown", full, [](auto& c) { c.mask = static_cast<fusedattn_mask>(6); }, invalid,
       {"config.mask = 6"}},
      {"WindowLeftBelowMinusOne", full, [](auto& c) { c.window_left = -2; }, invalid,
       {"config.window_left = -2"}},
      {"WindowRightBelowMinusOne", full, [](auto& c) { c.window_right = -5; }, invalid,
       {"config.window_right = -5"}},
      {"CausalMaskWithPositiveWindowRight", full, [](auto& c) { c.window_right = 3; }, invalid,
       {"config.window_right = 3", "padding_causal"}},
      {"BiasRequiresGradWithoutBias", Base::kThd, [](auto& c) { c.bias_requires_grad = 1; },
       invalid, {"config.bias_requires_grad = 1", "none"}},
      {"BiasRequiresGradWithAlibi", Base::kAlibi, [](auto& c) { c.bias_requires_grad = 1; },
       invalid, {"config.bias_requires_grad = 1", "alibi"}},
      {"BiasRequiresGradNotBool", full, [](auto& c) { c.bias_requires_grad = 5; }, invalid,
       {"config.bias_requires_grad = 5"}},
      {"BiasBatchNeitherOneNorBatch", full, [](auto& c) { c.bias_batch = 3; }, invalid,
       {"config.bias_batch = 3", "batch = 2"}},
      {"BiasHeadsNeitherOneNorHeadsQ", full, [](auto& c) { c.bias_heads = 2; }, invalid,
       {"config.bias_heads = 2", "heads_q = 4"}},
      {"BiasTypeUnknown", full, [](auto& c) { c.bias_type = static_cast<fusedattn_bias>(4); },
       invalid, {"config.bias_type = 4"}},
      {"SoftmaxTypeUnknown", full,
       [](auto& c) { c.softmax_type = static_cast<fusedattn_softmax>(3); }, invalid,
       {"config.softmax_type = 3"}},
      {"AttnScaleNan", full, [](auto& c) { c.attn_scale = std::nan(""); }, invalid,
       {"config.attn_scale = nan"}},
      {"AttnScaleInfinite", full, [](auto& c) { c.attn_scale = -INFINITY; }, invalid,
       {"config.attn_scale = -inf"}},
      {"SoftcapNegative", full, [](auto& c) { c.softcap = -1.5; }, invalid,
       {"config.softcap = -1.5"}},
      {"SoftcapInfinite", full, [](auto& c) { c.softcap = INFINITY; }, invalid,
       {"config.softcap = inf"}},
      // The GPU kernels compute in float32: values that round to 0, a subnormal or inf there
      // are refused, so that every backend sees the problem the planner saw.
      {"AttnScaleBelowFloat", full, [](auto& c) { c.attn_scale = 1e-50; }, invalid,
       {"config.attn_scale = 1e-50", "float32's normal range"}},
      {"AttnScaleSubnormalFloat", full, [](auto& c) { c.attn_scale = -1e-40; }, invalid,
       {"config.attn_scale = -1e-40", "float32's normal range"}},
      {"AttnScaleAboveFloat", full, [](auto& c) { c.attn_scale = 1e39; }, invalid,
       {"config.attn_scale = 1e+39", "float32's normal range"}},
      {"SoftcapBelowFloat", full, [](auto& c) { c.softcap = 1e-50; }, invalid,
       {"config.softcap = 1e-50", "float32's normal range"}},
      {"SoftcapAboveFloat", full, [](auto& c) { c.softcap = 1e300; }, invalid,
       {"config.softcap = 1e+300", "float32's normal range"}},
      {"DropoutNegative", full, [](auto& c) { c.dropout = -0.1; }, invalid,
       {"config.dropout = -0.1"}},
      {"DropoutOne", full, [](auto& c) { c.dropout = 1.0; }, invalid, {"config.dropout = 1"}},
      {"DropoutNan", full, [](auto& c) { c.dropout = std::nan(""); }, invalid,
       {"config.dropout = nan"}},
      {"DropoutRowCounterOverflow", Base::kAlibi,
       [](auto& c) {
         c.dropout = 0.25, c.batch = 65536, c.heads_q = 65536, c.heads_kv = 1;
         c.max_seqlen_q = 2, c.max_seqlen_kv = 1, c.head_dim_qk = c.head_dim_v = 1;
       },
       invalid, {"config.dropout = 0.25", "65536 * 65536 * 2", "2^32"}},
      // The dropout positions (fusedattn.h, "Dropout mask") are checked whatever the dropout
      // (kFull has none): a bad one is a caller's error before it matters.
      {"DropoutBatchOffsetNegative", full, [](auto& c) { c.dropout_batch_offset = -1; }, invalid,
       {"config.dropout_batch_offset = -1"}},
      {"DropoutHeadsNegative", full, [](auto& c) { c.dropout_heads = -4; }, invalid,
       {"config.dropout_heads = -4"}},
      {"DropoutHeadOffsetNegative", full, [](auto& c) { c.dropout_head_offset = -2; }, invalid,
       {"config.dropout_head_offset = -2"}},
      {"DropoutRowsNegative", full, [](auto& c) { c.dropout_rows = -5; }, invalid,
       {"config.dropout_rows = -5"}},
      {"DropoutRowOffsetNegative", full, [](auto& c) { c.dropout_row_offset = -3; }, invalid,
       {"config.dropout_row_offset = -3"}},
      {"DropoutKeyOffsetNegative", full, [](auto& c) { c.dropout_key_offset = -4; }, invalid,
       {"config.dropout_key_offset = -4"}},
      {"DropoutKeyOffsetAboveLimit", full,
       [](auto& c) { c.dropout_key_offset = int64_t{1} << 31; }, invalid,
       {"config.dropout_key_offset = 2147483648"}},
      {"DropoutKeyOffsetNotMultipleOf4", full, [](auto& c) { c.dropout_key_offset = 6; },
       invalid, {"config.dropout_key_offset = 6", "multiple of 4"}},
      {"DropoutHeadsFewerThanTheCallsHeads", full, [](auto& c) { c.dropout_heads = 3; }, invalid,
       {"config.dropout_heads = 3", "heads_q + dropout_head_offset = 4 + 0"}},
      {"DropoutHeadOffsetPastTheDefaultHeads", full, [](auto& c) { c.dropout_head_offset = 1; },
       invalid, {"config.dropout_heads = 0", "heads_q + dropout_head_offset = 4 + 1"}},
      {"DropoutRowOffsetPastTheRows", full,
       [](auto& c) { c.dropout_rows = 8, c.dropout_row_offset = 4; }, invalid,
       {"config.dropout_rows = 8", "max_seqlen_q + dropout_row_offset = 5 + 4"}},
      {"DropoutPositionsRowCounterOverflow", Base::kAlibi,
       [](auto& c) {
         c.dropout = 0.25, c.dropout_batch_offset = 65535, c.dropout_heads = 65536;
         c.dropout_rows = 65536;
       },
       invalid, {"config.dropout = 0.25", "(2 + 65535) * 65536 * 65536", "2^32"}},
      {"DeterministicNotBool", full, [](auto& c) { c.deterministic = -1; }, invalid,
       {"config.deterministic = -1"}},
      {"ReturnLseNotBool", full, [](auto& c) { c.return_lse = 2; }, invalid,
       {"config.return_lse = 2"}},
      {"ReturnMaxLogitNotBool", full, [](auto& c) { c.return_max_logit = 3; }, invalid,
       {"config.return_max_logit = 3"}},
      {"BackendUnknown", full,
       [](auto& c) { c.backend = static_cast<fusedattn_backend>(FUSEDATTN_BACKEND_COUNT); },
       invalid, {"config.backend = 5"}},
      {"BackendNegative", full, [](auto& c) { c.backend = static_cast<fusedattn_backend>(-1); },
       invalid, {"config.backend = -1"}},
      {"DeviceUnknown", full, [](auto& c) { c.device = static_cast<fusedattn_device>(3); },
       invalid, {"config.device = 3"}},
  };
}

class ConfigRejected : public ::testing::TestWithParam<ConfigCase> {};

TEST_P(ConfigRejected, ByEveryEntryPointNamingTheFieldAndValue) {
  const ConfigCase& k = GetParam();
  Problem p = MakeValid(k.base);
  fusedattn_config c = p.config;
  k.breaks(c);

  EXPECT_REJECTED(test::Forward(c, p.tensors.fwd_args()), k.code, k.mentions);
  ExpectFwdOutputsUntouched(p.tensors);
  EXPECT_REJECTED(test::Backward(c, p.tensors.bwd_args()), k.code, k.mentions);
  ExpectBwdOutputsUntouched(p.tensors);

  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  EXPECT_REJECTED(test::GetBackend(c, &backend), k.code, k.mentions);
  char msg[1024];
  size_t bytes = 12345;
  fusedattn_status s = fusedattn_fwd_workspace_size(&c, &bytes, msg, sizeof msg);
  EXPECT_REJECTED((test::Result{s, msg}), k.code, k.mentions);
  s = fusedattn_bwd_workspace_size(&c, &bytes, msg, sizeof msg);
  EXPECT_REJECTED((test::Result{s, msg}), k.code, k.mentions);
  EXPECT_EQ(bytes, 12345u) << "the workspace size was written for an invalid config";
}

INSTANTIATE_TEST_SUITE_P(Fields, ConfigRejected, ::testing::ValuesIn(ConfigCases()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Forward arguments.
// ---------------------------------------------------------------------------------------------
struct FwdCase {
  std::string name;
  Base base;
  std::function<void(fusedattn_config&, fusedattn_fwd_args&)> breaks;
  std::vector<std::string> mentions;
  fusedattn_status code = FUSEDATTN_ERROR_INVALID_ARGUMENT;
};

// A pointer that is never dereferenced: validation must not read through pointers.
void* Somewhere() {
  static float storage[4096];
  return storage;
}

std::vector<FwdCase> FwdCases() {
  const auto full = Base::kFull;
  return {
      {"StructSizeMismatch", full, [](auto&, auto& a) { a.struct_size = 16; },
       {"args.struct_size = 16", std::to_string(sizeof(fusedattn_fwd_args))}},
      {"QMissing", full, [](auto&, auto& a) { a.q.data = nullptr; }, {"args.q.data is NULL"}},
      {"KMissing", full, [](auto&, auto& a) { a.k.data = nullptr; }, {"args.k.data is NULL"}},
      {"OMissing", full, [](auto&, auto& a) { a.o.data = nullptr; }, {"args.o.data is NULL"}},
      {"KWrongDtype", full, [](auto&, auto& a) { a.k.dtype = FUSEDATTN_DTYPE_FLOAT16; },
       {"args.k.dtype = float16", "bfloat16"}},
      {"OWrongDtype", full, [](auto&, auto& a) { a.o.dtype = FUSEDATTN_DTYPE_FLOAT32; },
       {"args.o.dtype = float32", "bfloat16"}},
      {"VWrongRank", full, [](auto&, auto& a) { a.v.ndim = 3; }, {"args.v.ndim = 3", "4"}},
      {"QWrongSeqlen", full, [](auto&, auto& a) { a.q.shape[1] = 6; },
       {"args.q.shape = [2, 6, 4, 8]", "[2, 5, 4, 8]"}},
      {"KWrongHeads", full, [](auto&, auto& a) { a.k.shape[2] = 4; },
       {"args.k.shape = [2, 7, 4, 8]", "[2, 7, 2, 8]"}},
      {"VWrongHeadDim", full, [](auto&, auto& a) { a.v.shape[3] = 16; },
       {"args.v.shape = [2, 7, 2, 16]", "[2, 7, 2, 8]"}},
      {"QNegativeStride", full, [](auto&, auto& a) { a.q.strides[0] = -1; },
       {"args.q.strides[0] = -1"}},
      {"OZeroStride", full, [](auto&, auto& a) { a.o.strides[1] = 0; },
       {"args.o.strides[1] = 0", "> 0"}},
      {"OOverlappingElements", full, [](auto&, auto& a) { a.o.strides[2] = 4; },
       {"args.o.strides", "overlap", "dimension 2"}},
      {"QBytesOverflow", full, [](auto&, auto& a) { a.q.strides[0] = INT64_MAX / 2; },
       {"args.q.strides overflow"}},
      {"KElementOffsetsOverflow", full, [](auto&, auto& a) { a.k.strides[1] = INT64_MAX / 4; },
       {"args.k.strides overflow"}},
      {"LseMissingInTraining", full, [](auto&, auto& a) { a.lse.data = nullptr; },
       {"args.lse.data is NULL", "is_training"}},
      {"LseGivenButNotAsked", Base::kAlibi,
       [](auto& c, auto&) { c.is_training = 0, c.return_lse = 0; },
       {"args.lse is given", "return_lse"}},
      {"LseWrongShape", full, [](auto&, auto& a) { a.lse.shape[2] = 4; },
       {"args.lse.shape = [2, 4, 4]", "[2, 4, 5]"}},
      {"LseWrongDtype", full, [](auto&, auto& a) { a.lse.dtype = FUSEDATTN_DTYPE_BFLOAT16; },
       {"args.lse.dtype = bfloat16", "float32"}},
      {"LseWrongRank", full, [](auto&, auto& a) { a.lse.ndim = 2; }, {"args.lse.ndim = 2"}},
      {"MaxLogitMissing", full, [](auto&, auto& a) { a.max_logit.data = nullptr; },
       {"args.max_logit.data is NULL", "return_max_logit"}},
      {"MaxLogitGivenButNotAsked", full,
       [](auto& c, auto&) { c.return_max_logit = 0; }, {"args.max_logit is given"}},
      {"MaxLogitWrongLength", full, [](auto&, auto& a) { a.max_logit.shape[0] = 2; },
       {"args.max_logit.shape = [2]", "[4]"}},
      {"BiasMissing", full, [](auto&, auto& a) { a.bias.data = nullptr; },
       {"args.bias.data is NULL", "post_scale"}},
      {"BiasGivenWithoutBiasType", Base::kThd, [](auto&, auto& a) { a.bias.data = Somewhere(); },
       {"args.bias is given", "none"}},
      {"BiasWrongDtype", full, [](auto&, auto& a) { a.bias.dtype = FUSEDATTN_DTYPE_FLOAT16; },
       {"args.bias.dtype = float16", "bfloat16", "float32"}},
      {"BiasShapeDisagreesWithBiasHeads", full, [](auto&, auto& a) { a.bias.shape[1] = 1; },
       {"args.bias.shape = [2, 1, 5, 7]", "[2, 4, 5, 7]"}},
      {"BiasWrongSeqlenKv", full, [](auto&, auto& a) { a.bias.shape[3] = 8; },
       {"args.bias.shape = [2, 4, 5, 8]"}},
      {"AlibiSlopesMissing", Base::kAlibi, [](auto&, auto& a) { a.alibi_slopes.data = nullptr; },
       {"args.alibi_slopes.data is NULL", "alibi"}},
      {"AlibiSlopesGivenWithoutAlibi", full,
       [](auto&, auto& a) { a.alibi_slopes = a.sink_logits; },
       {"args.alibi_slopes is given", "alibi"}},
      {"AlibiSlopesWrongLength", Base::kAlibi, [](auto&, auto& a) { a.alibi_slopes.shape[0] = 2; },
       {"args.alibi_slopes.shape = [2]", "[4]"}},
      {"SinkLogitsMissing", full, [](auto&, auto& a) { a.sink_logits.data = nullptr; },
       {"args.sink_logits.data is NULL", "learnable_sink"}},
      {"SinkLogitsGivenWithoutSink", Base::kAlibi,
       [](auto&, auto& a) { a.sink_logits = a.alibi_slopes; },
       {"args.sink_logits is given", "learnable_sink"}},
      {"SinkLogitsWrongDtype", full,
       [](auto&, auto& a) { a.sink_logits.dtype = FUSEDATTN_DTYPE_BFLOAT16; },
       {"args.sink_logits.dtype = bfloat16", "float32"}},
      {"CuSeqlensQMissingForPaddingMask", full,
       [](auto&, auto& a) { a.cu_seqlens_q.data = nullptr; },
       {"args.cu_seqlens_q is NULL", "padding"}},
      {"CuSeqlensKvMissingForThd", Base::kThd,
       [](auto&, auto& a) { a.cu_seqlens_kv.data = nullptr; },
       {"args.cu_seqlens_kv is NULL", "THD"}},
      {"CuSeqlensGivenWithoutPadding", Base::kAlibi,
       [](auto&, auto& a) { a.cu_seqlens_q = a.alibi_slopes, a.cu_seqlens_q.data = Somewhere(); },
       {"args.cu_seqlens_q is given", "causal"}},
      {"CuSeqlensWrongLength", full, [](auto&, auto& a) { a.cu_seqlens_q.shape[0] = 2; },
       {"args.cu_seqlens_q.shape = [2]", "[3]"}},
      {"CuSeqlensWrongDtype", full,
       [](auto&, auto& a) { a.cu_seqlens_kv.dtype = FUSEDATTN_DTYPE_FLOAT32; },
       {"args.cu_seqlens_kv.dtype = float32", "int32"}},
      {"CuSeqlensNotContiguous", full, [](auto&, auto& a) { a.cu_seqlens_kv.strides[0] = 2; },
       {"args.cu_seqlens_kv.strides[0] = 2"}},
      {"SeqOffsetsGivenWithoutThd", full, [](auto&, auto& a) { a.seq_offsets_q = a.cu_seqlens_q; },
       {"args.seq_offsets_q is given", "THD"}},
      {"SeqOffsetsWrongLength", Base::kThd, [](auto&, auto& a) { a.seq_offsets_kv.shape[0] = 4; },
       {"args.seq_offsets_kv.shape = [4]", "[3]"}},
      {"ThdQWrongRank", Base::kThd, [](auto&, auto& a) { a.q.ndim = 4; },
       {"args.q.ndim = 4", "THD"}},
      {"ThdQNoTokens", Base::kThd, [](auto&, auto& a) { a.q.shape[0] = 0; },
       {"args.q.shape[0] = 0", "tokens"}},
      {"ThdVTokensDifferFromK", Base::kThd, [](auto&, auto& a) { a.v.shape[0] -= 1; },
       {"args.v.shape[0]", "tokens"}},
      {"ThdOTokensDifferFromQ", Base::kThd, [](auto&, auto& a) { a.o.shape[0] += 1; },
       {"args.o.shape[0]", "tokens"}},
      {"ThdLseWrongRankMentionsBothForms", Base::kThd, [](auto&, auto& a) { a.lse.ndim = 1; },
       {"args.lse.ndim = 1", "[2, 4, 5]", "[11, 4] packed"}},
      {"ThdPackedLseWrongTokens", Base::kThd,
       [](auto&, auto& a) {
         a.lse.ndim = 2, a.lse.shape[0] = 3, a.lse.shape[1] = 4, a.lse.strides[0] = 4;
         a.lse.strides[1] = 1;
       },
       {"args.lse.shape = [3, 4]", "[11, 4]"}},
  };
}

class FwdArgsRejected : public ::testing::TestWithParam<FwdCase> {};

TEST_P(FwdArgsRejected, NamingTheFieldAndWritingNothing) {
  const FwdCase& k = GetParam();
  Problem p = MakeValid(k.base);
  fusedattn_config c = p.config;
  fusedattn_fwd_args args = p.tensors.fwd_args();
  k.breaks(c, args);
  EXPECT_REJECTED(test::Forward(c, args), k.code, k.mentions);
  ExpectFwdOutputsUntouched(p.tensors);
}

INSTANTIATE_TEST_SUITE_P(Fields, FwdArgsRejected, ::testing::ValuesIn(FwdCases()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Backward arguments (what the forward shares is checked by the same code; these are the
// backward's own).
// ---------------------------------------------------------------------------------------------
struct BwdCase {
  std::string name;
  Base base;
  std::function<void(fusedattn_config&, fusedattn_bwd_args&)> breaks;
  std::vector<std::string> mentions;
  fusedattn_status code = FUSEDATTN_ERROR_INVALID_ARGUMENT;
};

std::vector<BwdCase> BwdCases() {
  const auto full = Base::kFull;
  return {
      {"StructSizeMismatch", full, [](auto&, auto& a) { a.struct_size += 8; },
       {"args.struct_size", std::to_string(sizeof(fusedattn_bwd_args) + 8)}},
      {"OMissing", full, [](auto&, auto& a) { a.o.data = nullptr; }, {"args.o.data is NULL"}},
      {"LseMissing", full, [](auto&, auto& a) { a.lse.data = nullptr; },
       {"args.lse.data is NULL", "backward needs"}},
      {"DoMissing", full, [](auto&, auto& a) { a.d_o.data = nullptr; },
       {"args.d_o.data is NULL"}},
      {"DoWrongDtype", full, [](auto&, auto& a) { a.d_o.dtype = FUSEDATTN_DTYPE_FLOAT16; },
       {"args.d_o.dtype = float16"}},
      {"DqMissing", full, [](auto&, auto& a) { a.dq.data = nullptr; }, {"args.dq.data is NULL"}},
      {"DkWrongShape", full, [](auto&, auto& a) { a.dk.shape[1] = 5; },
       {"args.dk.shape = [2, 5, 2, 8]", "[2, 7, 2, 8]"}},
      {"DvOverlappingElements", full, [](auto&, auto& a) { a.dv.strides[1] = 8; },
       {"args.dv.strides", "overlap"}},
      {"DqZeroStride", full, [](auto&, auto& a) { a.dq.strides[3] = 0; },
       {"args.dq.strides[3] = 0"}},
      {"DbiasMissing", full, [](auto&, auto& a) { a.dbias.data = nullptr; },
       {"args.dbias.data is NULL", "bias_requires_grad"}},
      {"DbiasGivenButNotAsked", full, [](auto& c, auto&) { c.bias_requires_grad = 0; },
       {"args.dbias is given", "bias_requires_grad = 0"}},
      {"DbiasDtypeDiffersFromBias", full,
       [](auto&, auto& a) { a.dbias.dtype = FUSEDATTN_DTYPE_BFLOAT16; },
       {"args.dbias.dtype = bfloat16", "float32"}},
      {"DbiasOverlappingElements", full, [](auto&, auto& a) { a.dbias.strides[2] = 1; },
       {"args.dbias.strides", "overlap"}},
      {"DsinkMissing", full, [](auto&, auto& a) { a.dsink.data = nullptr; },
       {"args.dsink.data is NULL", "learnable_sink"}},
      {"DsinkGivenWithoutSink", Base::kAlibi, [](auto&, auto& a) { a.dsink = a.alibi_slopes; },
       {"args.dsink is given"}},
      {"DsinkWrongLength", full, [](auto&, auto& a) { a.dsink.shape[0] = 1; },
       {"args.dsink.shape = [1]", "[4]"}},
      {"ThdDkTokensDifferFromK", Base::kThd, [](auto&, auto& a) { a.dk.shape[0] += 2; },
       {"args.dk.shape[0]", "tokens"}},
      {"CuSeqlensQMissing", full, [](auto&, auto& a) { a.cu_seqlens_q.data = nullptr; },
       {"args.cu_seqlens_q is NULL"}},
  };
}

class BwdArgsRejected : public ::testing::TestWithParam<BwdCase> {};

TEST_P(BwdArgsRejected, NamingTheFieldAndWritingNothing) {
  const BwdCase& k = GetParam();
  Problem p = MakeValid(k.base);
  fusedattn_config c = p.config;
  fusedattn_bwd_args args = p.tensors.bwd_args();
  k.breaks(c, args);
  EXPECT_REJECTED(test::Backward(c, args), k.code, k.mentions);
  ExpectBwdOutputsUntouched(p.tensors);
}

INSTANTIATE_TEST_SUITE_P(Fields, BwdArgsRejected, ::testing::ValuesIn(BwdCases()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Contents of cu_seqlens / seq_offsets: only the reference reads them (on the host); it returns
// INVALID_ARGUMENT naming the array and the index, before writing anything.
// ---------------------------------------------------------------------------------------------
void SetIndexArray(HostTensor& t, const std::vector<int32_t>& values) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), values[i]);
}

void ExpectBothDirectionsRejected(Problem& p, const std::vector<std::string>& mentions) {
  EXPECT_REJECTED(test::Forward(p.config, p.tensors.fwd_args()),
                  FUSEDATTN_ERROR_INVALID_ARGUMENT, mentions);
  ExpectFwdOutputsUntouched(p.tensors);
  EXPECT_REJECTED(test::Backward(p.config, p.tensors.bwd_args()),
                  FUSEDATTN_ERROR_INVALID_ARGUMENT, mentions);
  ExpectBwdOutputsUntouched(p.tensors);
}

TEST(SequenceLengths, NegativeLengthIsRejectedNamingArrayAndIndex) {
  Problem p = MakeValid(Base::kFull);  // cu_seqlens_q = {0, 5, 8}
  SetIndexArray(p.tensors.cu_seqlens_q, {0, 5, 3});
  ExpectBothDirectionsRejected(p, {"cu_seqlens_q[1..2] = 5..3", "length -2"});
}

TEST(SequenceLengths, LengthAboveMaxSeqlenIsRejectedNamingArrayAndIndex) {
  Problem p = MakeValid(Base::kFull);  // cu_seqlens_kv = {0, 7, 11}, max_seqlen_kv = 7
  SetIndexArray(p.tensors.cu_seqlens_kv, {0, 9, 11});
  ExpectBothDirectionsRejected(p, {"cu_seqlens_kv[0..1] = 0..9", "length 9", "max_seqlen_kv = 7"});
}

TEST(SequenceLengths, ThdSequencePastTheTokensIsRejectedNamingArrayAndIndex) {
  Problem p = MakeValid(Base::kThd);  // seq_offsets_q = {0, 6, 11} over 11 tokens
  SetIndexArray(p.tensors.seq_offsets_q, {0, 9, 11});
  ExpectBothDirectionsRejected(p, {"seq_offsets_q[1] = 9", "length 3", "11 tokens"});
}

TEST(SequenceLengths, ThdNegativeOffsetIsRejectedNamingArrayAndIndex) {
  Problem p = MakeValid(Base::kThd);  // seq_offsets_kv = {0, 8, 14}
  SetIndexArray(p.tensors.seq_offsets_kv, {-3, 8, 14});
  ExpectBothDirectionsRejected(p, {"seq_offsets_kv[0] = -3"});
}

TEST(SequenceLengths, ThdWithoutOffsetsPastTheTokensIsRejectedNamingCuSeqlens) {
  Problem p = MakeValid(Base::kThd);
  // Drop the offsets: sequences start at cu_seqlens, which now point past q's 11 tokens.
  p.tensors.seq_offsets_q = HostTensor();
  p.tensors.seq_offsets_kv = HostTensor();
  SetIndexArray(p.tensors.cu_seqlens_q, {8, 13, 16});
  ExpectBothDirectionsRejected(p, {"cu_seqlens_q[0] = 8", "length 5", "11 tokens"});
}

// ---------------------------------------------------------------------------------------------
// The C API's own arguments.
// ---------------------------------------------------------------------------------------------
TEST(ApiArguments, NullConfigIsRejectedByEveryEntryPoint) {
  Problem p = MakeValid(Base::kFull);
  char msg[256];
  fusedattn_fwd_args fa = p.tensors.fwd_args();
  fusedattn_bwd_args ba = p.tensors.bwd_args();
  EXPECT_REJECTED((test::Result{fusedattn_fwd(nullptr, &fa, nullptr, 0, nullptr, msg, sizeof msg),
                                msg}),
                  FUSEDATTN_ERROR_INVALID_ARGUMENT, {"config is NULL"});
  EXPECT_REJECTED((test::Result{fusedattn_bwd(nullptr, &ba, nullptr, 0, nullptr, msg, sizeof msg),
                                msg}),
                  FUSEDATTN_ERROR_INVALID_ARGUMENT, {"config is NULL"});
  fusedattn_backend backend;
  EXPECT_REJECTED((test::Result{fusedattn_get_backend(nullptr, &backend, msg, sizeof msg), msg}),
                  FUSEDATTN_ERROR_INVALID_ARGUMENT, {"config is NULL"});
  size_t bytes;
  EXPECT_REJECTED((test::Result{fusedattn_fwd_workspace_size(nullptr, &bytes, msg, sizeof msg),
                                msg}),
                  FUSEDATTN_ERROR_INVALID_ARGUMENT, {"config is NULL"});
  EXPECT_REJECTED((test::Result{fusedattn_bwd_workspace_size(nullptr, &bytes, msg, sizeof msg),
                                msg}),
                  FUSEDATTN_ERROR_INVALID_ARGUMENT, {"config is NULL"});
  ExpectFwdOutputsUntouched(p.tensors);
  ExpectBwdOutputsUntouched(p.tensors);
}

TEST(ApiArguments, NullArgsAreRejected) {
  Problem p = MakeValid(Base::kFull);
  char msg[256];
  EXPECT_REJECTED(
      (test::Result{fusedattn_fwd(&p.config, nullptr, nullptr, 0, nullptr, msg, sizeof msg), msg}),
      FUSEDATTN_ERROR_INVALID_ARGUMENT, {"args is NULL"});
  EXPECT_REJECTED(
      (test::Result{fusedattn_bwd(&p.config, nullptr, nullptr, 0, nullptr, msg, sizeof msg), msg}),
      FUSEDATTN_ERROR_INVALID_ARGUMENT, {"args is NULL"});
}

TEST(ApiArguments, NullBackendOutputPointerIsRejected) {
  Problem p = MakeValid(Base::kFull);
  char msg[256];
  EXPECT_REJECTED((test::Result{fusedattn_get_backend(&p.config, nullptr, msg, sizeof msg), msg}),
                  FUSEDATTN_ERROR_INVALID_ARGUMENT, {"backend", "NULL"});
}

TEST(ApiArguments, NullWorkspaceSizeOutputPointerIsRejected) {
  Problem p = MakeValid(Base::kFull);
  char msg[256];
  EXPECT_REJECTED(
      (test::Result{fusedattn_fwd_workspace_size(&p.config, nullptr, msg, sizeof msg), msg}),
      FUSEDATTN_ERROR_INVALID_ARGUMENT, {"bytes", "NULL"});
  EXPECT_REJECTED(
      (test::Result{fusedattn_bwd_workspace_size(&p.config, nullptr, msg, sizeof msg), msg}),
      FUSEDATTN_ERROR_INVALID_ARGUMENT, {"bytes", "NULL"});
}

TEST(ApiArguments, MessageIsTruncatedToTheBufferAndTerminated) {
  Problem p = MakeValid(Base::kFull);
  p.config.batch = 0;
  char msg[9];
  std::memset(msg, 'x', sizeof msg);
  fusedattn_backend backend;
  EXPECT_EQ(fusedattn_get_backend(&p.config, &backend, msg, 8), FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(msg, "config.");
  EXPECT_EQ(msg[8], 'x') << "wrote past msg_len";
}

TEST(ApiArguments, NoMessageBufferIsAllowed) {
  Problem p = MakeValid(Base::kFull);
  p.config.batch = 0;
  fusedattn_backend backend;
  EXPECT_EQ(fusedattn_get_backend(&p.config, &backend, nullptr, 0),
            FUSEDATTN_ERROR_INVALID_ARGUMENT);
  char msg[4] = "abc";
  EXPECT_EQ(fusedattn_get_backend(&p.config, &backend, msg, 0), FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(msg, "abc") << "msg_len 0 must leave the buffer alone";
}

// The reference needs no workspace, so on the CPU a NULL workspace is always enough; the
// FUSEDATTN_ERROR_WORKSPACE path is reachable only through a backend that asks for one (GPU).
TEST(Workspace, ReferenceAsksForNoneAndRunsWithoutOne) {
  Problem p = MakeValid(Base::kFull);
  size_t fwd = 1, bwd = 1;
  char msg[256];
  ASSERT_EQ(fusedattn_fwd_workspace_size(&p.config, &fwd, msg, sizeof msg), FUSEDATTN_SUCCESS)
      << msg;
  ASSERT_EQ(fusedattn_bwd_workspace_size(&p.config, &bwd, msg, sizeof msg), FUSEDATTN_SUCCESS)
      << msg;
  EXPECT_EQ(fwd, 0u);
  EXPECT_EQ(bwd, 0u);
  fusedattn_fwd_args args = p.tensors.fwd_args();
  EXPECT_EQ(fusedattn_fwd(&p.config, &args, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_SUCCESS)
      << msg;
}

// Without a GPU, CUDA tensors cannot be used at all.
TEST(Device, CudaWithoutAGpuIsNotSupported) {
  if (HasCudaDevice()) GTEST_SKIP() << "a CUDA device is present";
  Problem p = MakeValid(Base::kFull);
  p.config.device = FUSEDATTN_DEVICE_CUDA;
  EXPECT_REJECTED(test::Forward(p.config, p.tensors.fwd_args()), FUSEDATTN_ERROR_NOT_SUPPORTED,
                  {"CUDA"});
  ExpectFwdOutputsUntouched(p.tensors);
}

}  // namespace
}  // namespace fusedattn
