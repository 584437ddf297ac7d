// The one translation unit that includes cudnn-frontend: an SdpaGraphSpec becomes an sdpa or
// sdpa_backward graph (samples/cpp/sdpa in cudnn-frontend show the same calls), built with
// heuristics A then the fallback list (as the unified node, a dynamic-shape graph with a kernel
// cache, or a per-shape graph: BuildSdpaGraph), and executed from a pointer table in the graph's
// uid order (a dynamic-shape plan also with its tensors' shapes, as execute-time overrides).
// Kernel caches go to and from cuDNN's own JSON form (a backend attribute, so the frontend's JSON
// library stays compiled out).
// A score_mod becomes the pointwise nodes of cudnn-frontend's score-modifier callbacks
// (ScoreModLowering below). Paged K/V: the pools are the graph's K and V "containers" and the
// page tables and max_seq_len_kv are SDPA attributes (cudnn-frontend's SDPA_attributes::
// set_paged_attention_k_table / _v_table / _max_seq_len_kv), next to the padding mask's lengths.
#include "backends/cudnn/sdpa_graph.h"

#include <cudnn_frontend.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "flex/graph.h"
#include "flex/score_mod.h"

namespace fusedattn::cudnn {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// A tensor's dims and strides as the graph was built with them.
struct TensorShape {
  int64_t uid = 0;
  std::vector<int64_t> dim, stride;
};

class SdpaGraph {
 public:
  std::shared_ptr<fe::graph::Graph> graph;
  std::vector<int> user_uids;  // the graph's user tensors, in the order execute() takes them
  int64_t workspace = 0;
  // A dynamic-shape plan with execute-time shapes (BuildOptions::execute_time_shapes): every
  // user tensor but the pass-by-value scalars and the sink logits, with the dims and strides it
  // was built with.
  std::vector<int64_t> override_uids;
  std::vector<std::vector<int64_t>> override_dims, override_strides;
};

class KernelCache {
 public:
  std::shared_ptr<fe::KernelCache> cache = std::make_shared<fe::KernelCache>();
};

namespace {

const char* CodeName(fe::error_code_t code) {
  switch (code) {
    case fe::error_code_t::OK: return "OK";
    case fe::error_code_t::ATTRIBUTE_NOT_SET: return "ATTRIBUTE_NOT_SET";
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED: return "SHAPE_DEDUCTION_FAILED";
    case fe::error_code_t::INVALID_TENSOR_NAME: return "INVALID_TENSOR_NAME";
    case fe::error_code_t::INVALID_VARIANT_PACK: return "INVALID_VARIANT_PACK";
    case fe::error_code_t::GRAPH_NOT_SUPPORTED: return "GRAPH_NOT_SUPPORTED";
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED:
      return "GRAPH_EXECUTION_PLAN_CREATION_FAILED";
    case fe::error_code_t::GRAPH_EXECUTION_FAILED: return "GRAPH_EXECUTION_FAILED";
    case fe::error_code_t::HEURISTIC_QUERY_FAILED: return "HEURISTIC_QUERY_FAILED";
    case fe::error_code_t::UNSUPPORTED_GRAPH_FORMAT: return "UNSUPPORTED_GRAPH_FORMAT";
    case fe::error_code_t::CUDA_API_FAILED: return "CUDA_API_FAILED";
    case fe::error_code_t::CUDNN_BACKEND_API_FAILED: return "CUDNN_BACKEND_API_FAILED";
    case fe::error_code_t::INVALID_CUDA_DEVICE: return "INVALID_CUDA_DEVICE";
    case fe::error_code_t::HANDLE_ERROR: return "HANDLE_ERROR";
    case fe::error_code_t::INVALID_VALUE: return "INVALID_VALUE";
    case fe::error_code_t::NVRTC_COMPILATION_FAILED: return "NVRTC_COMPILATION_FAILED";
  }
  return "UNKNOWN";
}

Status FromFrontend(fe::error_t error) {
  if (error.is_good()) return Status::Ok();
  return Status(FUSEDATTN_ERROR_CUDNN,
                Format("%s: %s", CodeName(error.get_code()), error.get_message().c_str()));
}

fe::DataType_t DataTypeOf(fusedattn_dtype dtype) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT16: return fe::DataType_t::HALF;
    case FUSEDATTN_DTYPE_BFLOAT16: return fe::DataType_t::BFLOAT16;
    case FUSEDATTN_DTYPE_FLOAT32: return fe::DataType_t::FLOAT;
    case FUSEDATTN_DTYPE_INT32: return fe::DataType_t::INT32;
    case FUSEDATTN_DTYPE_FP8_E4M3: return fe::DataType_t::FP8_E4M3;
    case FUSEDATTN_DTYPE_FP8_E5M2: return fe::DataType_t::FP8_E5M2;
    default: return fe::DataType_t::NOT_SET;
  }
}

std::vector<int64_t> Dims(const TensorDesc& d) { return {d.dim[0], d.dim[1], d.dim[2], d.dim[3]}; }
std::vector<int64_t> Strides(const TensorDesc& d) {
  return {d.stride[0], d.stride[1], d.stride[2], d.stride[3]};
}

// ------------------------------------------------------------------------------------------------
// Score modifiers: a flex program as the pointwise nodes of cuDNN's score-modifier callbacks.
// ------------------------------------------------------------------------------------------------
// cudnn-frontend calls the forward callback with the score after attn_scale, s [b, h_q, s_q, s_kv]
// (float), and uses what it returns as the score of the softmax; the backward graph calls it
// again, then calls the backward callback with dS (the gradient of the returned score) and uses
// what that returns as the gradient of s.
//
// What cuDNN's fused engines accept inside the callbacks is narrower than the pointwise API
// (measured on H100 with cuDNN 9.19; XLA's cuDNN score_mod lowering keeps to the same rules):
//  * the first operand of every pointwise node is a virtual tensor (computed in the graph):
//    commutative operations and comparisons are reordered, the rest get a materialized operand
//    (0 + x, broadcast over the score); operations on constants only are folded here;
//  * integer index arithmetic (GEN_INDEX, sequence lengths, int32 tensors) stays int32, as
//    cuDNN's own ALiBi computes kv_idx - q_idx;
//  * booleans come only from comparisons; and / or / not are computed as int32 0/1 (min, max,
//    == 0) and compared back to a boolean, never with the logical pointwise modes;
//  * visibility (the config's band and padding, which cuDNN's masks cannot do next to a
//    callback, and the mask_mod) is a conjunction applied as one select per term: -inf in the
//    forward, 0 in the backward, so whatever the graph computes at a hidden key (inf, NaN)
//    never reaches a sum.
//
// The forward callback keeps every node's value; the backward one reuses them for d score / d s,
// as cudnn-frontend's own Softcap reads the tensors of its forward. Each forward call starts
// afresh, so a graph expanded twice never mixes the tensors of two expansions.
class ScoreModLowering {
 public:
  // program is one of score_mod's; what the callbacks need is copied or owned here, since
  // cudnn-frontend keeps them in the graph.
  ScoreModLowering(const SdpaGraphSpec& spec, std::shared_ptr<const flex::ScoreMod> score_mod,
                   const flex::Program& program, std::vector<TensorPtr> tensors,
                   TensorPtr seq_len_q, TensorPtr seq_len_kv)
      : band_(spec.mod_band),
        seq_lens_(spec.mod_seq_lens),
        seqlen_q_(spec.seqlen_q),
        seqlen_kv_(spec.seqlen_kv),
        score_mod_(std::move(score_mod)),
        program_(program),
        tensors_(std::move(tensors)),
        seq_len_q_(std::move(seq_len_q)),
        seq_len_kv_(std::move(seq_len_kv)) {
    for (const SdpaGraphSpec::Aux& aux : spec.aux)
      tensor_is_int_.push_back(aux.dtype == FUSEDATTN_DTYPE_INT32);
  }

  TensorPtr Forward(const std::shared_ptr<fe::graph::Graph>& graph, const TensorPtr& s) {
    graph_ = graph.get();
    s_ = s;
    values_.assign(program_.nodes.size(), Val{});
    for (Val& index : index_) index = Val{};
    zero_int_ = zero_float_ = Val{};
    Val score{s, Kind::kFloat, true};
    if (program_.score >= 0) score = Materialize(ToNumber(Value(program_.score)));
    visible_ = Visibility();
    TensorPtr out = score.t;
    for (const Val& condition : visible_)
      out = Select(out, Scalar(fe::graph::attn::score_modifiers::get_negative_inf_value()),
                   condition);
    return out;
  }

  TensorPtr Backward(const std::shared_ptr<fe::graph::Graph>& graph, const TensorPtr& ds) {
    if (s_ == nullptr || program_.d_score < 0)
      throw std::logic_error("the score modifier's backward ran before its forward");
    graph_ = graph.get();
    TensorPtr grad = ds;
    const flex::Node& d = program_.nodes[static_cast<size_t>(program_.d_score)];
    if (!(d.op == flex::Op::kConstant && d.value == 1.0)) {
      const Val factor = ToNumber(Value(program_.d_score));
      grad = Emit(Mode::MUL, Val{ds, Kind::kFloat, true}, factor, fe::DataType_t::FLOAT).t;
    }
    for (const Val& condition : visible_) grad = Select(grad, Scalar(0.0f), condition);
    return grad;
  }

 private:
  using Mode = fe::PointwiseMode_t;
  // What a value is: a float number, an int32 number (indices, lengths, int tensors), a
  // boolean from a comparison, or an int32 0/1 truth value (from and / or / not).
  enum class Kind { kFloat, kInt, kBool, kTruth };
  struct Val {
    TensorPtr t;
    Kind kind = Kind::kFloat;
    bool virt = false;        // computed in the graph (not a user tensor or a scalar)
    bool constant = false;    // a scalar folded on the host
    double value = 0;         // its value
  };

  static TensorPtr Scalar(float value) { return std::make_shared<fe::graph::Tensor_attributes>(value); }
  static TensorPtr ScalarInt(int32_t value) {
    return std::make_shared<fe::graph::Tensor_attributes>(value);
  }
  static bool IsIntegral(double v) {
    return v == static_cast<double>(static_cast<int32_t>(v)) && v >= -2147483648.0 &&
           v <= 2147483647.0;
  }
  static Val Constant(double v) {
    Val c;
    c.constant = true, c.value = v;
    c.kind = IsIntegral(v) ? Kind::kInt : Kind::kFloat;
    return c;
  }
  // The scalar tensor of a constant, int32 when it is used with int32 values.
  static TensorPtr ScalarOf(const Val& c, bool as_int) {
    return as_int && IsIntegral(c.value) ? ScalarInt(static_cast<int32_t>(c.value))
                                         : Scalar(static_cast<float>(c.value));
  }

  // One pointwise node; its first operand must be virtual (callers see to it).
  // Scalars are int32 in int32 arithmetic and where scalars_int asks (int comparisons).
  Val Emit(Mode mode, const Val& a, const Val& b, fe::DataType_t compute,
           const Val* c = nullptr, bool scalars_int = false) {
    const bool as_int = compute == fe::DataType_t::INT32;
    auto tensor = [&](const Val& v) { return v.constant ? ScalarOf(v, as_int || scalars_int) : v.t; };
    auto attributes = fe::graph::Pointwise_attributes()
                          .set_name("score_mod_" + std::to_string(++count_))
                          .set_mode(mode)
                          .set_compute_data_type(compute);
    TensorPtr out;
    if (c != nullptr)
      out = graph_->pointwise(tensor(a), tensor(b), tensor(*c), attributes);
    else if (b.t != nullptr || b.constant)
      out = graph_->pointwise(tensor(a), tensor(b), attributes);
    else
      out = graph_->pointwise(tensor(a), attributes);
    Kind kind = Kind::kFloat;
    if (compute == fe::DataType_t::BOOLEAN) kind = Kind::kBool;
    if (as_int) kind = Kind::kInt;
    if (compute != fe::DataType_t::FLOAT) out->set_data_type(compute);
    return Val{out, kind, true};
  }
  Val Unary(Mode mode, const Val& a, fe::DataType_t compute) {
    return Emit(mode, Materialize(a), Val{}, compute);
  }

  // The index of s along an axis (0 batch, 1 query head, 2 query, 3 key), made once.
  Val Index(int axis) {
    Val& index = index_[axis];
    if (index.t == nullptr) {
      index.t = graph_->pointwise(s_, fe::graph::Pointwise_attributes()
                                          .set_name("score_mod_index_" + std::to_string(axis))
                                          .set_mode(Mode::GEN_INDEX)
                                          .set_axis(axis)
                                          .set_compute_data_type(fe::DataType_t::INT32));
      index.t->set_data_type(fe::DataType_t::INT32);
      index.kind = Kind::kInt, index.virt = true;
    }
    return index;
  }
  // A virtual tensor over the whole score with v's values: v itself when already virtual.
  Val Materialize(const Val& v) {
    if (v.virt) return v;
    const bool is_int = v.kind == Kind::kInt || v.kind == Kind::kTruth || v.kind == Kind::kBool;
    Val& zero = is_int ? zero_int_ : zero_float_;
    if (zero.t == nullptr)
      zero = is_int ? Emit(Mode::SUB, Index(3), Index(3), fe::DataType_t::INT32)
                    : Emit(Mode::MUL, Index(3), Constant(0.0), fe::DataType_t::FLOAT);
    Val out = Emit(Mode::ADD, zero, v, is_int ? fe::DataType_t::INT32 : fe::DataType_t::FLOAT);
    if (v.kind == Kind::kTruth || v.kind == Kind::kBool) out.kind = Kind::kTruth;
    return out;
  }
  Val SeqLenQ() {
    return seq_lens_ ? Val{seq_len_q_, Kind::kInt, false} : Constant(double(seqlen_q_));
  }
  Val SeqLenKv() {
    return seq_lens_ ? Val{seq_len_kv_, Kind::kInt, false} : Constant(double(seqlen_kv_));
  }

  // Numbers: a boolean used as a number is 0 / 1.
  Val ToNumber(const Val& v) {
    if (v.kind == Kind::kBool) return ToTruth(v);
    return v;
  }
  Val ToTruth(const Val& v) {
    if (v.kind == Kind::kTruth || v.constant) return v;
    if (v.kind == Kind::kBool) {
      Val out = Emit(Mode::IDENTITY, Materialize(v), Val{}, fe::DataType_t::INT32);
      out.kind = Kind::kTruth;
      return out;
    }
    return v;
  }
  Val ToBool(const Val& v) {
    if (v.kind == Kind::kBool) return v;
    if (v.constant)  // true / false over every key
      return Emit(v.value != 0.0 ? Mode::CMP_GE : Mode::CMP_LT, Index(3), Constant(0.0),
                  fe::DataType_t::BOOLEAN, nullptr, true);
    return Emit(Mode::CMP_NEQ, Materialize(v), Constant(0.0), fe::DataType_t::BOOLEAN, nullptr,
                v.kind != Kind::kFloat);
  }

  static bool Commutes(Mode mode) {
    return mode == Mode::ADD || mode == Mode::MUL || mode == Mode::MIN || mode == Mode::MAX ||
           mode == Mode::CMP_EQ || mode == Mode::CMP_NEQ;
  }
  static Mode Mirrored(Mode mode) {  // a op b == b Mirrored(op) a
    switch (mode) {
      case Mode::CMP_LT: return Mode::CMP_GT;
      case Mode::CMP_LE: return Mode::CMP_GE;
      case Mode::CMP_GT: return Mode::CMP_LT;
      case Mode::CMP_GE: return Mode::CMP_LE;
      default: return mode;
    }
  }
  // a op b for numbers: folded when both are constants, int32 when both are integers,
  // reordered or materialized so that the first operand is virtual.
  Val Binary(flex::Op op, Mode mode, Val a, Val b) {
    a = ToNumber(a), b = ToNumber(b);
    const bool is_compare = mode == Mode::CMP_LT || mode == Mode::CMP_LE ||
                            mode == Mode::CMP_GT || mode == Mode::CMP_GE ||
                            mode == Mode::CMP_EQ || mode == Mode::CMP_NEQ;
    if (a.constant && b.constant) {
      Val c = Constant(flex::ApplyOp(op, a.value, b.value, 0.0));
      if (is_compare) c.kind = Kind::kTruth;
      return c;
    }
    auto is_int = [](const Val& v) { return v.kind == Kind::kInt || v.kind == Kind::kTruth; };
    const bool ints = is_int(a) && is_int(b) && mode != Mode::DIV;
    if (!a.virt && b.virt && (Commutes(mode) || is_compare)) {
      std::swap(a, b);
      mode = Mirrored(mode);
    }
    a = Materialize(a);
    const fe::DataType_t compute = is_compare ? fe::DataType_t::BOOLEAN
                                   : ints     ? fe::DataType_t::INT32
                                              : fe::DataType_t::FLOAT;
    // A comparison of integers against an integral constant compares int32 with int32.
    return Emit(mode, a, b, compute, nullptr, ints);
  }

  // and / or / not / boolean equality on int32 0/1 truth values.
  Val Logic(flex::Op op, const std::vector<Val>& args) {
    bool all_constant = true;
    for (const Val& v : args) all_constant = all_constant && v.constant;
    if (all_constant) {
      Val c = Constant(flex::ApplyOp(op, args[0].value, args.size() > 1 ? args[1].value : 0.0,
                                     args.size() > 2 ? args[2].value : 0.0));
      c.kind = Kind::kTruth;
      return c;
    }
    auto truth = [&](const Val& v) { return ToTruth(v); };
    auto min_max = [&](Mode mode, Val a, Val b) {
      if (!a.virt) std::swap(a, b);
      Val out = Emit(mode, Materialize(a), b, fe::DataType_t::INT32);
      out.kind = Kind::kTruth;
      return out;
    };
    auto negate = [&](const Val& a) {
      if (a.constant) {
        Val c = Constant(a.value != 0.0 ? 0.0 : 1.0);
        c.kind = Kind::kTruth;
        return c;
      }
      return Emit(Mode::CMP_EQ, Materialize(ToTruth(a)), Constant(0.0), fe::DataType_t::BOOLEAN,
                  nullptr, true);
    };
    switch (op) {
      case flex::Op::kNot: return negate(args[0]);
      case flex::Op::kAnd: return min_max(Mode::MIN, truth(args[0]), truth(args[1]));
      case flex::Op::kOr: return min_max(Mode::MAX, truth(args[0]), truth(args[1]));
      case flex::Op::kEq:
      case flex::Op::kNe: {
        Val a = truth(args[0]), b = truth(args[1]);
        if (!a.virt) std::swap(a, b);
        return Emit(op == flex::Op::kEq ? Mode::CMP_EQ : Mode::CMP_NEQ, Materialize(a), b,
                    fe::DataType_t::BOOLEAN, nullptr, true);
      }
      default: break;  // select of booleans: (c and a) or (not c and b)
    }
    const Val c = truth(args[0]);
    const Val not_c = ToTruth(negate(args[0]));
    return min_max(Mode::MAX, min_max(Mode::MIN, c, truth(args[1])),
                   min_max(Mode::MIN, not_c, truth(args[2])));
  }

  TensorPtr Select(const TensorPtr& value, const TensorPtr& otherwise, const Val& condition) {
    const Val mask = ToBool(condition);
    return graph_->pointwise(value, otherwise, mask.t,
                             fe::graph::Pointwise_attributes()
                                 .set_name("score_mod_" + std::to_string(++count_))
                                 .set_mode(Mode::BINARY_SELECT));
  }

  // The config's mask and the mask_mod as a conjunction of conditions (empty: all visible).
  std::vector<Val> Visibility() {
    std::vector<Val> terms;
    const Band& band = band_;
    if (band.left >= 0 || band.right >= 0) {
      // Key j is visible when -left <= j - d <= right, d = i (+ sk - sq bottom-right).
      Val offset = Binary(flex::Op::kSub, Mode::SUB, Index(3), Index(2));
      if (band.bottom_right) {
        const Val shift = Binary(flex::Op::kSub, Mode::SUB, SeqLenKv(), SeqLenQ());
        offset = Binary(flex::Op::kSub, Mode::SUB, offset, shift);
      }
      if (band.right >= 0)
        terms.push_back(Binary(flex::Op::kLe, Mode::CMP_LE, offset, Constant(double(band.right))));
      if (band.left >= 0)
        terms.push_back(Binary(flex::Op::kGe, Mode::CMP_GE, offset, Constant(-double(band.left))));
    }
    if (seq_lens_) {
      terms.push_back(Binary(flex::Op::kLt, Mode::CMP_LT, Index(2), SeqLenQ()));
      terms.push_back(Binary(flex::Op::kLt, Mode::CMP_LT, Index(3), SeqLenKv()));
    }
    if (program_.mask >= 0) {
      // Top-level conjunctions become one term each.
      std::vector<int32_t> pending{program_.mask};
      while (!pending.empty()) {
        const int32_t id = pending.back();
        pending.pop_back();
        const flex::Node& n = program_.nodes[static_cast<size_t>(id)];
        if (n.op == flex::Op::kAnd) {
          pending.push_back(n.args[1]);
          pending.push_back(n.args[0]);
          continue;
        }
        const Val term = Value(id);
        if (term.constant && term.value != 0.0) continue;  // always true
        terms.push_back(term);
      }
    }
    return terms;
  }

  // The value of node id, lowered once (operands first).
  Val Value(int32_t id) {
    Val& value = values_[static_cast<size_t>(id)];
    if (value.t == nullptr && !value.constant) value = Lower(program_.nodes[static_cast<size_t>(id)]);
    return value;
  }

  Val Lower(const flex::Node& n) {
    using flex::Op;
    auto arg = [&](int k) { return Value(n.args[k]); };
    auto is_bool = [&](int k) {
      return program_.nodes[static_cast<size_t>(n.args[k])].type == flex::Type::kBool;
    };
    auto unary = [&](Mode mode) {
      const Val a = ToNumber(arg(0));
      if (a.constant) return Constant(flex::ApplyOp(n.op, a.value, 0.0, 0.0));
      const bool keeps_int = (mode == Mode::NEG || mode == Mode::ABS) && a.kind == Kind::kInt;
      return Unary(mode, a, keeps_int ? fe::DataType_t::INT32 : fe::DataType_t::FLOAT);
    };
    switch (n.op) {
      case Op::kInput:
        switch (n.slot) {
          case FUSEDATTN_SCORE_MOD_SCORE: return Val{s_, Kind::kFloat, true};
          case FUSEDATTN_SCORE_MOD_BATCH: return Index(0);
          case FUSEDATTN_SCORE_MOD_HEAD: return Index(1);
          case FUSEDATTN_SCORE_MOD_Q_IDX: return Index(2);
          case FUSEDATTN_SCORE_MOD_KV_IDX: return Index(3);
          case FUSEDATTN_SCORE_MOD_SEQLEN_Q: return SeqLenQ();
          case FUSEDATTN_SCORE_MOD_SEQLEN_KV: return SeqLenKv();
        }
        throw std::logic_error("score_mod input " + std::to_string(n.slot) + " has no lowering");
      case Op::kConstant: {
        Val c = Constant(n.value);
        if (n.type == flex::Type::kBool) c.kind = Kind::kTruth;
        return c;
      }
      case Op::kTensor: {
        if (n.slot < 0 || static_cast<size_t>(n.slot) >= tensors_.size())
          throw std::logic_error("score_mod tensor " + std::to_string(n.slot) + " is not an input");
        const size_t k = static_cast<size_t>(n.slot);
        return Val{tensors_[k], tensor_is_int_[k] ? Kind::kInt : Kind::kFloat, false};
      }
      case Op::kNeg: return unary(Mode::NEG);
      case Op::kAbs: return unary(Mode::ABS);
      case Op::kExp: return unary(Mode::EXP);
      case Op::kLog: return unary(Mode::LOG);
      case Op::kTanh: return unary(Mode::TANH_FWD);
      case Op::kSigmoid: return unary(Mode::SIGMOID_FWD);
      case Op::kAdd: return Binary(n.op, Mode::ADD, arg(0), arg(1));
      case Op::kSub: return Binary(n.op, Mode::SUB, arg(0), arg(1));
      case Op::kMul: return Binary(n.op, Mode::MUL, arg(0), arg(1));
      case Op::kDiv: return Binary(n.op, Mode::DIV, arg(0), arg(1));
      case Op::kMin: return Binary(n.op, Mode::MIN, arg(0), arg(1));
      case Op::kMax: return Binary(n.op, Mode::MAX, arg(0), arg(1));
      case Op::kLt: return Binary(n.op, Mode::CMP_LT, arg(0), arg(1));
      case Op::kLe: return Binary(n.op, Mode::CMP_LE, arg(0), arg(1));
      case Op::kGt: return Binary(n.op, Mode::CMP_GT, arg(0), arg(1));
      case Op::kGe: return Binary(n.op, Mode::CMP_GE, arg(0), arg(1));
      case Op::kEq:
      case Op::kNe:
        if (is_bool(0)) return Logic(n.op, {arg(0), arg(1)});
        return Binary(n.op, n.op == Op::kEq ? Mode::CMP_EQ : Mode::CMP_NEQ, arg(0), arg(1));
      case Op::kNot: return Logic(n.op, {arg(0)});
      case Op::kAnd:
      case Op::kOr: return Logic(n.op, {arg(0), arg(1)});
      case Op::kSelect: {
        if (is_bool(1)) return Logic(n.op, {arg(0), arg(1), arg(2)});
        const Val c = arg(0);
        if (c.constant) return c.value != 0.0 ? arg(1) : arg(2);
        Val a = ToNumber(arg(1)), b = ToNumber(arg(2));
        Val condition = ToBool(c);
        if (!a.virt && b.virt) {  // select(c, a, b) == select(not c, b, a)
          std::swap(a, b);
          condition = ToBool(Logic(Op::kNot, {c}));
        }
        const bool ints = a.kind == Kind::kInt && b.kind == Kind::kInt;
        a = Materialize(a);
        Val out = Emit(Mode::BINARY_SELECT, a, b,
                       ints ? fe::DataType_t::INT32 : fe::DataType_t::FLOAT, &condition);
        return out;
      }
    }
    throw std::logic_error("score_mod operation without a lowering");
  }

  Band band_;
  bool seq_lens_;
  int64_t seqlen_q_, seqlen_kv_;
  std::shared_ptr<const flex::ScoreMod> score_mod_;
  const flex::Program& program_;  // score_mod_'s
  std::vector<TensorPtr> tensors_;
  std::vector<bool> tensor_is_int_;  // per tensor: int32 (integer arithmetic on it)
  TensorPtr seq_len_q_, seq_len_kv_;
  fe::graph::Graph* graph_ = nullptr;  // the callback's sub-graph, during the call
  TensorPtr s_;
  std::vector<Val> visible_;
  Val index_[4];
  Val zero_int_, zero_float_;
  std::vector<Val> values_;
  int count_ = 0;
};

// Builds the nodes of one graph; one instance per attempt.
class GraphMaker {
 public:
  // With a kernel cache: a dynamic-shape graph using it. cudnn-frontend reads the flag while
  // it adds the SDPA node (the unified node takes no dynamic shapes), so it is set first.
  GraphMaker(const SdpaGraphSpec& spec, const std::shared_ptr<KernelCache>& dynamic)
      : s_(spec) {
    graph_ = std::make_shared<fe::graph::Graph>();
    graph_->set_io_data_type(DataTypeOf(s_.io_dtype))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    if (dynamic) graph_->set_dynamic_shape_enabled(true).set_kernel_cache(dynamic->cache);
  }

  std::shared_ptr<fe::graph::Graph> forward(fe::AttentionImplementation_t implementation) {
    if (s_.fp8) return forward_fp8(implementation);
    TensorPtr q = data("Q", kUidQ, s_.q, kUidRaggedQ);
    TensorPtr k = data("K", kUidK, s_.k, kUidRaggedK);
    TensorPtr v = data("V", kUidV, s_.v, kUidRaggedV);
    auto options = fe::graph::SDPA_attributes()
                       .set_name("sdpa")
                       .set_generate_stats(s_.stats)
                       .set_attn_scale(s_.attn_scale)
                       .set_implementation(implementation);
    if (s_.padding) {
      auto [seq_q, seq_kv] = seq_lens();
      options.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
    }
    if (s_.has_left_bound || s_.has_right_bound)
      options.set_diagonal_alignment(s_.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                     : fe::DiagonalAlignment_t::TOP_LEFT);
    if (s_.has_left_bound) options.set_diagonal_band_left_bound(static_cast<int>(s_.left_bound));
    if (s_.has_right_bound)
      options.set_diagonal_band_right_bound(static_cast<int>(s_.right_bound));
    if (s_.bias) options.set_bias(plain("bias", kUidBias, s_.bias_desc, s_.bias_dtype));
    if (s_.dropout > 0.0f) {
      auto [seed, offset] = rng();
      options.set_dropout(s_.dropout, seed, offset);
    }
    if (s_.score_mod) {
      auto lowering = score_mod_lowering(s_.score_mod->forward());
      options.set_score_mod([lowering](std::shared_ptr<fe::graph::Graph> graph, TensorPtr s) {
        return lowering->Forward(graph, s);
      });
    }
    if (s_.paged) {
      // One table for K and V (the same pages hold both), under two uids; cuDNN reads the keys
      // of sequence b up to seq_len_kv[b] (padding is on: SdpaGraphSpec::paged).
      options.set_paged_attention_k_table(page_table("page_table_k", kUidPageTableK))
          .set_paged_attention_v_table(page_table("page_table_v", kUidPageTableV))
          .set_paged_attention_max_seq_len_kv(static_cast<int>(s_.seqlen_kv));
    }
    if (s_.sink) {
      options.set_sink_token(graph_->tensor(fe::graph::Tensor_attributes()
                                                .set_name("sink")
                                                .set_uid(kUidSink)
                                                .set_dim({1, s_.heads_q, 1, 1})
                                                .set_stride({s_.heads_q, 1, 1, 1})
                                                .set_data_type(fe::DataType_t::FLOAT)));
      // Not recorded: [1, heads, 1, 1] whatever the shape.
    }
    auto [o, stats] = graph_->sdpa(q, k, v, options);
    o->set_output(true).set_uid(kUidO).set_dim(Dims(s_.o)).set_stride(Strides(s_.o));
    record(kUidO, Dims(s_.o), Strides(s_.o));
    if (s_.ragged) o->set_ragged_offset(ragged("ragged_o", kUidRaggedO));
    if (s_.stats) {
      stats->set_output(true)
          .set_uid(kUidStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim(stats_dim())
          .set_stride(stats_stride());
      record(kUidStats, stats_dim(), stats_stride());
    }
    return graph_;
  }

  std::shared_ptr<fe::graph::Graph> backward() {
    if (s_.fp8) return backward_fp8();
    TensorPtr q = data("Q", kUidQ, s_.q, kUidRaggedQ);
    TensorPtr k = data("K", kUidK, s_.k, kUidRaggedK);
    TensorPtr v = data("V", kUidV, s_.v, kUidRaggedV);
    TensorPtr o = data("O", kUidO, s_.o, kUidRaggedO);
    TensorPtr d_o = data("dO", kUidDO, s_.d_o, kUidRaggedDO);
    TensorPtr stats = stats_input();
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("sdpa_backward")
                       .set_attn_scale(s_.attn_scale)
                       .set_deterministic_algorithm(s_.deterministic);
    if (s_.padding) {
      auto [seq_q, seq_kv] = seq_lens();
      options.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
    }
    if (s_.has_left_bound || s_.has_right_bound)
      options.set_diagonal_alignment(s_.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                     : fe::DiagonalAlignment_t::TOP_LEFT);
    if (s_.has_left_bound) options.set_diagonal_band_left_bound(static_cast<int>(s_.left_bound));
    if (s_.has_right_bound)
      options.set_diagonal_band_right_bound(static_cast<int>(s_.right_bound));
    if (s_.bias) {
      options.set_bias(plain("bias", kUidBias, s_.bias_desc, s_.bias_dtype));
      if (s_.dbias) options.set_dbias(plain("dbias", kUidDBias, s_.dbias_desc, s_.bias_dtype));
    }
    if (s_.dropout > 0.0f) {
      auto [seed, offset] = rng();
      options.set_dropout(s_.dropout, seed, offset);
    }
    if (s_.score_mod) {
      auto lowering = score_mod_lowering(s_.score_mod->backward());
      options.set_score_mod([lowering](std::shared_ptr<fe::graph::Graph> graph, TensorPtr s) {
        return lowering->Forward(graph, s);
      });
      options.set_score_mod_bprop([lowering](std::shared_ptr<fe::graph::Graph> graph,
                                             TensorPtr ds) { return lowering->Backward(graph, ds); });
    }
    auto [dq, dk, dv] = graph_->sdpa_backward(q, k, v, o, d_o, stats, options);
    dq->set_output(true).set_uid(kUidDQ).set_dim(Dims(s_.dq)).set_stride(Strides(s_.dq));
    dk->set_output(true).set_uid(kUidDK).set_dim(Dims(s_.dk)).set_stride(Strides(s_.dk));
    dv->set_output(true).set_uid(kUidDV).set_dim(Dims(s_.dv)).set_stride(Strides(s_.dv));
    record(kUidDQ, Dims(s_.dq), Strides(s_.dq));
    record(kUidDK, Dims(s_.dk), Strides(s_.dk));
    record(kUidDV, Dims(s_.dv), Strides(s_.dv));
    if (s_.ragged) {
      dq->set_ragged_offset(ragged("ragged_dq", kUidRaggedDQ));
      dk->set_ragged_offset(ragged("ragged_dk", kUidRaggedDK));
      dv->set_ragged_offset(ragged("ragged_dv", kUidRaggedDV));
    }
    return graph_;
  }

  // FP8 (fusedattn.h "FP8 attention"; cudnn-frontend's sdpa_fp8): S = Q8_e4m3(softmax * scale_s)
  // feeds the S.V GEMM, O = (S.V) * descale_s * descale_v, written as o_dtype after scale_o, with
  // amax_s and amax_o reduced before scaling. Dense layouts, no bias/dropout/sink/score_mod
  // (Fp8PreCheck).
  std::shared_ptr<fe::graph::Graph> forward_fp8(fe::AttentionImplementation_t implementation) {
    TensorPtr q = data("Q", kUidQ, s_.q, kUidRaggedQ);
    TensorPtr k = data("K", kUidK, s_.k, kUidRaggedK);
    TensorPtr v = data("V", kUidV, s_.v, kUidRaggedV);
    auto options = fe::graph::SDPA_fp8_attributes()
                       .set_name("sdpa_fp8")
                       .set_generate_stats(s_.stats)
                       .set_attn_scale(s_.attn_scale)
                       .set_implementation(implementation);
    set_band(options);
    const bool o_fp8 = IsFp8(s_.o_dtype);
    auto [o, stats, amax_s, amax_o] = graph_->sdpa_fp8(
        q, k, v, scalar("descale_q", kUidDescaleQ), scalar("descale_k", kUidDescaleK),
        scalar("descale_v", kUidDescaleV), scalar("descale_s", kUidDescaleS),
        scalar("scale_s", kUidScaleS), o_fp8 ? scalar("scale_o", kUidScaleO) : one(), options);
    o->set_output(true)
        .set_uid(kUidO)
        .set_dim(Dims(s_.o))
        .set_stride(Strides(s_.o))
        .set_data_type(DataTypeOf(s_.o_dtype));
    record(kUidO, Dims(s_.o), Strides(s_.o));
    if (s_.stats) {
      stats->set_output(true)
          .set_uid(kUidStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim(stats_dim())
          .set_stride(stats_stride());
      record(kUidStats, stats_dim(), stats_stride());
    }
    amax_output(amax_s, kUidAmaxS);
    amax_output(amax_o, kUidAmaxO);
    return graph_;
  }

  // FP8 backward (sdpa_fp8_backward): S = Q8_e4m3(p * scale_s) for dV = S^T.dO; dP = dS *
  // attn_scale quantized as Q8_dO(dP * scale_dp) for dQ = dP.K and dK = dP^T.Q; D = rowsum(dO * O)
  // after descale_do and descale_o; amax of dP, dQ, dK, dV before scaling.
  std::shared_ptr<fe::graph::Graph> backward_fp8() {
    TensorPtr q = data("Q", kUidQ, s_.q, kUidRaggedQ);
    TensorPtr k = data("K", kUidK, s_.k, kUidRaggedK);
    TensorPtr v = data("V", kUidV, s_.v, kUidRaggedV);
    TensorPtr o = plain("O", kUidO, s_.o, s_.o_dtype);
    TensorPtr d_o = plain("dO", kUidDO, s_.d_o, s_.do_dtype);
    TensorPtr stats = stats_input();
    auto options = fe::graph::SDPA_fp8_backward_attributes()
                       .set_name("sdpa_fp8_backward")
                       .set_attn_scale(s_.attn_scale)
                       .set_deterministic_algorithm(s_.deterministic);
    set_band(options);
    const bool o_fp8 = IsFp8(s_.o_dtype), dqkv_fp8 = IsFp8(s_.dqkv_dtype);
    auto [dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp] = graph_->sdpa_fp8_backward(
        q, k, v, o, d_o, stats, scalar("descale_q", kUidDescaleQ),
        scalar("descale_k", kUidDescaleK), scalar("descale_v", kUidDescaleV),
        o_fp8 ? scalar("descale_o", kUidDescaleO) : one(), scalar("descale_do", kUidDescaleDO),
        scalar("descale_s", kUidDescaleS), scalar("descale_dp", kUidDescaleDP),
        scalar("scale_s", kUidScaleS), dqkv_fp8 ? scalar("scale_dq", kUidScaleDQ) : one(),
        dqkv_fp8 ? scalar("scale_dk", kUidScaleDK) : one(),
        dqkv_fp8 ? scalar("scale_dv", kUidScaleDV) : one(), scalar("scale_dp", kUidScaleDP),
        options);
    const fe::DataType_t grad_type = DataTypeOf(s_.dqkv_dtype);
    dq->set_output(true).set_uid(kUidDQ).set_dim(Dims(s_.dq)).set_stride(Strides(s_.dq));
    dk->set_output(true).set_uid(kUidDK).set_dim(Dims(s_.dk)).set_stride(Strides(s_.dk));
    dv->set_output(true).set_uid(kUidDV).set_dim(Dims(s_.dv)).set_stride(Strides(s_.dv));
    dq->set_data_type(grad_type), dk->set_data_type(grad_type), dv->set_data_type(grad_type);
    record(kUidDQ, Dims(s_.dq), Strides(s_.dq));
    record(kUidDK, Dims(s_.dk), Strides(s_.dk));
    record(kUidDV, Dims(s_.dv), Strides(s_.dv));
    amax_output(amax_dq, kUidAmaxDQ);
    amax_output(amax_dk, kUidAmaxDK);
    amax_output(amax_dv, kUidAmaxDV);
    amax_output(amax_dp, kUidAmaxDP);
    return graph_;
  }

  // The dims and strides of every tensor made so far but the pass-by-value scalars and the sink
  // (the tensors whose dims follow the batch or the sequence lengths, and a few that do not).
  const std::vector<TensorShape>& shapes() const { return shapes_; }

 private:
  void record(Uid uid, std::vector<int64_t> dim, std::vector<int64_t> stride) {
    shapes_.push_back(TensorShape{uid, std::move(dim), std::move(stride)});
  }
  std::vector<int64_t> stats_dim() const { return {s_.batch, s_.heads_q, s_.seqlen_q, 1}; }
  std::vector<int64_t> stats_stride() const {
    return {s_.stats_stride[0], s_.stats_stride[1], s_.stats_stride[2], s_.stats_stride[3]};
  }

  // The lowering of a program with the graph's inputs it reads: the score_mod tensors and, with
  // padding, the sequence lengths (the prepare kernel's, under uids of their own: cuDNN's
  // seq_len attributes belong to its padding mask, which stays off next to a callback).
  std::shared_ptr<ScoreModLowering> score_mod_lowering(const flex::Program& program) {
    std::vector<TensorPtr> tensors;
    for (size_t k = 0; k < s_.aux.size(); ++k)
      tensors.push_back(plain(("score_mod_tensor_" + std::to_string(k)).c_str(),
                              static_cast<Uid>(kUidModTensor0 + static_cast<int>(k)),
                              s_.aux[k].desc, s_.aux[k].dtype));
    TensorPtr seq_q, seq_kv;
    if (s_.mod_seq_lens) {
      seq_q = per_sequence("score_mod_seq_len_q", kUidModSeqLenQ);
      seq_kv = per_sequence("score_mod_seq_len_kv", kUidModSeqLenKv);
    }
    return std::make_shared<ScoreModLowering>(s_, s_.score_mod, program, std::move(tensors),
                                              std::move(seq_q), std::move(seq_kv));
  }

  TensorPtr plain(const char* name, Uid uid, const TensorDesc& d, fusedattn_dtype dtype) {
    record(uid, Dims(d), Strides(d));
    return graph_->tensor(fe::graph::Tensor_attributes()
                              .set_name(name)
                              .set_uid(uid)
                              .set_dim(Dims(d))
                              .set_stride(Strides(d))
                              .set_data_type(DataTypeOf(dtype)));
  }
  // The forward's softmax statistics (LSE), float32, as the backward graphs read them.
  TensorPtr stats_input() {
    record(kUidStats, stats_dim(), stats_stride());
    return graph_->tensor(fe::graph::Tensor_attributes()
                              .set_name("stats")
                              .set_uid(kUidStats)
                              .set_dim(stats_dim())
                              .set_stride(stats_stride())
                              .set_data_type(fe::DataType_t::FLOAT));
  }
  // A q/k/v-like input, with its ragged offsets for THD (not a paged pool: its pages are found
  // through the page table).
  TensorPtr data(const char* name, Uid uid, const TensorDesc& d, Uid ragged_uid) {
    TensorPtr t = plain(name, uid, d, s_.io_dtype);
    const bool pool = s_.paged && (uid == kUidK || uid == kUidV);
    if (s_.ragged && !pool)
      t->set_ragged_offset(ragged((std::string("ragged_") + name).c_str(), ragged_uid));
    return t;
  }
  // A paged graph's page table, int32 [batch, 1, table_pages, 1], packed as the prepare kernel
  // writes it (cudnn-frontend's paged cache load asks for exactly ceil(max_seq_len_kv /
  // page_size) entries per sequence).
  TensorPtr page_table(const char* name, Uid uid) {
    const int64_t n = s_.table_pages;
    record(uid, {s_.batch, 1, n, 1}, {n, n, 1, 1});
    return graph_->tensor(fe::graph::Tensor_attributes()
                              .set_name(name)
                              .set_uid(uid)
                              .set_dim({s_.batch, 1, n, 1})
                              .set_stride({n, n, 1, 1})
                              .set_data_type(fe::DataType_t::INT32));
  }
  // Element offsets of each sequence's first token, int32 [batch + 1].
  TensorPtr ragged(const char* name, Uid uid) {
    record(uid, {s_.batch + 1, 1, 1, 1}, {1, 1, 1, 1});
    return graph_->tensor(fe::graph::Tensor_attributes()
                              .set_name(name)
                              .set_uid(uid)
                              .set_dim({s_.batch + 1, 1, 1, 1})
                              .set_stride({1, 1, 1, 1})
                              .set_data_type(fe::DataType_t::INT32));
  }
  // An int32 [batch] input: one value per sequence (its length).
  TensorPtr per_sequence(const char* name, Uid uid) {
    record(uid, {s_.batch, 1, 1, 1}, {1, 1, 1, 1});
    return graph_->tensor(fe::graph::Tensor_attributes()
                              .set_name(name)
                              .set_uid(uid)
                              .set_dim({s_.batch, 1, 1, 1})
                              .set_stride({1, 1, 1, 1})
                              .set_data_type(fe::DataType_t::INT32));
  }
  std::pair<TensorPtr, TensorPtr> seq_lens() {
    return {per_sequence("seq_len_q", kUidSeqLenQ), per_sequence("seq_len_kv", kUidSeqLenKv)};
  }
  static bool IsFp8(fusedattn_dtype dtype) {
    return dtype == FUSEDATTN_DTYPE_FP8_E4M3 || dtype == FUSEDATTN_DTYPE_FP8_E5M2;
  }
  // The padding and band of an FP8 graph (Fp8PreCheck refuses padding today: the prepare kernel
  // that writes the lengths has no FP8 call path; the graph is built as the spec says anyway).
  template <typename Options>
  void set_band(Options& options) {
    if (s_.padding) {
      auto [seq_q, seq_kv] = seq_lens();
      options.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
    }
    if (s_.has_left_bound || s_.has_right_bound)
      options.set_diagonal_alignment(s_.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                     : fe::DiagonalAlignment_t::TOP_LEFT);
    if (s_.has_left_bound) options.set_diagonal_band_left_bound(static_cast<int>(s_.left_bound));
    if (s_.has_right_bound)
      options.set_diagonal_band_right_bound(static_cast<int>(s_.right_bound));
  }
  // A float32 scalar in device memory (an FP8 scaling factor), not recorded: [1, 1, 1, 1]
  // whatever the shape.
  TensorPtr scalar(const char* name, Uid uid) {
    return graph_->tensor(fe::graph::Tensor_attributes()
                              .set_name(name)
                              .set_uid(uid)
                              .set_dim({1, 1, 1, 1})
                              .set_stride({1, 1, 1, 1})
                              .set_data_type(fe::DataType_t::FLOAT));
  }
  // The factor 1 where the problem reads none (scale_o of a bfloat16 O, ...): a constant.
  static TensorPtr one() { return std::make_shared<fe::graph::Tensor_attributes>(1.0f); }
  void amax_output(const TensorPtr& amax, Uid uid) {
    amax->set_output(true)
        .set_uid(uid)
        .set_dim({1, 1, 1, 1})
        .set_stride({1, 1, 1, 1})
        .set_data_type(fe::DataType_t::FLOAT);
  }
  // Philox seed and offset as host int64 scalars, passed by value at execution.
  std::pair<TensorPtr, TensorPtr> rng() {
    auto make = [&](const char* name, Uid uid) {
      return graph_->tensor(fe::graph::Tensor_attributes()
                                .set_name(name)
                                .set_uid(uid)
                                .set_dim({1, 1, 1, 1})
                                .set_stride({1, 1, 1, 1})
                                .set_is_pass_by_value(true)
                                .set_data_type(fe::DataType_t::INT64));
    };
    return {make("seed", kUidSeed), make("offset", kUidOffset)};
  }

  const SdpaGraphSpec& s_;
  std::shared_ptr<fe::graph::Graph> graph_;
  std::vector<TensorShape> shapes_;
};

// overrides: set for a dynamic-shape plan executed with execute-time shapes; the shapes its
// tensors were built with.
Status Finish(std::shared_ptr<fe::graph::Graph> graph, cudnnHandle_t handle,
              const std::vector<TensorShape>* overrides, std::shared_ptr<const SdpaGraph>* out) {
  FUSEDATTN_RETURN_IF_ERROR(
      FromFrontend(graph->build(handle, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK})));
  auto built = std::make_shared<SdpaGraph>();
  FUSEDATTN_RETURN_IF_ERROR(FromFrontend(graph->get_workspace_size(built->workspace)));
  for (int64_t uid : graph->get_variant_pack_uids_sorted()) {
    if (uid <= kUidNone || uid >= kUidCount)
      return InternalError("the cuDNN graph asks for a tensor with uid %lld that we did not make",
                           (long long)uid);
    built->user_uids.push_back(static_cast<int>(uid));
    if (overrides == nullptr || uid == kUidSeed || uid == kUidOffset) continue;  // by value
    for (const TensorShape& t : *overrides) {
      if (t.uid != uid) continue;
      built->override_uids.push_back(uid);
      built->override_dims.push_back(t.dim);
      built->override_strides.push_back(t.stride);
      break;
    }
  }
  built->graph = std::move(graph);
  *out = std::move(built);
  return Status::Ok();
}

// One attempt: make the graph's nodes and build its plan. cudnn-frontend throws on a few misuses
// (e.g. when no SDPA implementation fits the attributes); those become statuses too.
// make(&maker_shapes) returns the graph; overrides (when not null) receives the shapes the maker
// recorded, which Finish keeps for execution.
template <typename Make>
Status Attempt(Make&& make, cudnnHandle_t handle, std::shared_ptr<const SdpaGraph>* out,
               bool overrides = false) {
  try {
    std::vector<TensorShape> shapes;
    std::shared_ptr<fe::graph::Graph> graph = make(&shapes);
    return Finish(std::move(graph), handle, overrides ? &shapes : nullptr, out);
  } catch (const std::exception& e) {
    return Status(FUSEDATTN_ERROR_CUDNN, Format("cudnn-frontend: %s", e.what()));
  }
}

}  // namespace

const char* RouteName(BuildRoute route) {
  switch (route) {
    case BuildRoute::kUnified: return "unified SDPA node, per shape";
    case BuildRoute::kDynamic: return "dynamic shapes with a kernel cache";
    case BuildRoute::kStatic: return "per-shape plan";
    case BuildRoute::kStored: return "per-shape plan read from the on-disk plan store";
  }
  return "unknown";
}

std::shared_ptr<KernelCache> NewKernelCache() { return std::make_shared<KernelCache>(); }

Status KernelCacheToJson(const KernelCache& cache, std::string* json) {
  try {
    return FromFrontend(cache.cache->to_json(*json));
  } catch (const std::exception& e) {
    return Status(FUSEDATTN_ERROR_CUDNN, Format("cudnn-frontend: %s", e.what()));
  }
}

Status KernelCacheFromJson(const std::string& json, std::shared_ptr<KernelCache>* out) {
  auto made = std::make_shared<KernelCache>();
  try {
    FUSEDATTN_RETURN_IF_ERROR(FromFrontend(made->cache->from_json(json)));
  } catch (const std::exception& e) {
    return Status(FUSEDATTN_ERROR_CUDNN, Format("cudnn-frontend: %s", e.what()));
  }
  *out = std::move(made);
  return Status::Ok();
}

namespace {
// The store's payload: magic, then int64 words (uid count, uids, workspace bytes, frontend bytes),
// then the frontend's bytes. The blob cache around it checks size and checksum; this layout is
// checked again so that a payload of another layout is an error, never a misread.
constexpr char kStoreMagic[8] = {'F', 'A', 'S', 'D', 'P', 'A', '0', '1'};

void PutWord(std::vector<uint8_t>* out, int64_t word) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(&word);
  out->insert(out->end(), bytes, bytes + sizeof word);
}

bool GetWord(const std::vector<uint8_t>& in, size_t* at, int64_t* word) {
  if (in.size() - *at < sizeof *word) return false;
  std::memcpy(word, in.data() + *at, sizeof *word);
  *at += sizeof *word;
  return true;
}
}  // namespace

Status StoreSdpaGraph(const SdpaGraph& graph, std::vector<uint8_t>* bytes) {
  if (!graph.override_uids.empty())
    return NotSupported("a dynamic-shape plan is not stored (its shapes are given at execution)");
  std::vector<uint8_t> plan;
  try {
    FUSEDATTN_RETURN_IF_ERROR(FromFrontend(graph.graph->serialize(plan, false)));
  } catch (const std::exception& e) {
    return Status(FUSEDATTN_ERROR_CUDNN, Format("cudnn-frontend: %s", e.what()));
  }
  bytes->assign(kStoreMagic, kStoreMagic + sizeof kStoreMagic);
  PutWord(bytes, static_cast<int64_t>(graph.user_uids.size()));
  for (int uid : graph.user_uids) PutWord(bytes, uid);
  PutWord(bytes, graph.workspace);
  PutWord(bytes, static_cast<int64_t>(plan.size()));
  bytes->insert(bytes->end(), plan.begin(), plan.end());
  return Status::Ok();
}

Status LoadSdpaGraph(const std::vector<uint8_t>& bytes, cudnnHandle_t handle,
                     std::shared_ptr<const SdpaGraph>* out) {
  auto bad = [](const char* what) {
    return InternalError("a stored cuDNN plan of another layout: %s", what);
  };
  if (bytes.size() < sizeof kStoreMagic ||
      std::memcmp(bytes.data(), kStoreMagic, sizeof kStoreMagic) != 0)
    return bad("no magic");
  size_t at = sizeof kStoreMagic;
  auto loaded = std::make_shared<SdpaGraph>();
  int64_t count = 0;
  if (!GetWord(bytes, &at, &count) || count < 0 || count >= kUidCount) return bad("uid count");
  for (int64_t i = 0; i < count; ++i) {
    int64_t uid = 0;
    if (!GetWord(bytes, &at, &uid) || uid <= kUidNone || uid >= kUidCount) return bad("uid");
    loaded->user_uids.push_back(static_cast<int>(uid));
  }
  int64_t plan_bytes = 0;
  if (!GetWord(bytes, &at, &loaded->workspace) || loaded->workspace < 0 ||
      !GetWord(bytes, &at, &plan_bytes) || plan_bytes < 0 ||
      static_cast<uint64_t>(plan_bytes) != bytes.size() - at)
    return bad("sizes");
  const std::vector<uint8_t> plan(bytes.begin() + static_cast<std::ptrdiff_t>(at), bytes.end());
  auto graph = std::make_shared<fe::graph::Graph>();
  try {
    // No warm-up: the frontend's warm-up captures a throwaway CUDA graph on a blocking stream,
    // during which another thread's work on the legacy default stream fails (H100, 2026-11-25:
    // CudnnCache.EightThreadsSelectAndRunConcurrently). A built plan gets no warm-up either.
    FUSEDATTN_RETURN_IF_ERROR(
        FromFrontend(graph->deserialize(handle, plan, /*enforce_precompiled=*/true,
                                        /*run_warmup=*/false)));
  } catch (const std::exception& e) {
    return Status(FUSEDATTN_ERROR_CUDNN, Format("cudnn-frontend: %s", e.what()));
  }
  // The frontend orders a deserialized plan's tensors itself: they must be the stored ones.
  std::vector<int64_t> order = graph->get_variant_pack_uids_sorted();
  if (order.size() != loaded->user_uids.size() ||
      !std::equal(order.begin(), order.end(), loaded->user_uids.begin()))
    return bad("the plan's tensors differ from the stored ones");
  loaded->graph = std::move(graph);
  *out = std::move(loaded);
  return Status::Ok();
}

int FrontendVersion() { return CUDNN_FRONTEND_VERSION; }

Status BuildSdpaGraph(const SdpaGraphSpec& spec, cudnnHandle_t handle, const BuildOptions& options,
                      std::shared_ptr<const SdpaGraph>* out, BuildReport* report) {
  *report = BuildReport{};
  // The earlier attempts' failures, added to the last one's message (which leads: the composite
  // graph is what runs everything the others do not).
  std::string failures;
  auto note = [&](const char* what, const Status& s) {
    failures += Format("%s%s: %s", failures.empty() ? "" : "; ", what, s.message().c_str());
  };
  const bool forward = spec.direction == Direction::kForward;
  const auto composite = fe::AttentionImplementation_t::COMPOSITE;
  // The unified node first, as cudnn-frontend's AUTO would pick it: plans stay what they were
  // before dynamic shapes (which the unified node does not take).
  if (forward && !options.skip_unified) {
    Status s = Attempt(
        [&](std::vector<TensorShape>*) {
          return GraphMaker(spec, nullptr).forward(fe::AttentionImplementation_t::UNIFIED);
        },
        handle, out);
    if (s.ok()) {
      report->route = BuildRoute::kUnified;
      return s;
    }
    report->unified_refused = true;
    note("the unified node", s);
  }
  std::shared_ptr<KernelCache> kernel_cache = options.kernel_cache ? options.kernel_cache() : nullptr;
  if (kernel_cache) {
    Status s = Attempt(
        [&](std::vector<TensorShape>* shapes) {
          GraphMaker maker(spec, kernel_cache);
          auto graph = forward ? maker.forward(composite) : maker.backward();
          *shapes = maker.shapes();
          return graph;
        },
        handle, out, options.execute_time_shapes);
    if (s.ok()) {
      report->route = BuildRoute::kDynamic;
      return s;
    }
    report->dynamic_refusal = s.message();
    note("the dynamic-shape graph", s);
  }
  Status s = Attempt(
      [&](std::vector<TensorShape>*) {
        GraphMaker maker(spec, nullptr);
        return forward ? maker.forward(composite) : maker.backward();
      },
      handle, out);
  if (s.ok()) {
    report->route = BuildRoute::kStatic;
    return s;
  }
  if (failures.empty()) return s;
  return Status(s.code(), Format("%s (before it, %s)", s.message().c_str(), failures.c_str()));
}

int64_t GraphWorkspaceBytes(const SdpaGraph& graph) { return graph.workspace; }

Status ExecuteSdpaGraph(const SdpaGraph& graph, cudnnHandle_t handle, const GraphPointers& ptrs,
                        void* workspace) {
  void* sorted[kUidCount];
  const int n = static_cast<int>(graph.user_uids.size());
  for (int i = 0; i < n; ++i) {
    sorted[i] = ptrs.at[graph.user_uids[i]];
    if (sorted[i] == nullptr)
      return InternalError("no pointer for the cuDNN graph's tensor uid %d", graph.user_uids[i]);
  }
  try {
    if (graph.override_uids.empty())
      return FromFrontend(graph.graph->execute(handle, sorted, n, workspace));
    // A dynamic-shape plan: its shapes passed at execution (BuildOptions::execute_time_shapes).
    std::unordered_map<int64_t, void*> by_uid;
    for (int i = 0; i < n; ++i) by_uid.emplace(graph.user_uids[i], sorted[i]);
    return FromFrontend(graph.graph->execute(handle, by_uid, workspace, graph.override_uids,
                                             graph.override_dims, graph.override_strides));
  } catch (const std::exception& e) {
    return Status(FUSEDATTN_ERROR_CUDNN, Format("cudnn-frontend: %s", e.what()));
  }
}

}  // namespace fusedattn::cudnn
