// Structural identity of score modifiers: graphs built twice are equal and hash equal; graphs that
// differ in any operation, constant (to the last bit, the sign of zero, a NaN payload), operand,
// output or tensor declaration are never equal; artifact caches keyed by it share entries between
// equal graphs and never alias different ones, even when their hashes collide.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "flex/cache.h"
#include "flex_test_util.h"

namespace fusedattn {
namespace {

using flex_test::Internal;

using Build = std::function<void(ScoreMod&)>;

ScoreMod Built(const Build& build) {
  ScoreMod mod;
  build(mod);
  mod.finalize();
  return mod;
}

std::array<uint64_t, 2> HashOf(const Build& build) { return Built(build).hash(); }

bool Equal(const Build& a, const Build& b) { return Built(a).equals(Built(b)); }

double WithBits(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

const Build kSoftCap = [](ScoreMod& m) { m.set_score(30.0 * tanh(m.score() / 30.0)); };

TEST(FlexIdentity, AGraphBuiltTwiceIsEqualAndHashesEqual) {
  ScoreMod a = Built(kSoftCap), b = Built(kSoftCap);
  EXPECT_TRUE(a.equals(b));
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_NE(a.get(), b.get());  // two handles
}

// Nodes built but not used, and the order nodes were built in, do not count: only what the
// outputs compute.
TEST(FlexIdentity, UnusedNodesAndBuildOrderDoNotCount) {
  Build forward_order = [](ScoreMod& m) {
    Expr q = m.q_idx(), kv = m.kv_idx();
    m.set_score(m.score() + 0.5 * (q - kv));
  };
  Build other_order = [](ScoreMod& m) {
    (void)exp(m.score() * 3.0);  // unused
    Expr half = m.constant(0.5);
    Expr kv = m.kv_idx(), q = m.q_idx();
    Expr s = m.score();
    m.set_score(s + half * (q - kv));
  };
  EXPECT_TRUE(Equal(forward_order, other_order));
  EXPECT_EQ(HashOf(forward_order), HashOf(other_order));
}

TEST(FlexIdentity, TensorNamesDoNotCount) {
  auto bias_named = [](const char* name) {
    return [name](ScoreMod& m) {
      m.set_score(m.score() + m.tensor(name, FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_Q));
    };
  };
  EXPECT_TRUE(Equal(bias_named("a"), bias_named("b")));
}

struct Difference {
  const char* name;
  Build a, b;
};

std::vector<Difference> Differences() {
  const double one_up = std::nextafter(1.0, 2.0);
  const uint64_t nan_bits = 0x7FF8000000000001ull;
  auto score_plus = [](double c) { return [c](ScoreMod& m) { m.set_score(m.score() + c); }; };
  auto tensor = [](fusedattn_dtype dtype, uint32_t axes, bool grad) {
    return [=](ScoreMod& m) { m.set_score(m.score() * m.tensor("t", dtype, axes, grad)); };
  };
  const uint32_t q = FUSEDATTN_SCORE_MOD_AXIS_Q, kv = FUSEDATTN_SCORE_MOD_AXIS_KV;
  return {
      {"Operation", [](ScoreMod& m) { m.set_score(m.score() + 1.0); },
       [](ScoreMod& m) { m.set_score(m.score() - 1.0); }},
      {"UnaryOperation", [](ScoreMod& m) { m.set_score(tanh(m.score())); },
       [](ScoreMod& m) { m.set_score(sigmoid(m.score())); }},
      {"ConstantLastBit", score_plus(1.0), score_plus(one_up)},
      {"SignOfZero", score_plus(0.0), score_plus(-0.0)},
      {"NaNPayload", score_plus(WithBits(nan_bits)), score_plus(WithBits(nan_bits + 1))},
      {"Operand", [](ScoreMod& m) { m.set_score(m.score() + m.q_idx()); },
       [](ScoreMod& m) { m.set_score(m.score() + m.kv_idx()); }},
      {"OperandOrder", [](ScoreMod& m) { m.set_score(m.q_idx() - m.kv_idx() + m.score()); },
       [](ScoreMod& m) { m.set_score(m.kv_idx() - m.q_idx() + m.score()); }},
      {"ComparisonDirection", [](ScoreMod& m) { m.set_mask(m.q_idx() >= m.kv_idx()); },
       [](ScoreMod& m) { m.set_mask(m.q_idx() > m.kv_idx()); }},
      {"ScoreVersusMask",
       [](ScoreMod& m) { m.set_score(select(m.q_idx() >= m.kv_idx(), m.score(), -INFINITY)); },
       [](ScoreMod& m) { m.set_mask(m.q_idx() >= m.kv_idx()); }},
      {"ExtraMask", kSoftCap,
       [](ScoreMod& m) {
         kSoftCap(m);
         m.set_mask(m.q_idx() >= m.kv_idx());
       }},
      {"ExplicitGradient", kSoftCap,
       [](ScoreMod& m) {
         kSoftCap(m);
         Expr t = tanh(m.score() / 30.0);
         m.set_gradient(m.score(), 1.0 - t * t);
       }},
      {"TensorDtype", tensor(FUSEDATTN_DTYPE_FLOAT32, q, false),
       tensor(FUSEDATTN_DTYPE_BFLOAT16, q, false)},
      {"TensorAxes", tensor(FUSEDATTN_DTYPE_FLOAT32, q, false),
       tensor(FUSEDATTN_DTYPE_FLOAT32, kv, false)},
      {"TensorRequiresGrad", tensor(FUSEDATTN_DTYPE_FLOAT32, q, false),
       tensor(FUSEDATTN_DTYPE_FLOAT32, q, true)},
      {"TensorOrder",
       [](ScoreMod& m) {
         Expr a = m.tensor("a", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_Q);
         Expr b = m.tensor("b", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_Q);
         m.set_score(m.score() + a - b);
       },
       [](ScoreMod& m) {
         Expr b = m.tensor("b", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_Q);
         Expr a = m.tensor("a", FUSEDATTN_DTYPE_FLOAT32, FUSEDATTN_SCORE_MOD_AXIS_Q);
         m.set_score(m.score() + a - b);
       }},
      {"UnusedTensorDeclaration", score_plus(1.0),
       [](ScoreMod& m) {
         m.tensor("unused", FUSEDATTN_DTYPE_FLOAT32, 0);  // still one of the call's tensors
         m.set_score(m.score() + 1.0);
       }},
  };
}

TEST(FlexIdentity, GraphsThatDifferInAnythingAreNeverEqual) {
  for (const Difference& d : Differences()) {
    ScoreMod a = Built(d.a), b = Built(d.b);
    EXPECT_FALSE(a.equals(b)) << d.name << ":\n" << a.describe() << "\nvs\n" << b.describe();
    EXPECT_NE(a.hash(), b.hash()) << d.name;
    EXPECT_TRUE(a.equals(Built(d.a))) << d.name << " is not equal to itself built again";
  }
}

// Random expressions from a small alphabet (with constants that differ in the last bit and in the
// sign of zero): two graphs are equal exactly when they compute the same expression tree, which
// their text shows. Equal graphs hash equal.
class RandomExpression {
 public:
  explicit RandomExpression(uint64_t seed) : rng_(seed) {}
  Expr Make(ScoreMod& m, int depth) {
    std::uniform_int_distribution<int> pick(0, depth <= 0 ? 3 : 9);
    switch (pick(rng_)) {
      case 0: return m.score();
      case 1: return m.q_idx();
      case 2: return m.kv_idx();
      case 3: {
        const double constants[] = {0.0, -0.0, 1.0, std::nextafter(1.0, 2.0), 30.0};
        return m.constant(constants[std::uniform_int_distribution<int>(0, 4)(rng_)]);
      }
      case 4: return Make(m, depth - 1) + Make(m, depth - 1);
      case 5: return Make(m, depth - 1) * Make(m, depth - 1);
      case 6: return Make(m, depth - 1) - Make(m, depth - 1);
      case 7: return tanh(Make(m, depth - 1));
      case 8: return max(Make(m, depth - 1), Make(m, depth - 1));
      default: return select(Make(m, depth - 1) < Make(m, depth - 1), Make(m, depth - 1),
                             Make(m, depth - 1));
    }
  }

 private:
  std::mt19937_64 rng_;
};

TEST(FlexIdentity, RandomGraphsAreEqualExactlyWhenTheyComputeTheSameExpression) {
  int equal_pairs = 0;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    // Small depths so that equal trees from different seeds occur too.
    auto make = [](uint64_t s) {
      return Built([s](ScoreMod& m) { m.set_score(RandomExpression(s).Make(m, 1 + s % 2)); });
    };
    ScoreMod a = make(seed), b = make(seed / 2 * 7 + 3), again = make(seed);
    EXPECT_TRUE(a.equals(again)) << "seed " << seed;
    EXPECT_EQ(a.hash(), again.hash()) << "seed " << seed;
    const bool same_text = a.describe() == b.describe();
    EXPECT_EQ(a.equals(b), same_text) << a.describe() << "\nvs\n" << b.describe();
    if (same_text) {
      ++equal_pairs;
      EXPECT_EQ(a.hash(), b.hash());
    } else {
      EXPECT_NE(a.hash(), b.hash());
    }
  }
  EXPECT_GT(equal_pairs, 0) << "no equal pair: the test did not exercise equality";
}

// ---------------------------------------------------------------------------------------------
// Artifact caches keyed by structure
// ---------------------------------------------------------------------------------------------

flex::ScoreModKey KeyOf(const ScoreMod& mod) { return {Internal(mod)}; }

TEST(FlexArtifactCache, EqualGraphsBuiltIndependentlyShareOneEntry) {
  flex::ArtifactCache<std::string> cache(8);
  cache.insert(KeyOf(Built(kSoftCap)), std::make_shared<std::string>("softcap kernel"));
  std::shared_ptr<std::string> hit = cache.find(KeyOf(Built(kSoftCap)));
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(*hit, "softcap kernel");
  EXPECT_EQ(cache.stats().entries, 1u);
  EXPECT_EQ(cache.stats().hits, 1u);
}

TEST(FlexArtifactCache, DifferentGraphsNeverShareAnEntry) {
  flex::ArtifactCache<std::string> cache(64);
  for (const Difference& d : Differences()) {
    cache.clear();
    cache.insert(KeyOf(Built(d.a)), std::make_shared<std::string>("a"));
    EXPECT_EQ(cache.find(KeyOf(Built(d.b))), nullptr) << d.name;
    cache.insert(KeyOf(Built(d.b)), std::make_shared<std::string>("b"));
    EXPECT_EQ(*cache.find(KeyOf(Built(d.a))), "a") << d.name;
    EXPECT_EQ(*cache.find(KeyOf(Built(d.b))), "b") << d.name;
  }
}

// Every key in one bucket: what keeps the entries apart is the structural comparison alone.
TEST(FlexArtifactCache, AHashCollisionDoesNotAliasDifferentGraphs) {
  struct Colliding {
    size_t operator()(const flex::ScoreModKey&) const { return 42; }
  };
  LruCache<flex::ScoreModKey, std::string, Colliding> cache(64);
  std::vector<ScoreMod> graphs;
  for (const Difference& d : Differences()) {
    graphs.push_back(Built(d.a));
    graphs.push_back(Built(d.b));
  }
  for (size_t k = 0; k < graphs.size(); ++k)
    cache.insert(KeyOf(graphs[k]), std::make_shared<std::string>(std::to_string(k)));
  for (size_t k = 0; k < graphs.size(); ++k) {
    // Some graphs of the list are equal (the soft-cap appears several times): their key finds
    // the entry of the first equal one, and every other key its own.
    size_t first = 0;
    while (!graphs[first].equals(graphs[k])) ++first;
    auto hit = cache.find(KeyOf(graphs[k]));
    ASSERT_NE(hit, nullptr) << k;
    EXPECT_EQ(*hit, std::to_string(first)) << graphs[k].describe();
  }
  EXPECT_LT(cache.stats().entries, graphs.size());  // the equal ones share
}

TEST(FlexArtifactCache, IsBoundedAndEvictsTheLeastRecentlyUsed) {
  flex::ArtifactCache<int> cache(2);
  auto plus = [](double c) { return Built([c](ScoreMod& m) { m.set_score(m.score() + c); }); };
  cache.insert(KeyOf(plus(1)), std::make_shared<int>(1));
  cache.insert(KeyOf(plus(2)), std::make_shared<int>(2));
  ASSERT_NE(cache.find(KeyOf(plus(1))), nullptr);  // 1 is now the most recent
  cache.insert(KeyOf(plus(3)), std::make_shared<int>(3));
  EXPECT_EQ(cache.stats().entries, 2u);
  EXPECT_EQ(cache.stats().evictions, 1u);
  EXPECT_EQ(cache.find(KeyOf(plus(2))), nullptr);
  EXPECT_NE(cache.find(KeyOf(plus(1))), nullptr);
  EXPECT_NE(cache.find(KeyOf(plus(3))), nullptr);
}

// An entry keeps its graph alive: destroying the handles of the graph it was built from does not
// invalidate the key.
TEST(FlexArtifactCache, AnEntryOutlivesTheHandleItWasBuiltFrom) {
  flex::ArtifactCache<int> cache(4);
  {
    ScoreMod mod = Built(kSoftCap);
    cache.insert(KeyOf(mod), std::make_shared<int>(7));
  }
  ScoreMod other = Built([](ScoreMod& m) { m.set_score(m.score() * 2.0); });
  EXPECT_EQ(cache.find(KeyOf(other)), nullptr);
  auto hit = cache.find(KeyOf(Built(kSoftCap)));
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(*hit, 7);
}

}  // namespace
}  // namespace fusedattn
