// The small_seq backend's selection rule (small_seq::CheckProblem), decided from the config alone:
// max_seqlen_q = 1 and max_seqlen_kv <= 16 with head dims it is built for, anything else refused
// with a reason naming the field and value. No device is needed to ask.
#include <gtest/gtest.h>

#include <string>

#include "fusedattn/fusedattn.h"
#include "problem/problem.h"

#ifdef FUSEDATTN_WITH_SMALL_SEQ
#include "backends/small_seq/small_seq.h"
#endif

namespace {

fusedattn_config SmallSeqConfig(int64_t seqlen_q, int64_t seqlen_kv, int64_t head_dim) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.is_training = 1;
  c.batch = 30720;
  c.heads_q = 8;
  c.heads_kv = 8;
  c.max_seqlen_q = seqlen_q;
  c.max_seqlen_kv = seqlen_kv;
  c.head_dim_qk = c.head_dim_v = head_dim;
  c.device = FUSEDATTN_DEVICE_CUDA;
  return c;
}

#ifdef FUSEDATTN_WITH_SMALL_SEQ
// The problem as the library normalizes it, taking a CUDA device to be present.
fusedattn::Status Check(fusedattn_config c) {
  fusedattn::Problem problem;
  fusedattn::Status made = fusedattn::MakeProblem(&c, /*has_cuda_device=*/true, &problem);
  if (!made.ok()) return made;
  return fusedattn::small_seq::CheckProblem(problem);
}
#define SKIP_WITHOUT_SMALL_SEQ()
#else
fusedattn::Status Check(fusedattn_config) { return {}; }
#define SKIP_WITHOUT_SMALL_SEQ() GTEST_SKIP() << "small_seq is not built (no CUDA toolkit)"
#endif

void ExpectRefused(const fusedattn_config& c, const std::string& reason) {
  fusedattn::Status s = Check(c);
  EXPECT_EQ(s.code(), FUSEDATTN_ERROR_NOT_SUPPORTED) << s.message();
  EXPECT_NE(s.message().find(reason), std::string::npos)
      << "expected the reason to contain '" << reason << "', got '" << s.message() << "'";
}

}  // namespace

TEST(SmallSeqCheck, AcceptsOneQueryAgainstSixteenKeys) {
  SKIP_WITHOUT_SMALL_SEQ();
  fusedattn::Status s = Check(SmallSeqConfig(1, 16, 128));
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(SmallSeqCheck, AcceptsEveryBuiltHeadDimAndOneKey) {
  SKIP_WITHOUT_SMALL_SEQ();
  for (int64_t d : {64, 128, 256, 512})
    for (int64_t skv : {1, 2, 16}) {
      fusedattn::Status s = Check(SmallSeqConfig(1, skv, d));
      EXPECT_TRUE(s.ok()) << "d=" << d << " skv=" << skv << ": " << s.message();
    }
}

TEST(SmallSeqCheck, AcceptsEveryFeature) {
  SKIP_WITHOUT_SMALL_SEQ();
  fusedattn_config c = SmallSeqConfig(1, 16, 256);
  c.heads_kv = 2;
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  c.window_left = 4;
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;
  c.bias_batch = 1;
  c.bias_heads = 8;
  c.bias_requires_grad = 1;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  c.softcap = 30;
  c.dropout = 0.1;
  c.deterministic = 1;
  c.return_max_logit = 1;
  c.qkv_dtype = FUSEDATTN_DTYPE_FLOAT16;
  c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  fusedattn::Status s = Check(c);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(SmallSeqCheck, RefusesSeventeenKeys) {
  SKIP_WITHOUT_SMALL_SEQ();
  ExpectRefused(SmallSeqConfig(1, 17, 128), "max_seqlen_kv = 17 > 16");
}

TEST(SmallSeqCheck, RefusesMoreThanOneQuery) {
  SKIP_WITHOUT_SMALL_SEQ();
  ExpectRefused(SmallSeqConfig(2, 16, 128), "max_seqlen_q = 2 != 1");
}

TEST(SmallSeqCheck, RefusesHeadDimsItIsNotBuiltFor) {
  SKIP_WITHOUT_SMALL_SEQ();
  ExpectRefused(SmallSeqConfig(1, 16, 96), "head_dim = 96");
  fusedattn_config c = SmallSeqConfig(1, 16, 128);
  c.head_dim_v = 64;
  ExpectRefused(c, "head_dim_qk = 128 != head_dim_v = 64");
}

TEST(SmallSeqCheck, RefusesHostTensors) {
  SKIP_WITHOUT_SMALL_SEQ();
  fusedattn_config c = SmallSeqConfig(1, 16, 128);
  c.device = FUSEDATTN_DEVICE_CPU;
  ExpectRefused(c, "CUDA tensors only");
}

// Dropout at the call's own positions runs here; placed in a larger problem's mask (config
// dropout_*, context parallelism) it is refused, naming the positions and the reference.
TEST(SmallSeqCheck, RefusesDropoutPositionsNamingThemAndTheReference) {
  SKIP_WITHOUT_SMALL_SEQ();
  fusedattn_config c = SmallSeqConfig(1, 16, 128);
  c.dropout = 0.1;
  fusedattn::Status s = Check(c);
  EXPECT_TRUE(s.ok()) << s.message();
  c.dropout_key_offset = 16, c.dropout_row_offset = 3, c.dropout_rows = 4;
  ExpectRefused(c, "dropout positions (context parallelism");
  ExpectRefused(c, "the reference runs them");
}

TEST(SmallSeqCheck, BackwardWorkspaceHoldsOnlyWhatCrossesWarps) {
  SKIP_WITHOUT_SMALL_SEQ();
#ifdef FUSEDATTN_WITH_SMALL_SEQ
  auto workspace = [](fusedattn_config c) {
    fusedattn::Problem problem;
    EXPECT_TRUE(fusedattn::MakeProblem(&c, true, &problem).ok());
    return fusedattn::small_seq::BackwardWorkspace(problem).total;
  };
  fusedattn_config c = SmallSeqConfig(1, 16, 128);
  EXPECT_EQ(workspace(c), 0u) << "without GQA, sinks or broadcast dbias the backward needs none";
  c.heads_kv = 2;  // two floats per (b, h, key)
  EXPECT_EQ(workspace(c), size_t{30720} * 8 * 16 * 2 * sizeof(float));
  c.heads_kv = 8;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;  // one float per (b, h)
  EXPECT_EQ(workspace(c), size_t{30720} * 8 * sizeof(float));
#endif
}
