#include "flex/interpreter.h"

#include "common/dtype.h"

namespace fusedattn::flex {

namespace {
double InputValue(int slot, const Point& p) {
  switch (slot) {
    case FUSEDATTN_SCORE_MOD_SCORE: return p.score;
    case FUSEDATTN_SCORE_MOD_BATCH: return static_cast<double>(p.batch);
    case FUSEDATTN_SCORE_MOD_HEAD: return static_cast<double>(p.head);
    case FUSEDATTN_SCORE_MOD_Q_IDX: return static_cast<double>(p.q_idx);
    case FUSEDATTN_SCORE_MOD_KV_IDX: return static_cast<double>(p.kv_idx);
    case FUSEDATTN_SCORE_MOD_SEQLEN_Q: return static_cast<double>(p.seqlen_q);
    case FUSEDATTN_SCORE_MOD_SEQLEN_KV: return static_cast<double>(p.seqlen_kv);
  }
  return 0.0;
}
}  // namespace

void Evaluate(const std::vector<Node>& nodes, const Point& point, const TensorRead* tensors,
              double* values) {
  const size_t count = nodes.size();
  for (size_t k = 0; k < count; ++k) {
    const Node& n = nodes[k];
    switch (n.op) {
      case Op::kInput: values[k] = InputValue(n.slot, point); break;
      case Op::kConstant: values[k] = n.value; break;
      case Op::kTensor: {
        const TensorRead& t = tensors[n.slot];
        values[k] = LoadAsDouble(t.data, t.dtype, t.offset(point));
        break;
      }
      default: {
        double a = values[n.args[0]];
        double b = n.args[1] >= 0 ? values[n.args[1]] : 0.0;
        double c = n.args[2] >= 0 ? values[n.args[2]] : 0.0;
        values[k] = ApplyOp(n.op, a, b, c);
      }
    }
  }
}

}  // namespace fusedattn::flex
