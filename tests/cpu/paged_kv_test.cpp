// Paged K/V (config.page_size > 0) on the reference backend: K and V as pools of pages found
// through a page table, with per-sequence key lengths (fusedattn.h, "Paged K/V").
//
// The specification says a paged problem computes exactly what the same problem computes on
// contiguous K/V: every sequence's keys gathered from its pages into a dense tensor, with the key
// lengths as a padding mask gives them. So each variant below runs twice on the same inputs —
// paged, and on that gathered contiguous problem — and the outputs must be bit-identical (the
// reference reads the same values in the same order either way). Then the properties of the
// table (entries past a sequence and spare pages are never read, pages may be shared), decode and
// chunked prefill, and every validation error, each with the outputs left untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "fusedattn/score_mod.hpp"
#include "problem/problem.h"
#include "select/select.h"
#include "test_util.h"
#include "testing/tensors.h"

namespace fusedattn {
namespace {

using testing::HostTensor;
using testing::MakeProblemTensors;
using testing::ProblemTensors;
using testing::TensorOptions;

// ---------------------------------------------------------------------------------------------
// The contiguous problem a paged one equals
// ---------------------------------------------------------------------------------------------

fusedattn_mask PaddingVariant(fusedattn_mask mask) {
  switch (mask) {
    case FUSEDATTN_MASK_NONE: return FUSEDATTN_MASK_PADDING;
    case FUSEDATTN_MASK_CAUSAL: return FUSEDATTN_MASK_PADDING_CAUSAL;
    case FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT: return FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
    default: return mask;
  }
}

// The index of (page, token, head, feature) in a pool laid out in `format`.
std::vector<int64_t> PoolIndex(fusedattn_format format, int64_t page, int64_t token, int64_t h,
                               int64_t x) {
  switch (format) {
    case FUSEDATTN_FORMAT_BHSD: return {page, h, token, x};
    case FUSEDATTN_FORMAT_SBHD: return {token, page, h, x};
    default: return {page, token, h, x};
  }
}

HostTensor Int32Vector(const std::vector<int32_t>& values) {
  HostTensor t(FUSEDATTN_DTYPE_INT32, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), values[i]);
  return t;
}

// The page table entry of sequence b for key j.
int64_t PageOf(const ProblemTensors& t, int64_t b, int64_t j) {
  return static_cast<int64_t>(t.page_table.at({b, j / t.config.page_size}));
}

// The same problem on contiguous K/V: keys gathered from the pages (BSHD for dense queries, with
// NaN in the rows past each sequence, which must never be read; packed THD for THD queries), the
// key lengths as cu_seqlens_kv, and the mask's padding form (paged K/V always has per-sequence
// key lengths). Everything else — q, the outputs with their poison, bias, ... — as it is.
ProblemTensors Contiguous(const ProblemTensors& paged) {
  ProblemTensors d = paged;
  fusedattn_config& c = d.config;
  const int64_t B = c.batch, HKV = c.heads_kv, page = c.page_size;
  const bool thd = c.q_format == FUSEDATTN_FORMAT_THD;
  c.page_size = 0;
  c.kv_format = thd ? FUSEDATTN_FORMAT_THD : FUSEDATTN_FORMAT_BSHD;
  if (!thd) c.mask = PaddingVariant(c.mask);
  std::vector<int32_t> cu_q(B + 1, 0), cu_kv(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    cu_q[b + 1] = cu_q[b] + paged.len_q[b];
    cu_kv[b + 1] = cu_kv[b] + paged.len_kv[b];
  }
  if (paged.cu_seqlens_q.empty()) d.cu_seqlens_q = Int32Vector(cu_q);
  d.cu_seqlens_kv = Int32Vector(cu_kv);
  d.seq_offsets_kv = HostTensor();
  d.page_table = HostTensor();
  d.seqlens_kv = HostTensor();
  d.num_pages = 0;
  for (auto [out, pool, dim] :
       {std::tuple<HostTensor*, const HostTensor*, int64_t>{&d.k, &paged.k, c.head_dim_qk},
        {&d.v, &paged.v, c.head_dim_v}}) {
    *out = thd ? HostTensor(c.qkv_dtype, {std::max<int64_t>(1, cu_kv[B]), HKV, dim})
               : HostTensor(c.qkv_dtype, {B, c.max_seqlen_kv, HKV, dim});
    out->fill(std::numeric_limits<double>::quiet_NaN());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < paged.len_kv[b]; ++j)
        for (int64_t h = 0; h < HKV; ++h)
          for (int64_t x = 0; x < dim; ++x) {
            double value = pool->at(PoolIndex(paged.config.kv_format, PageOf(paged, b, j),
                                              j % page, h, x));
            out->set(out->offset_of(thd ? std::vector<int64_t>{cu_kv[b] + j, h, x}
                                        : std::vector<int64_t>{b, j, h, x}),
                     value);
          }
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// Score modifiers the variants use (graphs live as long as the process)
// ---------------------------------------------------------------------------------------------

enum class Mod { kNone, kGraph, kKvTensor };

// A tanh soft-cap in the graph and a mask_mod that hides key 2.
const fusedattn_score_mod* GraphMod() {
  static ScoreMod* mod = [] {
    auto* m = new ScoreMod;
    Expr s = m->score();
    m->set_score(4.0 * tanh(s / 4.0));
    m->set_mask(ne(m->kv_idx(), 2.0));
    m->finalize();
    return m;
  }();
  return mod->get();
}

// s + bias_kv[j]: a tensor along the key axis (positions inside the sequence, not in a page).
const fusedattn_score_mod* KvTensorMod() {
  static ScoreMod* mod = [] {
    auto* m = new ScoreMod;
    Expr bias = m->tensor("bias_kv", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_KV, false);
    m->set_score(m->score() + bias);
    m->finalize();
    return m;
  }();
  return mod->get();
}

// ---------------------------------------------------------------------------------------------
// Variants (what the problem computes) and shapes (how queries and pages are laid out)
// ---------------------------------------------------------------------------------------------

struct Variant {
  std::string name;
  std::function<void(fusedattn_config&)> apply;
  Mod mod = Mod::kNone;
};

std::vector<Variant> Variants() {
  auto mask = [](fusedattn_mask m) { return [m](fusedattn_config& c) { c.mask = m; }; };
  return {
      {"Plain", [](fusedattn_config&) {}},
      {"Causal", mask(FUSEDATTN_MASK_CAUSAL)},
      {"CausalBottomRight", mask(FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT)},
      {"Padding", mask(FUSEDATTN_MASK_PADDING)},
      {"PaddingCausal", mask(FUSEDATTN_MASK_PADDING_CAUSAL)},
      {"PaddingCausalBottomRight", mask(FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT)},
      {"Window", [](auto& c) { c.window_left = 3, c.window_right = 1; }},
      {"CausalBottomRightWindow",
       [](auto& c) { c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT, c.window_left = 4; }},
      {"Softcap", [](auto& c) { c.softcap = 2.5, c.attn_scale = 1.5; }},
      {"OffByOne", [](auto& c) { c.softmax_type = FUSEDATTN_SOFTMAX_OFF_BY_ONE; }},
      {"LearnableSink", [](auto& c) { c.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK; }},
      {"Alibi",
       [](auto& c) {
         c.bias_type = FUSEDATTN_BIAS_ALIBI, c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
       }},
      {"PreScaleBias",
       [](auto& c) {
         c.bias_type = FUSEDATTN_BIAS_PRE_SCALE, c.bias_batch = c.batch, c.bias_heads = c.heads_q;
       }},
      {"PostScaleBiasBroadcast", [](auto& c) { c.bias_type = FUSEDATTN_BIAS_POST_SCALE; }},
      {"Dropout", [](auto& c) { c.dropout = 0.3; }},
      {"MultiQuery", [](auto& c) { c.heads_kv = 1; }},
      {"NoGrouping", [](auto& c) { c.heads_kv = c.heads_q; }},
      {"HeadDimsDiffer", [](auto& c) { c.head_dim_v = 6; }},
      {"Float16", [](auto& c) { c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT16; }},
      {"Float32", [](auto& c) { c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32; }},
      {"ScoreMod", [](fusedattn_config&) {}, Mod::kGraph},
      {"ScoreModKvTensor", [](fusedattn_config&) {}, Mod::kKvTensor},
  };
}

struct Shape {
  std::string name;
  fusedattn_format q_format;     // q, o, dO, dQKV
  fusedattn_format pool_format;  // kv_format: the pages' layout
  int64_t page_size;
  int64_t max_seqlen_q;
  bool share_prefix = false;
  bool thd_gaps = false;
  bool padded_strides = false;
};

std::vector<Shape> Shapes() {
  return {
      {"BshdQueriesBshdPages4", FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_BSHD, 4, 5},
      {"ThdChunksBhsdPages3Gaps", FUSEDATTN_FORMAT_THD, FUSEDATTN_FORMAT_BHSD, 3, 5, false, true},
      {"SbhdQueriesSbhdPageLongerThanSequences", FUSEDATTN_FORMAT_SBHD, FUSEDATTN_FORMAT_SBHD, 16,
       5},
      {"BhsdQueriesBshdPages1SharedPrefix", FUSEDATTN_FORMAT_BHSD, FUSEDATTN_FORMAT_BSHD, 1, 5,
       true},
      {"DecodeBshdBhsdPages8SharedPrefix", FUSEDATTN_FORMAT_BSHD, FUSEDATTN_FORMAT_BHSD, 8, 1,
       true},
      {"ThdChunksBshdPages5PaddedStrides", FUSEDATTN_FORMAT_THD, FUSEDATTN_FORMAT_BSHD, 5, 4,
       false, false, true},
  };
}

// Test names print the variant and shape by name.
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }
void PrintTo(const Shape& s, std::ostream* os) { *os << s.name; }

fusedattn_config PagedConfig(const Shape& shape) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.batch = 3, c.heads_q = 4, c.heads_kv = 2;
  c.max_seqlen_q = shape.max_seqlen_q, c.max_seqlen_kv = 13;
  c.head_dim_qk = 8, c.head_dim_v = 8;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  c.q_format = c.o_format = c.do_format = c.dqkv_format = shape.q_format;
  c.kv_format = shape.pool_format;
  c.page_size = shape.page_size;
  c.return_lse = 1;
  c.return_max_logit = 1;
  return c;
}

TensorOptions PagedOptions(const Shape& shape) {
  TensorOptions o;
  o.seed = 21;
  o.share_prefix = shape.share_prefix;
  o.thd_gaps = shape.thd_gaps;
  o.padded_strides = shape.padded_strides;
  // Sequence 0 at max_seqlen (drawn so); one empty cache and one of length 1 among the others
  // would hide a shuffled table's errors, so the random draw decides (seed fixed).
  return o;
}

// The score_mod tensors of a run, kept alive with their descriptors.
struct ModTensors {
  std::vector<HostTensor> tensors;
  std::vector<fusedattn_tensor> descs;
  void Set(fusedattn_fwd_args* args) {
    descs.clear();
    for (const HostTensor& t : tensors) descs.push_back(t.desc());
    args->num_score_mod_tensors = static_cast<int64_t>(descs.size());
    args->score_mod_tensors = descs.empty() ? nullptr : descs.data();
  }
};

ModTensors MakeModTensors(Mod mod, const fusedattn_config& c) {
  ModTensors m;
  if (mod == Mod::kKvTensor) {
    HostTensor bias(FUSEDATTN_DTYPE_FLOAT32, {c.max_seqlen_kv});
    for (int64_t j = 0; j < c.max_seqlen_kv; ++j) bias.set(j, 0.25 * static_cast<double>(j % 5));
    m.tensors.push_back(bias);
  }
  return m;
}

test::Result RunForward(const fusedattn_config& c, ProblemTensors* t, ModTensors* mods) {
  fusedattn_fwd_args args = t->fwd_args();
  if (mods) mods->Set(&args);
  return test::Forward(c, args);
}

void ExpectSameOutputs(const ProblemTensors& paged, const ProblemTensors& dense) {
  EXPECT_FALSE(test::AllPoison(paged.o)) << "the paged run wrote no O";
  for (auto [name, out, ref] :
       {std::tuple<const char*, const HostTensor*, const HostTensor*>{"o", &paged.o, &dense.o},
        {"lse", &paged.lse, &dense.lse},
        {"max_logit", &paged.max_logit, &dense.max_logit}}) {
    EXPECT_MATCHES(name, *out, *ref, 0.0, "paged against contiguous");
    EXPECT_TRUE(test::SameBytes(*out, *ref)) << name << " differs from the contiguous run's";
  }
}

class PagedKv : public ::testing::TestWithParam<std::tuple<Variant, Shape>> {};

TEST_P(PagedKv, EqualsTheContiguousProblem) {
  const auto& [variant, shape] = GetParam();
  fusedattn_config c = PagedConfig(shape);
  variant.apply(c);
  if (variant.mod == Mod::kGraph) c.score_mod = GraphMod();
  if (variant.mod == Mod::kKvTensor) c.score_mod = KvTensorMod();
  ProblemTensors paged = MakeProblemTensors(c, PagedOptions(shape));
  ProblemTensors dense = Contiguous(paged);
  ModTensors mods = MakeModTensors(variant.mod, c);

  test::Result r = RunForward(c, &paged, &mods);
  ASSERT_TRUE(r.ok()) << "paged: " << test::StatusText(r);
  r = RunForward(dense.config, &dense, &mods);
  ASSERT_TRUE(r.ok()) << "contiguous: " << test::StatusText(r);
  ExpectSameOutputs(paged, dense);
}

INSTANTIATE_TEST_SUITE_P(
    EveryVariant, PagedKv, ::testing::Combine(::testing::ValuesIn(Variants()),
                                              ::testing::ValuesIn(Shapes())),
    [](const auto& info) {
      return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name;
    });

// ---------------------------------------------------------------------------------------------
// The table: what is read and what is not
// ---------------------------------------------------------------------------------------------

Shape DecodeShape() { return Shapes()[4]; }
Shape ChunkShape() { return Shapes()[1]; }

// Runs the paged problem and its contiguous twin; both must succeed and agree bit for bit.
void ExpectEqualsContiguous(const fusedattn_config& c, ProblemTensors* paged) {
  ProblemTensors dense = Contiguous(*paged);
  test::Result r = RunForward(c, paged, nullptr);
  ASSERT_TRUE(r.ok()) << "paged: " << test::StatusText(r);
  r = RunForward(dense.config, &dense, nullptr);
  ASSERT_TRUE(r.ok()) << "contiguous: " << test::StatusText(r);
  ExpectSameOutputs(*paged, dense);
}

TEST(PagedKvTable, EntriesPastASequenceAreNeverRead) {
  for (int32_t unused : {-1, -1000, std::numeric_limits<int32_t>::max()}) {
    SCOPED_TRACE("unused entries = " + std::to_string(unused));
    fusedattn_config c = PagedConfig(ChunkShape());
    TensorOptions o = PagedOptions(ChunkShape());
    o.unused_page_entry = unused;
    o.extra_table_width = 3;  // a wider table than max_seqlen_kv needs is fine too
    o.len_q = {5, 2, 1}, o.len_kv = {13, 4, 0};
    ProblemTensors paged = MakeProblemTensors(c, o);
    ExpectEqualsContiguous(c, &paged);
  }
}

TEST(PagedKvTable, PagesNoSequenceUsesAreNeverRead) {
  fusedattn_config c = PagedConfig(DecodeShape());
  TensorOptions o = PagedOptions(DecodeShape());
  o.spare_pages = 4;
  ProblemTensors paged = MakeProblemTensors(c, o);
  // NaN in every page the table does not point at: reading one would show in the outputs.
  std::vector<bool> used(static_cast<size_t>(paged.num_pages), false);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t j = 0; j < paged.len_kv[b]; j += c.page_size) used[PageOf(paged, b, j)] = true;
  int64_t spare = 0;
  for (int64_t page = 0; page < paged.num_pages; ++page) {
    if (used[page]) continue;
    ++spare;
    for (HostTensor* pool : {&paged.k, &paged.v})
      for (int64_t token = 0; token < c.page_size; ++token)
        for (int64_t h = 0; h < c.heads_kv; ++h)
          for (int64_t x = 0; x < c.head_dim_qk; ++x)
            pool->set(pool->offset_of(PoolIndex(c.kv_format, page, token, h, x)),
                      std::numeric_limits<double>::quiet_NaN());
  }
  ASSERT_GE(spare, 4);
  ExpectEqualsContiguous(c, &paged);
}

TEST(PagedKvTable, SequencesMayShareAndReorderPages) {
  // Sequence 1's first page is sequence 0's second, sequence 2 reads one page twice.
  fusedattn_config c = PagedConfig(DecodeShape());
  c.page_size = 4;
  TensorOptions o = PagedOptions(DecodeShape());
  o.len_kv = {12, 6, 8};
  ProblemTensors paged = MakeProblemTensors(c, o);
  auto entry = [&](int64_t b, int64_t e) -> int64_t {
    return b * paged.page_table.shape()[1] + e;
  };
  paged.page_table.set(entry(1, 0), paged.page_table.get(entry(0, 1)));
  paged.page_table.set(entry(2, 1), paged.page_table.get(entry(2, 0)));
  ExpectEqualsContiguous(c, &paged);
}

TEST(PagedKvTable, EmptyCacheGivesMaskedRowsAndTheLastPageMayBePartlyFilled) {
  fusedattn_config c = PagedConfig(DecodeShape());
  TensorOptions o = PagedOptions(DecodeShape());
  o.len_kv = {13, 0, 1};  // 13 = one full page of 8 and 5 tokens of the next
  ProblemTensors paged = MakeProblemTensors(c, o);
  ExpectEqualsContiguous(c, &paged);
  for (int64_t h = 0; h < c.heads_q; ++h) {
    EXPECT_EQ(paged.lse.at({1, h, 0}), -std::numeric_limits<double>::infinity());
    for (int64_t x = 0; x < c.head_dim_v; ++x) EXPECT_EQ(paged.o.at({1, 0, h, x}), 0.0);
  }
}

// ---------------------------------------------------------------------------------------------
// Decode and chunked prefill
// ---------------------------------------------------------------------------------------------

// A decode step (one query per sequence) with a bottom-right causal mask sees every cached key:
// it equals the same step without a mask.
TEST(PagedKvServing, DecodeWithBottomRightCausalSeesTheWholeCache) {
  fusedattn_config causal = PagedConfig(DecodeShape());
  causal.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  fusedattn_config unmasked = causal;
  unmasked.mask = FUSEDATTN_MASK_NONE;
  ProblemTensors a = MakeProblemTensors(causal, PagedOptions(DecodeShape()));
  ProblemTensors b = a;
  ASSERT_TRUE(RunForward(causal, &a, nullptr).ok());
  ASSERT_TRUE(RunForward(unmasked, &b, nullptr).ok());
  EXPECT_TRUE(test::SameBytes(a.o, b.o));
  EXPECT_TRUE(test::SameBytes(a.lse, b.lse));
}

// Chunked prefill: a chunk of new tokens (the last sq of the sequence's sk cached keys) under a
// bottom-right causal mask. Its last token attends to every key, as a decode step with that
// token as the query does.
TEST(PagedKvServing, ChunkedPrefillsLastTokenEqualsADecodeStep) {
  fusedattn_config chunk = PagedConfig(ChunkShape());
  chunk.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  chunk.return_max_logit = 0;
  TensorOptions o = PagedOptions(ChunkShape());
  o.len_q = {4, 3, 1}, o.len_kv = {13, 7, 2};
  ProblemTensors prefill = MakeProblemTensors(chunk, o);
  ASSERT_TRUE(RunForward(chunk, &prefill, nullptr).ok());

  // The decode step: THD with one query per sequence, the chunk's last token, same cache.
  fusedattn_config decode = chunk;
  decode.max_seqlen_q = 1;
  TensorOptions od = o;
  od.len_q = {1, 1, 1};
  od.thd_gaps = false;
  ProblemTensors step = MakeProblemTensors(decode, od);
  step.k = prefill.k, step.v = prefill.v, step.page_table = prefill.page_table;
  step.seqlens_kv = prefill.seqlens_kv;
  for (int64_t b = 0; b < chunk.batch; ++b) {
    const int64_t last = prefill.start_q[b] + prefill.len_q[b] - 1;
    for (int64_t h = 0; h < chunk.heads_q; ++h)
      for (int64_t x = 0; x < chunk.head_dim_qk; ++x)
        step.q.set(step.q.offset_of({b, h, x}), prefill.q.at({last, h, x}));
  }
  ASSERT_TRUE(RunForward(decode, &step, nullptr).ok());
  for (int64_t b = 0; b < chunk.batch; ++b) {
    const int64_t last = prefill.start_q[b] + prefill.len_q[b] - 1;
    for (int64_t h = 0; h < chunk.heads_q; ++h) {
      for (int64_t x = 0; x < chunk.head_dim_v; ++x)
        EXPECT_EQ(step.o.at({b, h, x}), prefill.o.at({last, h, x}))
            << "sequence " << b << " head " << h << " feature " << x;
      EXPECT_EQ(step.lse.at({b, h, 0}), prefill.lse.at({b, h, prefill.len_q[b] - 1}));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Selection
// ---------------------------------------------------------------------------------------------

TEST(PagedKvSelection, TheReferenceRunsPagedProblemsOnTheCpu) {
  fusedattn_config c = PagedConfig(DecodeShape());
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  test::Result r = test::GetBackend(c, &backend);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  EXPECT_EQ(backend, FUSEDATTN_BACKEND_REFERENCE);
}

// Every GPU backend compiled in refuses this paged problem (head dims of 8 with return_max_logit,
// checked without a GPU's facts) and its reason says that the problem is a paged one (the reason
// of its check, asked as selection asks it, with a CUDA device taken to be present).
TEST(PagedKvSelection, EveryGpuBackendRefusesItNamingPagedKv) {
  fusedattn_config c = PagedConfig(DecodeShape());
  c.device = FUSEDATTN_DEVICE_CUDA;
  Problem problem;
  ASSERT_TRUE(MakeProblem(&c, /*has_cuda_device=*/true, &problem).ok());
  int asked = 0;
  for (fusedattn_backend id :
       {FUSEDATTN_BACKEND_SMALL_SEQ, FUSEDATTN_BACKEND_CUDNN, FUSEDATTN_BACKEND_FLASH}) {
    Backend* backend = FindBackend(id);
    ASSERT_NE(backend, nullptr);
    Status s = backend->check(problem);
    EXPECT_EQ(s.code(), FUSEDATTN_ERROR_NOT_SUPPORTED) << backend->name();
    if (s.message().rfind("not built", 0) == 0) continue;  // the reason it is absent instead
    ++asked;
    EXPECT_NE(s.message().find("paged K/V (page_size = 8)"), std::string::npos)
        << backend->name() << ": " << s.message();
  }
  if (asked == 0) GTEST_SKIP() << "no GPU backend in this build";
}

// ---------------------------------------------------------------------------------------------
// Validation: one thing broken at a time; the status, a message naming the field and the value,
// and no output written.
// ---------------------------------------------------------------------------------------------

struct Broken {
  fusedattn_config config;
  ProblemTensors tensors;
  fusedattn_fwd_args args;
};

// A valid paged chunked prefill (THD queries, BHSD pages of 3) with lengths {5, 2, 1} against
// caches of {13, 4, 0} keys.
Broken ValidProblem() {
  Broken p;
  p.config = PagedConfig(ChunkShape());
  TensorOptions o = PagedOptions(ChunkShape());
  o.len_q = {5, 2, 1}, o.len_kv = {13, 4, 0};
  p.tensors = MakeProblemTensors(p.config, o);
  p.args = p.tensors.fwd_args();
  return p;
}

struct Rejection {
  std::string name;
  std::function<void(Broken&)> breaks;
  fusedattn_status code;
  std::vector<std::string> mentions;
};

// A page table entry of the valid problem (entries of sequence 0 cover its 13 keys: 0..4).
void SetEntry(Broken& p, int64_t b, int64_t e, int32_t value) {
  p.tensors.page_table.set(b * p.tensors.page_table.shape()[1] + e, value);
}

std::vector<Rejection> Rejections() {
  const auto invalid = FUSEDATTN_ERROR_INVALID_ARGUMENT;
  return {
      {"PageIndexEqualToThePoolSize",
       [](Broken& p) { SetEntry(p, 0, 4, static_cast<int32_t>(p.tensors.num_pages)); }, invalid,
       {"page_table[0, 4]", "num_pages", "sequence 0"}},
      {"NegativePageIndex", [](Broken& p) { SetEntry(p, 1, 1, -1); }, invalid,
       {"page_table[1, 1] = -1", "[0, num_pages"}},
      {"HugePageIndex",
       [](Broken& p) { SetEntry(p, 0, 0, std::numeric_limits<int32_t>::max()); }, invalid,
       {"page_table[0, 0] = 2147483647"}},
      {"KeyLengthAboveMaxSeqlenKv", [](Broken& p) { p.tensors.seqlens_kv.set(1, 14); }, invalid,
       {"seqlens_kv[1] = 14", "max_seqlen_kv = 13"}},
      {"NegativeKeyLength", [](Broken& p) { p.tensors.seqlens_kv.set(2, -3); }, invalid,
       {"seqlens_kv[2] = -3"}},
      {"TableTooShortForMaxSeqlenKv",
       [](Broken& p) {
         p.tensors.page_table = HostTensor(FUSEDATTN_DTYPE_INT32, {3, 4});
         p.tensors.page_table.fill(0);
       },
       invalid, {"args.page_table.shape = [3, 4]", "max_seqlen_kv = 13", "at least 5 pages"}},
      {"TableRowsForAnotherBatch",
       [](Broken& p) { p.tensors.page_table = HostTensor(FUSEDATTN_DTYPE_INT32, {2, 5}); },
       invalid, {"args.page_table.shape = [2, 5]", "[3, 5]"}},
      {"TableNotInt32",
       [](Broken& p) { p.tensors.page_table = HostTensor(FUSEDATTN_DTYPE_FLOAT32, {3, 5}); },
       invalid, {"args.page_table.dtype = float32", "int32"}},
      {"TableOneDimensional",
       [](Broken& p) { p.tensors.page_table = HostTensor(FUSEDATTN_DTYPE_INT32, {15}); },
       invalid, {"args.page_table.ndim = 1"}},
      {"TableRowsNotContiguous",
       [](Broken& p) {
         p.tensors.page_table = HostTensor(FUSEDATTN_DTYPE_INT32, {3, 5}, {10, 2}, 30);
       },
       invalid, {"args.page_table.strides[1] = 2", "must be 1"}},
      {"NoPageTable", [](Broken& p) { p.tensors.page_table = HostTensor(); }, invalid,
       {"args.page_table.data is NULL", "config.page_size = 3"}},
      {"NoKeyLengths", [](Broken& p) { p.tensors.seqlens_kv = HostTensor(); }, invalid,
       {"args.seqlens_kv.data is NULL"}},
      {"KeyLengthsForAnotherBatch",
       [](Broken& p) { p.tensors.seqlens_kv = Int32Vector({13, 4}); }, invalid,
       {"args.seqlens_kv.shape = [2]", "[3]"}},
      {"PageSizeDiffersFromThePools", [](Broken& p) { p.config.page_size = 4; }, invalid,
       {"args.k.shape[2] = 3 tokens per page", "config.page_size = 4"}},
      {"ValuePoolWithOtherPages",
       [](Broken& p) {
         const auto& s = p.tensors.v.shape();
         p.tensors.v = HostTensor(p.config.qkv_dtype, {s[0] + 1, s[1], s[2], s[3]});
       },
       invalid, {"args.v.shape[0]", "pages but args.k has"}},
      {"PoolOfThreeDimensions",
       [](Broken& p) {
         p.tensors.k = HostTensor(p.config.qkv_dtype, {p.tensors.num_pages * 3, 2, 8});
       },
       invalid, {"args.k.ndim = 3", "[num_pages, heads_kv, page_size, d]"}},
      {"CuSeqlensKvGiven",
       [](Broken& p) { p.tensors.cu_seqlens_kv = Int32Vector({0, 13, 17, 17}); }, invalid,
       {"args.cu_seqlens_kv is given", "args.seqlens_kv"}},
      {"SeqOffsetsKvGiven",
       [](Broken& p) { p.tensors.seq_offsets_kv = Int32Vector({0, 13, 17, 17}); }, invalid,
       {"args.seq_offsets_kv is given", "page_table"}},
      {"PagesAsThd",
       [](Broken& p) { p.config.kv_format = FUSEDATTN_FORMAT_THD; }, invalid,
       {"config.kv_format = THD", "page_size = 3", "BSHD [num_pages, page_size, heads_kv, d]"}},
      {"OutputNotThdWithThdQueries",
       [](Broken& p) { p.config.o_format = FUSEDATTN_FORMAT_BSHD; }, invalid,
       {"config.o_format = BSHD", "kv_format is the layout of the pages"}},
      {"NegativePageSize", [](Broken& p) { p.config.page_size = -2; }, invalid,
       {"config.page_size = -2"}},
      {"Training", [](Broken& p) { p.config.is_training = 1; }, invalid,
       {"config.is_training = 1", "forward only"}},
      {"TableWithoutPaging",
       [](Broken& p) {
         // A contiguous problem (THD keys from cu_seqlens_kv) handed a page table.
         Broken contiguous = p;
         contiguous.tensors = Contiguous(p.tensors);
         contiguous.tensors.page_table = p.tensors.page_table;
         contiguous.config = contiguous.tensors.config;
         p = contiguous;
       },
       invalid, {"args.page_table is given", "config.page_size = 0"}},
  };
}

void PrintTo(const Rejection& r, std::ostream* os) { *os << r.name; }

class PagedKvValidation : public ::testing::TestWithParam<Rejection> {};

TEST_P(PagedKvValidation, IsRefusedWithoutWritingOutputs) {
  const Rejection& rejection = GetParam();
  Broken p = ValidProblem();
  ASSERT_TRUE(RunForward(p.config, &p.tensors, nullptr).ok()) << "the valid problem runs";
  p.tensors.poison_outputs();
  rejection.breaks(p);
  test::Result r = RunForward(p.config, &p.tensors, nullptr);
  EXPECT_EQ(r.status, rejection.code) << test::StatusText(r);
  for (const std::string& mention : rejection.mentions)
    EXPECT_NE(r.message.find(mention), std::string::npos)
        << "the message \"" << r.message << "\" does not mention '" << mention << "'";
  EXPECT_TRUE(test::AllPoison(p.tensors.o)) << "O was written";
  EXPECT_TRUE(test::AllPoison(p.tensors.lse)) << "LSE was written";
  EXPECT_TRUE(test::AllPoison(p.tensors.max_logit)) << "max_logit was written";
}

INSTANTIATE_TEST_SUITE_P(EveryRule, PagedKvValidation, ::testing::ValuesIn(Rejections()),
                         [](const auto& info) { return info.param.name; });

// The backward is not defined for paged K/V: fusedattn_bwd and its workspace size say so.
TEST(PagedKvValidation, TheBackwardRefusesAPagedConfig) {
  Broken p = ValidProblem();
  size_t bytes = 0;
  char msg[4096] = "";
  EXPECT_EQ(fusedattn_bwd_workspace_size(&p.config, &bytes, msg, sizeof msg),
            FUSEDATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("paged K/V is forward only"), std::string::npos) << msg;
  test::Result r = test::Backward(p.config, p.tensors.bwd_args());
  EXPECT_EQ(r.status, FUSEDATTN_ERROR_INVALID_ARGUMENT) << test::StatusText(r);
  EXPECT_NE(r.message.find("config.page_size = 3: paged K/V is forward only"), std::string::npos)
      << r.message;
  EXPECT_TRUE(test::AllPoison(p.tensors.dq)) << "dQ was written";
}

// ---------------------------------------------------------------------------------------------
// Callers compiled before paged K/V existed
// ---------------------------------------------------------------------------------------------

// Their config ends where page_size begins and their args where page_table begins: what lies past
// the end is not read (stale bytes there are ignored), so K/V are contiguous as they meant.
TEST(PagedKvAbi, ConfigsAndArgsOfTheEarlierLayoutReadAsContiguousKv) {
  Broken p = ValidProblem();
  ProblemTensors contiguous = Contiguous(p.tensors);
  fusedattn_config earlier = contiguous.config;
  earlier.struct_size = offsetof(fusedattn_config, page_size);
  earlier.page_size = 7;  // stale
  fusedattn_fwd_args args = contiguous.fwd_args();
  args.struct_size = offsetof(fusedattn_fwd_args, page_table);
  args.page_table = p.tensors.page_table.desc();  // stale
  test::Result r = test::Forward(earlier, args);
  ASSERT_TRUE(r.ok()) << test::StatusText(r);
  ProblemTensors full = Contiguous(p.tensors);
  ASSERT_TRUE(RunForward(full.config, &full, nullptr).ok());
  EXPECT_TRUE(test::SameBytes(contiguous.o, full.o));
  EXPECT_FALSE(test::AllPoison(contiguous.o));
}

}  // namespace
}  // namespace fusedattn
