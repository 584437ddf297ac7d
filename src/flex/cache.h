// Caches of artifacts built from score modifiers (compiled kernels, cuDNN graphs): bounded,
// thread-safe LRU caches keyed by the modifier's structure, never by a handle's address. Two
// graphs built independently with the same structure share one entry; a hash collision between
// different graphs cannot alias them, since lookups compare the identity words.
#pragma once

#include <array>
#include <cstdint>

#include "common/lru_cache.h"
#include "flex/score_mod.h"

namespace fusedattn::flex {

template <typename Artifact>
using ArtifactCache = LruCache<ScoreModKey, Artifact, ScoreModKeyHash>;

// A graph plus the words of whatever else changes the artifact (dtype, head dim, direction,
// target architecture, ...): for caches holding several artifacts per graph.
struct VariantKey {
  static constexpr size_t kWords = 8;
  ScoreModKey graph;
  std::array<int64_t, kWords> words{};
  bool operator==(const VariantKey& other) const {
    return words == other.words && graph == other.graph;
  }
};
struct VariantKeyHash {
  size_t operator()(const VariantKey& key) const {
    return static_cast<size_t>(::fusedattn::HashWords(key.words.data(), key.words.size()) ^
                               ScoreModKeyHash()(key.graph));
  }
};

template <typename Artifact>
using VariantArtifactCache = LruCache<VariantKey, Artifact, VariantKeyHash>;

}  // namespace fusedattn::flex
