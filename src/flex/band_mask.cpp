#include "flex/band_mask.h"

#include <cmath>

namespace fusedattn::flex {

namespace {

// c_i * q_idx + c_j * kv_idx + c_sq * seqlen_q + c_sk * seqlen_kv + c_0: what an index
// expression of adds, subtractions, negations and products with constants is.
struct Linear {
  double ci = 0, cj = 0, csq = 0, csk = 0, c0 = 0;
  bool constant() const { return ci == 0 && cj == 0 && csq == 0 && csk == 0; }
  Linear scaled(double k) const { return {ci * k, cj * k, csq * k, csk * k, c0 * k}; }
  Linear plus(const Linear& o, double sign) const {
    return {ci + sign * o.ci, cj + sign * o.cj, csq + sign * o.csq, csk + sign * o.csk,
            c0 + sign * o.c0};
  }
};

// Constants beyond this are not exact integers in double; such a bound is not a band we trust.
constexpr double kMaxExact = 4503599627370496.0;  // 2^52

bool LinearOf(const std::vector<Node>& nodes, int32_t id, Linear* out) {
  const Node& n = nodes[static_cast<size_t>(id)];
  if (n.type != Type::kNumber) return false;
  Linear a, b;
  switch (n.op) {
    case Op::kInput:
      switch (n.slot) {
        case FUSEDATTN_SCORE_MOD_Q_IDX: out->ci = 1; return true;
        case FUSEDATTN_SCORE_MOD_KV_IDX: out->cj = 1; return true;
        case FUSEDATTN_SCORE_MOD_SEQLEN_Q: out->csq = 1; return true;
        case FUSEDATTN_SCORE_MOD_SEQLEN_KV: out->csk = 1; return true;
        default: return false;  // s, batch, head
      }
    case Op::kConstant:
      if (!std::isfinite(n.value) || std::fabs(n.value) > kMaxExact) return false;
      out->c0 = n.value;
      return true;
    case Op::kNeg:
      if (!LinearOf(nodes, n.args[0], &a)) return false;
      *out = a.scaled(-1);
      return true;
    case Op::kAdd:
    case Op::kSub:
      if (!LinearOf(nodes, n.args[0], &a) || !LinearOf(nodes, n.args[1], &b)) return false;
      *out = a.plus(b, n.op == Op::kAdd ? 1.0 : -1.0);
      return true;
    case Op::kMul:
      if (!LinearOf(nodes, n.args[0], &a) || !LinearOf(nodes, n.args[1], &b)) return false;
      if (a.constant()) *out = b.scaled(a.c0);
      else if (b.constant()) *out = a.scaled(b.c0);
      else return false;
      return true;
    default:
      return false;
  }
}

// A band under construction: bounds per side (-1 unbounded) and the diagonal they refer to.
struct Partial {
  MaskBand band;
  bool aligned = false;  // band.bottom_right is fixed by a comparison
};

void Tighten(int64_t* side, int64_t bound) {
  if (*side < 0 || bound < *side) *side = bound;
}

bool BandOf(const std::vector<Node>& nodes, int32_t id, Partial* band) {
  const Node& n = nodes[static_cast<size_t>(id)];
  if (n.op == Op::kAnd)
    return BandOf(nodes, n.args[0], band) && BandOf(nodes, n.args[1], band);
  if (n.op != Op::kLt && n.op != Op::kLe && n.op != Op::kGt && n.op != Op::kGe) return false;
  Linear lhs, rhs;
  if (!LinearOf(nodes, n.args[0], &lhs) || !LinearOf(nodes, n.args[1], &rhs)) return false;
  Linear f = lhs.plus(rhs, -1.0);  // f op 0
  Op op = n.op;
  if (f.cj == 0) return false;
  if (f.cj < 0) {  // a positive coefficient of kv_idx, flipping the comparison
    f = f.scaled(-1);
    op = op == Op::kLt ? Op::kGt : op == Op::kLe ? Op::kGe : op == Op::kGt ? Op::kLt : Op::kLe;
  }
  f = f.scaled(1.0 / f.cj);  // kv_idx's coefficient 1 (2j <= 2i is j <= i)
  // Now f = j - d + c with d = i or i + sk - sq.
  if (f.cj != 1 || f.ci != -1 || f.csk != -f.csq || (f.csk != 0 && f.csk != -1)) return false;
  const bool bottom_right = f.csk == -1;
  if (band->aligned && band->band.bottom_right != bottom_right) return false;
  band->aligned = true;
  band->band.bottom_right = bottom_right;
  const double c = f.c0;
  double bound = 0;
  switch (op) {
    case Op::kLe: bound = std::floor(-c); break;     // j - d <= -c
    case Op::kLt: bound = std::ceil(-c) - 1; break;  // j - d < -c
    case Op::kGe: bound = std::floor(c); break;      // d - j <= c
    default: bound = std::ceil(c) - 1; break;        // d - j < c
  }
  // A negative bound (the diagonal itself hidden) has no form in the window rule, where -1
  // means unbounded: leave it to the general path.
  if (bound < 0) return false;
  const bool right_side = op == Op::kLe || op == Op::kLt;
  Tighten(right_side ? &band->band.right : &band->band.left, static_cast<int64_t>(bound));
  return true;
}

}  // namespace

bool RecognizeBandMask(const Program& program, MaskBand* band) {
  if (program.mask < 0) return false;
  Partial partial;
  if (!BandOf(program.nodes, program.mask, &partial)) return false;
  *band = partial.band;
  return true;
}

bool IsMaskOnly(const Program& program) {
  if (program.score < 0) return true;
  const Node& score = program.nodes[static_cast<size_t>(program.score)];
  return score.op == Op::kInput && score.slot == FUSEDATTN_SCORE_MOD_SCORE;
}

}  // namespace fusedattn::flex
