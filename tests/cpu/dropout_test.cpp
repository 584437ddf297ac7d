// Dropout: the Philox4x32-10 generator against Random123's published known answers, the mask the
// reference draws against the spec's rule bit for bit, reproducibility, and statistics (keep
// fraction, and E[O] under dropout equals O without it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "brute_force.h"
#include "common/philox.h"
#include "test_util.h"
#include "testing/tensors.h"

namespace fusedattn {
namespace {

using testing::HostTensor;
using testing::MakeProblemTensors;
using testing::ProblemTensors;
using testing::TensorOptions;

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 known answers (Random123, tests/kat_vectors: counter, key -> output).
// ---------------------------------------------------------------------------------------------
void ExpectPhilox(Philox4 counter, uint32_t k0, uint32_t k1, Philox4 want) {
  Philox4 got = Philox4x32_10(counter, k0, k1);
  EXPECT_EQ(got.x, want.x);
  EXPECT_EQ(got.y, want.y);
  EXPECT_EQ(got.z, want.z);
  EXPECT_EQ(got.w, want.w);
}

TEST(Philox, KnownAnswerForZeroCounterAndKey) {
  ExpectPhilox({0, 0, 0, 0}, 0, 0, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
}

TEST(Philox, KnownAnswerForAllOnesCounterAndKey) {
  ExpectPhilox({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0xffffffffu, 0xffffffffu,
               {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
}

TEST(Philox, KnownAnswerForPiDigits) {
  ExpectPhilox({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u, 0x299f31d0u,
               {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

// threshold = min(floor(dropout * 2^32), 2^32 - 1)
TEST(DropoutThreshold, IsFloorOfProbabilityTimesTwoToThe32Clamped) {
  EXPECT_EQ(DropoutRow::Threshold(0.0), 0u);
  EXPECT_EQ(DropoutRow::Threshold(0.5), 0x80000000u);
  EXPECT_EQ(DropoutRow::Threshold(0.1), 429496729u);  // 0.1 * 2^32 = 429496729.6
  EXPECT_EQ(DropoutRow::Threshold(std::ldexp(1.0, -32)), 1u);
  EXPECT_EQ(DropoutRow::Threshold(std::ldexp(3.0, -33)), 1u);  // 1.5 -> 1
  EXPECT_EQ(DropoutRow::Threshold(1.0 - std::ldexp(1.0, -33)), 0xFFFFFFFFu);
  EXPECT_EQ(DropoutRow::Threshold(1.0 - std::ldexp(1.0, -30)), 0xFFFFFFFCu);
}

// ---------------------------------------------------------------------------------------------
// The mask through the public API. With q = 0 every visible score is 0, so p_j = 1 / n for the n
// visible keys (vanilla softmax); with V one-hot (v[j, x] = 1 when x = j) the output exposes each
// key's dropout factor: O[i, x = j] = keep_j / ((1 - dropout) * n).
// ---------------------------------------------------------------------------------------------
struct MaskProblem {
  fusedattn_config config;
  ProblemTensors tensors;
};

MaskProblem OneHotProblem(fusedattn_config c, TensorOptions options) {
  c.head_dim_qk = 1;
  c.head_dim_v = c.max_seqlen_kv;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.device = FUSEDATTN_DEVICE_CPU;
  MaskProblem m{c, MakeProblemTensors(c, options)};
  ProblemTensors& t = m.tensors;
  t.q.fill(0.0);
  t.v.fill(0.0);
  const auto seqs = brute_force::SequencesOf(t);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_kv; ++h)
      for (int64_t j = 0; j < seqs[b].len_kv; ++j)
        t.v.set(t.v.offset_of(brute_force::LogicalIndex(c.kv_format, b, j, h, j, seqs[b].start_kv)),
                1.0);
  return m;
}

// For every visible (b, h, i, j): the keep decision read back from O. Fails the test when an
// element of O is neither 0 nor the kept value.
struct ReadMask {
  std::vector<char> kept;  // [b][h][i][j], only visible entries meaningful
  std::vector<char> visible;
  int64_t mismatches_with_spec = 0;  // against brute_force::DropoutKeeps
  int64_t visible_count = 0, kept_count = 0;
};

ReadMask RunAndReadMask(MaskProblem& m) {
  const fusedattn_config& c = m.config;
  ProblemTensors& t = m.tensors;
  ReadMask r;
  test::Result status = test::Forward(c, t.fwd_args());
  EXPECT_TRUE(status.ok()) << test::StatusText(status);
  const auto seqs = brute_force::SequencesOf(t);
  const int64_t HQ = c.heads_q, SQ = c.max_seqlen_q, SKV = c.max_seqlen_kv;
  r.kept.assign(static_cast<size_t>(c.batch * HQ * SQ * SKV), 0);
  r.visible.assign(r.kept.size(), 0);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < HQ; ++h)
      for (int64_t i = 0; i < seqs[b].len_q; ++i) {
        int64_t n = 0;
        for (int64_t j = 0; j < SKV; ++j)
          n += brute_force::Visible(c, i, j, seqs[b].len_q, seqs[b].len_kv);
        for (int64_t j = 0; j < SKV; ++j) {
          if (!brute_force::Visible(c, i, j, seqs[b].len_q, seqs[b].len_kv)) continue;
          const size_t at = static_cast<size_t>(((b * HQ + h) * SQ + i) * SKV + j);
          const double o =
              t.o.at(brute_force::LogicalIndex(c.o_format, b, i, h, j, seqs[b].start_q));
          const double factor = o * (1.0 - c.dropout) * static_cast<double>(n);
          EXPECT_TRUE(std::fabs(factor) < 1e-5 || std::fabs(factor - 1) < 1e-5)
              << "O[b=" << b << ", h=" << h << ", i=" << i << ", x=" << j << "] = " << o
              << " is neither 0 nor the kept value";
          r.visible[at] = 1;
          r.kept[at] = factor > 0.5;
          ++r.visible_count;
          r.kept_count += r.kept[at];
          const bool spec =
              brute_force::DropoutKeeps(c, t.dropout_seed, t.dropout_offset, b, h, i, j);
          r.mismatches_with_spec += spec != static_cast<bool>(r.kept[at]);
        }
      }
  return r;
}

fusedattn_config MaskConfig() {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 3, c.heads_q = 4, c.heads_kv = 2, c.max_seqlen_q = 6, c.max_seqlen_kv = 13;
  c.dropout = 0.3;
  return c;
}

TEST(DropoutMask, MatchesTheSpecRuleBitForBit) {
  MaskProblem m = OneHotProblem(MaskConfig(), {});
  // Seed and offset with both 32-bit halves in use.
  m.tensors.dropout_seed = 0x0123456789ABCDEFull;
  m.tensors.dropout_offset = 0x0000000500000007ull;
  ReadMask r = RunAndReadMask(m);
  EXPECT_EQ(r.visible_count, 3 * 4 * 6 * 13);
  EXPECT_EQ(r.mismatches_with_spec, 0);
}

// The boundary of the keep rule: an element whose word u equals the threshold is kept
// (u >= threshold). Choosing dropout = u / 2^32 for one element's own word u puts it exactly there.
TEST(DropoutMask, ElementWhoseWordEqualsTheThresholdIsKept) {
  MaskProblem m = OneHotProblem(MaskConfig(), {});
  const uint64_t seed = m.tensors.dropout_seed, offset = m.tensors.dropout_offset;
  // Element (b, h, i, j) = (1, 2, 3, 6): row = (1 * 4 + 2) * 6 + 3, counter (6 / 4, row, offset).
  const uint32_t row = (1 * 4 + 2) * 6 + 3;
  const Philox4 words =
      Philox4x32_10({1, row, static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)},
                    static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint32_t u = words.z;  // word j % 4 = 2
  ASSERT_GT(u, 0u);
  m.config.dropout = std::ldexp(static_cast<double>(u), -32);  // exact: u has 32 bits
  ASSERT_EQ(DropoutRow::Threshold(m.config.dropout), u);
  ReadMask r = RunAndReadMask(m);
  const size_t at = static_cast<size_t>(((1 * 4 + 2) * 6 + 3) * 13 + 6);
  EXPECT_TRUE(r.kept[at]) << "u = threshold = " << u << " must be kept";
  EXPECT_EQ(r.mismatches_with_spec, 0);
}

// THD: b is the sequence index and i, j positions inside the sequence; the row counter still uses
// max_seqlen_q, so sequences of different lengths and gaps between them change nothing.
TEST(DropoutMask, InThdUsesSequenceIndexAndPositionsInsideTheSequence) {
  fusedattn_config c = MaskConfig();
  c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  TensorOptions o;
  o.thd_gaps = true;
  o.len_q = {6, 2, 5}, o.len_kv = {13, 9, 5};
  MaskProblem m = OneHotProblem(c, o);
  ReadMask r = RunAndReadMask(m);
  EXPECT_GT(r.visible_count, 0);
  EXPECT_EQ(r.mismatches_with_spec, 0);
}

TEST(DropoutMask, SameSeedAndOffsetGiveBitIdenticalOutputs) {
  fusedattn_config c = MaskConfig();
  c.head_dim_qk = 8, c.head_dim_v = 8, c.is_training = 1;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  c.device = FUSEDATTN_DEVICE_CPU;
  ProblemTensors first = MakeProblemTensors(c, {});
  ProblemTensors second = first;
  ASSERT_TRUE(test::Forward(c, first.fwd_args()).ok());
  ASSERT_TRUE(test::Forward(c, second.fwd_args()).ok());
  EXPECT_TRUE(test::SameBytes(first.o, second.o));
  EXPECT_TRUE(test::SameBytes(first.lse, second.lse));
  ASSERT_TRUE(test::Backward(c, first.bwd_args()).ok());
  ASSERT_TRUE(test::Backward(c, second.bwd_args()).ok());
  EXPECT_TRUE(test::SameBytes(first.dq, second.dq));
  EXPECT_TRUE(test::SameBytes(first.dk, second.dk));
  EXPECT_TRUE(test::SameBytes(first.dv, second.dv));
}

// args.dropout_seed_offset: {seed, offset} read from memory replace the two host fields (here
// zeroed, so that the result can only match by reading the memory), forward and backward alike.
TEST(DropoutSeedOffsetInMemory, GivesTheSameResultsAsTheHostFields) {
  fusedattn_config c = MaskConfig();
  c.head_dim_qk = 8, c.head_dim_v = 8, c.is_training = 1;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.device = FUSEDATTN_DEVICE_CPU;
  ProblemTensors host = MakeProblemTensors(c, {});
  ProblemTensors memory = host;
  const uint64_t seed_offset[2] = {host.dropout_seed, host.dropout_offset};
  memory.dropout_seed = memory.dropout_offset = 0;
  fusedattn_fwd_args fwd = memory.fwd_args();
  fwd.dropout_seed_offset = seed_offset;
  ASSERT_TRUE(test::Forward(c, host.fwd_args()).ok());
  ASSERT_TRUE(test::Forward(c, fwd).ok());
  EXPECT_TRUE(test::SameBytes(host.o, memory.o));
  EXPECT_TRUE(test::SameBytes(host.lse, memory.lse));
  fusedattn_bwd_args bwd = memory.bwd_args();
  bwd.dropout_seed_offset = seed_offset;
  ASSERT_TRUE(test::Backward(c, host.bwd_args()).ok());
  ASSERT_TRUE(test::Backward(c, bwd).ok());
  EXPECT_TRUE(test::SameBytes(host.dq, memory.dq));
  EXPECT_TRUE(test::SameBytes(host.dk, memory.dk));
  EXPECT_TRUE(test::SameBytes(host.dv, memory.dv));
  // And the host fields are what a call without the pointer uses: zero differs.
  ASSERT_TRUE(test::Forward(c, memory.fwd_args()).ok());
  EXPECT_FALSE(test::SameBytes(host.o, memory.o));
}

// Callers compiled before dropout_seed_offset existed pass the shorter struct_size: accepted,
// and the field reads as NULL (the host fields are used).
TEST(DropoutSeedOffsetInMemory, ArgsOfTheEarlierLayoutAreAccepted) {
  fusedattn_config c = MaskConfig();
  c.head_dim_qk = 8, c.head_dim_v = 8;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.device = FUSEDATTN_DEVICE_CPU;
  ProblemTensors a = MakeProblemTensors(c, {});
  ProblemTensors b = a;
  fusedattn_fwd_args args = b.fwd_args();
  args.struct_size = offsetof(fusedattn_fwd_args, dropout_seed_offset);
  const uint64_t ignored[2] = {1, 2};
  args.dropout_seed_offset = ignored;  // past struct_size: never read
  ASSERT_TRUE(test::Forward(c, a.fwd_args()).ok());
  ASSERT_TRUE(test::Forward(c, args).ok());
  EXPECT_TRUE(test::SameBytes(a.o, b.o));
}

// Fraction of visible elements whose keep decision differs between two masks.
double DifferentFraction(const ReadMask& a, const ReadMask& b) {
  int64_t differ = 0, n = 0;
  for (size_t i = 0; i < a.kept.size(); ++i)
    if (a.visible[i]) differ += a.kept[i] != b.kept[i], ++n;
  return static_cast<double>(differ) / static_cast<double>(n);
}

// Two independent masks with keep probability k differ in 2 k (1 - k) of their elements.
TEST(DropoutMask, AnotherOffsetDrawsAnIndependentMask) {
  MaskProblem a = OneHotProblem(MaskConfig(), {});
  MaskProblem b = a;
  b.tensors.dropout_offset = a.tensors.dropout_offset + 1;
  const double differ = DifferentFraction(RunAndReadMask(a), RunAndReadMask(b));
  EXPECT_NEAR(differ, 2 * 0.3 * 0.7, 0.1);
}

TEST(DropoutMask, AnotherSeedDrawsAnIndependentMask) {
  MaskProblem a = OneHotProblem(MaskConfig(), {});
  MaskProblem b = a;
  b.tensors.dropout_seed = a.tensors.dropout_seed ^ (uint64_t{1} << 40);  // high word only
  const double differ = DifferentFraction(RunAndReadMask(a), RunAndReadMask(b));
  EXPECT_NEAR(differ, 2 * 0.3 * 0.7, 0.1);
}

TEST(DropoutMask, AnOffsetDifferingOnlyInItsHighWordDrawsAnotherMask) {
  MaskProblem a = OneHotProblem(MaskConfig(), {});
  MaskProblem b = a;
  b.tensors.dropout_offset = a.tensors.dropout_offset + (uint64_t{1} << 32);
  const double differ = DifferentFraction(RunAndReadMask(a), RunAndReadMask(b));
  EXPECT_NEAR(differ, 2 * 0.3 * 0.7, 0.1);
}

// ---------------------------------------------------------------------------------------------
// Dropout positions (config.dropout_*; fusedattn.h "Dropout mask"): a call placed in a larger
// problem draws that problem's mask at its place, which is how context parallelism runs dropout.
// ---------------------------------------------------------------------------------------------

// Every position field set (and the larger problem's heads and rows): the spec's rule with them
// (brute_force::DropoutKeeps), bit for bit, and another mask than at the call's own positions.
TEST(DropoutPositions, MaskMatchesTheSpecRuleBitForBit) {
  MaskProblem own = OneHotProblem(MaskConfig(), {});
  fusedattn_config c = MaskConfig();
  c.dropout_batch_offset = 2, c.dropout_heads = 9, c.dropout_head_offset = 5;
  c.dropout_rows = 20, c.dropout_row_offset = 7, c.dropout_key_offset = 12;
  MaskProblem placed = OneHotProblem(c, {});
  ReadMask r = RunAndReadMask(placed);
  EXPECT_EQ(r.visible_count, 3 * 4 * 6 * 13);
  EXPECT_EQ(r.mismatches_with_spec, 0);
  EXPECT_NEAR(DifferentFraction(r, RunAndReadMask(own)), 2 * 0.3 * 0.7, 0.1);
}

// THD: b + dropout_batch_offset is the larger problem's sequence, i and j positions inside it.
TEST(DropoutPositions, InThdMatchTheSpecRuleBitForBit) {
  fusedattn_config c = MaskConfig();
  c.q_format = c.kv_format = c.o_format = c.do_format = c.dqkv_format = FUSEDATTN_FORMAT_THD;
  c.mask = FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  c.dropout_batch_offset = 1, c.dropout_rows = 16, c.dropout_row_offset = 10;
  c.dropout_key_offset = 4;
  TensorOptions o;
  o.thd_gaps = true;
  o.len_q = {6, 2, 5}, o.len_kv = {13, 9, 5};
  MaskProblem m = OneHotProblem(c, o);
  ReadMask r = RunAndReadMask(m);
  EXPECT_GT(r.visible_count, 0);
  EXPECT_EQ(r.mismatches_with_spec, 0);
}

// The point of the fields: a block of the whole problem (sequence 1 of 3, query heads 2..3 of 4,
// rows 2..4 of 6, keys 4..11 of 13), run as its own call with its place given, keeps exactly the
// elements the whole problem's call keeps there. Read from both calls' outputs, no oracle.
TEST(DropoutPositions, ABlockKeepsTheWholeProblemsElementsAtItsPlace) {
  MaskProblem whole = OneHotProblem(MaskConfig(), {});
  const ReadMask all = RunAndReadMask(whole);
  fusedattn_config c = MaskConfig();
  c.batch = 1, c.heads_q = 2, c.heads_kv = 1, c.max_seqlen_q = 3, c.max_seqlen_kv = 8;
  c.dropout_batch_offset = 1, c.dropout_heads = 4, c.dropout_head_offset = 2;
  c.dropout_rows = 6, c.dropout_row_offset = 2, c.dropout_key_offset = 4;
  MaskProblem block = OneHotProblem(c, {});
  block.tensors.dropout_seed = whole.tensors.dropout_seed;  // one seed and offset: one mask
  block.tensors.dropout_offset = whole.tensors.dropout_offset;
  const ReadMask part = RunAndReadMask(block);
  ASSERT_EQ(part.visible_count, 2 * 3 * 8);
  int64_t differ = 0;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 8; ++j) {
        const size_t in_block = static_cast<size_t>((h * 3 + i) * 8 + j);
        const size_t in_whole = static_cast<size_t>(((1 * 4 + h + 2) * 6 + i + 2) * 13 + j + 4);
        differ += part.kept[in_block] != all.kept[in_whole];
      }
  EXPECT_EQ(differ, 0) << "of " << part.visible_count << " elements";
}

// A whole problem whose rows see only keys 5..11 (bottom-right causal with window_left 3: row i
// sees keys i + 5 .. i + 8 of 12), and the block of sequence 1 of 2, heads 1..2 of 4 and keys
// 4..11, with rows [row0, row0 + rows): the block holds every key its rows see, under the same
// mask, so with the whole problem's dropout mask at its place its call computes exactly the
// whole call's O, LSE and dQ of those rows, and (all rows) dK and dV of its keys. float32,
// compared bit for bit: the reference sums the same terms in the same order.
struct BlockOfWhole {
  ProblemTensors whole, block;
};

BlockOfWhole RunBlockOfWhole(int64_t row0, int64_t rows) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 2, c.heads_q = 4, c.heads_kv = 4, c.max_seqlen_q = 4, c.max_seqlen_kv = 12;
  c.head_dim_qk = 8, c.head_dim_v = 8;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT, c.window_left = 3;
  c.dropout = 0.4, c.is_training = 1;
  BlockOfWhole r{MakeProblemTensors(c, {}), {}};
  EXPECT_TRUE(test::Forward(c, r.whole.fwd_args()).ok());
  EXPECT_TRUE(test::Backward(c, r.whole.bwd_args()).ok());

  fusedattn_config b = c;
  b.batch = 1, b.heads_q = b.heads_kv = 2, b.max_seqlen_q = rows, b.max_seqlen_kv = 8;
  b.dropout_batch_offset = 1, b.dropout_heads = 4, b.dropout_head_offset = 1;
  b.dropout_rows = 4, b.dropout_row_offset = row0, b.dropout_key_offset = 4;
  r.block = MakeProblemTensors(b, {});
  ProblemTensors& w = r.whole;
  ProblemTensors& k = r.block;
  k.dropout_seed = w.dropout_seed, k.dropout_offset = w.dropout_offset;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t x = 0; x < 8; ++x) {
      for (int64_t i = 0; i < rows; ++i) {
        k.q.set(k.q.offset_of({0, i, h, x}), w.q.at({1, row0 + i, h + 1, x}));
        k.d_o.set(k.d_o.offset_of({0, i, h, x}), w.d_o.at({1, row0 + i, h + 1, x}));
      }
      for (int64_t j = 0; j < 8; ++j) {
        k.k.set(k.k.offset_of({0, j, h, x}), w.k.at({1, j + 4, h + 1, x}));
        k.v.set(k.v.offset_of({0, j, h, x}), w.v.at({1, j + 4, h + 1, x}));
      }
    }
  test::Result fwd = test::Forward(b, k.fwd_args());
  EXPECT_TRUE(fwd.ok()) << test::StatusText(fwd);
  test::Result bwd = test::Backward(b, k.bwd_args());
  EXPECT_TRUE(bwd.ok()) << test::StatusText(bwd);
  return r;
}

// Elements of the block's rows that differ from the whole problem's: O, LSE and dQ.
int64_t RowsDiffer(const BlockOfWhole& r, int64_t row0, int64_t rows) {
  const ProblemTensors& w = r.whole;
  const ProblemTensors& k = r.block;
  int64_t differ = 0;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < rows; ++i) {
      differ += k.lse.at({0, h, i}) != w.lse.at({1, h + 1, row0 + i});
      for (int64_t x = 0; x < 8; ++x) {
        differ += k.o.at({0, i, h, x}) != w.o.at({1, row0 + i, h + 1, x});
        differ += k.dq.at({0, i, h, x}) != w.dq.at({1, row0 + i, h + 1, x});
      }
    }
  return differ;
}

TEST(DropoutPositions, ABlockHoldingAllItsRowsSeeGivesTheWholeCallsOutputsAndGradients) {
  const BlockOfWhole r = RunBlockOfWhole(0, 4);
  EXPECT_EQ(RowsDiffer(r, 0, 4), 0);
  int64_t differ = 0;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t j = 0; j < 8; ++j)
      for (int64_t x = 0; x < 8; ++x) {
        differ += r.block.dk.at({0, j, h, x}) != r.whole.dk.at({1, j + 4, h + 1, x});
        differ += r.block.dv.at({0, j, h, x}) != r.whole.dv.at({1, j + 4, h + 1, x});
      }
  EXPECT_EQ(differ, 0);
  // The whole problem's keys 0..3 are seen by no row: the block left out nothing.
  for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(r.whole.dk.at({1, j, 1, 0}), 0.0) << "key " << j;
}

TEST(DropoutPositions, ABlockOfRowsGivesTheWholeCallsRowsWithARowOffset) {
  const BlockOfWhole r = RunBlockOfWhole(2, 2);
  EXPECT_EQ(RowsDiffer(r, 2, 2), 0);
}

// Without dropout the fields change nothing: a call with them gives the bytes of one without.
TEST(DropoutPositions, WithoutDropoutChangeNothing) {
  fusedattn_config c = MaskConfig();
  c.dropout = 0.0, c.head_dim_qk = 8, c.head_dim_v = 8;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.device = FUSEDATTN_DEVICE_CPU;
  ProblemTensors plain = MakeProblemTensors(c, {});
  ProblemTensors placed = plain;
  fusedattn_config p = c;
  p.dropout_batch_offset = 1, p.dropout_heads = 8, p.dropout_head_offset = 4;
  p.dropout_rows = 12, p.dropout_row_offset = 6, p.dropout_key_offset = 8;
  ASSERT_TRUE(test::Forward(c, plain.fwd_args()).ok());
  ASSERT_TRUE(test::Forward(p, placed.fwd_args()).ok());
  EXPECT_TRUE(test::SameBytes(plain.o, placed.o));
}

// Callers compiled before the fields existed pass the shorter struct_size: accepted, and the
// call draws its mask at its own positions (what lies past struct_size is never read).
TEST(DropoutPositions, ConfigOfTheEarlierLayoutDrawsAtTheCallsOwnPositions) {
  MaskProblem own = OneHotProblem(MaskConfig(), {});
  fusedattn_config earlier = MaskConfig();
  earlier.struct_size = offsetof(fusedattn_config, dropout_batch_offset);
  earlier.dropout_key_offset = 3;  // invalid, were it read
  earlier.dropout_row_offset = 5;
  MaskProblem old = OneHotProblem(earlier, {});  // (it keeps the struct_size)
  ReadMask r = RunAndReadMask(old);
  EXPECT_EQ(r.visible_count, 3 * 4 * 6 * 13);
  EXPECT_EQ(DifferentFraction(r, RunAndReadMask(own)), 0.0);
}

// ---------------------------------------------------------------------------------------------
// Statistics on a large problem. With q = 0, V = 1 and head_dim_v = 1, each output is
// O = (1 / n) sum_j keep_j / (1 - p): the number of kept keys of the row is O (1 - p) n.
// ---------------------------------------------------------------------------------------------
class DropoutKeepFraction : public ::testing::TestWithParam<double> {};

TEST_P(DropoutKeepFraction, IsOneMinusPWithinFiveSigma) {
  const double p = GetParam();
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 4, c.heads_q = 8, c.heads_kv = 8, c.max_seqlen_q = 128, c.max_seqlen_kv = 512;
  c.head_dim_qk = 1, c.head_dim_v = 1, c.dropout = p;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.device = FUSEDATTN_DEVICE_CPU;
  ProblemTensors t = MakeProblemTensors(c, {});
  t.q.fill(0.0);
  t.v.fill(1.0);
  ASSERT_TRUE(test::Forward(c, t.fwd_args()).ok());
  double kept = 0;
  for (const double o : t.o.to_vector()) {
    const double row_kept = o * (1 - p) * static_cast<double>(c.max_seqlen_kv);
    ASSERT_NEAR(row_kept, std::round(row_kept), 1e-3) << "not a whole number of kept keys";
    kept += std::round(row_kept);
  }
  const double n = static_cast<double>(c.batch * c.heads_q * c.max_seqlen_q * c.max_seqlen_kv);
  const double fraction = kept / n, sigma = std::sqrt(p * (1 - p) / n);
  std::printf("[ dropout ] p=%g: kept %.6f of %.0f elements (expected %.6f, sigma %.2g)\n", p,
              fraction, n, 1 - p, sigma);
  EXPECT_NEAR(fraction, 1 - p, 5 * sigma);
}

INSTANTIATE_TEST_SUITE_P(Probabilities, DropoutKeepFraction, ::testing::Values(0.1, 0.5, 0.9),
                         [](const auto& info) {
                           return "p" + std::to_string(static_cast<int>(info.param * 10)) + "0pct";
                         });

// E[O] under dropout is O without it: the mean of O over many seeds is within a few standard
// errors of the dropout-free output, element by element.
TEST(DropoutExpectation, MeanOutputOverSeedsIsTheOutputWithoutDropout) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 1, c.heads_q = 2, c.heads_kv = 1, c.max_seqlen_q = 3, c.max_seqlen_kv = 8;
  c.head_dim_qk = 4, c.head_dim_v = 4;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_FLOAT32;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT;
  ProblemTensors t = MakeProblemTensors(c, {});
  ASSERT_TRUE(test::Forward(c, t.fwd_args()).ok());
  const std::vector<double> exact = t.o.to_vector();

  c.dropout = 0.5;
  constexpr int kSeeds = 4000;
  std::vector<double> sum(exact.size(), 0), sum2(exact.size(), 0);
  for (int seed = 0; seed < kSeeds; ++seed) {
    t.dropout_seed = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(seed + 1);
    ASSERT_TRUE(test::Forward(c, t.fwd_args()).ok());
    const std::vector<double> o = t.o.to_vector();
    for (size_t e = 0; e < o.size(); ++e) sum[e] += o[e], sum2[e] += o[e] * o[e];
  }
  double worst_z = 0, mean_z2 = 0;
  for (size_t e = 0; e < exact.size(); ++e) {
    const double mean = sum[e] / kSeeds;
    const double variance = (sum2[e] - kSeeds * mean * mean) / (kSeeds - 1);
    const double z = (mean - exact[e]) / std::sqrt(variance / kSeeds);
    worst_z = std::max(worst_z, std::fabs(z));
    mean_z2 += z * z / static_cast<double>(exact.size());
  }
  std::printf(
      "[ dropout ] E[O] over %d seeds: worst |z| = %.2f, mean z^2 = %.2f over %zu elements\n",
      kSeeds, worst_z, mean_z2, exact.size());
  // 24 elements: |z| > 5 has probability ~1e-5; mean z^2 is about chi^2_24 / 24.
  EXPECT_LT(worst_z, 5.0);
  EXPECT_LT(mean_z2, 3.0);
}

}  // namespace
}  // namespace fusedattn
