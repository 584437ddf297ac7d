// All-pairs (strength-2 covering array) test design: rows of parameter values such that every
// value of every parameter appears together with every value of every other parameter in at least
// one row. Far fewer rows than the full product, and still every feature meets every mask and
// every layout. Greedy (AETG-like) and deterministic: the same domains give the same rows on every
// platform (no std:: distributions, whose results are implementation-defined).
#pragma once

#include <cstdint>
#include <random>
#include <set>
#include <tuple>
#include <vector>

namespace fusedattn::testing_design {

inline std::vector<std::vector<int>> AllPairs(const std::vector<int>& domain_sizes,
                                              uint64_t seed = 1) {
  const int n = static_cast<int>(domain_sizes.size());
  std::set<std::tuple<int, int, int, int>> uncovered;  // (param a, value a, param b, value b)
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b)
      for (int va = 0; va < domain_sizes[a]; ++va)
        for (int vb = 0; vb < domain_sizes[b]; ++vb) uncovered.insert({a, va, b, vb});

  auto new_pairs = [&](const std::vector<int>& row) {
    int count = 0;
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b)
        if (row[a] >= 0 && row[b] >= 0) count += uncovered.count({a, row[a], b, row[b]});
    return count;
  };

  std::mt19937_64 rng(seed);
  std::vector<std::vector<int>> rows;
  while (!uncovered.empty()) {
    std::vector<int> best;
    int best_gain = -1;
    for (int candidate = 0; candidate < 24; ++candidate) {
      // Start from an uncovered pair, then fill the other parameters in a random order, each
      // with the value that covers the most new pairs with those already chosen.
      auto it = uncovered.begin();
      std::advance(it, static_cast<long>(rng() % uncovered.size()));
      std::vector<int> row(n, -1);
      row[std::get<0>(*it)] = std::get<1>(*it);
      row[std::get<2>(*it)] = std::get<3>(*it);
      std::vector<int> order;
      for (int p = 0; p < n; ++p)
        if (row[p] < 0) order.push_back(p);
      for (size_t k = order.size(); k > 1; --k) std::swap(order[k - 1], order[rng() % k]);
      for (int p : order) {
        int best_value = 0, best_value_gain = -1;
        const int start = static_cast<int>(rng() % domain_sizes[p]);
        for (int d = 0; d < domain_sizes[p]; ++d) {
          const int value = (start + d) % domain_sizes[p];
          row[p] = value;
          const int gain = new_pairs(row);
          if (gain > best_value_gain) best_value_gain = gain, best_value = value;
        }
        row[p] = best_value;
      }
      const int gain = new_pairs(row);
      if (gain > best_gain) best_gain = gain, best = row;
    }
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) uncovered.erase({a, best[a], b, best[b]});
    rows.push_back(best);
  }
  return rows;
}

}  // namespace fusedattn::testing_design
