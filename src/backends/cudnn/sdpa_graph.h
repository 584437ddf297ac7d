// Our small interface to cudnn-frontend: build the SDPA graph of a spec, ask its workspace, run
// it. sdpa_graph.cpp is the only translation unit that includes cudnn-frontend (about a minute
// to compile); everything else sees these few declarations.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/cudnn/plan_spec.h"
#include "common/status.h"

namespace fusedattn::cudnn {

// The tensors of a graph, by the uid they have in it.
enum Uid : int {
  kUidNone = 0,
  kUidQ, kUidK, kUidV, kUidO, kUidStats, kUidBias, kUidSeqLenQ, kUidSeqLenKv,
  kUidSeed, kUidOffset, kUidSink,
  kUidRaggedQ, kUidRaggedK, kUidRaggedV, kUidRaggedO,
  kUidDO, kUidDQ, kUidDK, kUidDV, kUidDBias,
  kUidRaggedDO, kUidRaggedDQ, kUidRaggedDK, kUidRaggedDV,
  // Score modifier inputs: per-sequence lengths (int32 [batch], the padding masks' lengths,
  // read by the callback), then the score_mod tensors in declaration order.
  kUidModSeqLenQ, kUidModSeqLenKv,
  kUidModTensor0,
  // FP8 (SdpaGraphSpec::fp8): per-tensor scaling factors and amax outputs, float32 scalars. (After
  // the score_mod tensors, so that the uids of plans stored before FP8 keep their meaning.)
  kUidDescaleQ = kUidModTensor0 + kMaxScoreModTensors,
  kUidDescaleK, kUidDescaleV, kUidDescaleO, kUidDescaleDO, kUidDescaleS, kUidDescaleDP,
  kUidScaleS, kUidScaleO, kUidScaleDP, kUidScaleDQ, kUidScaleDK, kUidScaleDV,
  kUidAmaxS, kUidAmaxO, kUidAmaxDP, kUidAmaxDQ, kUidAmaxDK, kUidAmaxDV,
  // Paged K/V (SdpaGraphSpec::paged): the page tables of K and V, int32 [batch, 1, table_pages,
  // 1] (both the one table the prepare kernel writes). Last, as FP8's, for stored plans' uids.
  kUidPageTableK, kUidPageTableV,
  kUidCount
};

// Device pointers by uid (seed and offset: host pointers to int64, passed by value).
struct GraphPointers {
  void* at[kUidCount] = {};
};

// A built graph with its execution plan. Immutable after building; execute() may be called from
// any thread at once, each with its own handle.
class SdpaGraph;

// How a graph's plan was built.
enum class BuildRoute {
  kUnified,  // cuDNN's unified SDPA node (what cudnn-frontend's AUTO picks when it can), per shape
  kDynamic,  // the composite node as a dynamic-shape graph: kernels come from the structure's
             // kernel cache, so a new batch size or sequence length compiles nothing
             // (experimental, FUSEDATTN_CUDNN_DYNAMIC_SHAPES=1; README.md "Dynamic shapes")
  kStatic,   // the composite node for this one shape, compiled afresh
  kStored,   // a per-shape plan (unified or composite) an earlier process built, read from the
             // on-disk plan store (StoreSdpaGraph / LoadSdpaGraph)
};
const char* RouteName(BuildRoute route);

// cuDNN's kernel cache (cudnn-frontend's KernelCache): the compiled kernels of one structure's
// dynamic-shape graphs. cuDNN binds it to the first graph built with it and reuses its kernels
// for graphs of the same topology; graphs keep it alive. Builds that use one cache must not run
// at once (cudnn_backend.cpp serializes them per structure).
class KernelCache;
std::shared_ptr<KernelCache> NewKernelCache();
// cuDNN's JSON form of a cache (cuDNN >= 9.10): its compiled kernels, for the on-disk cache.
Status KernelCacheToJson(const KernelCache& cache, std::string* json);
Status KernelCacheFromJson(const std::string& json, std::shared_ptr<KernelCache>* cache);

struct BuildOptions {
  // Set: asked for the kernel cache when the dynamic-shape attempt is reached (after the unified
  // node, for the forward); a null answer skips that attempt. (Lazy, so that a structure the
  // unified node builds never reads a kernel cache from disk.)
  std::function<std::shared_ptr<KernelCache>()> kernel_cache;
  // The unified node refused this structure before: do not ask again.
  bool skip_unified = false;
  // A dynamic-shape plan is executed with the shape and strides of each of its tensors passed at
  // execution (cuDNN's variant-pack overrides, cuDNN >= 9.18), the way cudnn-frontend's SDPA
  // dynamic-shape sample runs one. Without them, on cuDNN 9.19 a plan whose kernels came from
  // the kernel cache computed the shape of the graph that compiled them (README.md, "Dynamic
  // shapes: status"). Equal to the plan's own shapes, they change nothing for a correct plan.
  bool execute_time_shapes = true;
};
struct BuildReport {
  BuildRoute route = BuildRoute::kStatic;
  bool unified_refused = false;  // the unified node was tried and refused
  std::string dynamic_refusal;   // a dynamic-shape attempt failed: cuDNN's message
};

// Builds the graph of spec on handle's device: the forward tries the unified node, then (with a
// kernel cache) the composite node with dynamic shapes, then the composite node for this shape;
// the backward the dynamic then the static composite graph. On failure the status carries
// cuDNN's message of every attempt.
Status BuildSdpaGraph(const SdpaGraphSpec& spec, cudnnHandle_t handle, const BuildOptions& options,
                      std::shared_ptr<const SdpaGraph>* graph, BuildReport* report);

// A built per-shape plan as bytes for the on-disk plan store: the tensors' uids in execution
// order, the workspace size, then cudnn-frontend's serialized execution plan (which holds the
// compiled kernels). NotSupported when cuDNN cannot serialize the plan's engine, or for a
// dynamic-shape plan (its execute-time shapes are not stored).
Status StoreSdpaGraph(const SdpaGraph& graph, std::vector<uint8_t>* bytes);
// The plan StoreSdpaGraph wrote, made executable on handle's device without compiling. An error
// (bytes of another layout, a plan cuDNN refuses) means the caller builds the plan instead.
Status LoadSdpaGraph(const std::vector<uint8_t>& bytes, cudnnHandle_t handle,
                     std::shared_ptr<const SdpaGraph>* graph);

// The cudnn-frontend version the backend is compiled with (major * 10000 + minor * 100 + patch);
// part of the on-disk cache's key.
int FrontendVersion();

// Bytes of workspace the graph needs.
int64_t GraphWorkspaceBytes(const SdpaGraph& graph);

// Runs the graph on the handle's stream. workspace holds GraphWorkspaceBytes(graph). A
// dynamic-shape plan built with execute_time_shapes gets its tensors' shapes passed too.
Status ExecuteSdpaGraph(const SdpaGraph& graph, cudnnHandle_t handle, const GraphPointers& ptrs,
                        void* workspace);

}  // namespace fusedattn::cudnn
