// Helpers of the flex tests: the internal ScoreMod behind a public handle, and the values of its
// programs at a point through the CPU interpreter.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "flex/interpreter.h"
#include "flex/score_mod.h"
#include "fusedattn/score_mod.hpp"

namespace fusedattn::flex_test {

inline std::shared_ptr<const flex::ScoreMod> Internal(const ScoreMod& mod) {
  std::shared_ptr<const flex::ScoreMod> out;
  Status s = flex::FinalizedOf(mod.get(), "mod", &out);
  EXPECT_TRUE(s.ok()) << s.message();
  return out;
}

// A program's outputs at one point. Absent outputs read as the spec says: score s unchanged,
// every key visible.
struct Values {
  double score = 0;
  bool visible = true;
  double d_score = 0;
  std::vector<double> d_tensor;  // NaN where the program has none
};

inline Values Outputs(const flex::Program& program, const flex::Point& point,
                  const std::vector<flex::TensorRead>& tensors = {}) {
  std::vector<double> v(program.nodes.size());
  flex::Evaluate(program.nodes, point, tensors.data(), v.data());
  Values out;
  out.score = program.score >= 0 ? v[program.score] : point.score;
  out.visible = program.mask < 0 || v[program.mask] != 0.0;
  out.d_score = program.d_score >= 0 ? v[program.d_score] : 0.0;
  for (int32_t d : program.d_tensor) out.d_tensor.push_back(d >= 0 ? v[d] : NAN);
  return out;
}

inline flex::Point At(double score, int64_t q_idx = 0, int64_t kv_idx = 0) {
  flex::Point p;
  p.score = score, p.q_idx = q_idx, p.kv_idx = kv_idx;
  p.seqlen_q = p.seqlen_kv = 16;
  return p;
}

}  // namespace fusedattn::flex_test
