// The one translation unit that includes cudnn-frontend: an SdpaGraphSpec becomes an sdpa or
// sdpa_backward graph (samples/cpp/sdpa in cudnn-frontend show the same calls), built with
// heuristics A then the fallback list, and executed from a pointer table in the graph's uid order.
#include "backends/cudnn/sdpa_graph.h"

#include <cudnn_frontend.h>

#include <exception>
#include <string>
#include <vector>

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
