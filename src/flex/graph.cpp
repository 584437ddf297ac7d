#include "flex/graph.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace fusedattn::flex {

namespace {

struct OpInfo {
  Op op;
  const char* name;
  int arity;
};

constexpr OpInfo kOps[kNumOps] = {
    {Op::kInput, "input", 0},     {Op::kConstant, "constant", 0}, {Op::kTensor, "tensor", 0},
    {Op::kNeg, "neg", 1},         {Op::kAbs, "abs", 1},           {Op::kExp, "exp", 1},
    {Op::kLog, "log", 1},         {Op::kTanh, "tanh", 1},         {Op::kSigmoid, "sigmoid", 1},
    {Op::kNot, "not", 1},         {Op::kAdd, "add", 2},           {Op::kSub, "sub", 2},
    {Op::kMul, "mul", 2},         {Op::kDiv, "div", 2},           {Op::kMin, "min", 2},
    {Op::kMax, "max", 2},         {Op::kLt, "lt", 2},             {Op::kLe, "le", 2},
    {Op::kGt, "gt", 2},           {Op::kGe, "ge", 2},             {Op::kEq, "eq", 2},
    {Op::kNe, "ne", 2},           {Op::kAnd, "and", 2},           {Op::kOr, "or", 2},
    {Op::kSelect, "select", 3},
};

const OpInfo& Info(Op op) { return kOps[static_cast<int>(op)]; }

constexpr int kFirstApiOp = static_cast<int>(Op::kNeg);

}  // namespace

bool OpFromApi(int op, Op* out) {
  if (op < FUSEDATTN_SCORE_MOD_NEG || op > FUSEDATTN_SCORE_MOD_SELECT) return false;
  *out = static_cast<Op>(op + kFirstApiOp);
  return true;
}

const char* OpName(Op op) { return Info(op).name; }
int Arity(Op op) { return Info(op).arity; }
const char* TypeName(Type type) { return type == Type::kBool ? "boolean" : "number"; }

const char* InputName(int input) {
  switch (input) {
    case FUSEDATTN_SCORE_MOD_SCORE: return "s";
    case FUSEDATTN_SCORE_MOD_BATCH: return "batch";
    case FUSEDATTN_SCORE_MOD_HEAD: return "head";
    case FUSEDATTN_SCORE_MOD_Q_IDX: return "q_idx";
    case FUSEDATTN_SCORE_MOD_KV_IDX: return "kv_idx";
    case FUSEDATTN_SCORE_MOD_SEQLEN_Q: return "seqlen_q";
    case FUSEDATTN_SCORE_MOD_SEQLEN_KV: return "seqlen_kv";
    case FUSEDATTN_SCORE_MOD_Q_IDX_BR: return "q_idx_br";
  }
  return "unknown";
}

uint64_t DoubleBits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

bool Node::operator==(const Node& other) const {
  return op == other.op && type == other.type && slot == other.slot &&
         DoubleBits(value) == DoubleBits(other.value) && args == other.args;
}

size_t Graph::NodeHash::operator()(const Node& node) const {
  uint64_t h = static_cast<uint64_t>(node.op) * 0x9E3779B97F4A7C15ull;
  auto mix = [&h](uint64_t w) {
    h ^= w + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  };
  mix(static_cast<uint64_t>(node.type));
  mix(static_cast<uint64_t>(node.slot));
  mix(DoubleBits(node.value));
  for (int32_t a : node.args) mix(static_cast<uint64_t>(static_cast<int64_t>(a)));
  return static_cast<size_t>(h);
}

int32_t Graph::Intern(const Node& node) {
  auto it = index_.find(node);
  if (it != index_.end()) return it->second;
  int32_t id = size();
  nodes_.push_back(node);
  index_.emplace(node, id);
  return id;
}

Status ResultType(Op op, const Type* types, int count, Type* out) {
  const OpInfo& info = Info(op);
  if (count != info.arity)
    return InvalidArgument("%s takes %d operand%s but %d %s given", info.name, info.arity,
                           info.arity == 1 ? "" : "s", count, count == 1 ? "is" : "are");
  auto expect = [&](int k, Type want) -> Status {
    if (types[k] != want)
      return InvalidArgument("%s: operand %d is a %s but a %s is expected%s", info.name, k,
                             TypeName(types[k]), TypeName(want),
                             want == Type::kNumber
                                 ? " (turn a boolean into a number with select(c, 1, 0))"
                                 : " (compare numbers to get a boolean)");
    return Status::Ok();
  };
  switch (op) {
    case Op::kInput:
    case Op::kConstant:
    case Op::kTensor: return InternalError("ResultType called on a leaf");
    case Op::kNeg:
    case Op::kAbs:
    case Op::kExp:
    case Op::kLog:
    case Op::kTanh:
    case Op::kSigmoid:
      FUSEDATTN_RETURN_IF_ERROR(expect(0, Type::kNumber));
      *out = Type::kNumber;
      return Status::Ok();
    case Op::kNot:
      FUSEDATTN_RETURN_IF_ERROR(expect(0, Type::kBool));
      *out = Type::kBool;
      return Status::Ok();
    case Op::kAdd:
    case Op::kSub:
    case Op::kMul:
    case Op::kDiv:
    case Op::kMin:
    case Op::kMax:
      FUSEDATTN_RETURN_IF_ERROR(expect(0, Type::kNumber));
      FUSEDATTN_RETURN_IF_ERROR(expect(1, Type::kNumber));
      *out = Type::kNumber;
      return Status::Ok();
    case Op::kLt:
    case Op::kLe:
    case Op::kGt:
    case Op::kGe:
      FUSEDATTN_RETURN_IF_ERROR(expect(0, Type::kNumber));
      FUSEDATTN_RETURN_IF_ERROR(expect(1, Type::kNumber));
      *out = Type::kBool;
      return Status::Ok();
    case Op::kEq:
    case Op::kNe:
      if (types[0] != types[1])
        return InvalidArgument("%s: operands are a %s and a %s; compare two numbers or two "
                               "booleans",
                               info.name, TypeName(types[0]), TypeName(types[1]));
      *out = Type::kBool;
      return Status::Ok();
    case Op::kAnd:
    case Op::kOr:
      FUSEDATTN_RETURN_IF_ERROR(expect(0, Type::kBool));
      FUSEDATTN_RETURN_IF_ERROR(expect(1, Type::kBool));
      *out = Type::kBool;
      return Status::Ok();
    case Op::kSelect:
      FUSEDATTN_RETURN_IF_ERROR(expect(0, Type::kBool));
      if (types[1] != types[2])
        return InvalidArgument("select: the branches are a %s and a %s but must have one type",
                               TypeName(types[1]), TypeName(types[2]));
      *out = types[1];
      return Status::Ok();
  }
  return InternalError("unknown op %d", static_cast<int>(op));
}

double ApplyOp(Op op, double a, double b, double c) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  auto truth = [](bool v) { return v ? 1.0 : 0.0; };
  switch (op) {
    case Op::kNeg: return -a;
    case Op::kAbs: return std::fabs(a);
    case Op::kExp: return std::exp(a);
    case Op::kLog: return std::log(a);
    case Op::kTanh: return std::tanh(a);
    case Op::kSigmoid: return 1.0 / (1.0 + std::exp(-a));
    case Op::kNot: return truth(a == 0.0);
    case Op::kAdd: return a + b;
    case Op::kSub: return a - b;
    case Op::kMul: return a * b;
    case Op::kDiv: return a / b;
    case Op::kMin: return std::isnan(a) || std::isnan(b) ? kNaN : (b < a ? b : a);
    case Op::kMax: return std::isnan(a) || std::isnan(b) ? kNaN : (b > a ? b : a);
    case Op::kLt: return truth(a < b);
    case Op::kLe: return truth(a <= b);
    case Op::kGt: return truth(a > b);
    case Op::kGe: return truth(a >= b);
    case Op::kEq: return truth(a == b);
    case Op::kNe: return truth(a != b);
    case Op::kAnd: return truth(a != 0.0 && b != 0.0);
    case Op::kOr: return truth(a != 0.0 || b != 0.0);
    case Op::kSelect: return a != 0.0 ? b : c;
    case Op::kInput:
    case Op::kConstant:
    case Op::kTensor: break;
  }
  return kNaN;
}

bool DependsOnInput(const std::vector<Node>& nodes, int32_t id, int input) {
  if (id < 0) return false;
  // Operands precede their users, so one backward sweep over [0, id] marks every dependency.
  std::vector<char> reached(static_cast<size_t>(id) + 1, 0);
  reached[static_cast<size_t>(id)] = 1;
  for (int32_t k = id; k >= 0; --k) {
    if (!reached[static_cast<size_t>(k)]) continue;
    const Node& n = nodes[static_cast<size_t>(k)];
    if (n.op == Op::kInput && n.slot == input) return true;
    for (int a = 0; a < Arity(n.op); ++a) reached[static_cast<size_t>(n.args[a])] = 1;
  }
  return false;
}

namespace {

void Append(const std::vector<Node>& nodes, int32_t id, const std::vector<std::string>* names,
            std::string* out) {
  constexpr size_t kMaxText = 8192;
  if (out->size() > kMaxText) {
    if (out->compare(out->size() - 3, 3, "...") != 0) *out += "...";
    return;
  }
  const Node& n = nodes[static_cast<size_t>(id)];
  switch (n.op) {
    case Op::kInput: *out += InputName(n.slot); return;
    case Op::kConstant:
      if (n.type == Type::kBool) {
        *out += n.value != 0.0 ? "true" : "false";
      } else {
        *out += Format("%.17g", n.value);
      }
      return;
    case Op::kTensor:
      if (names && n.slot < static_cast<int32_t>(names->size())) {
        *out += (*names)[static_cast<size_t>(n.slot)];
      } else {
        *out += Format("tensor%d", n.slot);
      }
      return;
    default: break;
  }
  *out += OpName(n.op);
  *out += "(";
  for (int a = 0; a < Arity(n.op); ++a) {
    if (a) *out += ", ";
    Append(nodes, n.args[a], names, out);
  }
  *out += ")";
}

}  // namespace

std::string ToString(const std::vector<Node>& nodes, int32_t id,
                     const std::vector<std::string>* tensor_names) {
  if (id < 0) return "none";
  std::string out;
  Append(nodes, id, tensor_names, &out);
  return out;
}

}  // namespace fusedattn::flex
