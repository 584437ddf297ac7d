// Our small interface to cudnn-frontend: build the SDPA graph of a spec, ask its workspace, run
// it. sdpa_graph.cpp is the only translation unit that includes cudnn-frontend (about a minute
// to compile); everything else sees these few declarations.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <memory>

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
  kUidCount = kUidModTensor0 + kMaxScoreModTensors
};

// Device pointers by uid (seed and offset: host pointers to int64, passed by value).
struct GraphPointers {
  void* at[kUidCount] = {};
};

// A built graph with its execution plan. Immutable after building; execute() may be called from
// any thread at once, each with its own handle.
class SdpaGraph;

// Builds the graph of spec on handle's device. On failure the status carries cuDNN's message.
Status BuildSdpaGraph(const SdpaGraphSpec& spec, cudnnHandle_t handle,
                      std::shared_ptr<const SdpaGraph>* graph);

// Bytes of workspace the graph needs.
int64_t GraphWorkspaceBytes(const SdpaGraph& graph);

// Runs the graph on the handle's stream. workspace holds GraphWorkspaceBytes(graph).
Status ExecuteSdpaGraph(const SdpaGraph& graph, cudnnHandle_t handle, const GraphPointers& ptrs,
                        void* workspace);

}  // namespace fusedattn::cudnn
