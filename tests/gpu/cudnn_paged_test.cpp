// cuDNN's paged SDPA forward (plan_spec.h SdpaGraphSpec::paged) against the CPU reference, on a
// GPU: decode (max_seqlen_q = 1) and chunked prefill (THD queries, and dense queries of several
// rows), GQA, page sizes 16 and 64, bottom-right causal, BSHD / BHSD / SBHD pools.
//
// Each case forces backend = cudnn on device tensors and runs the reference (device = CPU) on host
// copies of the same inputs; O and LSE are compared with the tolerances of shared/DESIGN.md,
// outputs poisoned before the run. The pools come from MakeProblemTensors: shuffled page tables,
// spare pages, table entries past a sequence's pages set to -1 (or INT32_MAX), key lengths that
// include an empty cache, one key, a last page partly filled and the longest cache. Every pool
// element no sequence uses holds random data, except in UnusedPoolRowsAreNaN, which puts NaN there
// (spare pages and the tokens of a last page past its sequence's length) to show whether cuDNN
// lets a masked key's value reach O.
//
// compute-sanitizer (the prepare kernel's table copy, a bad page index in a used entry):
//   compute-sanitizer --tool memcheck build/tests/fusedattn_gpu_tests \
//     --gtest_filter='CudnnPagedTable*:Shapes/CudnnPagedDecode.MatchesReference/Page16_Gqa8x2_D128*'
// Compiled when the cuDNN backend is built.
#ifdef FUSEDATTN_WITH_CUDNN

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/cudnn/cudnn_backend.h"
#include "fusedattn/fusedattn.h"
#include "fusedattn/fusedattn.hpp"
#include "gpu/cudnn_run.h"
#include "gpu/device_memory.h"
#include "gpu/expect_close.h"
#include "gpu/paged_pools.h"
#include "gpu/skip.h"
#include "testing/scoped_env.h"
#include "testing/tensors.h"

namespace fusedattn::testing {
namespace {

// b = 5 sequences of max_seqlen_q queries against caches of up to skv keys, forced onto cuDNN.
fusedattn_config PagedConfig(int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t d,
                             int64_t page_size) {
  fusedattn_config c = Config(5, hq, hkv, sq, skv, d);
  c.page_size = page_size;
  c.return_lse = 1;
  return c;
}

// Key lengths: the longest, empty, one key, a last page partly filled, one page of 64.
TensorOptions PagedOptions(int64_t skv) {
  TensorOptions o;
  o.seed = 4242;
  const int32_t longest = static_cast<int32_t>(skv);
  o.len_kv = {longest, 0, 1, std::min<int32_t>(longest, 333), std::min<int32_t>(longest, 64)};
  o.spare_pages = 3;
  return o;
}

void SetQueryFormat(fusedattn_config* c, fusedattn_format f) {
  c->q_format = c->o_format = c->do_format = c->dqkv_format = f;
}

struct Outputs {
  ProblemTensors cudnn, reference;
  bool ran = false;  // both forwards succeeded
};

// Runs the problem on cuDNN (device) and on the reference (host). `prepare` changes the host
// tensors both runs read; `device_only` changes only what cuDNN reads (after the reference ran).
Outputs RunBoth(const fusedattn_config& config, const TensorOptions& options,
                const std::function<void(ProblemTensors*)>& prepare = {},
                const std::function<void(ProblemTensors*)>& device_only = {}) {
  Outputs out;
  ProblemTensors host = MakeProblemTensors(config, options);
  if (prepare) prepare(&host);
  out.reference = host;
  out.reference.config = ReferenceConfig(config);
  try {
    Forward(out.reference.config, out.reference.fwd_args());
  } catch (const Error& e) {
    ADD_FAILURE() << "reference forward: " << e.what();
    return out;
  }
  out.cudnn = host;
  if (device_only) device_only(&out.cudnn);
  DeviceProblem dev;
  std::string error;
  if (!dev.upload(out.cudnn, &error)) {
    ADD_FAILURE() << error;
    return out;
  }
  try {
    const size_t bytes = FwdWorkspaceSize(config);
    DeviceBuffer workspace(bytes);
    if (bytes != 0 && workspace.ptr == nullptr) {
      ADD_FAILURE() << "cudaMalloc of " << bytes << " bytes";
      return out;
    }
    Forward(config, dev.fwd_args(), workspace.ptr, bytes);
  } catch (const Error& e) {
    ADD_FAILURE() << "cuDNN forward: " << e.what();
    return out;
  }
  if (!dev.download_outputs(&out.cudnn, &error)) {
    ADD_FAILURE() << error;
    return out;
  }
  out.ran = true;
  return out;
}

void ExpectMatchesReference(const fusedattn_config& config, const TensorOptions& options,
                            const std::function<void(ProblemTensors*)>& prepare = {}) {
  const Outputs r = RunBoth(config, options, prepare);
  if (!r.ran) return;
  const double tol = Tolerance(config.qkv_dtype);
  ExpectClose("O", r.cudnn.o, r.reference.o, tol);
  ExpectClose("LSE", r.cudnn.lse, r.reference.lse, tol);
}

// ---------------------------------------------------------------------------------------------
// Decode: page sizes x GQA groups x head dims x masks (BSHD pools, sq = 1, 1000 keys)
// ---------------------------------------------------------------------------------------------

struct DecodeShape {
  int64_t page_size, heads_q, heads_kv, head_dim;
  fusedattn_mask mask;
};

void PrintTo(const DecodeShape& s, std::ostream* os) {
  *os << "page " << s.page_size << " gqa " << s.heads_q << "/" << s.heads_kv << " d "
      << s.head_dim << " mask " << s.mask;
}

class CudnnPagedDecode : public ::testing::TestWithParam<DecodeShape> {};

TEST_P(CudnnPagedDecode, MatchesReference) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  const DecodeShape s = GetParam();
  fusedattn_config c = PagedConfig(s.heads_q, s.heads_kv, 1, 1000, s.head_dim, s.page_size);
  c.mask = s.mask;
  TensorOptions o = PagedOptions(1000);
  o.share_prefix = s.heads_q == 16;  // sequences share their first pages with sequence 0
  o.unused_page_entry = s.head_dim == 64 ? std::numeric_limits<int32_t>::max() : -1;
  ExpectMatchesReference(c, o);
}

std::vector<DecodeShape> DecodeShapes() {
  std::vector<DecodeShape> shapes;
  for (int64_t page : {16, 64})
    for (int64_t hq : {8, 16})
      for (int64_t d : {64, 128})
        for (fusedattn_mask mask : {FUSEDATTN_MASK_NONE, FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT})
          shapes.push_back({page, hq, 2, d, mask});
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnPagedDecode, ::testing::ValuesIn(DecodeShapes()),
                         [](const auto& info) {
                           const DecodeShape& s = info.param;
                           return "Page" + std::to_string(s.page_size) + "_Gqa" +
                                  std::to_string(s.heads_q) + "x" + std::to_string(s.heads_kv) +
                                  "_D" + std::to_string(s.head_dim) +
                                  (s.mask == FUSEDATTN_MASK_NONE ? "_NoMask" : "_CausalBR");
                         });

// ---------------------------------------------------------------------------------------------
// Chunked prefill: several query rows per sequence, bottom-right causal
// ---------------------------------------------------------------------------------------------

struct PrefillCase {
  std::string name;
  std::function<void(fusedattn_config&, TensorOptions&)> apply;
  std::function<void(ProblemTensors*)> edit = {};  // the tensors' layouts, before both runs
};

void PrintTo(const PrefillCase& c, std::ostream* os) { *os << c.name; }

class CudnnPagedPrefill : public ::testing::TestWithParam<PrefillCase> {};

// THD queries of {40, 3, 1, 17, 64} rows against caches of {700, 0, 1, 1, 64} keys (three
// queries against an empty cache, and a sequence with one cached key and 17 new ones, of which
// the first 16 see no key under bottom-right causal: the fix-up's O = 0, LSE = -inf), GQA 8/2,
// d128, pages of 16 in BHSD, unless the case says otherwise.
TEST_P(CudnnPagedPrefill, MatchesReference) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  fusedattn_config c = PagedConfig(8, 2, 64, 700, 128, 16);
  c.kv_format = FUSEDATTN_FORMAT_BHSD;
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  SetQueryFormat(&c, FUSEDATTN_FORMAT_THD);
  TensorOptions o = PagedOptions(700);
  o.len_q = {40, 3, 1, 17, 64};
  o.len_kv = {700, 0, 1, 1, 64};
  GetParam().apply(c, o);
  ExpectMatchesReference(c, o, GetParam().edit);
}

std::vector<PrefillCase> PrefillCases() {
  using C = fusedattn_config;
  using O = TensorOptions;
  return {
      {"ThdBhsdPages16", [](C&, O&) {}},
      {"ThdBhsdPages64", [](C& c, O&) { c.page_size = 64; }},
      {"ThdBshdPages64", [](C& c, O&) { c.page_size = 64, c.kv_format = FUSEDATTN_FORMAT_BSHD; }},
      {"ThdGapsPackedLse", [](C&, O& o) { o.thd_gaps = true, o.lse_packed = true; }},
      {"ThdMultiQuery", [](C& c, O&) { c.heads_kv = 1; }},
      {"ThdNoGrouping", [](C& c, O&) { c.heads_kv = c.heads_q; }},
      {"ThdD64", [](C& c, O&) { c.head_dim_qk = c.head_dim_v = 64; }},
      {"ThdFloat16", [](C& c, O&) { c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT16; }},
      {"ThdWindowBottomRight", [](C& c, O&) { c.window_left = 150; }},
      {"ThdSharedPrefixPages", [](C&, O& o) { o.share_prefix = true; }},
      // Pool rows padded by 8 elements (16 bytes, cuDNN's alignment): strides other than the
      // canonical pool's, a plan of their own.
      {"ThdPoolRowsPadded", [](C&, O&) {},
       [](ProblemTensors* t) {
         t->k = WithPaddedRows(t->k, 8, false);
         t->v = WithPaddedRows(t->v, 8, false);
       }},
      // Dense queries of 8 rows each (every sequence has max_seqlen_q queries), bottom-right.
      {"BshdQueries8BshdPages16",
       [](C& c, O& o) {
         SetQueryFormat(&c, FUSEDATTN_FORMAT_BSHD);
         c.kv_format = FUSEDATTN_FORMAT_BSHD, c.max_seqlen_q = 8;
         o.len_q.clear();
       }},
      {"BshdQueriesPaddedRowsPages64",
       [](C& c, O& o) {
         SetQueryFormat(&c, FUSEDATTN_FORMAT_BSHD);
         c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT, c.page_size = 64,
         c.max_seqlen_q = 8;
         o.len_q = {8, 0, 1, 5, 3};
       }},
      {"BhsdQueriesTopLeftCausal",
       [](C& c, O& o) {
         SetQueryFormat(&c, FUSEDATTN_FORMAT_BHSD);
         c.mask = FUSEDATTN_MASK_CAUSAL, c.max_seqlen_q = 8;
         o.len_q.clear();
       }},
      {"SbhdQueriesSbhdPagesNoMask",
       [](C& c, O& o) {
         SetQueryFormat(&c, FUSEDATTN_FORMAT_SBHD);
         c.kv_format = FUSEDATTN_FORMAT_SBHD, c.mask = FUSEDATTN_MASK_NONE, c.max_seqlen_q = 8;
         o.len_q.clear();
       }},
      // cuDNN takes a bias only with a top-left (or no) diagonal: no mask here. 704 keys: the
      // bias rows are 16-byte aligned; its key extent is the graph's (no bucket).
      {"BshdQueriesPostScaleBiasNoMask",
       [](C& c, O& o) {
         SetQueryFormat(&c, FUSEDATTN_FORMAT_BSHD);
         c.mask = FUSEDATTN_MASK_NONE, c.max_seqlen_q = 8, c.max_seqlen_kv = 704;
         c.bias_type = FUSEDATTN_BIAS_POST_SCALE, c.bias_heads = c.heads_q;
         o.len_q.clear();
         o.len_kv = {704, 0, 1, 333, 64};
         o.bias_dtype = c.qkv_dtype;
       }},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, CudnnPagedPrefill, ::testing::ValuesIn(PrefillCases()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// What is read, and which plan runs
// ---------------------------------------------------------------------------------------------

// NaN in every pool element no sequence uses (spare pages, the tail of each last page): a masked
// key's value must not reach O (cuDNN may read every page the table names; the prepare kernel
// gives it only the sequence's own pages, whose tails are masked keys).
TEST(CudnnPagedTable, UnusedPoolRowsAreNaN) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  fusedattn_config c = PagedConfig(8, 2, 1, 1000, 128, 16);
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  ExpectMatchesReference(c, PagedOptions(1000), PoisonUnusedPoolRows);
}

// A used table entry outside the pool (sequence 1's second page) is never followed: the call
// succeeds, every other sequence's O and LSE are the reference's (computed with the valid table),
// and sequence 1's results, which fusedattn.h leaves undefined, are not compared.
TEST(CudnnPagedTable, AnIndexOutsideThePoolIsNeverFollowed) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  fusedattn_config c = PagedConfig(8, 2, 1, 1000, 128, 16);
  TensorOptions o = PagedOptions(1000);
  o.len_kv = {1000, 40, 1, 333, 64};
  Outputs r = RunBoth(c, o, {}, [](ProblemTensors* t) {
    const int64_t width = t->page_table.shape()[1];
    t->page_table.set(1 * width + 1, static_cast<double>(t->num_pages + 1000));
  });
  if (!r.ran) return;
  // Sequence 1's rows (batch index 1 of O [b, s, h, d] and LSE [b, h, s]) from the reference.
  for (auto [out, ref] : {std::pair<HostTensor*, const HostTensor*>{&r.cudnn.o, &r.reference.o},
                          {&r.cudnn.lse, &r.reference.lse}}) {
    const auto& shape = ref->shape();
    const int n = static_cast<int>(shape.size());
    std::vector<int64_t> index(shape.size(), 0);
    index[0] = 1;
    for (int d = 1; d >= 1;) {  // every index with index[0] = 1
      out->set(out->offset_of(index), ref->at(index));
      for (d = n - 1; d >= 1; --d) {
        if (++index[d] < shape[d]) break;
        index[d] = 0;
      }
    }
  }
  const double tol = Tolerance(c.qkv_dtype);
  ExpectClose("O of the other sequences", r.cudnn.o, r.reference.o, tol);
  ExpectClose("LSE of the other sequences", r.cudnn.lse, r.reference.lse, tol);
}

// A pool of batch * ceil(max_seqlen_kv / page_size) contiguous pages (plan_spec.h
// CanonicalNumPages, with max_seqlen_kv at its bucket: 256 stays 256) runs the plan check()
// built: the call builds nothing.
TEST(CudnnPagedPlans, TheCanonicalPoolRunsThePlanCheckBuilt) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  fusedattn_config c = PagedConfig(8, 2, 1, 256, 128, 16);
  c.batch = 3;
  TensorOptions o;
  o.seed = 77;
  o.len_kv = {256, 17, 0};                // 16 + 2 + 0 pages used
  o.spare_pages = 3 * (256 / 16) - 18;  // 48 pages in all
  RunOptions run;
  run.backward = false;
  run.expect_no_new_plans = true;
  RunAndCompare(c, o, run);
}

// A pool of another size builds its own plan at its first call (the pool's extent is part of the
// graph), and the second call with it builds nothing.
TEST(CudnnPagedPlans, AnotherPoolBuildsItsPlanOnce) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  fusedattn_config c = PagedConfig(8, 2, 1, 1000, 128, 16);
  const TensorOptions o = PagedOptions(1000);
  char msg[4096];
  fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
  ASSERT_EQ(fusedattn_get_backend(&c, &chosen, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  const uint64_t before = CacheStats().misses;  // check() has the canonical pool's plan now
  RunOptions first;
  first.backward = false;
  first.expect_no_new_plans = false;
  RunAndCompare(c, o, first);
  EXPECT_GT(CacheStats().misses, before) << "the call's own pool built its plan";
  RunOptions second = first;
  second.expect_no_new_plans = true;
  RunAndCompare(c, o, second);
}

// ---------------------------------------------------------------------------------------------
// Automatic selection
// ---------------------------------------------------------------------------------------------

// Paged decode (one query row) on sm_90: cuDNN's paged forward goes first (measured faster than
// flash's decode kernel, select/measured_speed.cpp); a chunked prefill keeps flash first.
TEST(CudnnPagedSelection, AutoPicksCudnnForPagedDecodeOnSm90AndFlashForChunkedPrefill) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (major != 9 || minor != 0) GTEST_SKIP() << "the measured order is sm_90's";
  // Built in the call: with a background build, selection would take flash until the plan is
  // ready (README "Background builds").
  ScopedEnv env(&cudnn::ReloadSettings);
  env.set("FUSEDATTN_CUDNN_BACKGROUND_BUILD", "0");
  fusedattn_config c = PagedConfig(8, 2, 1, 1000, 128, 16);
  c.backend = FUSEDATTN_BACKEND_AUTO;
  char msg[4096];
  fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
  ASSERT_EQ(fusedattn_get_backend(&c, &chosen, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  EXPECT_EQ(chosen, FUSEDATTN_BACKEND_CUDNN) << msg;
  char reason[512];
  if (!fusedattn_backend_available(FUSEDATTN_BACKEND_FLASH, reason, sizeof reason)) return;
  c = PagedConfig(8, 2, 64, 1000, 128, 16);
  c.backend = FUSEDATTN_BACKEND_AUTO;
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  ASSERT_EQ(fusedattn_get_backend(&c, &chosen, msg, sizeof msg), FUSEDATTN_SUCCESS) << msg;
  EXPECT_EQ(chosen, FUSEDATTN_BACKEND_FLASH) << msg;
}

// ---------------------------------------------------------------------------------------------
// Refusals name their reason
// ---------------------------------------------------------------------------------------------

// Forced onto cuDNN, a page size that is no power of two is refused before anything runs, and
// the reason says why; the outputs keep their poison.
TEST(CudnnPagedRefusal, APageSizeThatIsNoPowerOfTwoNamesItsReason) {
  SKIP_UNLESS_BACKEND_RUNS(FUSEDATTN_BACKEND_CUDNN);
  fusedattn_config c = PagedConfig(8, 2, 1, 200, 128, 24);
  char msg[4096];
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  EXPECT_EQ(fusedattn_get_backend(&c, &backend, msg, sizeof msg), FUSEDATTN_ERROR_NOT_SUPPORTED)
      << msg;
  EXPECT_NE(std::string(msg).find("paged K/V (page_size = 24)"), std::string::npos) << msg;
  EXPECT_NE(std::string(msg).find("power-of-two"), std::string::npos) << msg;

  ProblemTensors host = MakeProblemTensors(c, PagedOptions(200));
  DeviceProblem dev;
  std::string error;
  ASSERT_TRUE(dev.upload(host, &error)) << error;
  fusedattn_fwd_args fa = dev.fwd_args();
  EXPECT_EQ(fusedattn_fwd(&c, &fa, nullptr, 0, nullptr, msg, sizeof msg),
            FUSEDATTN_ERROR_NOT_SUPPORTED)
      << msg;
  EXPECT_NE(std::string(msg).find("power-of-two"), std::string::npos) << msg;
  ProblemTensors after = host;
  ASSERT_TRUE(dev.download_outputs(&after, &error)) << error;
  // host's outputs are all poison: any element the call wrote counts as touched_unwritten.
  for (auto [name, out, poisoned] :
       {std::tuple<const char*, const HostTensor*, const HostTensor*>{"O", &after.o, &host.o},
        {"LSE", &after.lse, &host.lse}}) {
    const Comparison cmp = Compare(*out, *poisoned);
    EXPECT_EQ(cmp.touched_unwritten, 0) << name << " was written: " << cmp.describe();
  }
}

}  // namespace
}  // namespace fusedattn::testing

#endif  // FUSEDATTN_WITH_CUDNN
