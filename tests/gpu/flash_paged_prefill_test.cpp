// Chunked prefill against a paged K/V cache on flash's Hopper forward (fwd_kernel_sm90.cuh, its
// paged instances: the producer loads each key tile from the pages the table names), against the
// CPU reference, on an sm_90 GPU.
//
// THD queries of several sequences (1, 100, 700 and 600 or 2000 new tokens) against caches
// longer than the queries, a sequence with no keys and one with neither; shuffled page tables
// with spare pages, shared prefix pages (every sequence shares the full pages of its common
// prefix with sequence 0) and -1 / INT32_MAX past a sequence's pages; every pool element no
// sequence uses is NaN (gpu/paged_pools.h), so that a key read past a sequence's end, or a V row
// past it that is not zeroed, shows in O. Page sizes 16, 64 (boxes per key tile), 256 (a box per
// tile inside one page), d64 and d128, no mask and causal bottom-right, GQA 4/2. Each case
// checks that the plan is the paged Hopper forward (else it skips: another GPU).
//
// compute-sanitizer (a bad page index in a used entry is never followed; no race in the
// producer's boxes and the V patch):
//   compute-sanitizer --tool memcheck build/tests/fusedattn_gpu_tests \
//     --gtest_filter='FlashPagedPrefillSanitize*'
//   compute-sanitizer --tool racecheck build/tests/fusedattn_gpu_tests \
//     --gtest_filter='FlashPagedPrefillSanitize*'
#include <gtest/gtest.h>

#include <algorithm>
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

// Sequences: q tokens {long, 1, 100, 700, 3, 0} against keys {long + 100, 1, 333, 1000, 0, 50}
// (long: 600, or 2000 in one variant; the reference's time on the CPU bounds the sizes):
// every cache at least as long as its queries except sequence 4 (three queries, no key: fully
// masked rows), last pages partly filled at every page size (the key lengths are not multiples
// of 16 but for 1 and 0).
struct Lengths {
  std::vector<int32_t> q, kv;
};
Lengths PrefillLengths(int32_t longest_q) {
  return {{longest_q, 1, 100, 700, 3, 0}, {longest_q + 100, 1, 333, 1000, 0, 50}};
}

fusedattn_config PrefillConfig(int64_t head_dim, int64_t page_size, int32_t longest_q) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 6, c.heads_q = 4, c.heads_kv = 2;
  c.max_seqlen_q = std::max<int64_t>(longest_q, 700);
  c.max_seqlen_kv = std::max<int64_t>(longest_q + 100, 1000);
  c.head_dim_qk = c.head_dim_v = head_dim;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  c.q_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
  c.kv_format = FUSEDATTN_FORMAT_BSHD;  // the pools: [num_pages, page_size, heads_kv, d]
  c.page_size = page_size;
  c.return_lse = 1, c.return_max_logit = 1;
  c.device = FUSEDATTN_DEVICE_CUDA;
  c.backend = FUSEDATTN_BACKEND_FLASH;
  return c;
}

TensorOptions PrefillOptions(const Lengths& lengths, bool share_prefix, int32_t unused_entry) {
  TensorOptions o;
  o.seed = 2107;
  o.len_q = lengths.q;
  o.len_kv = lengths.kv;
  o.share_prefix = share_prefix;
  o.unused_page_entry = unused_entry;
  o.spare_pages = 3;
  o.thd_gaps = true;
  o.lse_packed = true;
  return o;
}

// Whether flash plans the paged Hopper forward for the call (planner.h: the plan is what runs).
bool PlansPagedHopperForward(const fusedattn_config& config, const fusedattn_fwd_args& args,
                             std::string* why) {
#ifdef FUSEDATTN_WITH_FLASH
  flash::ForwardPlan plan;
  Status s = flash::PlanForwardCall(config, args, &plan);
  if (!s.ok()) {
    *why = s.message();
    return false;
  }
  *why = flash::DescribeForwardPlan(plan);
  return plan.path == flash::KernelPath::kHopperWgmma && plan.paged;
#else
  *why = "built without flash";
  return false;
#endif
}

// Runs the case on flash (device) and the reference (host); compares O, LSE and max_logit.
// `prepare` changes the device's copy of the inputs only (after the pools are poisoned), and
// `exclude` blanks outputs of both before the comparison. Skips where flash does not plan the
// paged Hopper forward (not an sm_90 GPU, or a build without sm_90a).
void ExpectPrefillMatchesReference(const fusedattn_config& config, const TensorOptions& options,
                                   const std::function<void(ProblemTensors*)>& prepare = {},
                                   const std::function<void(ProblemTensors*)>& exclude = {}) {
#ifdef FUSEDATTN_WITH_CUDA
  ProblemTensors dev_host = MakeProblemTensors(config, options);
  PoisonUnusedPoolRows(&dev_host);
  ProblemTensors ref = dev_host;
  ref.config.backend = FUSEDATTN_BACKEND_REFERENCE;
  ref.config.device = FUSEDATTN_DEVICE_CPU;
  ASSERT_NO_THROW(Forward(ref.config, ref.fwd_args())) << "reference forward";
  if (prepare) prepare(&dev_host);

  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(dev_host, &error)) << error;
  std::string plan;
  if (!PlansPagedHopperForward(config, dev.fwd_args(), &plan))
    GTEST_SKIP() << "flash does not plan the paged Hopper forward here: " << plan;
  size_t bytes = 0;
  ASSERT_NO_THROW(bytes = FwdWorkspaceSize(config));
  DeviceBuffer workspace(bytes);
  ASSERT_TRUE(bytes == 0 || workspace.ptr) << "cudaMalloc of " << bytes << " bytes";
  try {
    Forward(config, dev.fwd_args(), workspace.ptr, bytes);
  } catch (const Error& e) {
    FAIL() << "flash forward failed: " << e.what() << " (" << plan << ")";
  }
  ASSERT_TRUE(dev.download_outputs(&dev_host, &error)) << error;
  if (exclude) {
    exclude(&dev_host);
    exclude(&ref);
  }
  SCOPED_TRACE(plan);
  const double tol = Tolerance(config.qkv_dtype);
  ExpectClose("O", dev_host.o, ref.o, tol);
  ExpectClose("LSE", dev_host.lse, ref.lse, tol);
  if (config.return_max_logit) ExpectClose("max_logit", dev_host.max_logit, ref.max_logit, tol);
#endif
}

// ---------------------------------------------------------------------------------------------
// Page sizes x head dims x masks
// ---------------------------------------------------------------------------------------------

struct PrefillShape {
  int64_t page_size, head_dim;
  bool causal;
};

class FlashPagedPrefill : public ::testing::TestWithParam<PrefillShape> {};

TEST_P(FlashPagedPrefill, MatchesReference) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  const PrefillShape s = GetParam();
  fusedattn_config c = PrefillConfig(s.head_dim, s.page_size, 600);
  if (s.causal) c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  const bool odd = (s.page_size / 16 + s.head_dim / 64 + (s.causal ? 1 : 0)) % 2 != 0;
  ExpectPrefillMatchesReference(
      c, PrefillOptions(PrefillLengths(600), odd,
                        odd ? std::numeric_limits<int32_t>::max() : -1));
}

std::vector<PrefillShape> PrefillShapes() {
  std::vector<PrefillShape> shapes;
  for (int64_t page : {16, 64, 256})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true}) shapes.push_back({page, d, causal});
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashPagedPrefill, ::testing::ValuesIn(PrefillShapes()),
                         [](const auto& info) {
                           const PrefillShape& s = info.param;
                           return "Page" + std::to_string(s.page_size) + "_D" +
                                  std::to_string(s.head_dim) +
                                  (s.causal ? "_CausalBottomRight" : "_NoMask");
                         });

// ---------------------------------------------------------------------------------------------
// Variants (page 16, d128, causal bottom-right, 600 queries unless the variant says otherwise)
// ---------------------------------------------------------------------------------------------

struct VariantCase {
  std::string name;
  std::function<void(fusedattn_config&, TensorOptions&)> apply;
};

std::vector<VariantCase> Variants() {
  using C = fusedattn_config;
  using O = TensorOptions;
  return {
      {"Longest2000Queries",
       [](C& c, O& o) {
         c.max_seqlen_q = 2000, c.max_seqlen_kv = 2100;
         const Lengths l = PrefillLengths(2000);
         o.len_q = l.q, o.len_kv = l.kv;
       }},
      {"Gqa8x2", [](C& c, O&) { c.heads_q = 8; }},
      {"MultiQuery", [](C& c, O&) { c.heads_kv = 1; }},
      {"Float16", [](C& c, O&) { c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT16; }},
      {"Page32", [](C& c, O&) { c.page_size = 32; }},
      {"Page128D64",  // two key tiles of 64 per page
       [](C& c, O&) { c.page_size = 128, c.head_dim_qk = c.head_dim_v = 64; }},
      {"PageLongerThanSequences", [](C& c, O&) { c.page_size = 2048; }},
      {"D64LongKeysTile",  // from 4096 keys d64 runs 128 keys per step (Sm90ForwardKeysPerStep)
       [](C& c, O& o) {
         c.head_dim_qk = c.head_dim_v = 64;
         c.max_seqlen_kv = 4200;
         o.len_kv[0] = 4200;
       }},
      {"HeadDim96", [](C& c, O&) { c.head_dim_qk = c.head_dim_v = 96; }},
      {"BhsdPool", [](C& c, O&) { c.kv_format = FUSEDATTN_FORMAT_BHSD; }},
      {"SbhdPool", [](C& c, O&) { c.kv_format = FUSEDATTN_FORMAT_SBHD; }},
      {"CausalTopLeft", [](C& c, O&) { c.mask = FUSEDATTN_MASK_CAUSAL; }},
      {"WindowBottomRight", [](C& c, O&) { c.window_left = 150; }},
      {"Softcap", [](C& c, O&) { c.softcap = 2.5, c.attn_scale = 1.5; }},
      {"AlibiD64",
       [](C& c, O&) {
         c.bias_type = FUSEDATTN_BIAS_ALIBI;
         c.head_dim_qk = c.head_dim_v = 64;
       }},
      {"LearnableSink", [](C& c, O&) { c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK; }},
      {"BatchHeadsSeqLse",  // the plain grid instead of the heavy-first schedule
       [](C&, O& o) { o.lse_packed = false; }},
      {"DenseBshdQueries",  // max_seqlen_q queries of every sequence, no THD
       [](C& c, O& o) {
         c.q_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_BSHD;
         c.max_seqlen_q = 300;
         o.len_q.clear();
         o.thd_gaps = false, o.lse_packed = false;
       }},
  };
}

class FlashPagedPrefillVariant : public ::testing::TestWithParam<VariantCase> {};

TEST_P(FlashPagedPrefillVariant, MatchesReference) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  fusedattn_config c = PrefillConfig(128, 16, 600);
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  TensorOptions o = PrefillOptions(PrefillLengths(600), true, -1);
  GetParam().apply(c, o);
  ExpectPrefillMatchesReference(c, o);
}

INSTANTIATE_TEST_SUITE_P(Variants, FlashPagedPrefillVariant, ::testing::ValuesIn(Variants()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// compute-sanitizer: memcheck (bad used entries never followed) and racecheck
// ---------------------------------------------------------------------------------------------

// Sequence 0 (130 queries, 300 keys) uses entries num_pages (one past the pool) and -1: the
// producer must not follow them (its results are undefined, left out of the comparison); every
// other sequence's results are exact. Under memcheck any read outside the pools is reported.
TEST(FlashPagedPrefillSanitize, BadUsedPageEntriesAreNeverFollowed) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  for (int64_t page_size : {16, 256}) {
    SCOPED_TRACE("page_size " + std::to_string(page_size));
    fusedattn_config c = PrefillConfig(128, page_size, 130);
    c.max_seqlen_q = 130, c.max_seqlen_kv = 300;
    c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    c.return_max_logit = 0;  // it mixes every sequence
    TensorOptions o = PrefillOptions({{130, 1, 64, 0}, {300, 5, 64, 0}}, false, -1);
    c.batch = 4;
    const int64_t width = (300 + page_size - 1) / page_size;
    ExpectPrefillMatchesReference(
        c, o,
        [&](ProblemTensors* t) {
          t->page_table.set(0, static_cast<double>(t->num_pages));
          if (width > 1) t->page_table.set(1, -1.0);
        },
        [](ProblemTensors* t) {  // sequence 0: tokens [start_q[0], start_q[0] + 130)
          for (int64_t i = 0; i < 130; ++i)
            for (int64_t h = 0; h < t->config.heads_q; ++h) {
              const int64_t token = t->start_q[0] + i;
              for (int64_t x = 0; x < t->config.head_dim_v; ++x)
                t->o.set(t->o.offset_of({token, h, x}), 0.0);
              t->lse.set(t->lse.offset_of({token, h}), 0.0);
            }
        });
  }
}

// Small cases of both instances under memcheck and racecheck: boxes per page (16), one box per
// tile (256), d64's tiles of 64 keys, a half tile at d128 (64 keys left in the last tile).
TEST(FlashPagedPrefillSanitize, SmallCases) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_FLASH);
  for (int64_t d : {64, 128})
    for (int64_t page_size : {16, 256}) {
      SCOPED_TRACE("d " + std::to_string(d) + " page_size " + std::to_string(page_size));
      fusedattn_config c = PrefillConfig(d, page_size, 200);
      c.max_seqlen_q = 200, c.max_seqlen_kv = 320;
      c.batch = 3;
      c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
      ExpectPrefillMatchesReference(
          c, PrefillOptions({{200, 17, 1}, {320, 40, 0}}, true, -1));
    }
}

}  // namespace
}  // namespace fusedattn::testing
