#include "flex/score_mod.h"

#include <cstring>

#include "flex/autodiff.h"
#include "problem/problem.h"

namespace fusedattn::flex {

std::string AxesText(uint32_t axes) {
  std::string text = "[";
  const std::pair<uint32_t, const char*> names[] = {{FUSEDATTN_SCORE_MOD_AXIS_BATCH, "batch"},
                                                    {FUSEDATTN_SCORE_MOD_AXIS_HEAD, "head"},
                                                    {FUSEDATTN_SCORE_MOD_AXIS_Q, "q"},
                                                    {FUSEDATTN_SCORE_MOD_AXIS_KV, "kv"}};
  for (const auto& [bit, name] : names)
    if (axes & bit) text += std::string(text.size() > 1 ? ", " : "") + name;
  return text + "]";
}

// ------------------------------------------------------------------------------------------------
// Builder
// ------------------------------------------------------------------------------------------------

Status Builder::CheckNode(const char* what, int32_t id) const {
  if (!graph_.contains(id))
    return InvalidArgument("%s = %d is not a node of this graph (it has %d node%s: 0..%d)", what,
                           id, graph_.size(), graph_.size() == 1 ? "" : "s", graph_.size() - 1);
  return Status::Ok();
}

int32_t Builder::Apply(Op op, int32_t a, int32_t b) {
  Node n;
  n.op = op;
  n.type = Type::kNumber;
  n.args = {a, b, -1};
  return graph_.Intern(n);
}

Status Builder::Input(int input, int32_t* node) {
  if (input < FUSEDATTN_SCORE_MOD_SCORE || input > FUSEDATTN_SCORE_MOD_Q_IDX_BR)
    return InvalidArgument(
        "input = %d is not a fusedattn_score_mod_variable (SCORE=0, BATCH, HEAD, Q_IDX, KV_IDX, "
        "SEQLEN_Q, SEQLEN_KV, Q_IDX_BR=7)",
        input);
  auto leaf = [this](int slot) {
    Node n;
    n.op = Op::kInput;
    n.type = Type::kNumber;
    n.slot = slot;
    return graph_.Intern(n);
  };
  if (input == FUSEDATTN_SCORE_MOD_Q_IDX_BR) {
    int32_t offset = Apply(Op::kSub, leaf(FUSEDATTN_SCORE_MOD_SEQLEN_KV),
                           leaf(FUSEDATTN_SCORE_MOD_SEQLEN_Q));
    *node = Apply(Op::kAdd, leaf(FUSEDATTN_SCORE_MOD_Q_IDX), offset);
  } else {
    *node = leaf(input);
  }
  return Status::Ok();
}

Status Builder::Constant(double value, int32_t* node) {
  Node n;
  n.op = Op::kConstant;
  n.type = Type::kNumber;
  n.value = value;
  *node = graph_.Intern(n);
  return Status::Ok();
}

Status Builder::Tensor(const char* name, int dtype, uint32_t axes, int32_t requires_grad,
                       int32_t* node) {
  if (name == nullptr || name[0] == '\0')
    return InvalidArgument("tensor name is %s: give each tensor a name (messages use it)",
                           name == nullptr ? "NULL" : "empty");
  for (const TensorDecl& t : tensors_)
    if (t.name == name)
      return InvalidArgument("tensor '%s' is declared twice: tensor names must be unique", name);
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT32:
    case FUSEDATTN_DTYPE_FLOAT16:
    case FUSEDATTN_DTYPE_BFLOAT16:
    case FUSEDATTN_DTYPE_INT32: break;
    default:
      return InvalidArgument(
          "tensor '%s': dtype = %d but score_mod tensors are float32, float16, bfloat16 or int32",
          name, dtype);
  }
  if ((axes & ~kAllAxes) != 0)
    return InvalidArgument(
        "tensor '%s': axes = 0x%x has bits outside FUSEDATTN_SCORE_MOD_AXIS_BATCH | HEAD | Q | KV "
        "(0xf)",
        name, axes);
  if (requires_grad != 0 && requires_grad != 1)
    return InvalidArgument("tensor '%s': requires_grad = %d must be 0 or 1", name, requires_grad);
  if (requires_grad && dtype == FUSEDATTN_DTYPE_INT32)
    return InvalidArgument("tensor '%s': requires_grad = 1 but its dtype is int32, which has no "
                           "gradient",
                           name);
  TensorDecl decl;
  decl.name = name;
  decl.dtype = static_cast<fusedattn_dtype>(dtype);
  decl.axes = axes;
  decl.requires_grad = requires_grad != 0;
  Node n;
  n.op = Op::kTensor;
  n.type = Type::kNumber;
  n.slot = static_cast<int32_t>(tensors_.size());
  tensors_.push_back(decl);
  roots_.grad_tensor.push_back(-1);
  *node = graph_.Intern(n);
  return Status::Ok();
}

Status Builder::Operation(int api_op, int32_t count, const int32_t* operands, int32_t* node) {
  Op op;
  if (!OpFromApi(api_op, &op))
    return InvalidArgument("op = %d is not a fusedattn_score_mod_opcode (NEG=0 .. SELECT=21)",
                           api_op);
  if (count != Arity(op))
    return InvalidArgument("%s takes %d operand%s but num_operands = %d", OpName(op), Arity(op),
                           Arity(op) == 1 ? "" : "s", count);
  if (operands == nullptr) return InvalidArgument("%s: operands is NULL", OpName(op));
  Type types[3];
  for (int k = 0; k < count; ++k) {
    std::string what = Format("%s: operand %d", OpName(op), k);
    FUSEDATTN_RETURN_IF_ERROR(CheckNode(what.c_str(), operands[k]));
    types[k] = graph_.node(operands[k]).type;
  }
  Node n;
  n.op = op;
  FUSEDATTN_RETURN_IF_ERROR(ResultType(op, types, count, &n.type));
  for (int k = 0; k < count; ++k) n.args[static_cast<size_t>(k)] = operands[k];
  *node = graph_.Intern(n);
  return Status::Ok();
}

Status Builder::SetScore(int32_t node) {
  FUSEDATTN_RETURN_IF_ERROR(CheckNode("score", node));
  if (graph_.node(node).type != Type::kNumber)
    return InvalidArgument("score = node %d is a boolean but the score is a number (to hide keys "
                           "use the mask, or select(c, s, -inf))",
                           node);
  roots_.score = node;
  return Status::Ok();
}

Status Builder::SetMask(int32_t node) {
  FUSEDATTN_RETURN_IF_ERROR(CheckNode("mask", node));
  if (graph_.node(node).type != Type::kBool)
    return InvalidArgument("mask = node %d is a number but the mask is a boolean (true = "
                           "visible); compare to get one",
                           node);
  if (DependsOnInput(graph_.nodes(), node, FUSEDATTN_SCORE_MOD_SCORE))
    return InvalidArgument("mask = node %d reads the score s: a mask may depend only on the "
                           "indices, the lengths and tensors (use the score output to change s)",
                           node);
  roots_.mask = node;
  return Status::Ok();
}

Status Builder::SetGradient(int32_t wrt, int32_t gradient) {
  FUSEDATTN_RETURN_IF_ERROR(CheckNode("wrt", wrt));
  FUSEDATTN_RETURN_IF_ERROR(CheckNode("gradient", gradient));
  const Node& leaf = graph_.node(wrt);
  if (graph_.node(gradient).type != Type::kNumber)
    return InvalidArgument("gradient = node %d is a boolean but a derivative is a number",
                           gradient);
  if (leaf.op == Op::kInput && leaf.slot == FUSEDATTN_SCORE_MOD_SCORE) {
    roots_.grad_score = gradient;
    return Status::Ok();
  }
  if (leaf.op == Op::kTensor) {
    const TensorDecl& t = tensors_[static_cast<size_t>(leaf.slot)];
    if (!t.requires_grad)
      return InvalidArgument("wrt = node %d is tensor '%s', declared with requires_grad = 0: a "
                             "gradient is only taken for tensors that require one",
                             wrt, t.name.c_str());
    roots_.grad_tensor[static_cast<size_t>(leaf.slot)] = gradient;
    return Status::Ok();
  }
  return InvalidArgument("wrt = node %d is %s, but gradients are taken with respect to the score "
                         "s or a tensor",
                         wrt, ToString(graph_.nodes(), wrt).c_str());
}

// ------------------------------------------------------------------------------------------------
// ScoreMod
// ------------------------------------------------------------------------------------------------

namespace {

// The identity's words: a format tag, the tensor declarations, the canonical nodes, the outputs.
std::vector<uint64_t> IdentityWords(const std::vector<TensorDecl>& tensors,
                                    const std::vector<Node>& nodes, const Roots& roots) {
  std::vector<uint64_t> words;
  words.push_back(0x464C455831ull);  // "FLEX1": bump when the encoding changes
  words.push_back(tensors.size());
  for (const TensorDecl& t : tensors) {
    words.push_back(static_cast<uint64_t>(t.dtype));
    words.push_back(t.axes);
    words.push_back(t.requires_grad ? 1 : 0);
  }
  AppendNodeWords(nodes, &words);
  auto root = [&words](int32_t id) {
    words.push_back(static_cast<uint64_t>(static_cast<int64_t>(id)));
  };
  root(roots.score);
  root(roots.mask);
  root(roots.grad_score);
  for (int32_t g : roots.grad_tensor) root(g);
  return words;
}

Program MakeProgram(const std::vector<Node>& nodes, int32_t score, int32_t mask, int32_t d_score,
                    std::vector<int32_t> d_tensor) {
  Program p;
  p.score = score, p.mask = mask, p.d_score = d_score;
  p.d_tensor = std::move(d_tensor);
  std::vector<int32_t*> roots = {&p.score, &p.mask, &p.d_score};
  for (int32_t& d : p.d_tensor) roots.push_back(&d);
  p.nodes = Compact(nodes, roots);
  return p;
}

}  // namespace

bool ScoreMod::any_requires_grad() const {
  for (const TensorDecl& t : tensors_)
    if (t.requires_grad) return true;
  return false;
}

Status ScoreMod::Make(const Builder& builder, std::shared_ptr<const ScoreMod>* out) {
  const Roots& user = builder.roots();
  if (user.score < 0 && user.mask < 0)
    return InvalidArgument("the graph has no output: set a score (fusedattn_score_mod_set_score) "
                           "or a mask (fusedattn_score_mod_set_mask)");
  auto mod = std::make_shared<ScoreMod>();
  mod->tensors_ = builder.tensors();

  // The canonical user graph and its identity.
  mod->roots_ = user;
  std::vector<int32_t*> roots = {&mod->roots_.score, &mod->roots_.mask, &mod->roots_.grad_score};
  for (int32_t& g : mod->roots_.grad_tensor) roots.push_back(&g);
  mod->canonical_ = Compact(builder.graph().nodes(), roots);
  mod->words_ = IdentityWords(mod->tensors_, mod->canonical_, mod->roots_);
  mod->hash_ = HashWords(mod->words_);

  // Derivatives, built into a graph that starts as the canonical one (its nodes are distinct,
  // so interning them in order keeps their ids).
  Graph graph;
  for (const Node& n : mod->canonical_) graph.Intern(n);
  Node score_leaf;
  score_leaf.op = Op::kInput;
  score_leaf.type = Type::kNumber;
  score_leaf.slot = FUSEDATTN_SCORE_MOD_SCORE;
  const int32_t s = graph.Intern(score_leaf);
  const Roots& r = mod->roots_;
  const int32_t score = r.score >= 0 ? r.score : s;

  Differentiator differentiate(&graph);
  Simplifier simplify(&graph);
  auto derivative = [&](int32_t wrt) {
    int32_t d = differentiate.Derivative(score, wrt);
    return d == Differentiator::kZero ? simplify.Constant(0.0) : d;
  };
  const int32_t derived_d_score = derivative(s);
  const size_t num_tensors = mod->tensors_.size();
  std::vector<int32_t> derived_d_tensor(num_tensors, -1), d_tensor(num_tensors, -1);
  for (size_t k = 0; k < num_tensors; ++k) {
    if (!mod->tensors_[k].requires_grad) continue;
    Node leaf;
    leaf.op = Op::kTensor;
    leaf.type = Type::kNumber;
    leaf.slot = static_cast<int32_t>(k);
    derived_d_tensor[k] = derivative(graph.Intern(leaf));
    d_tensor[k] = r.grad_tensor[k] >= 0 ? r.grad_tensor[k] : derived_d_tensor[k];
    mod->has_explicit_gradient_ |= r.grad_tensor[k] >= 0;
  }
  mod->has_explicit_gradient_ |= r.grad_score >= 0;

  mod->forward_ = MakeProgram(graph.nodes(), r.score, r.mask, -1, {});
  mod->derived_ =
      MakeProgram(graph.nodes(), r.score, r.mask, derived_d_score, derived_d_tensor);
  mod->backward_ =
      MakeProgram(graph.nodes(), r.score, r.mask,
                  r.grad_score >= 0 ? r.grad_score : derived_d_score, d_tensor);
  *out = std::move(mod);
  return Status::Ok();
}

std::string ScoreMod::Describe() const {
  std::vector<std::string> names;
  for (const TensorDecl& t : tensors_) names.push_back(t.name);
  const Program& b = backward_;
  std::string text;
  text += "score: " + (b.score >= 0 ? ToString(b.nodes, b.score, &names) : "s (unchanged)");
  text += "\nmask: " + (b.mask >= 0 ? ToString(b.nodes, b.mask, &names) : "none");
  text += "\nd score/d s: " + ToString(b.nodes, b.d_score, &names) +
          (roots_.grad_score >= 0 ? " (given)" : " (derived)");
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const TensorDecl& t = tensors_[k];
    text += Format("\ntensor %s: %s %s%s", t.name.c_str(), DtypeName(t.dtype),
                   AxesText(t.axes).c_str(), t.requires_grad ? " requires_grad" : "");
    if (t.requires_grad)
      text += "\nd score/d " + t.name + ": " + ToString(b.nodes, b.d_tensor[k], &names) +
              (roots_.grad_tensor[k] >= 0 ? " (given)" : " (derived)");
  }
  return text;
}

bool SameScoreMod(const ScoreMod* a, const ScoreMod* b) {
  if (a == nullptr || b == nullptr) return a == b;
  return a == b || *a == *b;
}

Status FinalizedOf(const fusedattn_score_mod* handle, const char* field,
                   std::shared_ptr<const ScoreMod>* out) {
  if (handle == nullptr) return InvalidArgument("%s is NULL", field);
  if (handle->magic != fusedattn_score_mod::kMagic)
    return InvalidArgument("%s does not point at a live fusedattn_score_mod (destroyed, or "
                           "another object)",
                           field);
  if (!handle->finalized)
    return InvalidArgument("%s is not finalized: call fusedattn_score_mod_finalize before using "
                           "it",
                           field);
  *out = handle->finalized;
  return Status::Ok();
}

}  // namespace fusedattn::flex
