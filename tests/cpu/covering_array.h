// All-pairs (strength-2 covering array) test design: rows of parameter values such that every
// value of every parameter appears together with every value of every other parameter in at least
// one row. Far fewer rows than the full product, and still every feature meets every mask and
// every layout. Greedy (AETG-like) and deterministic: the same domains give the same rows on every
// platform (no std:: distributions, whose results are implementation-defined).
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace fusedattn::testing_design {

// Which pairs of (parameter, value) are still to be covered.
class PairSet {
 public:
  explicit PairSet(const std::vector<int>& domains) : domains_(domains) {
    const size_t n = domains.size();
    offset_.assign(n * n, 0);
    size_t total = 0;
    for (size_t a = 0; a < n; ++a)
      for (size_t b = a + 1; b < n; ++b) {
        offset_[a * n + b] = total;
        total += static_cast<size_t>(domains[a] * domains[b]);
      }
    uncovered_.assign(total, 1);
    remaining_ = total;
  }
  // Whether (a = va, b = vb) is still uncovered; a != b in any order.
  bool uncovered(int a, int va, int b, int vb) const { return uncovered_[index(a, va, b, vb)]; }
  void cover(int a, int va, int b, int vb) {
    char& u = uncovered_[index(a, va, b, vb)];
    remaining_ -= u;
    u = 0;
  }
  size_t remaining() const { return remaining_; }
  // The k-th uncovered pair (0 <= k < remaining()).
  void nth_uncovered(size_t k, int* a, int* va, int* b, int* vb) const {
    const int n = static_cast<int>(domains_.size());
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q)
        for (int x = 0; x < domains_[p]; ++x)
          for (int y = 0; y < domains_[q]; ++y)
            if (uncovered(p, x, q, y) && k-- == 0) {
              *a = p, *va = x, *b = q, *vb = y;
              return;
            }
  }

 private:
  size_t index(int a, int va, int b, int vb) const {
    if (a > b) std::swap(a, b), std::swap(va, vb);
    return offset_[a * domains_.size() + b] + static_cast<size_t>(va * domains_[b] + vb);
  }
  std::vector<int> domains_;
  std::vector<size_t> offset_;
  std::vector<char> uncovered_;
  size_t remaining_ = 0;
};

inline std::vector<std::vector<int>> AllPairs(const std::vector<int>& domains, uint64_t seed = 1) {
  const int n = static_cast<int>(domains.size());
  PairSet pairs(domains);
  // New pairs that parameter p = value covers together with the parameters already chosen.
  auto gain_of = [&](const std::vector<int>& row, int p, int value) {
    int gain = 0;
    for (int q = 0; q < n; ++q)
      if (q != p && row[q] >= 0) gain += pairs.uncovered(p, value, q, row[q]);
    return gain;
  };

  std::mt19937_64 rng(seed);
  std::vector<std::vector<int>> rows;
  while (pairs.remaining() > 0) {
    std::vector<int> best;
    int best_gain = -1;
    for (int candidate = 0; candidate < 16; ++candidate) {
      // Start from an uncovered pair, then fill the other parameters in a random order, each
      // with the value that covers the most new pairs with those already chosen.
      std::vector<int> row(n, -1);
      int a, va, b, vb;
      pairs.nth_uncovered(rng() % pairs.remaining(), &a, &va, &b, &vb);
      row[a] = va, row[b] = vb;
      int gain = 1;
      std::vector<int> order;
      for (int p = 0; p < n; ++p)
        if (row[p] < 0) order.push_back(p);
      for (size_t k = order.size(); k > 1; --k) std::swap(order[k - 1], order[rng() % k]);
      for (int p : order) {
        int best_value = 0, best_value_gain = -1;
        const int start = static_cast<int>(rng() % static_cast<uint64_t>(domains[p]));
        for (int d = 0; d < domains[p]; ++d) {
          const int value = (start + d) % domains[p];
          const int g = gain_of(row, p, value);
          if (g > best_value_gain) best_value_gain = g, best_value = value;
        }
        row[p] = best_value;
        gain += best_value_gain;
      }
      if (gain > best_gain) best_gain = gain, best = row;
    }
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q) pairs.cover(p, best[p], q, best[q]);
    rows.push_back(best);
  }
  return rows;
}

}  // namespace fusedattn::testing_design
