// flash's decode kernel (src/backends/flash/decode_kernel.cuh) against the CPU reference, on a
// GPU: paged K/V (every problem with page_size > 0 that flash runs) and contiguous K/V with
// max_seqlen_q <= 16 (flash's forward takes the decode kernel for those too).
//
// Each case forces backend = flash on device tensors and runs the reference (device = CPU) on
// host copies of the same inputs; O, LSE and max_logit are compared with the tolerances of
// shared/DESIGN.md, outputs poisoned before the run. The paged pools come from
// MakeProblemTensors: shuffled page tables, spare pages, entries past a sequence's pages set to
// -1 or INT32_MAX; on top of that every pool element no sequence uses (spare pages, the tokens of a
// last page past its sequence's length) is NaN here, so that reading one shows in O. Lengths 0
// and 1, a last page partly filled and a long sequence (several splits and their combine) are in
// every case, and each case says how many splits it ran with (one split writes o itself).
//
// compute-sanitizer (a bad page index in a used entry is never followed):
//   compute-sanitizer --tool memcheck build/tests/fusedattn_gpu_tests \
//     --gtest_filter='FlashDecodeSanitize*'
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "fusedattn/fusedattn.hpp"
#include "gpu/device_memory.h"
#include "gpu/expect_close.h"
#include "gpu/paged_pools.h"
#include "gpu/skip.h"
#include "testing/tensors.h"

#ifdef FUSEDATTN_WITH_FLASH
#include "backends/flash/planner.h"
#endif

namespace fusedattn::testing {
namespace {

// The split count of the call's plan (planner.h) when it is the decode kernel, else 0: the
// backend runs the plan, so this is what ran.
int PlannedDecodeSplits(const fusedattn_config& config, const fusedattn_fwd_args& args) {
#ifdef FUSEDATTN_WITH_FLASH
  flash::ForwardPlan plan;
  Status s = flash::PlanForwardCall(config, args, &plan);
  EXPECT_TRUE(s.ok()) << s.message();
  return plan.path == flash::KernelPath::kDecode ? plan.decode_splits : 0;
#else
  return 0;
#endif
}

// A decode problem: b sequences of max_seqlen_q queries against up to max_seqlen_kv keys.
fusedattn_config DecodeConfig(int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t d,
                              int64_t page_size) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 5, c.heads_q = hq, c.heads_kv = hkv, c.max_seqlen_q = sq, c.max_seqlen_kv = skv;
  c.head_dim_qk = c.head_dim_v = d;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  c.page_size = page_size;
  c.return_lse = 1, c.return_max_logit = 1;
  c.device = FUSEDATTN_DEVICE_CUDA;
  c.backend = FUSEDATTN_BACKEND_FLASH;
  return c;
}

// Key lengths of the 5 sequences: the longest, empty, one key, a last page partly filled (and
// not a multiple of the 64-key tiles), and one tile.
TensorOptions DecodeOptions(int64_t skv, bool share_prefix, int32_t unused_entry) {
  TensorOptions o;
  o.seed = 2121;
  const int32_t longest = static_cast<int32_t>(skv);
  o.len_kv = {longest, 0, 1, std::min<int32_t>(longest, 333), std::min<int32_t>(longest, 64)};
  o.share_prefix = share_prefix;
  o.unused_page_entry = unused_entry;
  o.spare_pages = 3;
  return o;
}

// Runs the case on flash (device) and the reference (host); compares O, LSE, max_logit.
// `prepare` may change the host tensors before both runs (after the pools are poisoned).
// Returns the split count flash ran with (0: not the decode kernel).
int ExpectDecodeMatchesReference(const fusedattn_config& config, const TensorOptions& options,
                                 const std::function<void(ProblemTensors*)>& prepare = {}) {
  int splits = -1;
#ifdef FUSEDATTN_WITH_CUDA
  ProblemTensors dev_host = MakeProblemTensors(config, options);
  if (config.page_size > 0) PoisonUnusedPoolRows(&dev_host);
  if (prepare) prepare(&dev_host);
  ProblemTensors ref = dev_host;
  ref.config.backend = FUSEDATTN_BACKEND_REFERENCE;
  ref.config.device = FUSEDATTN_DEVICE_CPU;
  EXPECT_NO_THROW(Forward(ref.config, ref.fwd_args())) << "reference forward";

  DeviceProblem dev;
  std::string error;
  EXPECT_TRUE(dev.upload(dev_host, &error)) << error;
  size_t bytes = 0;
  EXPECT_NO_THROW(bytes = FwdWorkspaceSize(config));
  DeviceBuffer workspace(bytes);
  EXPECT_TRUE(bytes == 0 || workspace.ptr) << "cudaMalloc of " << bytes << " bytes";
  try {
    Forward(config, dev.fwd_args(), workspace.ptr, bytes);
  } catch (const Error& e) {
    ADD_FAILURE() << "flash forward failed: " << e.what();
    return -1;
  }
  splits = PlannedDecodeSplits(config, dev.fwd_args());
  EXPECT_TRUE(dev.download_outputs(&dev_host, &error)) << error;
  const double tol = Tolerance(config.qkv_dtype);
  ExpectClose("O", dev_host.o, ref.o, tol);
  ExpectClose("LSE", dev_host.lse, ref.lse, tol);
  ExpectClose("max_logit", dev_host.max_logit, ref.max_logit, tol);
#endif
  return splits;
}

// ---------------------------------------------------------------------------------------------
// Paged K/V: page sizes x GQA groups x head dims x query rows
// ---------------------------------------------------------------------------------------------

struct PagedShape {
  int64_t page_size, heads_q, heads_kv, head_dim, sq;
};

class FlashDecodePaged : public ::testing::TestWithParam<PagedShape> {};

// GQA 32/8 and 64/8 scaled down to groups of 4 and 8 over 2 kv heads; shared prefix pages and
// the two kinds of unused entries alternate.
TEST_P(FlashDecodePaged, MatchesReference) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  const PagedShape s = GetParam();
  fusedattn_config c = DecodeConfig(s.heads_q, s.heads_kv, s.sq, 1000, s.head_dim, s.page_size);
  const bool odd = (s.page_size / 16 + s.heads_q / 8 + s.head_dim / 64 + s.sq) % 2 != 0;
  const int splits = ExpectDecodeMatchesReference(
      c, DecodeOptions(1000, odd, odd ? std::numeric_limits<int32_t>::max() : -1));
  EXPECT_GT(splits, 1) << "1000 keys over 10 (sequence, kv head) pairs should be split";
}

std::vector<PagedShape> PagedShapes() {
  std::vector<PagedShape> shapes;
  for (int64_t page : {16, 64})
    for (int64_t hq : {8, 16})
      for (int64_t d : {64, 128})
        for (int64_t sq : {1, 4}) shapes.push_back({page, hq, 2, d, sq});
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashDecodePaged, ::testing::ValuesIn(PagedShapes()),
                         [](const auto& info) {
                           const PagedShape& s = info.param;
                           return "Page" + std::to_string(s.page_size) + "_Gqa" +
                                  std::to_string(s.heads_q) + "x" + std::to_string(s.heads_kv) +
                                  "_D" + std::to_string(s.head_dim) + "_Sq" +
                                  std::to_string(s.sq);
                         });

// ---------------------------------------------------------------------------------------------
// Variants (on paged 16, GQA 8/2, d128, sq 4 unless the variant says otherwise)
// ---------------------------------------------------------------------------------------------

struct VariantCase {
  std::string name;
  std::function<void(fusedattn_config&, TensorOptions&)> apply;
};

void SetQueryFormat(fusedattn_config& c, fusedattn_format f) {
  c.q_format = c.o_format = c.do_format = c.dqkv_format = f;
}

std::vector<VariantCase> Variants() {
  using C = fusedattn_config;
  using O = TensorOptions;
  return {
      {"Causal", [](C& c, O&) { c.mask = FUSEDATTN_MASK_CAUSAL; }},
      {"CausalBottomRight", [](C& c, O&) { c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT; }},
      {"WindowBottomRight",
       [](C& c, O&) {
         c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
         c.window_left = 150;
       }},
      {"WindowBothSides", [](C& c, O&) { c.window_left = 70, c.window_right = 2; }},
      {"Softcap", [](C& c, O&) { c.softcap = 2.5, c.attn_scale = 1.5; }},
      {"Alibi",
       [](C& c, O&) {
         c.bias_type = FUSEDATTN_BIAS_ALIBI;
         c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
       }},
      {"PostScaleBiasBroadcast", [](C& c, O&) { c.bias_type = FUSEDATTN_BIAS_POST_SCALE; }},
      {"PreScaleBias",
       [](C& c, O&) {
         c.bias_type = FUSEDATTN_BIAS_PRE_SCALE, c.bias_batch = c.batch, c.bias_heads = c.heads_q;
       }},
      {"OffByOne", [](C& c, O&) { c.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE; }},
      {"LearnableSink", [](C& c, O&) { c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK; }},
      {"OffByOneSingleSplit",  // the extra logit in the decode kernel itself, not the combine
       [](C& c, O& o) {
         c.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE;
         c.max_seqlen_kv = 60;
         o.len_kv = {60, 0, 1, 37, 16};
       }},
      {"SinkSingleSplit",
       [](C& c, O& o) {
         c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
         c.max_seqlen_kv = 60;
         o.len_kv = {60, 0, 1, 37, 16};
       }},
      {"Float16", [](C& c, O&) { c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT16; }},
      {"BhsdPool", [](C& c, O&) { c.kv_format = FUSEDATTN_FORMAT_BHSD; }},
      {"SbhdPoolSbhdQueries",
       [](C& c, O&) {
         c.kv_format = FUSEDATTN_FORMAT_SBHD;
         SetQueryFormat(c, FUSEDATTN_FORMAT_SBHD);
       }},
      {"BhsdQueries", [](C& c, O&) { SetQueryFormat(c, FUSEDATTN_FORMAT_BHSD); }},
      {"PaddedQueriesCausalBottomRight",
       [](C& c, O& o) {
         c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
         o.len_q = {4, 0, 1, 3, 2};
       }},
      {"ThdQueriesPackedLse",
       [](C& c, O& o) {
         SetQueryFormat(c, FUSEDATTN_FORMAT_THD);
         c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
         o.len_q = {4, 0, 1, 3, 2};
         o.thd_gaps = true, o.lse_packed = true;
       }},
      {"Sq16Group8",  // 128 query rows per kv head: four blocks of 32 rows read the same keys
       [](C& c, O&) {
         c.heads_q = 16;
         c.max_seqlen_q = 16;
         c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
       }},
      {"MultiQuery", [](C& c, O&) { c.heads_kv = 1; }},
      {"NoGrouping", [](C& c, O&) { c.heads_kv = c.heads_q; }},
      {"PageSize1", [](C& c, O&) { c.page_size = 1; }},
      {"PageSize48", [](C& c, O&) { c.page_size = 48; }},
      {"PageLongerThanSequences", [](C& c, O&) { c.page_size = 2048; }},
  };
}

class FlashDecodeVariant : public ::testing::TestWithParam<VariantCase> {};

TEST_P(FlashDecodeVariant, MatchesReference) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = DecodeConfig(8, 2, 4, 1000, 128, 16);
  TensorOptions o = DecodeOptions(1000, true, -1);
  GetParam().apply(c, o);
  const int splits = ExpectDecodeMatchesReference(c, o);
  EXPECT_GE(splits, 1) << "flash did not take the decode kernel";
  if (c.max_seqlen_kv <= 64) EXPECT_EQ(splits, 1) << "one 64-key tile: one split";
}

INSTANTIATE_TEST_SUITE_P(Variants, FlashDecodeVariant, ::testing::ValuesIn(Variants()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Contiguous K/V through the same kernel
// ---------------------------------------------------------------------------------------------

TEST(FlashDecodeContiguous, DenseSq1Gqa) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = DecodeConfig(8, 2, 1, 1000, 128, 0);
  EXPECT_GT(ExpectDecodeMatchesReference(c, TensorOptions{}), 1);
}

TEST(FlashDecodeContiguous, PaddedKeysSq4CausalBottomRightD64) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = DecodeConfig(16, 2, 4, 1000, 64, 0);
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  TensorOptions o = DecodeOptions(1000, false, -1);
  o.len_q = {4, 1, 1, 4, 2};
  EXPECT_GE(ExpectDecodeMatchesReference(c, o), 1);
}

TEST(FlashDecodeContiguous, ThdSoftcapSink) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = DecodeConfig(8, 2, 2, 700, 128, 0);
  c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
  c.softcap = 3.0;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  TensorOptions o = DecodeOptions(700, false, -1);
  o.len_q = {2, 1, 0, 2, 1};
  o.thd_gaps = true, o.lse_packed = true;
  EXPECT_GE(ExpectDecodeMatchesReference(c, o), 1);
}

TEST(FlashDecodeContiguous, TrainingForwardFloat16) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = DecodeConfig(4, 4, 3, 300, 64, 0);
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT16;
  c.is_training = 1;
  c.mask = FUSEDATTN_MASK_CAUSAL;
  EXPECT_GE(ExpectDecodeMatchesReference(c, TensorOptions{}), 1);
}

// ---------------------------------------------------------------------------------------------
// Many splits (issue 21's small batches against long caches)
// ---------------------------------------------------------------------------------------------

// GQA 32/8 with one long sequence (20000 keys) and a short one (100): 16 (sequence, kv head)
// pairs, so the planner splits the keys many ways (on a 132-SM H100: 16 splits of 1280 keys at
// d128, 23 of 896 at d64, three d64 blocks per SM); every split of the short sequence past its
// 100 keys sees none (LSE_s = -inf: weight 0 in the combine). Paged (page 16, unused pool rows
// NaN) and contiguous (padding mask).
struct ManySplitsCase {
  int64_t head_dim, page_size, sq;
};

class FlashDecodeManySplits : public ::testing::TestWithParam<ManySplitsCase> {};

TEST_P(FlashDecodeManySplits, LongAndShortSequenceMatchReference) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  const ManySplitsCase x = GetParam();
  fusedattn_config c = DecodeConfig(32, 8, x.sq, 20000, x.head_dim, x.page_size);
  c.batch = 2;
  if (x.page_size == 0)
    c.mask = x.sq > 1 ? FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT : FUSEDATTN_MASK_PADDING;
  else if (x.sq > 1)
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  TensorOptions o;
  o.seed = 2122;
  o.len_kv = {20000, 100};
  o.spare_pages = 3;
  if (x.sq > 1) o.len_q = {static_cast<int32_t>(x.sq), static_cast<int32_t>(x.sq)};
  const int splits = ExpectDecodeMatchesReference(c, o);
  EXPECT_GT(splits, 8) << "16 (sequence, kv head) pairs should be split many ways";
}

INSTANTIATE_TEST_SUITE_P(Cases, FlashDecodeManySplits,
                         ::testing::Values(ManySplitsCase{128, 16, 1}, ManySplitsCase{128, 0, 1},
                                           ManySplitsCase{64, 16, 1}, ManySplitsCase{64, 0, 1},
                                           ManySplitsCase{128, 64, 4}, ManySplitsCase{64, 0, 4}),
                         [](const auto& info) {
                           const ManySplitsCase& x = info.param;
                           return "D" + std::to_string(x.head_dim) +
                                  (x.page_size ? "_Page" + std::to_string(x.page_size)
                                               : std::string("_Contiguous")) +
                                  "_Sq" + std::to_string(x.sq);
                         });

// Problems the decode kernel does not take still run on flash's other kernels (contiguous), on
// the Hopper forward's paged instances (paged; flash_paged_prefill_test.cpp), or are refused
// with the reasons of both (paged; page size 48 is one the Hopper forward does not take).
TEST(FlashDecodeSelection, PagedRefusalsNameTheReason) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = DecodeConfig(8, 2, 1, 1000, 96, 48);
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  char msg[4096];
  ASSERT_EQ(fusedattn_get_backend(&c, &backend, msg, sizeof msg), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(std::string(msg).find("head_dim_qk = head_dim_v in {64, 128}"), std::string::npos)
      << msg;
  c = DecodeConfig(8, 2, 1, 1000, 128, 16);
  c.dropout = 0.1;
  ASSERT_EQ(fusedattn_get_backend(&c, &backend, msg, sizeof msg), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(std::string(msg).find("no dropout"), std::string::npos) << msg;
  c = DecodeConfig(8, 2, 17, 1000, 128, 48);
  ASSERT_EQ(fusedattn_get_backend(&c, &backend, msg, sizeof msg), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(std::string(msg).find("max_seqlen_q <= 16"), std::string::npos) << msg;
}

// Auto selection: small_seq refuses paged K/V; where cuDNN does not run (not built here), flash's
// decode kernel runs paged decode (cudnn_paged_test.cpp: cuDNN first where it runs, on sm_90).
TEST(FlashDecodeSelection, AutoPicksFlashForPagedDecodeWithoutCudnn) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  char reason[512];
  if (fusedattn_backend_available(FUSEDATTN_BACKEND_CUDNN, reason, sizeof reason))
    GTEST_SKIP() << "cuDNN runs here: CudnnPagedSelection covers auto's choice";
  fusedattn_config c = DecodeConfig(8, 2, 1, 1000, 128, 16);
  c.backend = FUSEDATTN_BACKEND_AUTO;
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  char msg[4096];
  ASSERT_EQ(fusedattn_get_backend(&c, &backend, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  EXPECT_EQ(backend, FUSEDATTN_BACKEND_FLASH) << msg;
}

// ---------------------------------------------------------------------------------------------
// Bad page indices in used entries (compute-sanitizer memcheck: no report)
// ---------------------------------------------------------------------------------------------

// Sequence 0 uses entries num_pages (one past the pool) and -1: the kernel must not follow them
// (its results are undefined); every other sequence's results are exact. Under memcheck, any
// read outside the pools is reported.
TEST(FlashDecodeSanitize, BadUsedPageEntriesAreNeverFollowed) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
#ifdef FUSEDATTN_WITH_CUDA
  for (int64_t page_size : {16, 64}) {
    SCOPED_TRACE("page_size " + std::to_string(page_size));
    fusedattn_config c = DecodeConfig(8, 2, 1, 300, 128, page_size);
    TensorOptions o = DecodeOptions(300, false, std::numeric_limits<int32_t>::max());
    ProblemTensors dev_host = MakeProblemTensors(c, o);
    PoisonUnusedPoolRows(&dev_host);
    ProblemTensors ref = dev_host;  // the reference runs the valid table
    ref.config.backend = FUSEDATTN_BACKEND_REFERENCE;
    ref.config.device = FUSEDATTN_DEVICE_CPU;
    ASSERT_NO_THROW(Forward(ref.config, ref.fwd_args()));
    dev_host.page_table.set(1, static_cast<double>(dev_host.num_pages));
    dev_host.page_table.set(2, -1.0);  // sequence 0 uses entries 0..4 (page 64) or 0..18

    DeviceProblem dev;
    std::string error;
    ASSERT_TRUE(dev.upload(dev_host, &error)) << error;
    const size_t bytes = FwdWorkspaceSize(c);
    DeviceBuffer workspace(bytes);
    ASSERT_NO_THROW(Forward(c, dev.fwd_args(), workspace.ptr, bytes));
    ASSERT_TRUE(dev.download_outputs(&dev_host, &error)) << error;
    // Sequence 0's O rows ([b, sq, h, d]) and LSE ([b, h, sq]) are left out of the comparison;
    // max_logit mixes every sequence, so it is not compared.
    for (ProblemTensors* t : {&dev_host, &ref}) {
      for (int64_t h = 0; h < c.heads_q; ++h) {
        for (int64_t x = 0; x < c.head_dim_v; ++x) t->o.set(t->o.offset_of({0, 0, h, x}), 0.0);
        t->lse.set(t->lse.offset_of({0, h, 0}), 0.0);
      }
    }
    const double tol = Tolerance(c.qkv_dtype);
    ExpectClose("O", dev_host.o, ref.o, tol);
    ExpectClose("LSE", dev_host.lse, ref.lse, tol);
  }
#endif
}

// A small paged and a small contiguous case under memcheck and racecheck.
TEST(FlashDecodeSanitize, PagedAndContiguousSplits) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = DecodeConfig(8, 2, 4, 300, 64, 16);
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  EXPECT_GT(ExpectDecodeMatchesReference(c, DecodeOptions(300, true, -1)), 1);
  c.page_size = 0;
  EXPECT_GE(ExpectDecodeMatchesReference(c, TensorOptions{}), 1);
}

// Many splits under memcheck and racecheck: 5 sequences (4000, 0, 1, 333 and 64 keys) x 2 kv
// heads over 63 key tiles, split 32 ways at d64 paged and 21 at d128 contiguous on an H100, so
// most splits of the short sequences see no key: the combine's batched reads of the partials
// and the programmatic launches (sm_90).
TEST(FlashDecodeSanitize, ManySplits) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = DecodeConfig(8, 2, 4, 4000, 64, 16);
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  EXPECT_GT(ExpectDecodeMatchesReference(c, DecodeOptions(4000, true, -1)), 8);
  c = DecodeConfig(8, 2, 1, 4000, 128, 0);
  EXPECT_GT(ExpectDecodeMatchesReference(c, TensorOptions{}), 8);
}

}  // namespace
}  // namespace fusedattn::testing
