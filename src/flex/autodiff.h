// Symbolic differentiation of score-modifier graphs, with simplification.
//
// Derivatives are taken in forward mode: the tangent of every node with respect to one leaf (the
// score s, or one auxiliary tensor), node by node in topological order. A score modifier has one
// output and few leaves that need a derivative, so forward mode costs about one extra node per
// node, and it is safe through select: select(c, a, b) has the tangent select(c, a', b'), and the
// branch not taken never reaches the result (reverse mode would multiply its zero adjoint into the
// untaken branch's local derivative, which is inf or NaN at, e.g., log(0)).
//
// A tangent that is identically zero is kept as "no node" (kZero), so terms that do not depend on
// the leaf vanish exactly instead of becoming 0 * x (which is NaN when x is inf).
#pragma once

#include <vector>

#include "flex/graph.h"

namespace fusedattn::flex {

// Builds nodes into a graph, simplifying as it goes: constant folding (with ApplyOp, the
// interpreter's own arithmetic), x + 0, x - 0, 0 - x, x * 1, x / 1, x * 0 when x is known to be
// finite, -(-x), select with a constant condition or equal branches. Only derived graphs are
// simplified; the user's graph is kept exactly as built (its identity is what was built).
class Simplifier {
 public:
  explicit Simplifier(Graph* graph) : graph_(graph) {}
  int32_t Constant(double value);
  // op applied to the operands (as many as its arity); operands must be well-typed.
  int32_t Apply(Op op, int32_t a, int32_t b = -1, int32_t c = -1);

  // Whether node `id` always has a finite value (so x * 0 == 0 exactly).
  bool KnownFinite(int32_t id);

 private:
  bool IsConstant(int32_t id, double value) const;
  Graph* graph_;
  std::vector<char> finite_;  // per node id, settled in order: 1 when known finite
};

class Differentiator {
 public:
  // `graph` holds the expression; the derivative's nodes are added to it.
  explicit Differentiator(Graph* graph) : graph_(graph), simplify_(graph) {}

  static constexpr int32_t kZero = -1;

  // d of / d wrt, where wrt is a leaf of the graph (an input or a tensor node): the id of a node
  // of the graph, or kZero when the derivative is identically zero.
  int32_t Derivative(int32_t of, int32_t wrt);

 private:
  int32_t Tangent(int32_t id, const std::vector<int32_t>& tangents);
  int32_t ZeroIfAbsent(int32_t tangent);
  Graph* graph_;
  Simplifier simplify_;
};

}  // namespace fusedattn::flex
