// The cuDNN backend's planning of paged K/V (fusedattn.h "Paged K/V"; plan_spec.h
// SdpaGraphSpec::paged), on the CPU: which paged problems it leaves to cuDNN's paged SDPA forward
// and which it refuses (naming paged K/V, the feature and the reference), the cuDNN versions it
// needs, the graph spec (the pools as cuDNN's containers with the caller's strides, the page
// table's width, padding always on), the keys that separate what changes a paged graph, the
// bucketed key extent, the call plan and scratch, the table entries cuDNN is given, and the
// shape-sharing routes a paged graph does not take. Compiled when the cuDNN backend is built;
// needs no GPU.
#ifdef FUSEDATTN_WITH_CUDNN

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backends/cudnn/plan_spec.h"
#include "fusedattn/score_mod.hpp"
#include "problem/problem.h"
#include "testing/tensors.h"

namespace fusedattn::cudnn {
namespace {

const DeviceInfo kH100{0, 90, 91900};

// A decode step of GQA 8/2 against caches of up to 100 keys in BSHD pages of 16.
fusedattn_config PagedConfig() {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 3, c.heads_q = 8, c.heads_kv = 2, c.max_seqlen_q = 1, c.max_seqlen_kv = 100;
  c.head_dim_qk = c.head_dim_v = 64;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  c.page_size = 16;
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  c.return_lse = 1;
  c.device = FUSEDATTN_DEVICE_CUDA;
  return c;
}

void SetQueryFormat(fusedattn_config* c, fusedattn_format f) {
  c->q_format = c->o_format = c->do_format = c->dqkv_format = f;
}

Problem MakeCuda(const fusedattn_config& c) {
  Problem p;
  Status s = MakeProblem(&c, true, &p);
  EXPECT_TRUE(s.ok()) << s.message();
  return p;
}

// The caller's tensors of a problem (as MakeProblemTensors lays them out), as the backend sees
// them. host must outlive the views.
FwdTensors ViewsOf(const Problem& p, const testing::ProblemTensors& host) {
  FwdTensors t;
  fusedattn_fwd_args args = host.fwd_args();
  Status s = MakeFwdTensors(p, &args, &t);
  EXPECT_TRUE(s.ok()) << s.message();
  return t;
}

SdpaGraphSpec CanonicalSpec(const Problem& p) { return ForwardSpec(p, CanonicalFwdTensors(p)); }

PlanKey CanonicalKey(const fusedattn_config& c) {
  Problem storage;
  const Problem p = MakeCuda(c);
  const Problem& e = EffectiveProblem(p, &storage);
  return MakePlanKey(CanonicalSpec(e), kH100);
}

// ---------------------------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------------------------

// A score_mod graph that is no plain band (it rescales the score), kept alive for the process.
const fusedattn_score_mod* ScaleMod() {
  static ScoreMod* mod = [] {
    auto* m = new ScoreMod;
    m->set_score(m->score() * 0.5);
    m->finalize();
    return m;
  }();
  return mod->get();
}

TEST(CudnnPagedPreCheck, RefusesWhatCudnnLacksNextToPagedCachesNamingPagedKvAndTheReference) {
  struct Case {
    const char* name;
    void (*edit)(fusedattn_config*);
    const char* mentions;
  };
  const Case cases[] = {
      {"page size 24", [](fusedattn_config* c) { c->page_size = 24; }, "power-of-two"},
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
      {"score_mod", [](fusedattn_config* c) { c->score_mod = ScaleMod(); }, "score_mod"},
      {"fp8",
       [](fusedattn_config* c) {
         c->qkv_dtype = c->o_dtype = FUSEDATTN_DTYPE_FP8_E4M3;
         c->head_dim_qk = c->head_dim_v = 128;
       },
       "FP8"},
  };
  for (const Case& k : cases) {
    fusedattn_config c = PagedConfig();
    k.edit(&c);
    Status s = PreCheck(MakeCuda(c));
    EXPECT_EQ(s.code(), FUSEDATTN_ERROR_NOT_SUPPORTED) << k.name;
    const std::string page = "paged K/V (page_size = " + std::to_string(c.page_size) + ")";
    EXPECT_EQ(s.message().rfind(page, 0), 0u) << k.name << ": " << s.message();
    EXPECT_NE(s.message().find(k.mentions), std::string::npos) << k.name << ": " << s.message();
    EXPECT_NE(s.message().find("reference"), std::string::npos) << k.name << ": " << s.message();
  }
}

TEST(CudnnPagedPreCheck, LeavesPagedDecodeAndChunkedPrefillToCudnn) {
  std::vector<fusedattn_config> configs;
  fusedattn_config c = PagedConfig();
  configs.push_back(c);  // decode, BSHD pages of 16, bottom-right causal
  c.mask = FUSEDATTN_MASK_NONE, c.kv_format = FUSEDATTN_FORMAT_BHSD, c.page_size = 64;
  configs.push_back(c);
  c = PagedConfig();
  SetQueryFormat(&c, FUSEDATTN_FORMAT_THD);  // chunked prefill
  c.max_seqlen_q = 40, c.head_dim_qk = c.head_dim_v = 128;
  configs.push_back(c);
  c = PagedConfig();
  c.max_seqlen_q = 7, c.kv_format = FUSEDATTN_FORMAT_SBHD, c.window_left = 20;
  configs.push_back(c);
  c = PagedConfig();
  c.mask = FUSEDATTN_MASK_NONE, c.bias_type = FUSEDATTN_BIAS_POST_SCALE, c.page_size = 1;
  configs.push_back(c);
  for (const auto& config : configs) {
    Status s = PreCheck(MakeCuda(config));
    EXPECT_TRUE(s.ok()) << s.message();
  }
}

TEST(CudnnPagedVersion, PagedCachesFrom95RaggedQueriesFrom98LargeHeadDimsAbove99) {
  const Problem decode = MakeCuda(PagedConfig());
  EXPECT_EQ(PagedVersionRefusal(decode, 90400).code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(PagedVersionRefusal(decode, 90400).message().find("9.5.0"), std::string::npos)
      << PagedVersionRefusal(decode, 90400).message();
  EXPECT_TRUE(PagedVersionRefusal(decode, 90500).ok());

  fusedattn_config c = PagedConfig();
  SetQueryFormat(&c, FUSEDATTN_FORMAT_THD);
  const Problem prefill = MakeCuda(c);
  const Status ragged = PagedVersionRefusal(prefill, 90700);
  EXPECT_EQ(ragged.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(ragged.message().find("THD"), std::string::npos) << ragged.message();
  EXPECT_TRUE(PagedVersionRefusal(prefill, 90800).ok());

  c = PagedConfig();
  c.head_dim_qk = c.head_dim_v = 192;
  const Problem wide = MakeCuda(c);
  EXPECT_EQ(PagedVersionRefusal(wide, 90900).code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
  EXPECT_TRUE(PagedVersionRefusal(wide, 91900).ok());

  fusedattn_config dense = PagedConfig();
  dense.page_size = 0;
  EXPECT_TRUE(PagedVersionRefusal(MakeCuda(dense), 90000).ok()) << "not paged: no limit";
}

// ---------------------------------------------------------------------------------------------
// The graph spec
// ---------------------------------------------------------------------------------------------

// The pools are cuDNN's containers [num_pages, heads_kv, page_size, d] with the strides of the
// caller's page layout, padded rows included; the table is ceil(max_seqlen_kv / page_size) wide.
TEST(CudnnPagedSpec, PoolsAreContainersWithTheCallersStrides) {
  for (fusedattn_format pool : {FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_BHSD,
                                FUSEDATTN_FORMAT_SBHD})
    for (bool padded : {false, true}) {
      fusedattn_config c = PagedConfig();
      c.kv_format = pool;
      c.device = FUSEDATTN_DEVICE_CPU;  // host tensors; the spec is the same on either device
      testing::TensorOptions o;
      o.padded_strides = padded;
      const testing::ProblemTensors host = testing::MakeProblemTensors(c, o);
      Problem p;
      ASSERT_TRUE(MakeProblem(&c, false, &p).ok());
      const SdpaGraphSpec s = ForwardSpec(p, ViewsOf(p, host));
      SCOPED_TRACE(Format("pool %s padded %d", FormatName(pool), padded));
      EXPECT_TRUE(s.paged);
      EXPECT_EQ(s.page_size, 16);
      EXPECT_EQ(s.num_pages, host.num_pages);
      EXPECT_EQ(s.table_pages, 7);  // ceil(100 / 16)
      // Pool axes in the tensor: BSHD [page, token, head, x], BHSD [page, head, token, x],
      // SBHD [token, page, head, x].
      const auto& st = host.k.strides();
      const int64_t page_axis = pool == FUSEDATTN_FORMAT_SBHD ? 1 : 0;
      const int64_t token_axis =
          pool == FUSEDATTN_FORMAT_BHSD ? 2 : (pool == FUSEDATTN_FORMAT_SBHD ? 0 : 1);
      const int64_t head_axis = pool == FUSEDATTN_FORMAT_BHSD ? 1 : 2;
      for (const TensorDesc* d : {&s.k, &s.v}) {
        EXPECT_EQ(d->dim[0], host.num_pages);
        EXPECT_EQ(d->dim[1], c.heads_kv);
        EXPECT_EQ(d->dim[2], c.page_size);
        EXPECT_EQ(d->dim[3], 64);
        EXPECT_EQ(d->stride[0], st[page_axis]);
        EXPECT_EQ(d->stride[1], st[head_axis]);
        EXPECT_EQ(d->stride[2], st[token_axis]);
        EXPECT_EQ(d->stride[3], 1);
      }
      EXPECT_EQ(s.q.dim[0], c.batch) << "queries keep their batch";
    }
}

// Per-sequence key lengths always reach cuDNN (its paged caches need its padding mask), and the
// bottom-right diagonal stays bottom-right even when max_seqlen_q == max_seqlen_kv: each cache has
// its own length, so the two alignments differ.
TEST(CudnnPagedSpec, PaddingIsAlwaysOnAndTheBottomRightDiagonalStays) {
  fusedattn_config c = PagedConfig();
  c.mask = FUSEDATTN_MASK_NONE;
  EXPECT_TRUE(CanonicalSpec(MakeCuda(c)).padding) << "no mask: the key lengths still apply";
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  c.max_seqlen_q = c.max_seqlen_kv = 32;
  const SdpaGraphSpec s = CanonicalSpec(MakeCuda(c));
  EXPECT_TRUE(s.padding);
  EXPECT_TRUE(s.bottom_right);
  EXPECT_TRUE(s.has_right_bound);
  EXPECT_EQ(s.right_bound, 0);
}

// check() plans for a pool of batch * table_pages pages (each sequence its own) of the effective
// problem (plan_spec.h EffectiveProblem: max_seqlen_kv rounded up to its bucket), as forward()
// does; a call with exactly such a pool (contiguous) has the plan check() built, one with another
// pool its own. 1000 keys in pages of 16 is 63 pages, its bucket 1024 is 64: a spec planned from
// the raw length would not match.
TEST(CudnnPagedSpec, TheCanonicalPoolHasThePlanCheckBuiltAndOtherPoolsTheirOwn) {
  fusedattn_config c = PagedConfig();
  c.device = FUSEDATTN_DEVICE_CPU;
  c.max_seqlen_kv = 1000;
  Problem p;
  ASSERT_TRUE(MakeProblem(&c, false, &p).ok());
  Problem storage;
  const Problem& e = EffectiveProblem(p, &storage);
  ASSERT_EQ(e.config.max_seqlen_kv, 1024) << "the paged key extent is bucketed";
  ASSERT_EQ(CanonicalNumPages(p), 3 * 63);
  EXPECT_EQ(CanonicalNumPages(e), 3 * 64);
  testing::TensorOptions o;
  o.len_kv = {1000, 17, 0};  // 63 + 2 + 0 pages used
  o.spare_pages = 3 * 64 - 65;
  // The caller's tensors are those of its own problem; the backend plans from the effective one.
  const testing::ProblemTensors canonical_pool = testing::MakeProblemTensors(c, o);
  ASSERT_EQ(canonical_pool.num_pages, CanonicalNumPages(e));
  EXPECT_EQ(MakePlanKey(ForwardSpec(e, ViewsOf(p, canonical_pool)), kH100),
            MakePlanKey(CanonicalSpec(e), kH100));
  o.spare_pages += 5;
  const testing::ProblemTensors larger_pool = testing::MakeProblemTensors(c, o);
  EXPECT_FALSE(MakePlanKey(ForwardSpec(e, ViewsOf(p, larger_pool)), kH100) ==
               MakePlanKey(CanonicalSpec(e), kH100));
}

// ---------------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------------

TEST(CudnnPagedKey, PagingThePageSizeAndTheTableWidthSeparateGraphs) {
  const PlanKey base = CanonicalKey(PagedConfig());
  fusedattn_config c = PagedConfig();
  c.page_size = 32;
  EXPECT_FALSE(CanonicalKey(c) == base) << "page size";
  c = PagedConfig();
  c.page_size = 0;
  EXPECT_FALSE(CanonicalKey(c) == base) << "contiguous K/V";
  c = PagedConfig();
  c.max_seqlen_kv = 1000;  // another bucket: a wider table
  EXPECT_FALSE(CanonicalKey(c) == base) << "table width";
}

// A new pool size is another plan of the same structure (the extent of a tensor), a new page
// size another structure.
TEST(CudnnPagedKey, ThePoolSizeIsShapeThePageSizeStructure) {
  const Problem p = MakeCuda(PagedConfig());
  FwdTensors t = CanonicalFwdTensors(p);
  const SdpaGraphSpec s = ForwardSpec(p, t);
  t.num_pages += 40;
  const SdpaGraphSpec more_pages = ForwardSpec(p, t);
  EXPECT_FALSE(MakePlanKey(s, kH100) == MakePlanKey(more_pages, kH100));
  EXPECT_EQ(MakeStructureKey(s, kH100), MakeStructureKey(more_pages, kH100));
  fusedattn_config c = PagedConfig();
  c.page_size = 64;
  const Problem other = MakeCuda(c);
  EXPECT_FALSE(MakeStructureKey(s, kH100) == MakeStructureKey(CanonicalSpec(other), kH100));
}

TEST(CudnnPagedKey, ThePagedSpecFitsTheKey) {
  fusedattn_config c = PagedConfig();
  SetQueryFormat(&c, FUSEDATTN_FORMAT_THD);
  c.max_seqlen_q = 64;
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE, c.bias_batch = c.batch, c.bias_heads = c.heads_q;
  c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  c.window_left = 9;
  const PlanKey key = CanonicalKey(c);
  EXPECT_LE(key.used, PlanKey::kWords);
}

// ---------------------------------------------------------------------------------------------
// The key extent grows to its bucket: decode steps share a plan
// ---------------------------------------------------------------------------------------------

TEST(CudnnPagedEffective, TheKeyExtentGrowsToItsBucketSoCachesOfNearLengthsShareAPlan) {
  fusedattn_config c = PagedConfig();
  c.max_seqlen_q = 20;  // a bucket of 32 for THD queries
  c.max_seqlen_kv = 1000;
  Problem storage;
  const Problem p = MakeCuda(c);
  const Problem& e = EffectiveProblem(p, &storage);
  EXPECT_EQ(e.config.max_seqlen_kv, ThdSeqlenBucket(1000));
  EXPECT_EQ(e.config.max_seqlen_q, 20) << "dense queries keep their rows";
  fusedattn_config next = c;
  next.max_seqlen_kv = 1001;  // the next decode step
  EXPECT_EQ(CanonicalKey(c), CanonicalKey(next));
}

TEST(CudnnPagedEffective, ThdQueriesGrowTooATensorWithTheKeyExtentKeepsIt) {
  fusedattn_config c = PagedConfig();
  SetQueryFormat(&c, FUSEDATTN_FORMAT_THD);
  c.max_seqlen_q = 70, c.max_seqlen_kv = 1000;
  Problem storage;
  const Problem thd = MakeCuda(c);
  const Problem& e = EffectiveProblem(thd, &storage);
  EXPECT_EQ(e.config.max_seqlen_q, ThdSeqlenBucket(70));
  EXPECT_EQ(e.config.max_seqlen_kv, ThdSeqlenBucket(1000));
  c.bias_type = FUSEDATTN_BIAS_POST_SCALE;  // [.., sq, skv]: its extent is the graph's
  Problem storage2;
  const Problem biased = MakeCuda(c);
  EXPECT_EQ(EffectiveProblem(biased, &storage2).config.max_seqlen_kv, 1000);
}

// ---------------------------------------------------------------------------------------------
// The call: prepare (lengths and table), fix-up, scratch
// ---------------------------------------------------------------------------------------------

TEST(CudnnPagedCallPlan, PreparesLengthsAndTheTableAndFixesEmptyRows) {
  fusedattn_config c = PagedConfig();
  c.mask = FUSEDATTN_MASK_NONE;
  const Problem p = MakeCuda(c);
  const CallPlan call = ForwardCallPlan(p, CanonicalFwdTensors(p));
  EXPECT_TRUE(call.padding) << "the key lengths";
  EXPECT_TRUE(call.page_table);
  EXPECT_TRUE(call.prep);
  EXPECT_TRUE(call.fixup) << "an empty cache's rows: O = 0, LSE = -inf";
  EXPECT_TRUE(call.stage_stats);
  EXPECT_FALSE(call.const_lengths);
}

TEST(CudnnPagedCallPlan, ScratchHoldsTheTableOfTheGraphBatchAndNoRaggedPools) {
  fusedattn_config c = PagedConfig();
  SetQueryFormat(&c, FUSEDATTN_FORMAT_THD);
  c.max_seqlen_q = 8;
  const Problem p = MakeCuda(c);
  const CallPlan call = ForwardCallPlan(p, CanonicalFwdTensors(p));
  const Scratch s = ForwardScratch(p, call);
  ASSERT_NE(s.page_table, Scratch::kNone);
  EXPECT_EQ(s.page_table % kWorkspaceAlignment, 0u);
  EXPECT_NE(s.ragged[kRaggedQ], Scratch::kNone);
  EXPECT_NE(s.ragged[kRaggedO], Scratch::kNone);
  EXPECT_EQ(s.ragged[kRaggedK], Scratch::kNone) << "a pool has no ragged offsets";
  EXPECT_EQ(s.ragged[kRaggedV], Scratch::kNone);
  // The table region reaches GraphBatch (4, a THD capacity) * 7 entries and overlaps no other.
  const size_t table_end = s.page_table + sizeof(int32_t) * GraphBatch(p) * 7;
  EXPECT_LE(table_end, s.bytes);
  for (size_t other : {s.seq_len_q, s.seq_len_kv, s.ragged[kRaggedQ], s.ragged[kRaggedO], s.stats})
    if (other != Scratch::kNone)
      EXPECT_TRUE(other + sizeof(int32_t) <= s.page_table || other >= table_end) << other;
}

// The entries cuDNN is given for one sequence's row (plan_spec.h TablePage).
std::vector<int32_t> TableRow(const std::vector<int32_t>& row, int64_t len_kv, int64_t width,
                              int64_t page_size, int64_t num_pages) {
  std::vector<int32_t> out;
  for (int64_t k = 0; k < width; ++k)
    out.push_back(TablePage(row.data(), k, len_kv, page_size, num_pages));
  return out;
}

TEST(CudnnPagedTable, UsedEntriesAreTheCallersAndThoseAfterRepeatTheLastUsedPage) {
  // 37 keys in pages of 16: entries 0..2 used; 3..5 hold what a caller leaves there.
  const std::vector<int32_t> row = {9, 2, 5, -1, 2147483647, 11};
  EXPECT_EQ(TableRow(row, 37, 6, 16, 12), (std::vector<int32_t>{9, 2, 5, 5, 5, 5}));
}

TEST(CudnnPagedTable, AnIndexOutsideThePoolBecomesPageZero) {
  const std::vector<int32_t> row = {3, 12, -7, 4};
  EXPECT_EQ(TableRow(row, 64, 4, 16, 12), (std::vector<int32_t>{3, 0, 0, 4}));
}

TEST(CudnnPagedTable, AnEmptyCacheReadsNoEntry) {
  // No entry is read: a null row would fault on any read.
  for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(TablePage(nullptr, k, 0, 16, 12), 0);
}

TEST(CudnnPagedTable, TheWidthIsTheKeyExtentInPages) {
  EXPECT_EQ(TablePages(100, 16), 7);
  EXPECT_EQ(TablePages(96, 16), 6);
  EXPECT_EQ(TablePages(1, 64), 1);
  EXPECT_EQ(TablePages(5, 1), 5);
}

// ---------------------------------------------------------------------------------------------
// Shape sharing a paged graph does not take
// ---------------------------------------------------------------------------------------------

TEST(CudnnPagedShapes, NoBatchChunksNoSequenceLengthRouteNoDynamicShapes) {
  const Problem p = MakeCuda(PagedConfig());
  const SdpaGraphSpec s = CanonicalSpec(p);
  for (const Status& refusal :
       {BatchChunkRefusal(s), SeqlenRouteRefusal(p, s), DynamicShapeRefusal(s)}) {
    EXPECT_EQ(refusal.code(), FUSEDATTN_ERROR_NOT_SUPPORTED);
    EXPECT_NE(refusal.message().find("paged"), std::string::npos) << refusal.message();
  }
}

TEST(CudnnPagedShapes, ASmallerBatchsSpecKeepsThePool) {
  const Problem p = MakeCuda(PagedConfig());
  FwdTensors t = CanonicalFwdTensors(p);
  t.num_pages = 3;  // as many pages as sequences: WithBatch must not take the pool for a batch
  const SdpaGraphSpec s = WithBatch(ForwardSpec(p, t), 2);
  EXPECT_EQ(s.q.dim[0], 2);
  EXPECT_EQ(s.k.dim[0], 3);
  EXPECT_EQ(s.v.dim[0], 3);
}

}  // namespace
}  // namespace fusedattn::cudnn

#endif  // FUSEDATTN_WITH_CUDNN
