// auto's order between cuDNN and flash from measured speed (src/select/measured_speed.h): the
// faster backend of the problem's class goes first, the nearest measured sequence length within
// an octave decides, and problems outside the measured classes keep the default order with the
// reason in the basis.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "problem/problem.h"
#include "select/measured_speed.h"

namespace fusedattn {
namespace {

fusedattn_config Plain(int64_t seqlen, int64_t head_dim = 128) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 2, c.heads_q = 16, c.heads_kv = 16;
  c.max_seqlen_q = c.max_seqlen_kv = seqlen;
  c.head_dim_qk = c.head_dim_v = head_dim;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  c.device = FUSEDATTN_DEVICE_CUDA;
  return c;
}

Problem Make(const fusedattn_config& c) {
  Problem p;
  Status s = MakeProblem(&c, true, &p);
  EXPECT_TRUE(s.ok()) << s.message();
  return p;
}

// bf16 d128, not causal, MHA, forward: cuDNN faster at 1024, flash faster at 16384.
const std::vector<MeasuredSpeed> kTable = {
    {90, FUSEDATTN_DTYPE_BFLOAT16, 128, false, false, false, 1024, 500, 400},
    {90, FUSEDATTN_DTYPE_BFLOAT16, 128, false, false, false, 16384, 600, 700},
    {90, FUSEDATTN_DTYPE_BFLOAT16, 128, false, false, true, 16384, 550, 500},
    {90, FUSEDATTN_DTYPE_BFLOAT16, 128, true, false, false, 16384, 500, 650},
};

SpeedOrder Order(const fusedattn_config& c, int sm = 90, bool training = false) {
  return OrderByMeasuredSpeed(Make(c), sm, training, kTable, "test table");
}

TEST(MeasuredSpeed, TheFasterBackendOfTheClassGoesFirst) {
  EXPECT_TRUE(Order(Plain(16384)).measured);
  EXPECT_TRUE(Order(Plain(16384)).flash_first);
  EXPECT_TRUE(Order(Plain(1024)).measured);
  EXPECT_FALSE(Order(Plain(1024)).flash_first);
}

TEST(MeasuredSpeed, TheBasisNamesBothFiguresAndTheSource) {
  const std::string basis = Order(Plain(16384)).basis;
  EXPECT_NE(basis.find("flash faster"), std::string::npos) << basis;
  EXPECT_NE(basis.find("cudnn 600, flash 700 TFLOP/s forward at sm_90 bfloat16 d128 s16384"),
            std::string::npos)
      << basis;
  EXPECT_NE(basis.find("test table"), std::string::npos) << basis;
}

TEST(MeasuredSpeed, TheNearestSequenceLengthWithinAnOctaveDecides) {
  EXPECT_TRUE(Order(Plain(12000)).flash_first);  // nearer 16384 than 1024
  EXPECT_FALSE(Order(Plain(1500)).flash_first);  // nearer 1024
  EXPECT_TRUE(Order(Plain(600)).measured);       // within an octave of 1024
  EXPECT_FALSE(Order(Plain(256)).measured);      // two octaves below: no class
  EXPECT_FALSE(Order(Plain(4096)).measured);     // two octaves from both points
  fusedattn_config decode = Plain(16384);
  decode.max_seqlen_q = 1;  // a query length far from every measured (square) point
  EXPECT_FALSE(Order(decode).measured);
}

TEST(MeasuredSpeed, TrainingUsesTheForwardPlusBackwardFigures) {
  EXPECT_TRUE(Order(Plain(16384), 90, /*training=*/false).flash_first);
  const SpeedOrder training = Order(Plain(16384), 90, /*training=*/true);
  EXPECT_TRUE(training.measured);
  EXPECT_FALSE(training.flash_first);
  EXPECT_NE(training.basis.find("forward+backward"), std::string::npos) << training.basis;
}

TEST(MeasuredSpeed, CausalIsItsOwnClass) {
  fusedattn_config c = Plain(16384);
  c.mask = FUSEDATTN_MASK_CAUSAL;
  EXPECT_TRUE(Order(c).flash_first);
  EXPECT_FALSE(Order(c, 90, true).measured);  // no causal forward+backward entry
}

TEST(MeasuredSpeed, AnotherArchitectureHeadDimDtypeOrGqaIsNotMeasured) {
  EXPECT_FALSE(Order(Plain(16384), 80).measured);
  EXPECT_FALSE(Order(Plain(16384, 64)).measured);
  fusedattn_config fp16 = Plain(16384);
  fp16.qkv_dtype = fp16.o_dtype = FUSEDATTN_DTYPE_FLOAT16;
  EXPECT_FALSE(Order(fp16).measured);
  fusedattn_config gqa = Plain(16384);
  gqa.heads_kv = 4;
  const SpeedOrder order = Order(gqa);
  EXPECT_FALSE(order.measured);
  EXPECT_FALSE(order.flash_first);
  EXPECT_NE(order.basis.find("default order"), std::string::npos) << order.basis;
  EXPECT_NE(order.basis.find("GQA"), std::string::npos) << order.basis;
}

TEST(MeasuredSpeed, VariantsTheTableDoesNotMeasureKeepTheDefaultOrderAndSayWhy) {
  struct Case {
    const char* reason;
    void (*apply)(fusedattn_config&);
  };
  const Case cases[] = {
      {"softcap", [](fusedattn_config& c) { c.softcap = 30; }},
      {"dropout", [](fusedattn_config& c) { c.dropout = 0.1; }},
      {"a bias or ALiBi", [](fusedattn_config& c) { c.bias_type = FUSEDATTN_BIAS_ALIBI; }},
      {"an extra softmax logit",
       [](fusedattn_config& c) { c.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE; }},
      {"a window", [](fusedattn_config& c) { c.window_left = 128; }},
      {"per-sequence lengths", [](fusedattn_config& c) { c.mask = FUSEDATTN_MASK_PADDING; }},
      {"deterministic mode",
       [](fusedattn_config& c) { c.deterministic = 1, c.is_training = 1; }},
  };
  for (const Case& k : cases) {
    fusedattn_config c = Plain(16384);
    k.apply(c);
    const SpeedOrder order = Order(c);
    EXPECT_FALSE(order.measured) << k.reason;
    EXPECT_FALSE(order.flash_first) << k.reason;
    EXPECT_NE(order.basis.find(std::string("no measured speed for problems with ") + k.reason),
              std::string::npos)
        << order.basis;
  }
}

// Paged decode (one query row) on sm_90 was measured: cuDNN's paged forward first, saying so.
TEST(MeasuredSpeed, PagedDecodePutsCudnnFirstOnSm90) {
  fusedattn_config c = Plain(1024);
  c.max_seqlen_q = 1;
  c.page_size = 16;
  const SpeedOrder order = Order(c);
  EXPECT_TRUE(order.measured);
  EXPECT_FALSE(order.flash_first);
  EXPECT_NE(order.basis.find("paged decode"), std::string::npos) << order.basis;
}

// Chunked prefill against a paged cache, and paged decode on another GPU, were not measured:
// flash (whose paged kernels came first) goes before cuDNN's paged SDPA forward, saying so.
TEST(MeasuredSpeed, OtherPagedProblemsPutFlashFirstUntilMeasured) {
  fusedattn_config c = Plain(1024);
  c.max_seqlen_q = 8;
  c.page_size = 16;
  SpeedOrder order = Order(c);
  EXPECT_FALSE(order.measured);
  EXPECT_TRUE(order.flash_first);
  EXPECT_NE(order.basis.find("paged K/V"), std::string::npos) << order.basis;
  c.max_seqlen_q = 1;
  order = Order(c, /*sm=*/80);
  EXPECT_FALSE(order.measured);
  EXPECT_TRUE(order.flash_first);
}

TEST(MeasuredSpeed, TheCompiledInTableIsWellFormed) {
  EXPECT_NE(std::string(MeasuredSpeedSource()), "");
  for (const MeasuredSpeed& e : MeasuredSpeedTable()) {
    EXPECT_GE(e.sm, 80);
    EXPECT_TRUE(e.dtype == FUSEDATTN_DTYPE_BFLOAT16 || e.dtype == FUSEDATTN_DTYPE_FLOAT16);
    EXPECT_GT(e.seqlen, 0);
    EXPECT_GT(e.cudnn_tflops, 0);
    EXPECT_GT(e.flash_tflops, 0);
  }
}

}  // namespace
}  // namespace fusedattn
