// The band recognizer (flex/band_mask.h): mask_mods that are diagonal bands are recognized with
// the right bounds and alignment, checked against the interpreter on every (i, j) of a few
// sequence shapes; everything that is not a band is left alone.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "flex/band_mask.h"
#include "flex_test_util.h"

namespace fusedattn {
namespace {

using flex::MaskBand;
using flex_test::Internal;

// The finalized graph built by `build` (which sets the mask, maybe the score); it outlives the
// handle (shared).
std::shared_ptr<const flex::ScoreMod> Build(const std::function<void(ScoreMod&)>& build) {
  ScoreMod mod;
  build(mod);
  mod.finalize();
  return Internal(mod);
}

// Whether key j is visible to query i under the band (common/band.h, fusedattn.h's window rule;
// tests/cpu/band_test.cpp specifies it).
bool InBand(const MaskBand& band, int64_t i, int64_t j, int64_t sq, int64_t sk) {
  int64_t lo = 0, hi = 0;
  band.keys_of_row(i, sq, sk, &lo, &hi);
  return j >= lo && j < hi;
}

// The recognized band agrees with the interpreter's mask everywhere.
void ExpectBand(const std::shared_ptr<const flex::ScoreMod>& mod, const MaskBand& expected,
                const std::string& what) {
  SCOPED_TRACE(what);
  MaskBand band;
  ASSERT_TRUE(flex::RecognizeBandMask(mod->forward(), &band));
  EXPECT_EQ(band.left, expected.left);
  EXPECT_EQ(band.right, expected.right);
  EXPECT_EQ(band.bottom_right, expected.bottom_right);
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{7, 7}, {5, 9}, {9, 4}})
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t j = 0; j < sk; ++j) {
        flex::Point p = flex_test::At(0.5, i, j);
        p.seqlen_q = sq, p.seqlen_kv = sk;
        EXPECT_EQ(flex_test::Outputs(mod->forward(), p).visible, InBand(band, i, j, sq, sk))
            << "sq=" << sq << " sk=" << sk << " i=" << i << " j=" << j;
      }
}

TEST(FlexBandMask, RecognizesCausalWindowsAndTheirAlignment) {
  ExpectBand(Build([](ScoreMod& m) { m.set_mask(m.kv_idx() <= m.q_idx()); }), {-1, 0, false},
             "kv_idx <= q_idx");
  ExpectBand(Build([](ScoreMod& m) { m.set_mask(m.q_idx() >= m.kv_idx()); }), {-1, 0, false},
             "q_idx >= kv_idx");
  ExpectBand(Build([](ScoreMod& m) { m.set_mask(m.kv_idx() <= m.q_idx_br()); }), {-1, 0, true},
             "kv_idx <= q_idx_br");
  ExpectBand(Build([](ScoreMod& m) {
               m.set_mask(m.kv_idx() <= m.q_idx() && m.q_idx() - m.kv_idx() < 4.0);
             }),
             {3, 0, false}, "causal sliding window of 4");
  ExpectBand(Build([](ScoreMod& m) {
               m.set_mask(m.q_idx_br() - m.kv_idx() <= 2.0 && m.kv_idx() - m.q_idx_br() <= 1.0);
             }),
             {2, 1, true}, "bottom-right band (2, 1)");
  ExpectBand(Build([](ScoreMod& m) {
               m.set_mask(m.kv_idx() < m.q_idx() + 2.5 && m.kv_idx() + 3.0 > m.q_idx());
             }),
             {2, 2, false}, "non-integer constants, strict comparisons");
  ExpectBand(Build([](ScoreMod& m) {
               m.set_mask(2.0 * m.kv_idx() <= 2.0 * m.q_idx() && m.kv_idx() <= m.q_idx() + 5.0);
             }),
             {-1, 0, false}, "scaled comparisons; the tighter bound wins");
  ExpectBand(Build([](ScoreMod& m) {
               m.set_mask(m.kv_idx() <= m.q_idx() + m.seqlen_kv() - m.seqlen_q());
             }),
             {-1, 0, true}, "bottom-right spelled with the lengths");
}

TEST(FlexBandMask, LeavesEverythingElseToTheGeneralPath) {
  struct Case {
    const char* what;
    std::function<void(ScoreMod&)> build;
  } cases[] = {
      {"no mask", [](ScoreMod& m) { m.set_score(m.score() * 2.0); }},
      {"an OR of bands", [](ScoreMod& m) {
         m.set_mask(m.kv_idx() <= m.q_idx() || m.kv_idx() >= m.q_idx() + 10.0);
       }},
      {"a negated band", [](ScoreMod& m) { m.set_mask(!(m.kv_idx() <= m.q_idx())); }},
      {"strictly causal (the diagonal hidden)",
       [](ScoreMod& m) { m.set_mask(m.kv_idx() < m.q_idx()); }},
      {"equality", [](ScoreMod& m) { m.set_mask(eq(m.kv_idx(), m.q_idx())); }},
      {"document ids from a tensor", [](ScoreMod& m) {
         Expr doc = m.tensor("doc", FUSEDATTN_DTYPE_INT32,
                             FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_KV);
         m.set_mask(m.kv_idx() <= m.q_idx() && ne(doc, 3.0));
       }},
      {"a key-only bound (a prefix, not a band)",
       [](ScoreMod& m) { m.set_mask(m.kv_idx() < 5.0); }},
      {"twice the query index", [](ScoreMod& m) { m.set_mask(m.kv_idx() <= 2.0 * m.q_idx()); }},
      {"mixed alignments", [](ScoreMod& m) {
         m.set_mask(m.kv_idx() <= m.q_idx() && m.q_idx_br() - m.kv_idx() <= 3.0);
       }},
      {"a head-dependent window", [](ScoreMod& m) {
         m.set_mask(m.kv_idx() <= m.q_idx() && m.q_idx() - m.kv_idx() <= m.head());
       }},
      {"sq alone (not sk - sq)",
       [](ScoreMod& m) { m.set_mask(m.kv_idx() <= m.q_idx() + m.seqlen_q()); }},
  };
  for (const Case& c : cases) {
    MaskBand band;
    EXPECT_FALSE(flex::RecognizeBandMask(Build(c.build)->forward(), &band)) << c.what;
  }
}

TEST(FlexBandMask, MaskOnlyMeansNoScoreOutput) {
  EXPECT_TRUE(flex::IsMaskOnly(
      Build([](ScoreMod& m) { m.set_mask(m.kv_idx() <= m.q_idx()); })->forward()));
  EXPECT_TRUE(flex::IsMaskOnly(Build([](ScoreMod& m) {
                                 m.set_mask(m.kv_idx() <= m.q_idx());
                                 m.set_score(m.score());
                               })->forward()));
  EXPECT_FALSE(flex::IsMaskOnly(Build([](ScoreMod& m) {
                                  m.set_mask(m.kv_idx() <= m.q_idx());
                                  m.set_score(tanh(m.score()));
                                })->forward()));
}

}  // namespace
}  // namespace fusedattn
