// The attention band of src/common/band.h — the one definition of which keys a query row sees,
// shared by every backend's host and device code — against fusedattn.h's rule written out element
// by element: query i of a sequence (seqlen_q, seqlen_kv) sees key j when 0 <= j < seqlen_kv,
// 0 <= i < seqlen_q and d - left <= j <= d + right (unbounded sides -1), d = i + (bottom_right ?
// seqlen_kv - seqlen_q : 0). Also how the masks of fusedattn.h map to it.
#include <gtest/gtest.h>

#include <vector>

#include "backends/flash/params.h"
#include "common/band.h"
#include "common/status.h"
#include "problem/problem.h"

namespace fusedattn {
namespace {

bool Sees(const Band& b, int64_t i, int64_t j, int64_t sq, int64_t skv) {
  if (i < 0 || i >= sq || j < 0 || j >= skv) return false;
  const int64_t d = i + (b.bottom_right ? skv - sq : 0);
  return (b.left < 0 || j >= d - b.left) && (b.right < 0 || j <= d + b.right);
}

// Every band of small windows, both alignments, on every pair of short lengths.
template <typename Check>
void ForEachCase(Check check) {
  for (bool bottom_right : {false, true})
    for (int64_t left : {-1, 0, 1, 3})
      for (int64_t right : {-1, 0, 2})
        for (int64_t sq = 0; sq <= 6; ++sq)
          for (int64_t skv = 0; skv <= 6; ++skv) {
            const Band b = MakeBand(left, right, bottom_right);
            SCOPED_TRACE(Format("left=%lld right=%lld %s sq=%lld skv=%lld", (long long)left,
                                (long long)right, DiagonalAlignmentName(b.alignment()),
                                (long long)sq, (long long)skv));
            check(b, sq, skv);
          }
}

TEST(Band, KeysOfARowAreExactlyTheKeysTheRuleShows) {
  ForEachCase([](const Band& b, int64_t sq, int64_t skv) {
    for (int64_t i = -1; i <= sq + 1; ++i) {
      int64_t lo = 0, hi = 0;
      b.keys_of_row(i, sq, skv, &lo, &hi);
      EXPECT_LE(lo, hi);
      for (int64_t j = -2; j <= skv + 2; ++j)
        EXPECT_EQ(j >= lo && j < hi, Sees(b, i, j, sq, skv)) << "i=" << i << " j=" << j;
    }
  });
}

TEST(Band, RowsSeeingKeysAreExactlyTheRowsThatSeeOneOfThem) {
  ForEachCase([](const Band& b, int64_t sq, int64_t skv) {
    for (int64_t key_lo = -1; key_lo <= skv; ++key_lo)
      for (int64_t key_hi = key_lo; key_hi <= skv + 1; ++key_hi) {
        int64_t first = 0, last = 0;
        b.rows_seeing_keys(key_lo, key_hi, sq, skv, &first, &last);
        for (int64_t i = -1; i <= sq; ++i) {
          bool sees = false;
          for (int64_t j = key_lo; j < key_hi; ++j) sees = sees || Sees(b, i, j, sq, skv);
          EXPECT_EQ(i >= first && i <= last, sees)
              << "keys [" << key_lo << ", " << key_hi << ") row " << i;
        }
        if (first > last) EXPECT_EQ(std::make_pair(first, last), std::make_pair(int64_t{0}, int64_t{-1}));
      }
  });
}

TEST(Band, EmptyRowsAndUnseenKeysFollowTheRule) {
  ForEachCase([](const Band& b, int64_t sq, int64_t skv) {
    bool any_empty = false, any_unseen = false;
    for (int64_t i = 0; i < sq; ++i) {
      bool sees = false;
      for (int64_t j = 0; j < skv; ++j) sees = sees || Sees(b, i, j, sq, skv);
      EXPECT_EQ(b.row_empty(i, sq, skv), !sees) << "row " << i;
      any_empty = any_empty || !sees;
    }
    for (int64_t j = 0; j < skv; ++j) {
      bool seen = false;
      for (int64_t i = 0; i < sq; ++i) seen = seen || Sees(b, i, j, sq, skv);
      EXPECT_EQ(b.key_unseen(j, sq, skv), !seen) << "key " << j;
      any_unseen = any_unseen || !seen;
    }
    EXPECT_TRUE(b.row_empty(sq, sq, skv)) << "rows past the sequence see nothing";
    EXPECT_TRUE(b.key_unseen(skv, sq, skv)) << "keys past the sequence are seen by none";
    EXPECT_EQ(b.any_row_empty(sq, skv), any_empty);
    EXPECT_EQ(b.any_key_unseen(sq, skv), any_unseen);
  });
}

TEST(Band, RawBoundsOfABlockOfRowsCoverEveryRowInIt) {
  // Kernels visit the keys [raw_lo(first row), raw_hi(last row)) of a block of rows.
  ForEachCase([](const Band& b, int64_t sq, int64_t skv) {
    const int64_t shift = b.shift(sq, skv);
    for (int64_t i = 0; i + 1 < sq; ++i) {
      EXPECT_LE(b.raw_lo(i, shift), b.raw_lo(i + 1, shift));
      EXPECT_LE(b.raw_hi(i, shift), b.raw_hi(i + 1, shift));
    }
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t j = 0; j < skv; ++j)
        if (Sees(b, i, j, sq, skv)) {
          EXPECT_GE(j, b.raw_lo(i, shift));
          EXPECT_LT(j, b.raw_hi(i, shift));
        }
  });
}

TEST(Band, AFlashTileIsFullyVisibleExactlyWhenEveryRowSeesEveryKeyOfIt) {
  // flash's kernels run no mask code on such tiles (flash/params.h, TileFullyVisible).
  ForEachCase([](const Band& b, int64_t sq, int64_t skv) {
    flash::FlashParams p;
    p.window_left = b.left, p.window_right = b.right, p.bottom_right = b.bottom_right;
    const int64_t shift = b.shift(sq, skv);
    for (int row0 = 0; row0 <= sq; ++row0)
      for (int rows = 1; rows <= 3; ++rows)
        for (int key0 = 0; key0 <= skv; ++key0)
          for (int keys = 1; keys <= 3; ++keys) {
            bool all = true;
            for (int i = row0; i < row0 + rows; ++i)
              for (int j = key0; j < key0 + keys; ++j) all = all && Sees(b, i, j, sq, skv);
            EXPECT_EQ(flash::TileFullyVisible(p, row0, rows, key0, keys, static_cast<int>(sq),
                                              static_cast<int>(skv), shift),
                      all)
                << "rows [" << row0 << ", " << row0 + rows << ") keys [" << key0 << ", "
                << key0 + keys << ")";
          }
  });
}

TEST(Band, UnboundedSidesStayFarFromOverflow) {
  const Band b = MakeBand(-1, -1, true);
  const int64_t big = int64_t{1} << 40;
  EXPECT_LT(b.raw_lo(big, big), -big);
  EXPECT_GT(b.raw_hi(big, big), big);
  EXPECT_FALSE(b.bounded());
  EXPECT_TRUE(MakeBand(0, -1, false).bounded());
}

Band BandOfMask(fusedattn_mask mask, int64_t window_left = -1, int64_t window_right = -1) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 1, c.heads_q = c.heads_kv = 1, c.max_seqlen_q = 8, c.max_seqlen_kv = 12;
  c.head_dim_qk = c.head_dim_v = 64;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.mask = mask, c.window_left = window_left, c.window_right = window_right;
  Problem p;
  Status s = MakeProblem(&c, false, &p);
  EXPECT_TRUE(s.ok()) << s.message();
  return p.band();
}

TEST(Band, CausalMasksAreTopLeftUnlessNamedBottomRight) {
  EXPECT_EQ(BandOfMask(FUSEDATTN_MASK_CAUSAL).alignment(), DiagonalAlignment::kTopLeft);
  EXPECT_EQ(BandOfMask(FUSEDATTN_MASK_PADDING_CAUSAL).alignment(), DiagonalAlignment::kTopLeft);
  EXPECT_EQ(BandOfMask(FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT).alignment(),
            DiagonalAlignment::kBottomRight);
  EXPECT_EQ(BandOfMask(FUSEDATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT).alignment(),
            DiagonalAlignment::kBottomRight);
  EXPECT_EQ(BandOfMask(FUSEDATTN_MASK_CAUSAL).right, 0);
  EXPECT_EQ(BandOfMask(FUSEDATTN_MASK_CAUSAL).left, -1);
}

TEST(Band, WindowsWithoutACausalMaskAlignBottomRight) {
  const Band b = BandOfMask(FUSEDATTN_MASK_NONE, 2, 1);
  EXPECT_EQ(b.alignment(), DiagonalAlignment::kBottomRight);
  EXPECT_EQ(b.left, 2);
  EXPECT_EQ(b.right, 1);
  EXPECT_FALSE(BandOfMask(FUSEDATTN_MASK_NONE).bounded());
}

TEST(Band, TheProblemsVisibleKeysAreTheBands) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 1, c.heads_q = c.heads_kv = 1, c.max_seqlen_q = 5, c.max_seqlen_kv = 9;
  c.head_dim_qk = c.head_dim_v = 64;
  c.device = FUSEDATTN_DEVICE_CPU;
  c.mask = FUSEDATTN_MASK_CAUSAL_BOTTOM_RIGHT, c.window_left = 2;
  Problem p;
  ASSERT_TRUE(MakeProblem(&c, false, &p).ok());
  for (int64_t i = 0; i < 5; ++i) {
    int64_t lo = 0, hi = 0;
    p.visible_keys(i, 5, 9, &lo, &hi);
    // Row i's diagonal is key i + 4; it sees keys i + 2 .. i + 4.
    EXPECT_EQ(lo, i + 2);
    EXPECT_EQ(hi, i + 5);
  }
}

TEST(Band, AlignmentsHaveOneNameEach) {
  EXPECT_STREQ(DiagonalAlignmentName(DiagonalAlignment::kTopLeft), "top_left");
  EXPECT_STREQ(DiagonalAlignmentName(DiagonalAlignment::kBottomRight), "bottom_right");
}

}  // namespace
}  // namespace fusedattn
