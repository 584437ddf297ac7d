// Score-modifier expression graphs: nodes, their types, and a node arena that hash-conses
// (building an identical node twice returns the first one's id).
//
// The public C API (fusedattn_score_mod_*) and the finalized ScoreMod (score_mod.h) are built on
// this. The numeric meaning of every operation lives in one function, ApplyOp, used by both the
// interpreter and constant folding, so the two can never disagree.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "fusedattn/fusedattn.h"

namespace fusedattn::flex {

enum class Op : uint8_t {
  // Leaves.
  kInput,     // slot: a fusedattn_score_mod_variable (SCORE .. SEQLEN_KV)
  kConstant,  // value
  kTensor,    // slot: the auxiliary tensor's index
  // Operations, in the order of fusedattn_score_mod_opcode.
  kNeg,
  kAbs,
  kExp,
  kLog,
  kTanh,
  kSigmoid,
  kNot,
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMin,
  kMax,
  kLt,
  kLe,
  kGt,
  kGe,
  kEq,
  kNe,
  kAnd,
  kOr,
  kSelect,
};
constexpr int kNumOps = static_cast<int>(Op::kSelect) + 1;

enum class Type : uint8_t { kNumber, kBool };

// The Op of a C API operation, or false when op is not one.
bool OpFromApi(int op, Op* out);
const char* OpName(Op op);
int Arity(Op op);  // operands of the op (0 for leaves)
const char* TypeName(Type type);
const char* InputName(int input);  // "s", "batch", ...

// Input slots (fusedattn_score_mod_variable without the derived Q_IDX_BR).
constexpr int kNumInputs = FUSEDATTN_SCORE_MOD_SEQLEN_KV + 1;

struct Node {
  Op op = Op::kConstant;
  Type type = Type::kNumber;
  int32_t slot = 0;   // kInput, kTensor
  double value = 0;   // kConstant (compared bit for bit)
  std::array<int32_t, 3> args{-1, -1, -1};

  // Structural equality: constants by their bits, so -0.0 != 0.0 and NaN payloads count.
  bool operator==(const Node& other) const;
};

uint64_t DoubleBits(double value);

// The type of an operation on operands of the given types, or why it is not well-typed.
// `what` prefixes messages (e.g. "fusedattn_score_mod_op(MUL)").
Status ResultType(Op op, const Type* operand_types, int count, Type* out);

// The value of an operation: the one definition of its numbers, shared by the interpreter and
// constant folding. Booleans are 0.0 / 1.0. Leaves are not operations.
double ApplyOp(Op op, double a, double b, double c);

// Nodes in creation order; operands always precede their users. Identical nodes are one node.
class Graph {
 public:
  // The id of `node`, adding it when no identical node exists. The caller has type-checked it
  // and its operands are ids of this graph.
  int32_t Intern(const Node& node);
  const Node& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  const std::vector<Node>& nodes() const { return nodes_; }
  int32_t size() const { return static_cast<int32_t>(nodes_.size()); }
  bool contains(int32_t id) const { return id >= 0 && id < size(); }

 private:
  struct NodeHash {
    size_t operator()(const Node& node) const;
  };
  std::vector<Node> nodes_;
  std::unordered_map<Node, int32_t, NodeHash> index_;
};

// Whether `id` depends on the input `input` (through any path).
bool DependsOnInput(const std::vector<Node>& nodes, int32_t id, int input);

// A readable text of node `id` as a nested expression, e.g. "mul(tanh(div(s, 30)), 30)".
// Tensors print as their names when given.
std::string ToString(const std::vector<Node>& nodes, int32_t id,
                     const std::vector<std::string>* tensor_names = nullptr);

}  // namespace fusedattn::flex
