// Caches of artifacts built from score modifiers (compiled kernels, cuDNN graphs): bounded,
// thread-safe LRU caches keyed by the modifier's structure, never by a handle's address. Two
// graphs built independently with the same structure share one entry; a hash collision between
// different graphs cannot alias them, since lookups compare the identity words.
#pragma once

#include "common/lru_cache.h"
#include "flex/score_mod.h"

namespace fusedattn::flex {

template <typename Artifact>
using ArtifactCache = LruCache<ScoreModKey, Artifact, ScoreModKeyHash>;

}  // namespace fusedattn::flex
