// The one translation unit that includes cudnn-frontend: an SdpaGraphSpec becomes an sdpa or
// sdpa_backward graph (samples/cpp/sdpa in cudnn-frontend show the same calls), built with
// heuristics A then the fallback list, and executed from a pointer table in the graph's uid order.
// A score_mod becomes the pointwise nodes of cudnn-frontend's score-modifier callbacks
// (ScoreModLowering below).
#include "backends/cudnn/sdpa_graph.h"

#include <cudnn_frontend.h>

#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "flex/graph.h"
#include "flex/score_mod.h"

namespace fusedattn::cudnn {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

class SdpaGraph {
 public:
  std::shared_ptr<fe::graph::Graph> graph;
  std::vector<int> user_uids;  // the graph's user tensors, in the order execute() takes them
  int64_t workspace = 0;
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
// what that returns as the gradient of s. Numbers are float (the graph's compute type;
// fusedattn.h allows float32 on a GPU: indices stay exact up to 2^24), indices int32 from
// GEN_INDEX on s as cuDNN's own masks make them, booleans BOOLEAN with a BOOLEAN compute type
// as in cuDNN's masks.
//
// Visibility (the config's band and padding, which cuDNN's masks cannot do next to a callback,
// and the mask_mod) selects -inf in the forward and 0 in the backward, so that whatever the
// graph computes at a hidden key (inf, NaN) never reaches a sum.
//
// The forward callback keeps every node's tensor; the backward one reuses them for d score / d s,
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
        seq_len_kv_(std::move(seq_len_kv)) {}

  TensorPtr Forward(const std::shared_ptr<fe::graph::Graph>& graph, const TensorPtr& s) {
    graph_ = graph.get();
    s_ = s;
    values_.assign(program_.nodes.size(), nullptr);
    for (TensorPtr& index : index_) index = nullptr;
    TensorPtr score = s;
    if (program_.score >= 0) {
      score = Value(program_.score);
      // A score that does not read s may lack some of its axes (a constant, a broadcast tensor).
      if (!flex::DependsOnInput(program_.nodes, program_.score, FUSEDATTN_SCORE_MOD_SCORE))
        score = Add(score, Mul(Index(3), Constant(0.0f)));
    }
    visible_ = Visible();
    if (visible_ == nullptr) return score;
    return Pointwise(fe::PointwiseMode_t::BINARY_SELECT, score,
                     Constant(fe::graph::attn::score_modifiers::get_negative_inf_value()),
                     visible_);
  }

  TensorPtr Backward(const std::shared_ptr<fe::graph::Graph>& graph, const TensorPtr& ds) {
    if (s_ == nullptr || program_.d_score < 0)
      throw std::logic_error("the score modifier's backward ran before its forward");
    graph_ = graph.get();
    TensorPtr grad = ds;
    const flex::Node& d = program_.nodes[static_cast<size_t>(program_.d_score)];
    if (!(d.op == flex::Op::kConstant && d.value == 1.0)) grad = Mul(ds, Value(program_.d_score));
    if (visible_ == nullptr) return grad;
    return Pointwise(fe::PointwiseMode_t::BINARY_SELECT, grad, Constant(0.0f), visible_);
  }

 private:
  using Mode = fe::PointwiseMode_t;

  TensorPtr Pointwise(Mode mode, const TensorPtr& a, const TensorPtr& b = nullptr,
                      const TensorPtr& c = nullptr, bool boolean = false) {
    auto attributes = fe::graph::Pointwise_attributes()
                          .set_name("score_mod_" + std::to_string(++count_))
                          .set_mode(mode);
    if (boolean) attributes.set_compute_data_type(fe::DataType_t::BOOLEAN);
    TensorPtr out = c ? graph_->pointwise(a, b, c, attributes)
                      : b ? graph_->pointwise(a, b, attributes) : graph_->pointwise(a, attributes);
    if (boolean) out->set_data_type(fe::DataType_t::BOOLEAN);
    return out;
  }
  TensorPtr Add(const TensorPtr& a, const TensorPtr& b) { return Pointwise(Mode::ADD, a, b); }
  TensorPtr Mul(const TensorPtr& a, const TensorPtr& b) { return Pointwise(Mode::MUL, a, b); }
  TensorPtr And(const TensorPtr& a, const TensorPtr& b) {
    if (a == nullptr) return b;
    if (b == nullptr) return a;
    return Pointwise(Mode::LOGICAL_AND, a, b, nullptr, true);
  }
  TensorPtr Or(const TensorPtr& a, const TensorPtr& b) {
    return Pointwise(Mode::LOGICAL_OR, a, b, nullptr, true);
  }
  TensorPtr Not(const TensorPtr& a) { return Pointwise(Mode::LOGICAL_NOT, a, nullptr, nullptr, true); }
  TensorPtr Compare(Mode mode, const TensorPtr& a, const TensorPtr& b) {
    return Pointwise(mode, a, b, nullptr, true);
  }
  // A scalar folded into the graph, as cuDNN's own masks pass theirs.
  static TensorPtr Constant(float value) {
    return std::make_shared<fe::graph::Tensor_attributes>(value);
  }

  // The index of s along an axis (0 batch, 1 query head, 2 query, 3 key), made once.
  TensorPtr Index(int axis) {
    TensorPtr& index = index_[axis];
    if (index == nullptr) {
      index = graph_->pointwise(s_, fe::graph::Pointwise_attributes()
                                        .set_name("score_mod_index_" + std::to_string(axis))
                                        .set_mode(Mode::GEN_INDEX)
                                        .set_axis(axis)
                                        .set_compute_data_type(fe::DataType_t::INT32));
      index->set_data_type(fe::DataType_t::INT32);
    }
    return index;
  }
  TensorPtr SeqLenQ() {
    return seq_lens_ ? seq_len_q_ : Constant(static_cast<float>(seqlen_q_));
  }
  TensorPtr SeqLenKv() {
    return seq_lens_ ? seq_len_kv_ : Constant(static_cast<float>(seqlen_kv_));
  }

  // The config's mask and the mask_mod as one boolean; null when every key stays visible.
  TensorPtr Visible() {
    TensorPtr visible;
    const Band& band = band_;
    if (band.left >= 0 || band.right >= 0) {
      // Key j is visible when -left <= j - d <= right, d = i (+ sk - sq bottom-right).
      TensorPtr offset = Pointwise(Mode::SUB, Index(3), Index(2));
      if (band.bottom_right)
        offset = Pointwise(Mode::SUB, offset, Pointwise(Mode::SUB, SeqLenKv(), SeqLenQ()));
      if (band.right >= 0)
        visible = Compare(Mode::CMP_LE, offset, Constant(static_cast<float>(band.right)));
      if (band.left >= 0)
        visible = And(visible, Compare(Mode::CMP_GE, offset,
                                       Constant(-static_cast<float>(band.left))));
    }
    if (seq_lens_)
      visible = And(visible, And(Compare(Mode::CMP_LT, Index(2), seq_len_q_),
                                 Compare(Mode::CMP_LT, Index(3), seq_len_kv_)));
    if (program_.mask >= 0) visible = And(visible, Value(program_.mask));
    return visible;
  }

  // The tensor of node id, lowered once (operands first).
  TensorPtr Value(int32_t id) {
    TensorPtr& value = values_[static_cast<size_t>(id)];
    if (value == nullptr) value = Lower(program_.nodes[static_cast<size_t>(id)]);
    return value;
  }

  TensorPtr Lower(const flex::Node& n) {
    using flex::Op;
    auto arg = [&](int k) { return Value(n.args[k]); };
    auto is_bool = [&](int k) {
      return program_.nodes[static_cast<size_t>(n.args[k])].type == flex::Type::kBool;
    };
    switch (n.op) {
      case Op::kInput:
        switch (n.slot) {
          case FUSEDATTN_SCORE_MOD_SCORE: return s_;
          case FUSEDATTN_SCORE_MOD_BATCH: return Index(0);
          case FUSEDATTN_SCORE_MOD_HEAD: return Index(1);
          case FUSEDATTN_SCORE_MOD_Q_IDX: return Index(2);
          case FUSEDATTN_SCORE_MOD_KV_IDX: return Index(3);
          case FUSEDATTN_SCORE_MOD_SEQLEN_Q: return SeqLenQ();
          case FUSEDATTN_SCORE_MOD_SEQLEN_KV: return SeqLenKv();
        }
        throw std::logic_error("score_mod input " + std::to_string(n.slot) + " has no lowering");
      case Op::kConstant:
        if (n.type == flex::Type::kBool)  // folded comparisons: true / false over every key
          return Compare(n.value != 0.0 ? Mode::CMP_GE : Mode::CMP_LT, Index(3), Constant(0.0f));
        return Constant(static_cast<float>(n.value));
      case Op::kTensor:
        if (n.slot < 0 || static_cast<size_t>(n.slot) >= tensors_.size())
          throw std::logic_error("score_mod tensor " + std::to_string(n.slot) + " is not an input");
        return tensors_[static_cast<size_t>(n.slot)];
      case Op::kNeg: return Pointwise(Mode::NEG, arg(0));
      case Op::kAbs: return Pointwise(Mode::ABS, arg(0));
      case Op::kExp: return Pointwise(Mode::EXP, arg(0));
      case Op::kLog: return Pointwise(Mode::LOG, arg(0));
      case Op::kTanh: return Pointwise(Mode::TANH_FWD, arg(0));
      case Op::kSigmoid: return Pointwise(Mode::SIGMOID_FWD, arg(0));
      case Op::kNot: return Not(arg(0));
      case Op::kAdd: return Add(arg(0), arg(1));
      case Op::kSub: return Pointwise(Mode::SUB, arg(0), arg(1));
      case Op::kMul: return Mul(arg(0), arg(1));
      case Op::kDiv: return Pointwise(Mode::DIV, arg(0), arg(1));
      case Op::kMin: return Pointwise(Mode::MIN, arg(0), arg(1));
      case Op::kMax: return Pointwise(Mode::MAX, arg(0), arg(1));
      case Op::kLt: return Compare(Mode::CMP_LT, arg(0), arg(1));
      case Op::kLe: return Compare(Mode::CMP_LE, arg(0), arg(1));
      case Op::kGt: return Compare(Mode::CMP_GT, arg(0), arg(1));
      case Op::kGe: return Compare(Mode::CMP_GE, arg(0), arg(1));
      case Op::kEq:
      case Op::kNe: {
        TensorPtr equal;
        if (is_bool(0))  // booleans: (a and b) or (not a and not b)
          equal = Or(And(arg(0), arg(1)), And(Not(arg(0)), Not(arg(1))));
        else
          return Compare(n.op == Op::kEq ? Mode::CMP_EQ : Mode::CMP_NEQ, arg(0), arg(1));
        return n.op == Op::kEq ? equal : Not(equal);
      }
      case Op::kAnd: return And(arg(0), arg(1));
      case Op::kOr: return Or(arg(0), arg(1));
      case Op::kSelect:
        if (is_bool(1))  // booleans: (c and a) or (not c and b)
          return Or(And(arg(0), arg(1)), And(Not(arg(0)), arg(2)));
        return Pointwise(Mode::BINARY_SELECT, arg(1), arg(2), arg(0));
    }
    throw std::logic_error("score_mod operation without a lowering");
  }

  Band band_;
  bool seq_lens_;
  int64_t seqlen_q_, seqlen_kv_;
  std::shared_ptr<const flex::ScoreMod> score_mod_;
  const flex::Program& program_;  // score_mod_'s
  std::vector<TensorPtr> tensors_;
  TensorPtr seq_len_q_, seq_len_kv_;
  fe::graph::Graph* graph_ = nullptr;  // the callback's sub-graph, during the call
  TensorPtr s_;
  TensorPtr visible_;
  TensorPtr index_[4];
  std::vector<TensorPtr> values_;
  int count_ = 0;
};

// Builds the nodes of one graph; one instance per attempt.
class GraphMaker {
 public:
  explicit GraphMaker(const SdpaGraphSpec& spec) : s_(spec) {
    graph_ = std::make_shared<fe::graph::Graph>();
    graph_->set_io_data_type(DataTypeOf(s_.io_dtype))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
  }

  std::shared_ptr<fe::graph::Graph> forward(fe::AttentionImplementation_t implementation) {
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
    if (s_.sink)
      options.set_sink_token(graph_->tensor(fe::graph::Tensor_attributes()
                                                .set_name("sink")
                                                .set_uid(kUidSink)
                                                .set_dim({1, s_.heads_q, 1, 1})
                                                .set_stride({s_.heads_q, 1, 1, 1})
                                                .set_data_type(fe::DataType_t::FLOAT)));
    auto [o, stats] = graph_->sdpa(q, k, v, options);
    o->set_output(true).set_uid(kUidO).set_dim(Dims(s_.o)).set_stride(Strides(s_.o));
    if (s_.ragged) o->set_ragged_offset(ragged("ragged_o", kUidRaggedO));
    if (s_.stats) {
      stats->set_output(true)
          .set_uid(kUidStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim({s_.batch, s_.heads_q, s_.seqlen_q, 1})
          .set_stride({s_.stats_stride[0], s_.stats_stride[1], s_.stats_stride[2],
                       s_.stats_stride[3]});
    }
    return graph_;
  }

  std::shared_ptr<fe::graph::Graph> backward() {
    TensorPtr q = data("Q", kUidQ, s_.q, kUidRaggedQ);
    TensorPtr k = data("K", kUidK, s_.k, kUidRaggedK);
    TensorPtr v = data("V", kUidV, s_.v, kUidRaggedV);
    TensorPtr o = data("O", kUidO, s_.o, kUidRaggedO);
    TensorPtr d_o = data("dO", kUidDO, s_.d_o, kUidRaggedDO);
    TensorPtr stats = graph_->tensor(fe::graph::Tensor_attributes()
                                         .set_name("stats")
                                         .set_uid(kUidStats)
                                         .set_dim({s_.batch, s_.heads_q, s_.seqlen_q, 1})
                                         .set_stride({s_.stats_stride[0], s_.stats_stride[1],
                                                      s_.stats_stride[2], s_.stats_stride[3]})
                                         .set_data_type(fe::DataType_t::FLOAT));
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
    if (s_.ragged) {
      dq->set_ragged_offset(ragged("ragged_dq", kUidRaggedDQ));
      dk->set_ragged_offset(ragged("ragged_dk", kUidRaggedDK));
      dv->set_ragged_offset(ragged("ragged_dv", kUidRaggedDV));
    }
    return graph_;
  }

 private:
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
      auto make = [&](const char* name, Uid uid) {
        return graph_->tensor(fe::graph::Tensor_attributes()
                                  .set_name(name)
                                  .set_uid(uid)
                                  .set_dim({s_.batch, 1, 1, 1})
                                  .set_stride({1, 1, 1, 1})
                                  .set_data_type(fe::DataType_t::INT32));
      };
      seq_q = make("score_mod_seq_len_q", kUidModSeqLenQ);
      seq_kv = make("score_mod_seq_len_kv", kUidModSeqLenKv);
    }
    return std::make_shared<ScoreModLowering>(s_, s_.score_mod, program, std::move(tensors),
                                              std::move(seq_q), std::move(seq_kv));
  }

  TensorPtr plain(const char* name, Uid uid, const TensorDesc& d, fusedattn_dtype dtype) {
    return graph_->tensor(fe::graph::Tensor_attributes()
                              .set_name(name)
                              .set_uid(uid)
                              .set_dim(Dims(d))
                              .set_stride(Strides(d))
                              .set_data_type(DataTypeOf(dtype)));
  }
  // A q/k/v-like input, with its ragged offsets for THD.
  TensorPtr data(const char* name, Uid uid, const TensorDesc& d, Uid ragged_uid) {
    TensorPtr t = plain(name, uid, d, s_.io_dtype);
    if (s_.ragged) t->set_ragged_offset(ragged((std::string("ragged_") + name).c_str(), ragged_uid));
    return t;
  }
  // Element offsets of each sequence's first token, int32 [batch + 1].
  TensorPtr ragged(const char* name, Uid uid) {
    return graph_->tensor(fe::graph::Tensor_attributes()
                              .set_name(name)
                              .set_uid(uid)
                              .set_dim({s_.batch + 1, 1, 1, 1})
                              .set_stride({1, 1, 1, 1})
                              .set_data_type(fe::DataType_t::INT32));
  }
  std::pair<TensorPtr, TensorPtr> seq_lens() {
    auto make = [&](const char* name, Uid uid) {
      return graph_->tensor(fe::graph::Tensor_attributes()
                                .set_name(name)
                                .set_uid(uid)
                                .set_dim({s_.batch, 1, 1, 1})
                                .set_stride({1, 1, 1, 1})
                                .set_data_type(fe::DataType_t::INT32));
    };
    return {make("seq_len_q", kUidSeqLenQ), make("seq_len_kv", kUidSeqLenKv)};
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
};

Status Finish(std::shared_ptr<fe::graph::Graph> graph, cudnnHandle_t handle,
              std::shared_ptr<const SdpaGraph>* out) {
  FUSEDATTN_RETURN_IF_ERROR(
      FromFrontend(graph->build(handle, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK})));
  auto built = std::make_shared<SdpaGraph>();
  FUSEDATTN_RETURN_IF_ERROR(FromFrontend(graph->get_workspace_size(built->workspace)));
  for (int64_t uid : graph->get_variant_pack_uids_sorted()) {
    if (uid <= kUidNone || uid >= kUidCount)
      return InternalError("the cuDNN graph asks for a tensor with uid %lld that we did not make",
                           (long long)uid);
    built->user_uids.push_back(static_cast<int>(uid));
  }
  built->graph = std::move(graph);
  *out = std::move(built);
  return Status::Ok();
}

// One attempt: make the graph's nodes and build its plan. cudnn-frontend throws on a few misuses
// (e.g. when no SDPA implementation fits the attributes); those become statuses too.
template <typename Make>
Status Attempt(Make&& make, cudnnHandle_t handle, std::shared_ptr<const SdpaGraph>* out) {
  try {
    return Finish(make(), handle, out);
  } catch (const std::exception& e) {
    return Status(FUSEDATTN_ERROR_CUDNN, Format("cudnn-frontend: %s", e.what()));
  }
}

}  // namespace

Status BuildSdpaGraph(const SdpaGraphSpec& spec, cudnnHandle_t handle,
                      std::shared_ptr<const SdpaGraph>* out) {
  if (spec.direction == Direction::kBackward)
    return Attempt([&] { return GraphMaker(spec).backward(); }, handle, out);
  // AUTO picks cuDNN's unified or composite SDPA node from the attributes alone; when the unified
  // one then finds no engine, the composite one may still have one.
  Status first = Attempt(
      [&] { return GraphMaker(spec).forward(fe::AttentionImplementation_t::AUTO); }, handle, out);
  if (first.ok()) return first;
  Status second = Attempt(
      [&] { return GraphMaker(spec).forward(fe::AttentionImplementation_t::COMPOSITE); }, handle,
      out);
  if (second.ok() || first.message() == second.message()) return second;
  return Status(first.code(), first.message() + "; with the composite node: " + second.message());
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
    return FromFrontend(graph.graph->execute(handle, sorted, n, workspace));
  } catch (const std::exception& e) {
    return Status(FUSEDATTN_ERROR_CUDNN, Format("cudnn-frontend: %s", e.what()));
  }
}

}  // namespace fusedattn::cudnn
