// The CPU interpreter of score-modifier programs: the reference backend's executor and the
// oracle for tests. Every number is a double; booleans are 0 and 1.
#pragma once

#include <cstdint>
#include <vector>

#include "flex/graph.h"

namespace fusedattn::flex {

// Where a program is evaluated: one (sequence, query head, query, key) and the score s there.
struct Point {
  int64_t batch = 0, head = 0, q_idx = 0, kv_idx = 0;
  int64_t seqlen_q = 0, seqlen_kv = 0;
  double score = 0;
};

// An auxiliary tensor on the host: element (b, h, i, j) is at
// b * stride_b + h * stride_h + i * stride_q + j * stride_kv, with stride 0 on the axes the
// tensor does not index.
struct TensorRead {
  const void* data = nullptr;
  fusedattn_dtype dtype = FUSEDATTN_DTYPE_FLOAT32;
  int64_t stride_b = 0, stride_h = 0, stride_q = 0, stride_kv = 0;
  int64_t offset(const Point& p) const {
    return p.batch * stride_b + p.head * stride_h + p.q_idx * stride_q + p.kv_idx * stride_kv;
  }
};

// Evaluates every node of `nodes` at `point` into values[0 .. nodes.size()).
void Evaluate(const std::vector<Node>& nodes, const Point& point, const TensorRead* tensors,
              double* values);

}  // namespace fusedattn::flex
