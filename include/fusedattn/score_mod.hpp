// Score modifiers in C++: expressions with operators over the C API's fusedattn_score_mod graphs
// (fusedattn.h says what every operation means and how the graph enters the computation).
//
//   fusedattn::ScoreMod mod;
//   auto s = mod.score();
//   mod.set_score(30.0 * tanh(s / 30.0));                       // a tanh soft-cap
//   mod.set_mask(mod.q_idx() >= mod.kv_idx());                  // causal, by index comparison
//   mod.finalize();
//   config.score_mod = mod.get();
//
// Expressions are node ids of one graph; an operation on two expressions of different graphs
// throws. && and || build the logical operations (both operands are always evaluated). Errors
// throw fusedattn::Error with the library's message.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "fusedattn/fusedattn.h"
#include "fusedattn/fusedattn.hpp"

namespace fusedattn {

// A node of a score-modifier graph.
class Expr {
 public:
  Expr() = default;
  Expr(fusedattn_score_mod* graph, int32_t id) : graph_(graph), id_(id) {}
  fusedattn_score_mod* graph() const { return graph_; }
  int32_t id() const { return id_; }

 private:
  fusedattn_score_mod* graph_ = nullptr;
  int32_t id_ = -1;
};

namespace detail {

inline Expr Constant(fusedattn_score_mod* graph, double value) {
  char msg[kMessageBytes];
  int32_t id = -1;
  Check(fusedattn_score_mod_constant(graph, value, &id, msg, sizeof msg), msg);
  return Expr(graph, id);
}

inline Expr Apply(fusedattn_score_mod_opcode op, std::initializer_list<Expr> operands) {
  fusedattn_score_mod* graph = operands.begin()->graph();
  int32_t ids[3] = {-1, -1, -1};
  int32_t count = 0;
  for (const Expr& e : operands) {
    if (e.graph() != graph)
      throw Error(FUSEDATTN_ERROR_INVALID_ARGUMENT,
                  "score_mod: the operands of one operation come from different graphs");
    ids[count++] = e.id();
  }
  char msg[kMessageBytes];
  int32_t id = -1;
  Check(fusedattn_score_mod_op(graph, op, count, ids, &id, msg, sizeof msg), msg);
  return Expr(graph, id);
}

}  // namespace detail

// Operators on two expressions, or an expression and a number (which becomes a constant).
#define FUSEDATTN_SCORE_MOD_BINARY(symbol, op)                                                \
  inline Expr operator symbol(Expr a, Expr b) { return detail::Apply(op, {a, b}); }         \
  inline Expr operator symbol(Expr a, double b) {                                           \
    return detail::Apply(op, {a, detail::Constant(a.graph(), b)});                          \
  }                                                                                         \
  inline Expr operator symbol(double a, Expr b) {                                           \
    return detail::Apply(op, {detail::Constant(b.graph(), a), b});                          \
  }
FUSEDATTN_SCORE_MOD_BINARY(+, FUSEDATTN_SCORE_MOD_ADD)
FUSEDATTN_SCORE_MOD_BINARY(-, FUSEDATTN_SCORE_MOD_SUB)
FUSEDATTN_SCORE_MOD_BINARY(*, FUSEDATTN_SCORE_MOD_MUL)
FUSEDATTN_SCORE_MOD_BINARY(/, FUSEDATTN_SCORE_MOD_DIV)
FUSEDATTN_SCORE_MOD_BINARY(<, FUSEDATTN_SCORE_MOD_LT)
FUSEDATTN_SCORE_MOD_BINARY(<=, FUSEDATTN_SCORE_MOD_LE)
FUSEDATTN_SCORE_MOD_BINARY(>, FUSEDATTN_SCORE_MOD_GT)
FUSEDATTN_SCORE_MOD_BINARY(>=, FUSEDATTN_SCORE_MOD_GE)
#undef FUSEDATTN_SCORE_MOD_BINARY

inline Expr operator-(Expr a) { return detail::Apply(FUSEDATTN_SCORE_MOD_NEG, {a}); }
inline Expr operator&&(Expr a, Expr b) { return detail::Apply(FUSEDATTN_SCORE_MOD_AND, {a, b}); }
inline Expr operator||(Expr a, Expr b) { return detail::Apply(FUSEDATTN_SCORE_MOD_OR, {a, b}); }
inline Expr operator!(Expr a) { return detail::Apply(FUSEDATTN_SCORE_MOD_NOT, {a}); }

// Equality builds nodes too, so it is spelled as functions (== on Expr would read as a test).
inline Expr eq(Expr a, Expr b) { return detail::Apply(FUSEDATTN_SCORE_MOD_EQ, {a, b}); }
inline Expr eq(Expr a, double b) { return eq(a, detail::Constant(a.graph(), b)); }
inline Expr ne(Expr a, Expr b) { return detail::Apply(FUSEDATTN_SCORE_MOD_NE, {a, b}); }
inline Expr ne(Expr a, double b) { return ne(a, detail::Constant(a.graph(), b)); }

inline Expr abs(Expr a) { return detail::Apply(FUSEDATTN_SCORE_MOD_ABS, {a}); }
inline Expr exp(Expr a) { return detail::Apply(FUSEDATTN_SCORE_MOD_EXP, {a}); }
inline Expr log(Expr a) { return detail::Apply(FUSEDATTN_SCORE_MOD_LOG, {a}); }
inline Expr tanh(Expr a) { return detail::Apply(FUSEDATTN_SCORE_MOD_TANH, {a}); }
inline Expr sigmoid(Expr a) { return detail::Apply(FUSEDATTN_SCORE_MOD_SIGMOID, {a}); }
inline Expr min(Expr a, Expr b) { return detail::Apply(FUSEDATTN_SCORE_MOD_MIN, {a, b}); }
inline Expr min(Expr a, double b) { return min(a, detail::Constant(a.graph(), b)); }
inline Expr max(Expr a, Expr b) { return detail::Apply(FUSEDATTN_SCORE_MOD_MAX, {a, b}); }
inline Expr max(Expr a, double b) { return max(a, detail::Constant(a.graph(), b)); }
// cond ? a : b
inline Expr select(Expr cond, Expr a, Expr b) {
  return detail::Apply(FUSEDATTN_SCORE_MOD_SELECT, {cond, a, b});
}
inline Expr select(Expr cond, Expr a, double b) {
  return select(cond, a, detail::Constant(cond.graph(), b));
}
inline Expr select(Expr cond, double a, Expr b) {
  return select(cond, detail::Constant(cond.graph(), a), b);
}
inline Expr select(Expr cond, double a, double b) {
  return select(cond, detail::Constant(cond.graph(), a), detail::Constant(cond.graph(), b));
}

// Owns a fusedattn_score_mod graph. Movable; expressions stay valid across moves (they name the
// handle, not this object).
class ScoreMod {
 public:
  ScoreMod() {
    if (fusedattn_score_mod_create(&graph_) != FUSEDATTN_SUCCESS)
      throw Error(FUSEDATTN_ERROR_OUT_OF_MEMORY, "fusedattn_score_mod_create failed");
  }
  ~ScoreMod() { fusedattn_score_mod_destroy(graph_); }
  ScoreMod(const ScoreMod&) = delete;
  ScoreMod& operator=(const ScoreMod&) = delete;
  ScoreMod(ScoreMod&& other) noexcept : graph_(std::exchange(other.graph_, nullptr)) {}
  ScoreMod& operator=(ScoreMod&& other) noexcept {
    if (this != &other) {
      fusedattn_score_mod_destroy(graph_);
      graph_ = std::exchange(other.graph_, nullptr);
    }
    return *this;
  }

  Expr score() { return input(FUSEDATTN_SCORE_MOD_SCORE); }
  Expr batch() { return input(FUSEDATTN_SCORE_MOD_BATCH); }
  Expr head() { return input(FUSEDATTN_SCORE_MOD_HEAD); }
  Expr q_idx() { return input(FUSEDATTN_SCORE_MOD_Q_IDX); }
  Expr kv_idx() { return input(FUSEDATTN_SCORE_MOD_KV_IDX); }
  Expr seqlen_q() { return input(FUSEDATTN_SCORE_MOD_SEQLEN_Q); }
  Expr seqlen_kv() { return input(FUSEDATTN_SCORE_MOD_SEQLEN_KV); }
  Expr q_idx_br() { return input(FUSEDATTN_SCORE_MOD_Q_IDX_BR); }  // q_idx + sk - sq

  Expr input(fusedattn_score_mod_variable which) {
    char msg[detail::kMessageBytes];
    int32_t id = -1;
    detail::Check(fusedattn_score_mod_input(graph_, which, &id, msg, sizeof msg), msg);
    return Expr(graph_, id);
  }
  Expr constant(double value) { return detail::Constant(graph_, value); }
  // The next auxiliary tensor (numbered in declaration order), indexed by `axes`
  // (FUSEDATTN_SCORE_MOD_AXIS_* bits).
  Expr tensor(const std::string& name, fusedattn_dtype dtype, uint32_t axes,
              bool requires_grad = false) {
    char msg[detail::kMessageBytes];
    int32_t id = -1;
    detail::Check(fusedattn_score_mod_tensor(graph_, name.c_str(), dtype, axes,
                                             requires_grad ? 1 : 0, &id, msg, sizeof msg),
                  msg);
    return Expr(graph_, id);
  }

  ScoreMod& set_score(Expr e) {
    char msg[detail::kMessageBytes];
    detail::Check(fusedattn_score_mod_set_score(graph_, Own(e), msg, sizeof msg), msg);
    return *this;
  }
  ScoreMod& set_mask(Expr e) {
    char msg[detail::kMessageBytes];
    detail::Check(fusedattn_score_mod_set_mask(graph_, Own(e), msg, sizeof msg), msg);
    return *this;
  }
  // An explicit derivative d score / d wrt (wrt: score() or a tensor requiring grad).
  ScoreMod& set_gradient(Expr wrt, Expr gradient) {
    char msg[detail::kMessageBytes];
    detail::Check(
        fusedattn_score_mod_set_gradient(graph_, Own(wrt), Own(gradient), msg, sizeof msg), msg);
    return *this;
  }
  ScoreMod& finalize() {
    char msg[detail::kMessageBytes];
    detail::Check(fusedattn_score_mod_finalize(graph_, msg, sizeof msg), msg);
    return *this;
  }

  const fusedattn_score_mod* get() const { return graph_; }
  fusedattn_score_mod* get() { return graph_; }

  // Identity of the finalized graph.
  std::array<uint64_t, 2> hash() const {
    std::array<uint64_t, 2> h{};
    detail::Check(fusedattn_score_mod_hash(graph_, h.data()), "score_mod is not finalized");
    return h;
  }
  bool equals(const ScoreMod& other) const {
    int32_t equal = 0;
    detail::Check(fusedattn_score_mod_equal(graph_, other.graph_, &equal),
                  "both score_mods must be finalized");
    return equal != 0;
  }
  std::string describe() const {
    char text[16384];
    detail::Check(fusedattn_score_mod_describe(graph_, text, sizeof text), text);
    return text;
  }
  // The finalized graph as text (fusedattn_score_mod_serialize), and back.
  std::string serialize() const {
    size_t needed = 0;
    detail::Check(fusedattn_score_mod_serialize(graph_, nullptr, 0, &needed),
                  "score_mod is not finalized");
    std::string text(needed, '\0');
    detail::Check(fusedattn_score_mod_serialize(graph_, text.data(), text.size(), &needed),
                  "fusedattn_score_mod_serialize failed");
    text.resize(needed - 1);
    return text;
  }
  static ScoreMod deserialize(const std::string& text) {
    char msg[detail::kMessageBytes];
    fusedattn_score_mod* graph = nullptr;
    detail::Check(fusedattn_score_mod_deserialize(text.c_str(), &graph, msg, sizeof msg), msg);
    return ScoreMod(graph);
  }

 private:
  int32_t Own(Expr e) const {
    if (e.graph() != graph_)
      throw Error(FUSEDATTN_ERROR_INVALID_ARGUMENT,
                  "score_mod: the expression belongs to another graph");
    return e.id();
  }
  explicit ScoreMod(fusedattn_score_mod* adopted) : graph_(adopted) {}
  fusedattn_score_mod* graph_ = nullptr;
};

}  // namespace fusedattn
