#include "flex/autodiff.h"

#include <cmath>

namespace fusedattn::flex {

// ------------------------------------------------------------------------------------------------
// Simplifier
// ------------------------------------------------------------------------------------------------

int32_t Simplifier::Constant(double value) {
  Node n;
  n.op = Op::kConstant;
  n.type = Type::kNumber;
  n.value = value;
  return graph_->Intern(n);
}

bool Simplifier::IsConstant(int32_t id, double value) const {
  const Node& n = graph_->node(id);
  return n.op == Op::kConstant && n.type == Type::kNumber && n.value == value;
}

bool Simplifier::KnownFinite(int32_t id) {
  // Operands precede their users: settle every node up to id in order, without recursion.
  for (int32_t k = static_cast<int32_t>(finite_.size()); k <= id; ++k) {
    const Node& n = graph_->node(k);
    auto finite = [&](int a) { return finite_[static_cast<size_t>(n.args[a])] != 0; };
    bool known = false;
    if (n.type == Type::kBool) {
      known = true;  // 0 or 1
    } else {
      switch (n.op) {
        case Op::kInput: known = n.slot != FUSEDATTN_SCORE_MOD_SCORE; break;  // indices, lengths
        case Op::kConstant: known = std::isfinite(n.value); break;
        case Op::kTensor: known = false; break;  // float tensors may hold inf
        case Op::kNeg:
        case Op::kAbs:
        case Op::kTanh:
        case Op::kSigmoid: known = finite(0); break;
        case Op::kMin:
        case Op::kMax: known = finite(0) && finite(1); break;
        case Op::kSelect: known = finite(1) && finite(2); break;
        default: known = false; break;  // add, mul, div, exp, log can overflow or divide by 0
      }
    }
    finite_.push_back(known ? 1 : 0);
  }
  return finite_[static_cast<size_t>(id)] != 0;
}

int32_t Simplifier::Apply(Op op, int32_t a, int32_t b, int32_t c) {
  const int arity = Arity(op);
  const int32_t args[3] = {a, b, c};
  Type types[3] = {Type::kNumber, Type::kNumber, Type::kNumber};
  bool all_constant = true;
  for (int k = 0; k < arity; ++k) {
    const Node& operand = graph_->node(args[k]);
    types[k] = operand.type;
    all_constant &= operand.op == Op::kConstant;
  }
  Type type = Type::kNumber;
  Status typed = ResultType(op, types, arity, &type);
  (void)typed;  // derived graphs are well-typed by construction

  if (all_constant) {
    double v[3] = {0, 0, 0};
    for (int k = 0; k < arity; ++k) v[k] = graph_->node(args[k]).value;
    Node n;
    n.op = Op::kConstant;
    n.type = type;
    n.value = ApplyOp(op, v[0], v[1], v[2]);
    return graph_->Intern(n);
  }
  switch (op) {
    case Op::kAdd:
      if (IsConstant(b, 0.0)) return a;  // x + 0 == x (up to the sign of a zero)
      if (IsConstant(a, 0.0)) return b;
      break;
    case Op::kSub:
      if (IsConstant(b, 0.0)) return a;
      if (IsConstant(a, 0.0)) return Apply(Op::kNeg, b);
      if (a == b && KnownFinite(a)) return Constant(0.0);
      break;
    case Op::kMul:
      if (IsConstant(b, 1.0)) return a;
      if (IsConstant(a, 1.0)) return b;
      if (IsConstant(b, -1.0)) return Apply(Op::kNeg, a);
      if (IsConstant(a, -1.0)) return Apply(Op::kNeg, b);
      if ((IsConstant(a, 0.0) && KnownFinite(b)) || (IsConstant(b, 0.0) && KnownFinite(a)))
        return Constant(0.0);
      break;
    case Op::kDiv:
      if (IsConstant(b, 1.0)) return a;
      break;
    case Op::kNeg:
      if (graph_->node(a).op == Op::kNeg) return graph_->node(a).args[0];
      break;
    case Op::kSelect: {
      const Node& cond = graph_->node(a);
      if (cond.op == Op::kConstant) return cond.value != 0.0 ? b : c;
      if (b == c) return b;
      break;
    }
    default: break;
  }
  Node n;
  n.op = op;
  n.type = type;
  for (int k = 0; k < arity; ++k) n.args[static_cast<size_t>(k)] = args[k];
  return graph_->Intern(n);
}

// ------------------------------------------------------------------------------------------------
// Differentiator
// ------------------------------------------------------------------------------------------------

int32_t Differentiator::ZeroIfAbsent(int32_t tangent) {
  return tangent == kZero ? simplify_.Constant(0.0) : tangent;
}

int32_t Differentiator::Derivative(int32_t of, int32_t wrt) {
  // Tangents of every node up to `of` in topological order (operands precede users). Nodes the
  // derivative adds come after `of` and are never differentiated themselves.
  std::vector<int32_t> tangents(static_cast<size_t>(of) + 1, kZero);
  for (int32_t id = 0; id <= of; ++id) {
    if (id == wrt) {
      tangents[static_cast<size_t>(id)] = simplify_.Constant(1.0);
      continue;
    }
    tangents[static_cast<size_t>(id)] = Tangent(id, tangents);
  }
  return tangents[static_cast<size_t>(of)];
}

int32_t Differentiator::Tangent(int32_t id, const std::vector<int32_t>& tangents) {
  const Node n = graph_->node(id);  // a copy: building nodes may reallocate the graph
  if (n.type == Type::kBool) return kZero;  // comparisons and logic carry no derivative
  const int arity = Arity(n.op);
  if (arity == 0) return kZero;  // leaves other than wrt
  const int32_t x = n.args[0], y = n.args[1];
  const int32_t dx = tangents[static_cast<size_t>(x)];
  const int32_t dy = arity >= 2 ? tangents[static_cast<size_t>(y)] : kZero;
  bool any = dx != kZero || dy != kZero;
  if (n.op == Op::kSelect) any = dy != kZero || tangents[static_cast<size_t>(n.args[2])] != kZero;
  if (!any) return kZero;

  Simplifier& s = simplify_;
  switch (n.op) {
    case Op::kNeg: return s.Apply(Op::kNeg, dx);
    case Op::kAbs: {
      // sign(x) dx, with sign(0) = 0 (as torch.abs's backward).
      int32_t zero = s.Constant(0.0);
      int32_t negative = s.Apply(Op::kSelect, s.Apply(Op::kLt, x, zero), s.Apply(Op::kNeg, dx),
                                 zero);
      return s.Apply(Op::kSelect, s.Apply(Op::kGt, x, zero), dx, negative);
    }
    case Op::kExp: return s.Apply(Op::kMul, dx, id);  // d e^x = e^x dx
    case Op::kLog: return s.Apply(Op::kDiv, dx, x);
    case Op::kTanh: {
      int32_t one = s.Constant(1.0);
      return s.Apply(Op::kMul, dx, s.Apply(Op::kSub, one, s.Apply(Op::kMul, id, id)));
    }
    case Op::kSigmoid: {
      int32_t one = s.Constant(1.0);
      return s.Apply(Op::kMul, dx, s.Apply(Op::kMul, id, s.Apply(Op::kSub, one, id)));
    }
    case Op::kAdd:
      if (dx == kZero) return dy;
      if (dy == kZero) return dx;
      return s.Apply(Op::kAdd, dx, dy);
    case Op::kSub:
      if (dy == kZero) return dx;
      if (dx == kZero) return s.Apply(Op::kNeg, dy);
      return s.Apply(Op::kSub, dx, dy);
    case Op::kMul: {
      // d(xy) = dx y + x dy, without the terms whose tangent is zero.
      int32_t left = dx == kZero ? kZero : s.Apply(Op::kMul, dx, y);
      int32_t right = dy == kZero ? kZero : s.Apply(Op::kMul, x, dy);
      if (left == kZero) return right;
      if (right == kZero) return left;
      return s.Apply(Op::kAdd, left, right);
    }
    case Op::kDiv: {
      // d(x/y) = (dx - (x/y) dy) / y.
      if (dy == kZero) return s.Apply(Op::kDiv, dx, y);
      int32_t quotient_dy = s.Apply(Op::kMul, id, dy);
      int32_t numerator =
          dx == kZero ? s.Apply(Op::kNeg, quotient_dy) : s.Apply(Op::kSub, dx, quotient_dy);
      return s.Apply(Op::kDiv, numerator, y);
    }
    case Op::kMin:  // min(x, y) = y < x ? y : x, and its tangent follows the branch taken
      return s.Apply(Op::kSelect, s.Apply(Op::kLt, y, x), ZeroIfAbsent(dy), ZeroIfAbsent(dx));
    case Op::kMax:
      return s.Apply(Op::kSelect, s.Apply(Op::kGt, y, x), ZeroIfAbsent(dy), ZeroIfAbsent(dx));
    case Op::kSelect: {
      int32_t d_then = tangents[static_cast<size_t>(n.args[1])];
      int32_t d_else = tangents[static_cast<size_t>(n.args[2])];
      return s.Apply(Op::kSelect, x, ZeroIfAbsent(d_then), ZeroIfAbsent(d_else));
    }
    default: return kZero;
  }
}

}  // namespace fusedattn::flex
