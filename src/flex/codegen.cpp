#include "flex/codegen.h"

#include <cmath>
#include <cstring>

namespace fusedattn::flex {

namespace {

std::string FloatConstant(double value) {
  const float f = static_cast<float>(value);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return Format("__uint_as_float(0x%08xu)", bits);
}

}  // namespace

std::string CudaValue(const CudaNames& names, int32_t id) {
  return names.prefix + std::to_string(id);
}

const char* CudaHelpers() {
  return R"(// min and max as graph.cpp's ApplyOp: NaN when either operand is NaN.
__device__ __forceinline__ float FlexMin(float a, float b) {
  return (a != a || b != b) ? __uint_as_float(0x7fc00000u) : (b < a ? b : a);
}
__device__ __forceinline__ float FlexMax(float a, float b) {
  return (a != a || b != b) ? __uint_as_float(0x7fc00000u) : (b > a ? b : a);
}
)";
}

void EmitCudaNodes(const Program& program, const std::vector<TensorDecl>& tensors,
                   const CudaNames& names, std::string* out) {
  const auto& nodes = program.nodes;
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    auto arg = [&](int a) { return CudaValue(names, n.args[a]); };
    std::string expr;
    switch (n.op) {
      case Op::kInput: expr = names.inputs[n.slot]; break;
      case Op::kConstant:
        expr = n.type == Type::kBool ? (n.value != 0.0 ? "true" : "false") : FloatConstant(n.value);
        break;
      case Op::kTensor:
        expr = names.tensor(n.slot, tensors[static_cast<size_t>(n.slot)].dtype);
        break;
      case Op::kNeg: expr = "-" + arg(0); break;
      case Op::kAbs: expr = "fabsf(" + arg(0) + ")"; break;
      case Op::kExp: expr = "expf(" + arg(0) + ")"; break;
      case Op::kLog: expr = "logf(" + arg(0) + ")"; break;
      case Op::kTanh: expr = names.tanh_function + "(" + arg(0) + ")"; break;
      case Op::kSigmoid: expr = "1.f / (1.f + expf(-" + arg(0) + "))"; break;
      case Op::kNot: expr = "!" + arg(0); break;
      case Op::kAdd: expr = arg(0) + " + " + arg(1); break;
      case Op::kSub: expr = arg(0) + " - " + arg(1); break;
      case Op::kMul: expr = arg(0) + " * " + arg(1); break;
      case Op::kDiv: {
        const Node& divisor = nodes[static_cast<size_t>(n.args[1])];
        // Only where 1 / c is a normal float32 (so not for c = 0, inf, NaN, a denormal c whose
        // reciprocal overflows, or |c| > 2^126 whose reciprocal is denormal).
        const float reciprocal =
            divisor.op == Op::kConstant
                ? static_cast<float>(1.0 / static_cast<double>(static_cast<float>(divisor.value)))
                : 0.f;
        expr = names.divide_by_reciprocal && divisor.op == Op::kConstant &&
                       std::isnormal(reciprocal)
                   ? arg(0) + " * " + FloatConstant(reciprocal)
                   : arg(0) + " / " + arg(1);
        break;
      }
      case Op::kMin: expr = "FlexMin(" + arg(0) + ", " + arg(1) + ")"; break;
      case Op::kMax: expr = "FlexMax(" + arg(0) + ", " + arg(1) + ")"; break;
      case Op::kLt: expr = arg(0) + " < " + arg(1); break;
      case Op::kLe: expr = arg(0) + " <= " + arg(1); break;
      case Op::kGt: expr = arg(0) + " > " + arg(1); break;
      case Op::kGe: expr = arg(0) + " >= " + arg(1); break;
      case Op::kEq: expr = arg(0) + " == " + arg(1); break;
      case Op::kNe: expr = arg(0) + " != " + arg(1); break;
      case Op::kAnd: expr = arg(0) + " && " + arg(1); break;
      case Op::kOr: expr = arg(0) + " || " + arg(1); break;
      case Op::kSelect: expr = arg(0) + " ? " + arg(1) + " : " + arg(2); break;
    }
    *out += Format("    const %s %s = %s;  // %s\n", n.type == Type::kBool ? "bool" : "float",
                   CudaValue(names, static_cast<int32_t>(k)).c_str(), expr.c_str(),
                   OpName(n.op));
  }
}

Dependence DependenceOf(const std::vector<Node>& nodes, const std::vector<TensorDecl>& tensors,
                        int32_t id) {
  Dependence d;
  if (id < 0) return d;
  std::vector<char> reached(static_cast<size_t>(id) + 1, 0);
  reached[static_cast<size_t>(id)] = 1;
  for (int32_t k = id; k >= 0; --k) {
    if (!reached[static_cast<size_t>(k)]) continue;
    const Node& n = nodes[static_cast<size_t>(k)];
    if (n.op == Op::kInput) {
      d.batch |= n.slot == FUSEDATTN_SCORE_MOD_BATCH || n.slot == FUSEDATTN_SCORE_MOD_SEQLEN_Q ||
                 n.slot == FUSEDATTN_SCORE_MOD_SEQLEN_KV;
      d.head |= n.slot == FUSEDATTN_SCORE_MOD_HEAD;
    } else if (n.op == Op::kTensor) {
      const uint32_t axes = tensors[static_cast<size_t>(n.slot)].axes;
      d.batch |= (axes & FUSEDATTN_SCORE_MOD_AXIS_BATCH) != 0;
      d.head |= (axes & FUSEDATTN_SCORE_MOD_AXIS_HEAD) != 0;
    }
    for (int a = 0; a < Arity(n.op); ++a) reached[static_cast<size_t>(n.args[a])] = 1;
  }
  return d;
}

}  // namespace fusedattn::flex
