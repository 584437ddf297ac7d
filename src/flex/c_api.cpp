// The C entry points of score-modifier graphs (fusedattn_score_mod_* in fusedattn.h).
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "flex/score_mod.h"
#include "flex/serialize.h"

using fusedattn::InternalError;
using fusedattn::InvalidArgument;
using fusedattn::Status;
using fusedattn::flex::Builder;

namespace {

void WriteText(char* out, size_t out_len, const std::string& text) {
  if (out == nullptr || out_len == 0) return;
  size_t n = text.size() < out_len - 1 ? text.size() : out_len - 1;
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

// Runs body, writing its message; no exception crosses the C boundary.
template <typename Body>
fusedattn_status Guarded(char* msg, size_t msg_len, Body&& body) {
  Status status;
  try {
    status = body();
  } catch (const std::bad_alloc&) {
    status = Status(FUSEDATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    status = InternalError("internal error: %s", e.what());
  } catch (...) {
    status = InternalError("internal error: unknown exception");
  }
  WriteText(msg, msg_len, status.message());
  return status.code();
}

// The builder of a live handle that is not finalized yet, or why not.
Status Building(fusedattn_score_mod* graph, const char* call, Builder** builder) {
  if (graph == nullptr) return InvalidArgument("%s: graph is NULL", call);
  if (graph->magic != fusedattn_score_mod::kMagic)
    return InvalidArgument("%s: graph does not point at a live fusedattn_score_mod", call);
  if (graph->finalized)
    return InvalidArgument("%s: the graph is finalized and can no longer change (build a new one)",
                           call);
  *builder = &graph->builder;
  return Status::Ok();
}

Status Prefixed(const char* call, Status status) {
  if (status.ok()) return status;
  return Status(status.code(), std::string(call) + ": " + status.message());
}

}  // namespace

extern "C" {

fusedattn_status fusedattn_score_mod_create(fusedattn_score_mod** graph) {
  if (graph == nullptr) return FUSEDATTN_ERROR_INVALID_ARGUMENT;
  *graph = nullptr;
  try {
    *graph = new fusedattn_score_mod();
    return FUSEDATTN_SUCCESS;
  } catch (const std::bad_alloc&) {
    return FUSEDATTN_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return FUSEDATTN_ERROR_INTERNAL;
  }
}

void fusedattn_score_mod_destroy(fusedattn_score_mod* graph) {
  if (graph == nullptr || graph->magic != fusedattn_score_mod::kMagic) return;
  graph->magic = 0;  // a later use of the dangling handle is more likely to be caught
  delete graph;
}

fusedattn_status fusedattn_score_mod_input(fusedattn_score_mod* graph,
                                           fusedattn_score_mod_variable input, int32_t* node,
                                           char* msg, size_t msg_len) {
  return Guarded(msg, msg_len, [&]() -> Status {
    const char* call = "fusedattn_score_mod_input";
    Builder* b = nullptr;
    FUSEDATTN_RETURN_IF_ERROR(Building(graph, call, &b));
    if (node == nullptr) return InvalidArgument("%s: node (the output pointer) is NULL", call);
    return Prefixed(call, b->Input(static_cast<int>(input), node));
  });
}

fusedattn_status fusedattn_score_mod_constant(fusedattn_score_mod* graph, double value,
                                              int32_t* node, char* msg, size_t msg_len) {
  return Guarded(msg, msg_len, [&]() -> Status {
    const char* call = "fusedattn_score_mod_constant";
    Builder* b = nullptr;
    FUSEDATTN_RETURN_IF_ERROR(Building(graph, call, &b));
    if (node == nullptr) return InvalidArgument("%s: node (the output pointer) is NULL", call);
    return Prefixed(call, b->Constant(value, node));
  });
}

fusedattn_status fusedattn_score_mod_tensor(fusedattn_score_mod* graph, const char* name,
                                            fusedattn_dtype dtype, uint32_t axes,
                                            int32_t requires_grad, int32_t* node, char* msg,
                                            size_t msg_len) {
  return Guarded(msg, msg_len, [&]() -> Status {
    const char* call = "fusedattn_score_mod_tensor";
    Builder* b = nullptr;
    FUSEDATTN_RETURN_IF_ERROR(Building(graph, call, &b));
    if (node == nullptr) return InvalidArgument("%s: node (the output pointer) is NULL", call);
    return Prefixed(call, b->Tensor(name, static_cast<int>(dtype), axes, requires_grad, node));
  });
}

fusedattn_status fusedattn_score_mod_op(fusedattn_score_mod* graph, fusedattn_score_mod_opcode op,
                                        int32_t num_operands, const int32_t* operands,
                                        int32_t* node, char* msg, size_t msg_len) {
  return Guarded(msg, msg_len, [&]() -> Status {
    const char* call = "fusedattn_score_mod_op";
    Builder* b = nullptr;
    FUSEDATTN_RETURN_IF_ERROR(Building(graph, call, &b));
    if (node == nullptr) return InvalidArgument("%s: node (the output pointer) is NULL", call);
    return Prefixed(call, b->Operation(static_cast<int>(op), num_operands, operands, node));
  });
}

fusedattn_status fusedattn_score_mod_set_score(fusedattn_score_mod* graph, int32_t node,
                                               char* msg, size_t msg_len) {
  return Guarded(msg, msg_len, [&]() -> Status {
    const char* call = "fusedattn_score_mod_set_score";
    Builder* b = nullptr;
    FUSEDATTN_RETURN_IF_ERROR(Building(graph, call, &b));
    return Prefixed(call, b->SetScore(node));
  });
}

fusedattn_status fusedattn_score_mod_set_mask(fusedattn_score_mod* graph, int32_t node,
                                              char* msg, size_t msg_len) {
  return Guarded(msg, msg_len, [&]() -> Status {
    const char* call = "fusedattn_score_mod_set_mask";
    Builder* b = nullptr;
    FUSEDATTN_RETURN_IF_ERROR(Building(graph, call, &b));
    return Prefixed(call, b->SetMask(node));
  });
}

fusedattn_status fusedattn_score_mod_set_gradient(fusedattn_score_mod* graph, int32_t wrt,
                                                  int32_t gradient, char* msg, size_t msg_len) {
  return Guarded(msg, msg_len, [&]() -> Status {
    const char* call = "fusedattn_score_mod_set_gradient";
    Builder* b = nullptr;
    FUSEDATTN_RETURN_IF_ERROR(Building(graph, call, &b));
    return Prefixed(call, b->SetGradient(wrt, gradient));
  });
}

fusedattn_status fusedattn_score_mod_finalize(fusedattn_score_mod* graph, char* msg,
                                              size_t msg_len) {
  return Guarded(msg, msg_len, [&]() -> Status {
    const char* call = "fusedattn_score_mod_finalize";
    Builder* b = nullptr;
    FUSEDATTN_RETURN_IF_ERROR(Building(graph, call, &b));
    std::shared_ptr<const fusedattn::flex::ScoreMod> made;
    FUSEDATTN_RETURN_IF_ERROR(Prefixed(call, fusedattn::flex::ScoreMod::Make(*b, &made)));
    graph->finalized = std::move(made);
    return Status::Ok();
  });
}

fusedattn_status fusedattn_score_mod_hash(const fusedattn_score_mod* graph, uint64_t hash[2]) {
  if (hash == nullptr) return FUSEDATTN_ERROR_INVALID_ARGUMENT;
  std::shared_ptr<const fusedattn::flex::ScoreMod> mod;
  Status s = fusedattn::flex::FinalizedOf(graph, "graph", &mod);
  if (!s.ok()) return s.code();
  hash[0] = mod->hash().lo;
  hash[1] = mod->hash().hi;
  return FUSEDATTN_SUCCESS;
}

fusedattn_status fusedattn_score_mod_equal(const fusedattn_score_mod* a,
                                           const fusedattn_score_mod* b, int32_t* equal) {
  if (equal == nullptr) return FUSEDATTN_ERROR_INVALID_ARGUMENT;
  std::shared_ptr<const fusedattn::flex::ScoreMod> ma, mb;
  Status s = fusedattn::flex::FinalizedOf(a, "a", &ma);
  if (s.ok()) s = fusedattn::flex::FinalizedOf(b, "b", &mb);
  if (!s.ok()) return s.code();
  *equal = fusedattn::flex::SameScoreMod(ma.get(), mb.get()) ? 1 : 0;
  return FUSEDATTN_SUCCESS;
}

fusedattn_status fusedattn_score_mod_describe(const fusedattn_score_mod* graph, char* text,
                                              size_t text_len) {
  return Guarded(text, text_len, [&]() -> Status {
    if (graph == nullptr || graph->magic != fusedattn_score_mod::kMagic)
      return InvalidArgument("fusedattn_score_mod_describe: graph is not a live handle");
    if (graph->finalized) return Status(FUSEDATTN_SUCCESS, graph->finalized->Describe());
    const Builder& b = graph->builder;
    std::vector<std::string> names;
    for (const auto& t : b.tensors()) names.push_back(t.name);
    const auto& nodes = b.graph().nodes();
    std::string described = "(not finalized) score: " +
                            (b.roots().score >= 0
                                 ? fusedattn::flex::ToString(nodes, b.roots().score, &names)
                                 : std::string("s (unchanged)")) +
                            "\nmask: " +
                            (b.roots().mask >= 0
                                 ? fusedattn::flex::ToString(nodes, b.roots().mask, &names)
                                 : std::string("none"));
    return Status(FUSEDATTN_SUCCESS, described);
  });
}

fusedattn_status fusedattn_score_mod_serialize(const fusedattn_score_mod* graph, char* text,
                                               size_t text_len, size_t* needed) {
  try {
    std::shared_ptr<const fusedattn::flex::ScoreMod> mod;
    Status s = fusedattn::flex::FinalizedOf(graph, "graph", &mod);
    if (!s.ok()) return s.code();
    std::string serialized = fusedattn::flex::Serialize(graph->builder);
    if (needed != nullptr) *needed = serialized.size() + 1;
    if (text_len == 0 && text == nullptr) return FUSEDATTN_SUCCESS;  // sizing only
    if (text == nullptr || text_len < serialized.size() + 1) return FUSEDATTN_ERROR_INVALID_ARGUMENT;
    std::memcpy(text, serialized.c_str(), serialized.size() + 1);
    return FUSEDATTN_SUCCESS;
  } catch (const std::bad_alloc&) {
    return FUSEDATTN_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return FUSEDATTN_ERROR_INTERNAL;
  }
}

fusedattn_status fusedattn_score_mod_deserialize(const char* text, fusedattn_score_mod** graph,
                                                 char* msg, size_t msg_len) {
  if (graph != nullptr) *graph = nullptr;
  return Guarded(msg, msg_len, [&]() -> Status {
    const char* call = "fusedattn_score_mod_deserialize";
    if (graph == nullptr) return InvalidArgument("%s: graph (the output pointer) is NULL", call);
    if (text == nullptr) return InvalidArgument("%s: text is NULL", call);
    std::unique_ptr<fusedattn_score_mod> made(new fusedattn_score_mod());
    FUSEDATTN_RETURN_IF_ERROR(Prefixed(call, fusedattn::flex::Deserialize(text, &made->builder)));
    std::shared_ptr<const fusedattn::flex::ScoreMod> finalized;
    FUSEDATTN_RETURN_IF_ERROR(
        Prefixed(call, fusedattn::flex::ScoreMod::Make(made->builder, &finalized)));
    made->finalized = std::move(finalized);
    *graph = made.release();
    return Status::Ok();
  });
}

}  // extern "C"
