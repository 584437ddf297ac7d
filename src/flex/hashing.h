// Canonical form and structural identity of score-modifier graphs.
//
// The canonical form of a graph keeps only the nodes its outputs reach, numbered in depth-first
// post-order from the outputs (operands left to right). It depends on what the outputs compute,
// not on the order the nodes were built in or on nodes built and never used. The identity is that
// form written out as 64-bit words (every field of every node, constants as their bits, the
// tensor declarations, the outputs) together with a 128-bit hash of the words: equal graphs have
// equal words; a cache compares the words, so a hash collision can never alias two graphs.
#pragma once

#include <cstdint>
#include <vector>

#include "flex/graph.h"

namespace fusedattn::flex {

struct Hash128 {
  uint64_t lo = 0, hi = 0;
  bool operator==(const Hash128& other) const { return lo == other.lo && hi == other.hi; }
};

Hash128 HashWords(const std::vector<uint64_t>& words);

// The nodes reachable from *roots[k] (ids < 0 are absent and stay so), in depth-first post-order,
// renumbered; each root is rewritten to its new id.
std::vector<Node> Compact(const std::vector<Node>& nodes, const std::vector<int32_t*>& roots);

// Appends a node list to words (every field, constants as bits).
void AppendNodeWords(const std::vector<Node>& nodes, std::vector<uint64_t>* words);

}  // namespace fusedattn::flex
