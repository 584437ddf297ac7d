// Score modifiers: the graph a user builds (Builder, behind the C handle) and the immutable,
// finalized ScoreMod that configs, problems and caches share.
//
// A ScoreMod holds
//  * the canonical form of the user's graph and its identity (words and 128-bit hash, see
//    hashing.h): two ScoreMods are equal exactly when their identities are;
//  * the programs the executors run: `forward` (score, mask), `backward` (score, mask, d score/ds,
//    d score/d tensor k, with the user's explicit derivatives where given) and `derived` (the
//    same with only the library's derivatives, which tests compare with explicit ones).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "flex/graph.h"
#include "flex/hashing.h"

namespace fusedattn::flex {

struct TensorDecl {
  std::string name;
  fusedattn_dtype dtype = FUSEDATTN_DTYPE_FLOAT32;
  uint32_t axes = 0;  // FUSEDATTN_SCORE_MOD_AXIS_* bits
  bool requires_grad = false;
};

constexpr uint32_t kAllAxes = FUSEDATTN_SCORE_MOD_AXIS_BATCH | FUSEDATTN_SCORE_MOD_AXIS_HEAD |
                              FUSEDATTN_SCORE_MOD_AXIS_Q | FUSEDATTN_SCORE_MOD_AXIS_KV;
// "[batch, q]" for messages.
std::string AxesText(uint32_t axes);

// The outputs of a user graph; -1 where absent.
struct Roots {
  int32_t score = -1;                // number: the modified score (absent: s unchanged)
  int32_t mask = -1;                 // boolean: the key stays visible
  int32_t grad_score = -1;           // explicit d score / d s
  std::vector<int32_t> grad_tensor;  // explicit d score / d tensor k, one per tensor
};

// The graph behind a fusedattn_score_mod handle while it is built. Every method checks its
// arguments and returns a message naming the bad one.
class Builder {
 public:
  Status Input(int input, int32_t* node);
  Status Constant(double value, int32_t* node);
  Status Tensor(const char* name, int dtype, uint32_t axes, int32_t requires_grad,
                int32_t* node);
  Status Operation(int op, int32_t count, const int32_t* operands, int32_t* node);
  Status SetScore(int32_t node);
  Status SetMask(int32_t node);
  Status SetGradient(int32_t wrt, int32_t gradient);

  const Graph& graph() const { return graph_; }
  const std::vector<TensorDecl>& tensors() const { return tensors_; }
  const Roots& roots() const { return roots_; }

 private:
  Status CheckNode(const char* what, int32_t id) const;
  int32_t Apply(Op op, int32_t a, int32_t b);  // well-typed internal construction
  Graph graph_;
  std::vector<TensorDecl> tensors_;
  Roots roots_;
};

// Nodes in evaluation order (operands first) and the outputs an executor reads; -1 where absent.
struct Program {
  std::vector<Node> nodes;
  int32_t score = -1;              // absent: s unchanged
  int32_t mask = -1;               // absent: every key the config's mask shows stays visible
  int32_t d_score = -1;            // backward: d score / d s (always present there)
  std::vector<int32_t> d_tensor;   // backward: per tensor, present when it requires grad
};

class ScoreMod {
 public:
  // Checks the builder's graph (outputs set and typed, the mask free of s), canonicalizes it,
  // derives the backward and builds the programs.
  static Status Make(const Builder& builder, std::shared_ptr<const ScoreMod>* out);

  const std::vector<TensorDecl>& tensors() const { return tensors_; }
  const Program& forward() const { return forward_; }
  const Program& backward() const { return backward_; }
  const Program& derived() const { return derived_; }
  bool has_explicit_gradient() const { return has_explicit_gradient_; }
  bool any_requires_grad() const;

  // The canonical user graph: what identity is computed from.
  const std::vector<Node>& canonical_nodes() const { return canonical_; }
  const Roots& canonical_roots() const { return roots_; }

  const Hash128& hash() const { return hash_; }
  const std::vector<uint64_t>& words() const { return words_; }
  // Structural equality: the same canonical graph and tensor declarations.
  bool operator==(const ScoreMod& other) const {
    return hash_ == other.hash_ && words_ == other.words_;
  }

  // Outputs and derivatives as text, e.g. "score: mul(tanh(div(s, 30)), 30)\n...".
  std::string Describe() const;

 private:
  std::vector<TensorDecl> tensors_;
  std::vector<Node> canonical_;
  Roots roots_;
  std::vector<uint64_t> words_;
  Hash128 hash_;
  Program forward_, backward_, derived_;
  bool has_explicit_gradient_ = false;
};

// Structural equality of two (possibly absent) score modifiers.
bool SameScoreMod(const ScoreMod* a, const ScoreMod* b);

// A cache key for artifacts built from a score modifier (compiled kernels, plans): equal keys
// <=> structurally equal graphs. The hash only picks the bucket; lookups compare the words.
struct ScoreModKey {
  std::shared_ptr<const ScoreMod> score_mod;
  bool operator==(const ScoreModKey& other) const {
    return SameScoreMod(score_mod.get(), other.score_mod.get());
  }
};
struct ScoreModKeyHash {
  size_t operator()(const ScoreModKey& key) const {
    return key.score_mod ? static_cast<size_t>(key.score_mod->hash().lo) : 0;
  }
};

}  // namespace fusedattn::flex

// The C handle: a builder until finalized, then the immutable ScoreMod.
struct fusedattn_score_mod {
  static constexpr uint64_t kMagic = 0x666C65785F6D6F64ull;  // "flex_mod"
  uint64_t magic = kMagic;
  fusedattn::flex::Builder builder;
  std::shared_ptr<const fusedattn::flex::ScoreMod> finalized;
};

namespace fusedattn::flex {
// The finalized graph of a handle, or why there is none (NULL, not a handle, not finalized).
// `field` names the handle in messages (e.g. "config.score_mod").
Status FinalizedOf(const fusedattn_score_mod* handle, const char* field,
                   std::shared_ptr<const ScoreMod>* out);
}  // namespace fusedattn::flex
