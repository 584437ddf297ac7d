#include "flex/hashing.h"

#include <utility>

namespace fusedattn::flex {

namespace {

// SplitMix64's finalizer: a bijection that spreads every input bit over the output.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

uint64_t RotateLeft(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

}  // namespace

Hash128 HashWords(const std::vector<uint64_t>& words) {
  // Two lanes with different seeds and multipliers; each word is mixed into both, and the word
  // count goes into the finalization so that prefixes hash differently.
  uint64_t a = 0x243F6A8885A308D3ull, b = 0x13198A2E03707344ull;
  for (uint64_t w : words) {
    a = RotateLeft(a ^ Mix(w), 27) * 0x9E3779B97F4A7C15ull + 0x52DCE729ull;
    b = RotateLeft(b ^ Mix(w ^ 0xA4093822299F31D0ull), 31) * 0xC2B2AE3D27D4EB4Full + 0x38495AB5ull;
  }
  uint64_t n = static_cast<uint64_t>(words.size());
  Hash128 h;
  h.lo = Mix(a ^ Mix(n) ^ RotateLeft(b, 17));
  h.hi = Mix(b ^ Mix(n + 1) ^ RotateLeft(a, 41));
  return h;
}

std::vector<Node> Compact(const std::vector<Node>& nodes, const std::vector<int32_t*>& roots) {
  std::vector<int32_t> new_id(nodes.size(), -1);
  std::vector<Node> out;
  // Iterative depth-first search (graphs may be deep chains): a frame is a node and the next
  // operand to visit.
  std::vector<std::pair<int32_t, int>> stack;
  for (int32_t* root : roots) {
    if (*root < 0) continue;
    if (new_id[static_cast<size_t>(*root)] < 0) {
      stack.push_back({*root, 0});
      while (!stack.empty()) {
        auto& [id, next] = stack.back();
        const Node& n = nodes[static_cast<size_t>(id)];
        if (next < Arity(n.op)) {
          int32_t operand = n.args[static_cast<size_t>(next++)];
          if (new_id[static_cast<size_t>(operand)] < 0) stack.push_back({operand, 0});
          continue;
        }
        Node copy = n;
        for (int a = 0; a < Arity(n.op); ++a)
          copy.args[static_cast<size_t>(a)] = new_id[static_cast<size_t>(n.args[a])];
        new_id[static_cast<size_t>(id)] = static_cast<int32_t>(out.size());
        out.push_back(copy);
        stack.pop_back();
      }
    }
    *root = new_id[static_cast<size_t>(*root)];
  }
  return out;
}

void AppendNodeWords(const std::vector<Node>& nodes, std::vector<uint64_t>* words) {
  words->push_back(static_cast<uint64_t>(nodes.size()));
  for (const Node& n : nodes) {
    words->push_back(static_cast<uint64_t>(n.op));
    words->push_back(static_cast<uint64_t>(n.type));
    words->push_back(static_cast<uint64_t>(static_cast<int64_t>(n.slot)));
    words->push_back(DoubleBits(n.value));
    for (int32_t a : n.args) words->push_back(static_cast<uint64_t>(static_cast<int64_t>(a)));
  }
}

}  // namespace fusedattn::flex
