// The cuDNN backend: SDPA forward and backward through cudnn-frontend graphs (sdpa_graph.cpp),
// planned by plan_spec.cpp, with the small kernels of kernels.cu around them.
//
// check() builds exactly the graphs forward()/backward() run for tensors with the canonical
// strides of the problem's formats (plan_spec.h says how other strides are handled) and returns
// cuDNN's own message when it cannot build them. Built plans live in a bounded LRU cache keyed by
// the whole graph spec plus the device (ordinal, compute capability) and the cuDNN version.
//
// Score modifiers: every entry point plans from EffectiveProblem (plan_spec.h): a band mask_mod
// is a plain problem with that band, every other graph reaches cuDNN's score-modifier callbacks
// through the spec (sdpa_graph.cpp lowers it).
//
// Batch size: a graph bakes in its batch, so a new batch size builds a new graph (a cold build,
// see bench/cudnn_overhead.cpp for its cost) and never reuses one of another size. THD problems
// without a per-sequence bias build for a power-of-two batch capacity instead (unused entries get
// length 0), so batch sizes within one power of two share a graph.
//
// Handles: cuDNN handles are not thread-safe, so each call leases one from a per-device pool for
// its duration (created on first need, kept for the process). Plans are immutable after building
// and run from any thread with the leased handle, on the caller's stream.
#include "backends/cudnn/cudnn_backend.h"

#include <cudnn.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/cudnn/kernels.h"
#include "backends/cudnn/plan_spec.h"
#include "backends/cudnn/sdpa_graph.h"
#include "common/cuda_util.h"
#include "common/lru_cache.h"
#include "select/backend.h"
#include "select/select.h"

namespace fusedattn {
namespace cudnn {

namespace {

constexpr size_t kDefaultCacheSize = 256;
constexpr int kMaxDevices = 64;

size_t CacheCapacityFromEnv() {
  const char* value = std::getenv("FUSEDATTN_PLAN_CACHE_SIZE");
  if (value == nullptr || *value == '\0') return kDefaultCacheSize;
  char* end = nullptr;
  long long n = std::strtoll(value, &end, 10);
  if (end == value || *end != '\0' || n < 1) return kDefaultCacheSize;
  return static_cast<size_t>(n);
}

Status CudnnError(const char* what, cudnnStatus_t status) {
  return Status(FUSEDATTN_ERROR_CUDNN, Format("%s failed: %s", what, cudnnGetErrorString(status)));
}

// ------------------------------------------------------------------------------------------------
// Handles: a pool per device. A lease returns its handle when it ends.
// ------------------------------------------------------------------------------------------------
// A pooled handle remembers the stream it was last set to: cudnnSetStream costs host time, and a
// caller mostly runs on one stream.
struct PooledHandle {
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
};

class HandlePool {
 public:
  Status acquire(int device, PooledHandle* out) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& free = free_[device];
      if (!free.empty()) {
        *out = free.back();
        free.pop_back();
        return Status::Ok();
      }
    }
    *out = PooledHandle{};
    cudnnStatus_t status = cudnnCreate(&out->handle);  // on the current device
    if (status != CUDNN_STATUS_SUCCESS) return CudnnError("cudnnCreate", status);
    return Status::Ok();
  }
  void release(int device, const PooledHandle& handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[device].push_back(handle);
  }

 private:
  std::mutex mutex_;
  // Handles are never destroyed: the pool lives for the process, and destroying handles while
  // CUDA shuts down at exit is unsafe. There are at most as many as calls ever ran at once.
  std::vector<PooledHandle> free_[kMaxDevices];
};

HandlePool& Handles() {
  static HandlePool* pool = new HandlePool();  // never destroyed, see above
  return *pool;
}

class HandleLease {
 public:
  HandleLease() = default;
  HandleLease(const HandleLease&) = delete;
  HandleLease& operator=(const HandleLease&) = delete;
  ~HandleLease() {
    if (pooled_.handle != nullptr) Handles().release(device_, pooled_);
  }
  Status acquire(int device) {
    device_ = device;
    return Handles().acquire(device, &pooled_);
  }
  // The stream the handle's work goes to (a new handle starts on the default stream).
  Status set_stream(cudaStream_t stream) {
    if (stream == pooled_.stream) return Status::Ok();
    cudnnStatus_t status = cudnnSetStream(pooled_.handle, stream);
    if (status != CUDNN_STATUS_SUCCESS) return CudnnError("cudnnSetStream", status);
    pooled_.stream = stream;
    return Status::Ok();
  }
  cudnnHandle_t get() const { return pooled_.handle; }

 private:
  int device_ = 0;
  PooledHandle pooled_;
};

// ------------------------------------------------------------------------------------------------
// Device and library
// ------------------------------------------------------------------------------------------------
Status CurrentDevice(DeviceInfo* info) {
  static std::atomic<int> capability[kMaxDevices] = {};
  int device = 0;
  FUSEDATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices)
    return NotSupported("CUDA device %d: the cuDNN backend serves devices 0..%d", device,
                        kMaxDevices - 1);
  int cc = capability[device].load(std::memory_order_relaxed);
  if (cc == 0) {
    int major = 0, minor = 0;
    FUSEDATTN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    FUSEDATTN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    cc = major * 10 + minor;
    capability[device].store(cc, std::memory_order_relaxed);
  }
  info->ordinal = device;
  info->compute_capability = cc;
  info->cudnn_version = static_cast<int64_t>(cudnnGetVersion());
  return Status::Ok();
}

// ------------------------------------------------------------------------------------------------
// The plan cache
// ------------------------------------------------------------------------------------------------
struct PlanEntry {
  Status status;  // the build's result; failures are cached too, with cuDNN's message
  std::shared_ptr<const SdpaGraph> graph;
  int64_t workspace = 0;
};

using PlanCache = LruCache<PlanKey, PlanEntry, PlanKeyHash>;

PlanCache& Cache() {
  static PlanCache* cache = new PlanCache(CacheCapacityFromEnv());  // plans outlive static dtors
  return *cache;
}

// The plan of spec on the current device: from the cache, or built (outside the cache's lock;
// two threads may build the same plan at once, the first inserted is kept).
Status GetPlan(const SdpaGraphSpec& spec, const DeviceInfo& device,
               std::shared_ptr<PlanEntry>* entry) {
  PlanKey key = MakePlanKey(spec, device);
  if (key.used > PlanKey::kWords)
    return InternalError("cuDNN plan key needs %zu words, more than %zu", key.used,
                         PlanKey::kWords);
  // cuDNN's refusals are cached like plans (check() of that graph fails fast next time); a
  // missing handle is not about the graph and is not cached.
  Status no_handle;
  *entry = Cache().get_or_make(key, [&]() -> std::shared_ptr<PlanEntry> {
    HandleLease handle;
    no_handle = handle.acquire(device.ordinal);
    if (!no_handle.ok()) return nullptr;
    auto made = std::make_shared<PlanEntry>();
    made->status = BuildSdpaGraph(spec, handle.get(), &made->graph);
    if (made->status.ok()) made->workspace = GraphWorkspaceBytes(*made->graph);
    return made;
  });
  if (*entry == nullptr) return no_handle;
  return Status::Ok();
}

const char* DirectionName(Direction d) {
  return d == Direction::kForward ? "forward" : "backward";
}

Status PlanStatus(const PlanEntry& entry, Direction direction) {
  if (entry.status.ok()) return Status::Ok();
  return NotSupported("cuDNN cannot build the %s graph: %s", DirectionName(direction),
                      entry.status.message().c_str());
}

// ------------------------------------------------------------------------------------------------
// Calls
// ------------------------------------------------------------------------------------------------
DeviceView ViewOf(const TensorView& t) {
  DeviceView v;
  v.data = t.data;
  v.stride_b = t.stride_b, v.stride_h = t.stride_h, v.stride_s = t.stride_s,
  v.stride_d = t.stride_d;
  return v;
}

template <typename Tensors>
Sequences SequencesOf(const Problem& p, const Tensors& t, bool const_lengths) {
  const auto& c = p.config;
  Sequences s;
  s.batch = c.batch;
  s.max_seqlen_q = c.max_seqlen_q;
  s.max_seqlen_kv = c.max_seqlen_kv;
  s.thd = p.thd;
  if (p.padding && !const_lengths) {
    s.cu_seqlens_q = t.cu_seqlens_q;
    s.cu_seqlens_kv = t.cu_seqlens_kv;
  }
  if (p.thd) {
    s.seq_offsets_q = t.seq_offsets_q;
    s.seq_offsets_kv = t.seq_offsets_kv;
    s.tokens_q = t.q.num_tokens;
    s.tokens_kv = t.k.num_tokens;
  }
  return s;
}

// The workspace: our scratch first (its size depends only on the problem), then cuDNN's.
struct WorkspaceLayout {
  char* scratch = nullptr;
  void* cudnn = nullptr;
  size_t needed = 0;
};

Status LayOut(void* workspace, size_t bytes, const Scratch& scratch, int64_t cudnn_bytes,
              WorkspaceLayout* out) {
  out->needed = WorkspaceBytes(scratch.bytes, cudnn_bytes);
  if (out->needed > bytes)
    return Status(FUSEDATTN_ERROR_WORKSPACE,
                  Format("the cuDNN plan for these tensors needs %zu bytes of workspace but %zu "
                         "were given",
                         out->needed, bytes));
  if (out->needed == 0) return Status::Ok();  // nothing to lay out
  uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
  base = (base + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
  out->scratch = reinterpret_cast<char*>(base);
  size_t scratch_aligned =
      (scratch.bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
  out->cudnn = out->scratch + scratch_aligned;
  return Status::Ok();
}

template <typename T>
T* At(const WorkspaceLayout& w, size_t offset) {
  return offset == Scratch::kNone ? nullptr : reinterpret_cast<T*>(w.scratch + offset);
}

// The score modifier's inputs (a graph without a score_mod asks for none of them): its tensors
// and, with padding, the sequence lengths the prepare kernel wrote.
template <typename Tensors>
void SetScoreModPointers(const Tensors& t, const Scratch& scratch, const WorkspaceLayout& ws,
                         GraphPointers* ptrs) {
  ptrs->at[kUidModSeqLenQ] = At<int32_t>(ws, scratch.seq_len_q);
  ptrs->at[kUidModSeqLenKv] = At<int32_t>(ws, scratch.seq_len_kv);
  for (size_t k = 0; k < t.score_mod_tensors.size() && k < size_t{kMaxScoreModTensors}; ++k)
    ptrs->at[kUidModTensor0 + static_cast<int>(k)] = t.score_mod_tensors[k].data;
}

Status Execute(const SdpaGraph& graph, int device, void* stream, const GraphPointers& ptrs,
               void* workspace) {
  HandleLease handle;
  FUSEDATTN_RETURN_IF_ERROR(handle.acquire(device));
  FUSEDATTN_RETURN_IF_ERROR(handle.set_stream(static_cast<cudaStream_t>(stream)));
  return ExecuteSdpaGraph(graph, handle.get(), ptrs, workspace);
}

class CudnnBackendImpl final : public Backend {
 public:
  fusedattn_backend id() const override { return FUSEDATTN_BACKEND_CUDNN; }
  const char* name() const override { return "cudnn"; }

  Status available() const override {
    if (!HasCudaDevice()) return NotSupported("%s", NoCudaDeviceReason().c_str());
    size_t version = cudnnGetVersion();
    if (version < 90000)
      return NotSupported("cuDNN %zu is loaded; the cuDNN backend needs cuDNN 9 or newer",
                          version);
    int cc = CurrentDeviceComputeCapability();
    if (cc < 80)
      return NotSupported("compute capability %d.%d: cuDNN SDPA needs 8.0 or newer", cc / 10,
                          cc % 10);
    // The backend's own small kernels (kernels.cu) are compiled for the build's architectures.
    static const cudaError_t probe = ProbeKernels();
    if (probe != cudaSuccess)
      return NotSupported("%s", NoKernelForDeviceReason(cudaGetErrorString(probe)).c_str());
    return Status::Ok();
  }

  Status check(const Problem& problem) override {
    Problem storage;
    const Problem& p = EffectiveProblem(problem, &storage);
    FUSEDATTN_RETURN_IF_ERROR(PreCheck(p));
    DeviceInfo device;
    FUSEDATTN_RETURN_IF_ERROR(CurrentDevice(&device));
    std::shared_ptr<PlanEntry> entry;
    FUSEDATTN_RETURN_IF_ERROR(GetPlan(ForwardSpec(p, CanonicalFwdTensors(p)), device, &entry));
    FUSEDATTN_RETURN_IF_ERROR(PlanStatus(*entry, Direction::kForward));
    if (p.config.is_training) {
      FUSEDATTN_RETURN_IF_ERROR(
          GetPlan(BackwardSpec(p, CanonicalBwdTensors(p)), device, &entry));
      FUSEDATTN_RETURN_IF_ERROR(PlanStatus(*entry, Direction::kBackward));
    }
    return Status::Ok();
  }

  Status fwd_workspace_size(const Problem& problem, size_t* bytes) override {
    Problem storage;
    const Problem& p = EffectiveProblem(problem, &storage);
    DeviceInfo device;
    FUSEDATTN_RETURN_IF_ERROR(CurrentDevice(&device));
    std::shared_ptr<PlanEntry> entry;
    FUSEDATTN_RETURN_IF_ERROR(GetPlan(ForwardSpec(p, CanonicalFwdTensors(p)), device, &entry));
    FUSEDATTN_RETURN_IF_ERROR(PlanStatus(*entry, Direction::kForward));
    // The scratch for the largest call plan: a caller's LSE that is not packed needs staging.
    CallPlan call = ForwardCallPlan(p, CanonicalFwdTensors(p));
    if (p.needs_lse()) call.stage_stats = true;
    *bytes = WorkspaceBytes(ForwardScratch(p, call).bytes, entry->workspace);
    return Status::Ok();
  }

  Status bwd_workspace_size(const Problem& problem, size_t* bytes) override {
    Problem storage;
    const Problem& p = EffectiveProblem(problem, &storage);
    DeviceInfo device;
    FUSEDATTN_RETURN_IF_ERROR(CurrentDevice(&device));
    BwdTensors canonical = CanonicalBwdTensors(p);
    std::shared_ptr<PlanEntry> entry;
    FUSEDATTN_RETURN_IF_ERROR(GetPlan(BackwardSpec(p, canonical), device, &entry));
    FUSEDATTN_RETURN_IF_ERROR(PlanStatus(*entry, Direction::kBackward));
    // The scratch for the largest call plan: a caller's LSE that is not packed needs staging.
    CallPlan call = BackwardCallPlan(p, canonical);
    call.stage_stats = true;
    *bytes = WorkspaceBytes(BackwardScratch(p, call).bytes, entry->workspace);
    return Status::Ok();
  }

  Status forward(const Problem& p, const FwdTensors& t, void* workspace, size_t workspace_bytes,
                 void* stream) override;
  Status backward(const Problem& p, const BwdTensors& t, void* workspace, size_t workspace_bytes,
                  void* stream) override;

  fusedattn_cache_stats cache_stats() const override { return Cache().stats(); }

 private:
  // What this call's tensors need that cuDNN cannot do (reason): run it on the flash backend
  // when it is built and the caller did not ask for cuDNN by name, else fail naming the reason.
  template <typename Run>
  Status Fallback(const Problem& p, const std::string& reason, Run&& run) {
    const bool forced = p.config.backend == FUSEDATTN_BACKEND_CUDNN ||
                        (p.config.backend == FUSEDATTN_BACKEND_AUTO &&
                         EnvironmentBackend() == FUSEDATTN_BACKEND_CUDNN);
    if (forced)
      return NotSupported("cudnn (forced): %s for these tensors (the flash backend takes any "
                          "layout)",
                          reason.c_str());
#ifdef FUSEDATTN_WITH_FLASH
    Backend* flash = FlashBackend();
    Status s = flash->available();
    if (s.ok()) s = flash->check(p);
    if (s.ok()) return run(flash);
    return NotSupported("cudnn: %s, and the flash fallback cannot run it: %s", reason.c_str(),
                        s.message().c_str());
#else
    (void)run;
    return NotSupported("cudnn: %s (for these tensors; the flash backend, which takes any "
                        "layout, is not built)",
                        reason.c_str());
#endif
  }
};

Status CudnnBackendImpl::forward(const Problem& problem, const FwdTensors& t, void* workspace,
                                 size_t workspace_bytes, void* stream) {
  Problem storage;
  const Problem& p = EffectiveProblem(problem, &storage);
  const auto& c = p.config;
  auto fallback = [&](const std::string& reason) {
    return Fallback(p, reason, [&](Backend* other) {
      size_t needed = 0;
      FUSEDATTN_RETURN_IF_ERROR(other->fwd_workspace_size(p, &needed));
      // Without a score_mod, flash's forward workspace is only its THD tile schedule, which it
      // skips (plain grid) when not given: a smaller cuDNN workspace still runs.
      if (needed > workspace_bytes && !p.score_mod)
        return other->forward(p, t, nullptr, 0, stream);
      if (needed > workspace_bytes)
        return Status(FUSEDATTN_ERROR_WORKSPACE,
                      Format("cudnn: %s; the flash fallback needs %zu bytes of workspace but %zu "
                             "were given",
                             reason.c_str(), needed, workspace_bytes));
      return other->forward(p, t, workspace, workspace_bytes, stream);
    });
  };

  const struct {
    const char* name;
    const TensorView& view;
    int64_t heads, seqlen, dim;
  } operands[] = {{"args.q", t.q, c.heads_q, c.max_seqlen_q, c.head_dim_qk},
                  {"args.k", t.k, c.heads_kv, c.max_seqlen_kv, c.head_dim_qk},
                  {"args.v", t.v, c.heads_kv, c.max_seqlen_kv, c.head_dim_v},
                  {"args.o", t.o, c.heads_q, c.max_seqlen_q, c.head_dim_v}};
  for (const auto& op : operands) {
    Status s = CheckRuntimeLayout(op.name, op.view, c.batch, op.heads, op.seqlen, op.dim, p.thd);
    if (!s.ok()) return fallback(s.message());
  }

  DeviceInfo device;
  FUSEDATTN_RETURN_IF_ERROR(CurrentDevice(&device));
  const SdpaGraphSpec spec = ForwardSpec(p, t);
  std::shared_ptr<PlanEntry> entry;
  FUSEDATTN_RETURN_IF_ERROR(GetPlan(spec, device, &entry));
  if (!entry->status.ok()) return fallback(PlanStatus(*entry, Direction::kForward).message());

  const CallPlan call = ForwardCallPlan(p, t);
  const Scratch scratch = ForwardScratch(p, call);
  WorkspaceLayout ws;
  Status laid = LayOut(workspace, workspace_bytes, scratch, entry->workspace, &ws);
  if (!laid.ok()) return fallback(laid.message());

  const Sequences seq = SequencesOf(p, t, call.const_lengths);
  const cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  if (call.prep) {
    PrepareParams prep;
    prep.seq = seq;
    prep.graph_batch = spec.batch;
    prep.seq_len_q = At<int32_t>(ws, scratch.seq_len_q);
    prep.seq_len_kv = At<int32_t>(ws, scratch.seq_len_kv);
    const TensorView* ragged_views[kRaggedSlots] = {&t.q, &t.k, &t.v, &t.o};
    for (int slot : {kRaggedQ, kRaggedK, kRaggedV, kRaggedO}) {
      prep.ragged[slot] = At<int32_t>(ws, scratch.ragged[slot]);
      prep.ragged_stride[slot] = ragged_views[slot]->stride_s;
      prep.ragged_kv_side[slot] = slot == kRaggedK || slot == kRaggedV;
    }
    prep.sink = At<float>(ws, scratch.sink);
    prep.sink_src = c.softmax_type == FUSEDATTN_SOFTMAX_LEARNABLE_SINK ? t.sink_logits : nullptr;
    prep.sink_stride = t.sink_stride;
    prep.heads_q = c.heads_q;
    FUSEDATTN_CUDA_CHECK(LaunchPrepare(prep, cuda_stream));
  }

  int64_t seed = static_cast<int64_t>(t.dropout_seed);
  int64_t offset = static_cast<int64_t>(t.dropout_offset);
  GraphPointers ptrs;
  ptrs.at[kUidQ] = t.q.data;
  ptrs.at[kUidK] = t.k.data;
  ptrs.at[kUidV] = t.v.data;
  ptrs.at[kUidO] = t.o.data;
  ptrs.at[kUidStats] = call.stage_stats ? At<float>(ws, scratch.stats) : t.lse.data;
  ptrs.at[kUidBias] = t.bias.data;
  ptrs.at[kUidSeqLenQ] = At<int32_t>(ws, scratch.seq_len_q);
  ptrs.at[kUidSeqLenKv] = At<int32_t>(ws, scratch.seq_len_kv);
  ptrs.at[kUidSeed] = &seed;
  ptrs.at[kUidOffset] = &offset;
  ptrs.at[kUidSink] = At<float>(ws, scratch.sink);
  ptrs.at[kUidRaggedQ] = At<int32_t>(ws, scratch.ragged[kRaggedQ]);
  ptrs.at[kUidRaggedK] = At<int32_t>(ws, scratch.ragged[kRaggedK]);
  ptrs.at[kUidRaggedV] = At<int32_t>(ws, scratch.ragged[kRaggedV]);
  ptrs.at[kUidRaggedO] = At<int32_t>(ws, scratch.ragged[kRaggedO]);
  SetScoreModPointers(t, scratch, ws, &ptrs);
  FUSEDATTN_RETURN_IF_ERROR(Execute(*entry->graph, device.ordinal, stream, ptrs, ws.cudnn));

  if (call.fixup) {
    ForwardFixupParams fix;
    fix.seq = seq;
    fix.band = BandOf(p);
    fix.heads_q = c.heads_q;
    fix.head_dim_v = c.head_dim_v;
    fix.o = ViewOf(t.o);
    fix.stats = At<float>(ws, scratch.stats);
    fix.lse = ViewOf(t.lse);
    fix.lse_packed = t.lse_packed;
    fix.empty_by_stats = call.empty_by_stats;
    FUSEDATTN_CUDA_CHECK(LaunchForwardFixup(fix, cuda_stream));
  }
  return Status::Ok();
}

Status CudnnBackendImpl::backward(const Problem& problem, const BwdTensors& t, void* workspace,
                                  size_t workspace_bytes, void* stream) {
  Problem storage;
  const Problem& p = EffectiveProblem(problem, &storage);
  const auto& c = p.config;
  auto fallback = [&](const std::string& reason) {
    return Fallback(p, reason, [&](Backend* other) {
      size_t needed = 0;
      FUSEDATTN_RETURN_IF_ERROR(other->bwd_workspace_size(p, &needed));
      if (needed > workspace_bytes)
        return Status(FUSEDATTN_ERROR_WORKSPACE,
                      Format("cudnn: %s; the flash fallback needs %zu bytes of workspace but %zu "
                             "were given",
                             reason.c_str(), needed, workspace_bytes));
      return other->backward(p, t, workspace, workspace_bytes, stream);
    });
  };

  const struct {
    const char* name;
    const TensorView& view;
    int64_t heads, seqlen, dim;
  } operands[] = {{"args.q", t.q, c.heads_q, c.max_seqlen_q, c.head_dim_qk},
                  {"args.k", t.k, c.heads_kv, c.max_seqlen_kv, c.head_dim_qk},
                  {"args.v", t.v, c.heads_kv, c.max_seqlen_kv, c.head_dim_v},
                  {"args.o", t.o, c.heads_q, c.max_seqlen_q, c.head_dim_v},
                  {"args.d_o", t.d_o, c.heads_q, c.max_seqlen_q, c.head_dim_v},
                  {"args.dq", t.dq, c.heads_q, c.max_seqlen_q, c.head_dim_qk},
                  {"args.dk", t.dk, c.heads_kv, c.max_seqlen_kv, c.head_dim_qk},
                  {"args.dv", t.dv, c.heads_kv, c.max_seqlen_kv, c.head_dim_v}};
  for (const auto& op : operands) {
    Status s = CheckRuntimeLayout(op.name, op.view, c.batch, op.heads, op.seqlen, op.dim, p.thd);
    if (!s.ok()) return fallback(s.message());
  }

  DeviceInfo device;
  FUSEDATTN_RETURN_IF_ERROR(CurrentDevice(&device));
  const SdpaGraphSpec spec = BackwardSpec(p, t);
  std::shared_ptr<PlanEntry> entry;
  FUSEDATTN_RETURN_IF_ERROR(GetPlan(spec, device, &entry));
  if (!entry->status.ok()) return fallback(PlanStatus(*entry, Direction::kBackward).message());

  const CallPlan call = BackwardCallPlan(p, t);
  const Scratch scratch = BackwardScratch(p, call);
  WorkspaceLayout ws;
  Status laid = LayOut(workspace, workspace_bytes, scratch, entry->workspace, &ws);
  if (!laid.ok()) return fallback(laid.message());

  const Sequences seq = SequencesOf(p, t, call.const_lengths);
  const Band band = BandOf(p);
  const cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  if (call.prep) {
    PrepareParams prep;
    prep.seq = seq;
    prep.graph_batch = spec.batch;
    prep.seq_len_q = At<int32_t>(ws, scratch.seq_len_q);
    prep.seq_len_kv = At<int32_t>(ws, scratch.seq_len_kv);
    const TensorView* ragged_views[kRaggedSlots] = {&t.q,   &t.k,  &t.v,  &t.o,
                                                    &t.d_o, &t.dq, &t.dk, &t.dv};
    for (int slot = 0; slot < kRaggedSlots; ++slot) {
      prep.ragged[slot] = At<int32_t>(ws, scratch.ragged[slot]);
      prep.ragged_stride[slot] = ragged_views[slot]->stride_s;
      prep.ragged_kv_side[slot] =
          slot == kRaggedK || slot == kRaggedV || slot == kRaggedDK || slot == kRaggedDV;
    }
    prep.heads_q = c.heads_q;
    prep.stats = At<float>(ws, scratch.stats);
    prep.lse = ViewOf(t.lse);
    prep.lse_packed = t.lse_packed;
    prep.band = band;
    FUSEDATTN_CUDA_CHECK(LaunchPrepare(prep, cuda_stream));
  }

  int64_t seed = static_cast<int64_t>(t.dropout_seed);
  int64_t offset = static_cast<int64_t>(t.dropout_offset);
  GraphPointers ptrs;
  ptrs.at[kUidQ] = t.q.data;
  ptrs.at[kUidK] = t.k.data;
  ptrs.at[kUidV] = t.v.data;
  ptrs.at[kUidO] = t.o.data;
  ptrs.at[kUidDO] = t.d_o.data;
  ptrs.at[kUidStats] = call.stage_stats ? At<float>(ws, scratch.stats) : t.lse.data;
  ptrs.at[kUidDQ] = t.dq.data;
  ptrs.at[kUidDK] = t.dk.data;
  ptrs.at[kUidDV] = t.dv.data;
  ptrs.at[kUidBias] = t.bias.data;
  ptrs.at[kUidDBias] = t.dbias.data;
  ptrs.at[kUidSeqLenQ] = At<int32_t>(ws, scratch.seq_len_q);
  ptrs.at[kUidSeqLenKv] = At<int32_t>(ws, scratch.seq_len_kv);
  ptrs.at[kUidSeed] = &seed;
  ptrs.at[kUidOffset] = &offset;
  const Uid ragged_uids[kRaggedSlots] = {kUidRaggedQ,  kUidRaggedK,  kUidRaggedV,  kUidRaggedO,
                                         kUidRaggedDO, kUidRaggedDQ, kUidRaggedDK, kUidRaggedDV};
  for (int slot = 0; slot < kRaggedSlots; ++slot)
    ptrs.at[ragged_uids[slot]] = At<int32_t>(ws, scratch.ragged[slot]);
  SetScoreModPointers(t, scratch, ws, &ptrs);
  FUSEDATTN_RETURN_IF_ERROR(Execute(*entry->graph, device.ordinal, stream, ptrs, ws.cudnn));

  if (call.fixup) {
    BackwardFixupParams fix;
    fix.seq = seq;
    fix.band = band;
    fix.heads_q = c.heads_q, fix.heads_kv = c.heads_kv;
    fix.head_dim_qk = c.head_dim_qk, fix.head_dim_v = c.head_dim_v;
    fix.dq = ViewOf(t.dq), fix.dk = ViewOf(t.dk), fix.dv = ViewOf(t.dv);
    FUSEDATTN_CUDA_CHECK(LaunchBackwardFixup(fix, cuda_stream));
  }
  if (call.fixup_dbias) {
    DbiasFixupParams fix;
    fix.seq = seq;
    fix.band = band;
    fix.bias_batch = c.bias_batch, fix.bias_heads = c.bias_heads;
    fix.dbias = t.dbias.data;
    fix.element_bytes = static_cast<int>(DtypeSize(t.dbias.dtype));
    fix.stride_b = t.dbias.stride_b, fix.stride_h = t.dbias.stride_h;
    fix.stride_q = t.dbias.stride_q, fix.stride_kv = t.dbias.stride_kv;
    FUSEDATTN_CUDA_CHECK(LaunchDbiasFixup(fix, cuda_stream));
  }
  if (call.dsink) {
    DsinkParams ds;
    ds.seq = seq;
    ds.band = band;
    ds.heads_q = c.heads_q, ds.head_dim_v = c.head_dim_v;
    ds.bf16 = c.o_dtype == FUSEDATTN_DTYPE_BFLOAT16;
    ds.o = ViewOf(t.o), ds.d_o = ViewOf(t.d_o), ds.lse = ViewOf(t.lse);
    ds.lse_packed = t.lse_packed;
    ds.sink = t.sink_logits, ds.sink_stride = t.sink_stride;
    ds.partials = At<float>(ws, scratch.dsink_partials);
    ds.dsink = t.dsink, ds.dsink_stride = t.dsink_stride;
    FUSEDATTN_CUDA_CHECK(LaunchDsink(ds, cuda_stream));
  }
  return Status::Ok();
}

}  // namespace

void ReloadPlanCacheCapacity() { Cache().set_capacity(CacheCapacityFromEnv()); }

void ClearPlanCache() { Cache().clear(); }

}  // namespace cudnn

Backend* CudnnBackend() {
  static cudnn::CudnnBackendImpl* backend = new cudnn::CudnnBackendImpl();
  return backend;
}

}  // namespace fusedattn
