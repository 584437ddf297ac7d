// The cuDNN backend: SDPA forward and backward through cudnn-frontend graphs (sdpa_graph.cpp),
// planned by plan_spec.cpp, with the small kernels of kernels.cu around them.
//
// check() builds exactly the graphs forward()/backward() run for tensors with the canonical
// strides of the problem's formats (plan_spec.h says how other strides are handled) and returns
// cuDNN's own message when it cannot build them. Built plans live in a bounded LRU cache keyed by
// the whole graph spec plus the device (ordinal, compute capability) and the cuDNN version. When
// the tensors of a call cannot be read by cuDNN at all, forward()/backward() answer NotSupported
// and selection gives the call to the next backend (select.h, RunForward).
//
// Paged K/V (forward only; plan_spec.h SdpaGraphSpec::paged): the pools are cuDNN's containers
// with the caller's strides, and the prepare kernel writes the page table cuDNN reads from the
// caller's, every entry a page of the pool, with the key lengths from seqlens_kv (kernels.h).
// The API layer checks only the table's shape and strides (its entries live on the device), so
// this copy is what keeps cuDNN inside the pool. The pool's number of pages is part of the graph:
// check() plans for CanonicalNumPages, and a call with another pool builds its plan once.
//
// Score modifiers: every entry point plans from EffectiveProblem (plan_spec.h): a band mask_mod
// is a plain problem with that band, every other graph reaches cuDNN's score-modifier callbacks
// through the spec (sdpa_graph.cpp lowers it).
//
// Shapes: a graph bakes in its batch and sequence lengths, so every shape has a plan of its own
// (THD problems without a per-sequence bias build for a power-of-two batch capacity, so batch
// sizes within one power of two share a plan). A dense problem whose batch grew runs in batch
// chunks of plans already built for fewer sequences of the same tensors (plan_spec.h
// BatchChunks; at most FUSEDATTN_CUDNN_BATCH_CHUNKS launches), so a new batch size builds nothing
// unless it is no sum of built ones. THD problems plan for their longest sequence rounded up to a
// bucket (plan_spec.h ThdSeqlenBucket). A dense BSHD problem of a new sequence length runs
// through the ragged (THD) plan of its tensors built for power-of-two extents at least its own
// (plan_spec.h RouteExtents, the sequence-length route); a length that builds its own plans
// builds that ragged plan with them once its structure has had another length (GetPlan), so that
// later lengths up to its extents build nothing. Per-shape plans are stored on disk
// after they are built and read back by later processes instead of building (the plan store,
// README.md "The on-disk caches"). Under automatic selection, a new shape of a structure built
// before whose plans none of that covers is built on a worker thread (BackgroundBuilder,
// check_or_defer) while selection runs it on the next backend. That is the default. Dynamic shapes
// (FUSEDATTN_CUDNN_DYNAMIC_SHAPES=1; experimental, off by default: on cuDNN 9.19 they gave wrong
// results after a shape change; README.md "Dynamic shapes: status") group the shapes of a
// problem into a structure (the problem without its shape, plan_spec.h MakeStructureKey) whose
// plans are dynamic-shape graphs sharing one cuDNN kernel cache, executed with their shapes
// passed at execution, and write the kernel cache to the on-disk cache (common/blob_cache.h) so
// that a new process starts with it.
// The forward keeps cuDNN's unified SDPA node where cudnn-frontend's AUTO would pick it (it takes
// no dynamic shapes; its plans are per shape). The selection diagnostic (explain) says which way
// each plan was built and why.
//
// Handles: cuDNN handles are not thread-safe, so each call leases one from a per-device pool for
// its duration (created on first need, kept for the process). Plans are immutable after building
// and run from any thread with the leased handle, on the caller's stream.
#include "backends/cudnn/cudnn_backend.h"

#include <cudnn.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backends/cudnn/kernels.h"
#include "backends/cudnn/plan_spec.h"
#include "backends/cudnn/sdpa_graph.h"
#include "common/blob_cache.h"
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
// Settings from the environment, read at first use (ReloadSettings re-reads them)
// ------------------------------------------------------------------------------------------------
constexpr int64_t kMinKernelCacheJsonCudnn = 91000;  // a kernel cache to and from JSON
// A dynamic build this slow compiled a kernel: the structure's kernel cache is written out again
// (a build that reuses a cached kernel takes a few milliseconds and writes nothing). The first
// dynamic build of a process does not count: it also loads cuDNN's engine libraries.
constexpr double kSaveAfterMs = 20.0;
std::atomic<bool> g_dynamic_built{false};
constexpr size_t kStructureCacheSize = 128;

std::string VersionText(int64_t v) {
  return Format("%lld.%lld.%lld", (long long)(v / 10000), (long long)(v % 10000 / 100),
                (long long)(v % 100));
}

struct Settings {
  // FUSEDATTN_CUDNN_DYNAMIC_SHAPES (plan_spec.h ParseDynamicShapes): off by default.
  DynamicShapesMode dynamic = DynamicShapesMode::kOff;
  std::string dynamic_off;  // why no structure uses dynamic shapes, or empty
  std::unique_ptr<BlobCache> disk;  // never null; off with its reason when unusable
  std::string disk_off;     // why kernel caches are not written to disk, or empty
  // The on-disk plan store (per-shape plans; never null): <cache dir>/cudnn-plans, off with its
  // reason when the cache directory is off or unusable, or dynamic shapes are on (their kernels
  // go to the kernel cache above).
  std::unique_ptr<BlobCache> plans;
  std::string plans_off;
  // FUSEDATTN_CUDNN_BATCH_CHUNKS (plan_spec.h ParseMaxBatchChunks): 1 when off.
  int max_batch_chunks = kMaxBatchChunks;
  std::string batch_chunks_off;
  // FUSEDATTN_CUDNN_SEQLEN_ROUTE (plan_spec.h ParseSeqlenRoute): on by default.
  SeqlenRouteMode seqlen_route = SeqlenRouteMode::kOn;
  std::string seqlen_route_off;
  // FUSEDATTN_CUDNN_BACKGROUND_BUILD (plan_spec.h ParseBackgroundBuild): on by default.
  bool background = true;
  std::string background_off;
};

// The on-disk store in <cache dir>/<subdirectory>; a disabled one when *off already says why
// not, or when the cache directory is off or unusable (*off then says why).
std::unique_ptr<BlobCache> OpenStore(const char* subdirectory, std::string* off) {
  if (off->empty()) {
    const CacheLocation where = CacheLocationFromEnvironment();
    if (!where.enabled) {
      *off = where.reason;
    } else {
      auto store = std::make_unique<BlobCache>(where.directory + "/" + subdirectory,
                                               where.max_bytes);
      if (store->enabled()) return store;
      *off = store->status().message();
    }
  }
  return std::make_unique<BlobCache>(BlobCache::Disabled(*off));
}

std::shared_ptr<const Settings> MakeSettings() {
  auto s = std::make_shared<Settings>();
  const int64_t version = static_cast<int64_t>(cudnnGetVersion());
  const DynamicShapesSetting dynamic =
      ParseDynamicShapes(std::getenv("FUSEDATTN_CUDNN_DYNAMIC_SHAPES"), version);
  s->dynamic = dynamic.mode;
  s->dynamic_off = dynamic.off_reason;
  s->max_batch_chunks =
      ParseMaxBatchChunks(std::getenv("FUSEDATTN_CUDNN_BATCH_CHUNKS"), &s->batch_chunks_off);
  s->seqlen_route =
      ParseSeqlenRoute(std::getenv("FUSEDATTN_CUDNN_SEQLEN_ROUTE"), &s->seqlen_route_off);
  s->background =
      ParseBackgroundBuild(std::getenv("FUSEDATTN_CUDNN_BACKGROUND_BUILD"), &s->background_off);
  if (s->dynamic == DynamicShapesMode::kOff) {
    s->disk_off = "the on-disk kernel cache applies only with dynamic shapes "
                  "(FUSEDATTN_CUDNN_DYNAMIC_SHAPES=1, experimental), which are off";
  } else if (version < kMinKernelCacheJsonCudnn) {
    s->disk_off = Format("cuDNN %s cannot write its kernel cache out (%s can)",
                         VersionText(version).c_str(),
                         VersionText(kMinKernelCacheJsonCudnn).c_str());
  }
  s->disk = OpenStore("cudnn", &s->disk_off);
  if (s->dynamic != DynamicShapesMode::kOff)
    s->plans_off = "dynamic shapes are on: their kernels go to the kernel cache instead";
  s->plans = OpenStore("cudnn-plans", &s->plans_off);
  return s;
}

std::mutex g_settings_mutex;
std::shared_ptr<const Settings> g_settings;  // guarded by g_settings_mutex

// Read on plan builds and diagnostics only, never on a warm call.
std::shared_ptr<const Settings> CurrentSettings() {
  std::lock_guard<std::mutex> lock(g_settings_mutex);
  if (!g_settings) g_settings = MakeSettings();
  return g_settings;
}

// What the on-disk key says about the GPU a kernel was compiled for, read once per device.
const MachineIdentity& Machine(int ordinal) {
  static std::once_flag once[kMaxDevices];
  static MachineIdentity identity[kMaxDevices];
  std::call_once(once[ordinal], [ordinal] {
    MachineIdentity& m = identity[ordinal];
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, ordinal) == cudaSuccess) {
      m.gpu_name = prop.name;
      for (unsigned char byte : prop.uuid.bytes) m.gpu_uuid += Format("%02x", byte);
      m.sm_count = prop.multiProcessorCount;
      m.compute_capability = prop.major * 10 + prop.minor;
    } else {
      cudaGetLastError();
      m.gpu_uuid = "unknown";  // still a key; a later process that can read the GPU differs
    }
    cudaDriverGetVersion(&m.driver_version);
    m.cudnn_version = static_cast<int64_t>(cudnnGetVersion());
    m.frontend_version = FrontendVersion();
    m.fusedattn_version = fusedattn_version_string();
  });
  return identity[ordinal];
}

// ------------------------------------------------------------------------------------------------
// Structures and plans
// ------------------------------------------------------------------------------------------------
// A structure is a problem without its shape (MakeStructureKey). Its plans share one cuDNN kernel
// cache, so that a new batch size or sequence length builds a plan from kernels already compiled;
// the kernel cache is read from and written to the on-disk cache, so that a new process compiles
// nothing it compiled before. Builds of one structure run one at a time under its mutex (cuDNN's
// kernel cache and its file are shared by them); plans of other structures build in parallel.
struct Structure {
  std::mutex mutex;
  std::string dynamic_off;  // why its plans are built per shape, or empty
  bool unified_refused = false;
  std::shared_ptr<KernelCache> kernel_cache;  // made or read at the first dynamic build
  bool kernel_cache_from_disk = false;
  bool save = false;  // the kernel cache has kernels its file lacks (or the file was bad)
  std::string disk_key;
  // The sequence lengths of the structure's first plan, seqlen_q << 32 | seqlen_kv (-1: none
  // yet): a plan asked for other lengths means that this structure's lengths vary, and the
  // sequence-length route builds a ragged plan with it (GetPlan). Written once under the mutex,
  // read without it.
  std::atomic<int64_t> first_seqlens{-1};
  // Whether a plan of it is in the plan cache (built, read from the store, or refused): then a
  // new shape of it may be built in the background (check_or_defer); set after the first one.
  std::atomic<bool> has_plan{false};
};

using StructureCache = LruCache<PlanKey, Structure, PlanKeyHash>;
StructureCache& Structures() {
  static StructureCache* cache = new StructureCache(kStructureCacheSize);  // outlives static dtors
  return *cache;
}

struct PlanEntry {
  Status status;  // the build's result; failures are cached too, with cuDNN's message
  std::shared_ptr<const SdpaGraph> graph;
  int64_t workspace = 0;
  BuildRoute route = BuildRoute::kStatic;
  std::string per_shape_reason;  // route kStatic: why not dynamic shapes
  bool kernels_from_disk = false;
  // The entry of a spec whose calls run in batch chunks (plan_spec.h BatchChunks): chunk i runs
  // chunk_plans[i], built for chunks.batch[i] sequences; graph is null and workspace the
  // largest of theirs.
  BatchChunks chunks;
  std::vector<std::shared_ptr<const PlanEntry>> chunk_plans;
  // The entry of a dense spec whose calls run through a ragged plan (plan_spec.h RouteExtents,
  // the sequence-length route): routed is the plan of RoutedProblem(problem, route_extents) for
  // the call's own views; graph is null, workspace routed's.
  RouteExtents route_extents;
  std::shared_ptr<const PlanEntry> routed;
};

using PlanCache = LruCache<PlanKey, PlanEntry, PlanKeyHash>;

PlanCache& Cache() {
  static PlanCache* cache = new PlanCache(CacheCapacityFromEnv());  // plans outlive static dtors
  return *cache;
}

// Counters for GetPlanBuildStats.
struct Counters {
  std::atomic<uint64_t> builds{0}, unified{0}, dynamic{0}, per_shape{0}, failed{0};
  std::atomic<uint64_t> batch_chunked{0};
  std::atomic<uint64_t> seqlen_routed{0}, route_plans{0};
  std::atomic<uint64_t> background_builds{0};
  std::atomic<uint64_t> plans_read{0}, plan_read_failures{0}, plans_written{0};
  std::atomic<uint64_t> plan_write_failures{0}, read_us{0};
  std::atomic<uint64_t> loaded{0}, load_failures{0}, saved{0}, save_failures{0};
  std::atomic<uint64_t> build_us{0};
};
Counters& Count() {
  static Counters* counters = new Counters();
  return *counters;
}
std::mutex g_disk_error_mutex;
std::string g_disk_error;  // the last failed write or read, for the diagnostic

// Why the last stored plan could not be written or read, for the diagnostic.
std::string g_plan_store_error;  // guarded by g_disk_error_mutex

void NotePlanStoreError(const std::string& error) {
  std::lock_guard<std::mutex> lock(g_disk_error_mutex);
  g_plan_store_error = error;
}

void NoteDiskError(const std::string& error) {
  std::lock_guard<std::mutex> lock(g_disk_error_mutex);
  g_disk_error = error;
}

// The structure's kernel cache: its own, else the one on disk, else a new one. Under its mutex.
std::shared_ptr<KernelCache> KernelCacheOf(Structure& st, const SdpaGraphSpec& spec,
                                           const DeviceInfo& device, const Settings& settings) {
  if (st.kernel_cache) return st.kernel_cache;
  if (settings.disk->enabled()) {
    st.disk_key = KernelCacheDiskKey(spec, Machine(device.ordinal));
    std::vector<uint8_t> bytes;
    BlobCache::Lookup lookup = settings.disk->get(st.disk_key, &bytes);
    if (lookup == BlobCache::Lookup::kHit) {
      Status s = KernelCacheFromJson(std::string(bytes.begin(), bytes.end()), &st.kernel_cache);
      if (s.ok()) {
        st.kernel_cache_from_disk = true;
        ++Count().loaded;
        return st.kernel_cache;
      }
      NoteDiskError(Format("cuDNN refused the kernel cache in %s (rewritten): %s",
                           settings.disk->path_of(st.disk_key).c_str(), s.message().c_str()));
    }
    if (lookup != BlobCache::Lookup::kMiss) ++Count().load_failures;
  }
  st.kernel_cache = NewKernelCache();
  st.kernel_cache_from_disk = false;
  st.save = true;  // whatever the first build compiles is new to the disk
  return st.kernel_cache;
}

void SaveKernelCache(Structure& st, const Settings& settings) {
  if (!settings.disk->enabled() || st.disk_key.empty() || !st.kernel_cache) return;
  std::string json;
  Status s = KernelCacheToJson(*st.kernel_cache, &json);
  if (s.ok()) s = settings.disk->put(st.disk_key, json.data(), json.size());
  if (!s.ok()) {
    ++Count().save_failures;
    NoteDiskError(Format("the kernel cache was not written: %s", s.message().c_str()));
    return;
  }
  ++Count().saved;
  st.save = false;
}

const char* DirectionName(Direction d) {
  return d == Direction::kForward ? "forward" : "backward";
}

// The sequence lengths of a spec as one word (Structure::first_seqlens).
int64_t SeqlensWord(const SdpaGraphSpec& spec) { return spec.seqlen_q << 32 | spec.seqlen_kv; }

// Builds the plan of spec (key) under its structure's lock; cuDNN's refusals are cached like
// plans (check() of that graph fails fast next time), a missing handle is not.
Status BuildPlan(const SdpaGraphSpec& spec, const DeviceInfo& device, const PlanKey& key,
                 std::shared_ptr<PlanEntry>* entry) {
  const std::shared_ptr<const Settings> settings = CurrentSettings();
  std::shared_ptr<Structure> st =
      Structures().get_or_make(MakeStructureKey(spec, device), [&] {
        auto made = std::make_shared<Structure>();
        made->dynamic_off = settings->dynamic_off;
        if (made->dynamic_off.empty()) {
          Status refusal = DynamicShapeRefusal(spec);
          if (!refusal.ok()) made->dynamic_off = refusal.message();
        }
        return made;
      });
  std::lock_guard<std::mutex> lock(st->mutex);
  if ((*entry = Cache().peek(key))) return Status::Ok();  // another thread built it meanwhile
  if (st->first_seqlens.load() < 0) st->first_seqlens = SeqlensWord(spec);

  HandleLease handle;
  FUSEDATTN_RETURN_IF_ERROR(handle.acquire(device.ordinal));
  Counters& count = Count();
  // A per-shape plan an earlier process built: read, not compiled.
  std::string store_key;
  if (settings->plans->enabled()) {
    store_key = PlanDiskKey(spec, Machine(device.ordinal));
    const auto start = std::chrono::steady_clock::now();
    std::vector<uint8_t> bytes;
    const BlobCache::Lookup lookup = settings->plans->get(store_key, &bytes);
    if (lookup == BlobCache::Lookup::kHit) {
      auto loaded = std::make_shared<PlanEntry>();
      Status s = LoadSdpaGraph(bytes, handle.get(), &loaded->graph);
      if (s.ok()) {
        loaded->workspace = GraphWorkspaceBytes(*loaded->graph);
        loaded->route = BuildRoute::kStored;
        ++count.plans_read;
        count.read_us += static_cast<uint64_t>(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count());
        *entry = Cache().insert(key, std::move(loaded));
        st->has_plan = true;
        return Status::Ok();
      }
      NotePlanStoreError(Format("a stored plan in %s was not used (built and rewritten): %s",
                                settings->plans->path_of(store_key).c_str(),
                                s.message().c_str()));
    }
    if (lookup != BlobCache::Lookup::kMiss) ++count.plan_read_failures;
  }
  BuildOptions options;
  options.skip_unified = st->unified_refused;
  options.execute_time_shapes = settings->dynamic == DynamicShapesMode::kOn;
  if (st->dynamic_off.empty())
    options.kernel_cache = [&] { return KernelCacheOf(*st, spec, device, *settings); };
  auto made = std::make_shared<PlanEntry>();
  BuildReport report;
  const auto start = std::chrono::steady_clock::now();
  made->status = BuildSdpaGraph(spec, handle.get(), options, &made->graph, &report);
  if (!report.dynamic_refusal.empty() && st->kernel_cache_from_disk) {
    // The kernel cache read from disk may be what cuDNN refused: once more with an empty one,
    // which the build then writes over the file.
    st->kernel_cache = NewKernelCache();
    st->kernel_cache_from_disk = false;
    st->save = true;
    ++Count().load_failures;
    options.skip_unified = true;  // refused already (else the dynamic attempt was not reached)
    options.kernel_cache = [&] { return st->kernel_cache; };
    made->status = BuildSdpaGraph(spec, handle.get(), options, &made->graph, &report);
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (report.unified_refused) st->unified_refused = true;
  if (!report.dynamic_refusal.empty()) {
    st->dynamic_off = "cuDNN refused the dynamic-shape graph: " + report.dynamic_refusal;
    st->kernel_cache.reset();
  }
  ++count.builds;
  count.build_us += static_cast<uint64_t>(ms * 1000.0);
  if (made->status.ok()) {
    made->workspace = GraphWorkspaceBytes(*made->graph);
    made->route = report.route;
    made->kernels_from_disk = report.route == BuildRoute::kDynamic && st->kernel_cache_from_disk;
    if (report.route == BuildRoute::kStatic) made->per_shape_reason = st->dynamic_off;
    ++(report.route == BuildRoute::kUnified   ? count.unified
       : report.route == BuildRoute::kDynamic ? count.dynamic
                                              : count.per_shape);
    if (report.route == BuildRoute::kDynamic) {
      const bool compiled = ms >= kSaveAfterMs && g_dynamic_built.exchange(true);
      g_dynamic_built = true;
      if (st->save || compiled) SaveKernelCache(*st, *settings);
    }
    if (!store_key.empty()) {
      std::vector<uint8_t> bytes;
      Status s = StoreSdpaGraph(*made->graph, &bytes);
      if (s.ok()) s = settings->plans->put(store_key, bytes.data(), bytes.size());
      if (s.ok()) {
        ++count.plans_written;
      } else {
        ++count.plan_write_failures;
        NotePlanStoreError(Format("the %s plan was not stored: %s",
                                  DirectionName(spec.direction), s.message().c_str()));
      }
    }
  } else {
    ++count.failed;
  }
  *entry = Cache().insert(key, std::move(made));
  st->has_plan = true;
  return Status::Ok();
}

// Plans of the same tensors for fewer sequences that calls of spec can run in batch chunks
// (plan_spec.h BatchChunks), chosen among the plans built so far. Found, the choice is cached
// under spec's key, so a warm call finds it at once. Null when there is none.
std::shared_ptr<PlanEntry> FindChunkPlans(const SdpaGraphSpec& spec, const DeviceInfo& device,
                                          const PlanKey& key) {
  constexpr int64_t kMaxScan = 4096;  // batch sizes looked up on a miss
  const int max_chunks = CurrentSettings()->max_batch_chunks;
  if (spec.batch < 2 || spec.batch > kMaxScan || max_chunks < 2) return nullptr;
  if (!BatchChunkRefusal(spec).ok()) return nullptr;
  std::vector<int64_t> built;
  std::vector<std::shared_ptr<PlanEntry>> plan_of(static_cast<size_t>(spec.batch));
  for (int64_t batch = 1; batch < spec.batch; ++batch) {
    std::shared_ptr<PlanEntry> found = Cache().peek(MakePlanKey(WithBatch(spec, batch), device));
    if (!found || !found->status.ok() || found->chunks.count != 0) continue;  // built ones only
    built.push_back(batch);
    plan_of[static_cast<size_t>(batch)] = std::move(found);
  }
  const BatchChunks chunks = ChooseBatchChunks(spec.batch, built, max_chunks);
  if (chunks.count == 0 || !BatchChunkAlignment(spec, chunks).ok()) return nullptr;
  auto alias = std::make_shared<PlanEntry>();
  alias->chunks = chunks;
  for (int i = 0; i < chunks.count; ++i) {
    const std::shared_ptr<PlanEntry>& plan = plan_of[static_cast<size_t>(chunks.batch[i])];
    alias->chunk_plans.push_back(plan);
    alias->workspace = std::max(alias->workspace, plan->workspace);
  }
  alias->route = alias->chunk_plans.front()->route;
  ++Count().batch_chunked;
  return Cache().insert(key, std::move(alias));
}

// What the sequence-length route needs of a call besides its spec: the dense problem (its
// effective problem) and the spec of the ragged plan that runs it for the THD form of it with
// some extents (RoutedProblem), made from the call's own views.
struct SeqlenRoute {
  const Problem* problem = nullptr;
  std::function<SdpaGraphSpec(const Problem& routed)> spec_of;
};

// The entry of a dense spec (key) whose calls run through the ragged plan `plan` of extents e.
std::shared_ptr<PlanEntry> InsertRouted(const PlanKey& key, const RouteExtents& e,
                                        std::shared_ptr<const PlanEntry> plan) {
  auto alias = std::make_shared<PlanEntry>();
  alias->route_extents = e;
  alias->workspace = plan->workspace;
  alias->route = plan->route;
  alias->routed = std::move(plan);
  ++Count().seqlen_routed;
  return Cache().insert(key, std::move(alias));
}

// A built ragged plan of the route's candidates (plan_spec.h RouteCandidates, cheapest first)
// for the call of spec (key): found, the choice is cached under key, so a warm call finds it at
// once. Null when none is built.
std::shared_ptr<PlanEntry> FindRoutedPlan(const DeviceInfo& device, const PlanKey& key,
                                          const SeqlenRoute& route) {
  for (const RouteExtents& e : RouteCandidates(*route.problem)) {
    std::shared_ptr<PlanEntry> plan =
        Cache().peek(MakePlanKey(route.spec_of(RoutedProblem(*route.problem, e)), device));
    if (!plan || !plan->status.ok() || plan->routed || plan->chunks.count != 0) continue;
    return InsertRouted(key, e, std::move(plan));
  }
  return nullptr;
}

// The ragged plan of the problem's own extents (plan_spec.h RouteExtentsOf): cached, else built
// (or read from the plan store). Its status says whether cuDNN built it.
Status MakeRaggedPlan(const DeviceInfo& device, const SeqlenRoute& route,
                      std::shared_ptr<PlanEntry>* plan) {
  const SdpaGraphSpec spec =
      route.spec_of(RoutedProblem(*route.problem, RouteExtentsOf(*route.problem)));
  const PlanKey key = MakePlanKey(spec, device);
  if ((*plan = Cache().find(key))) return Status::Ok();
  ++Count().route_plans;
  return BuildPlan(spec, device, key, plan);
}

// Whether plans of spec's structure were asked for other sequence lengths than spec's: then its
// lengths vary, and a length that builds its own plan builds the ragged plan that later lengths
// run through too.
bool SeqlensVary(const SdpaGraphSpec& spec, const DeviceInfo& device) {
  std::shared_ptr<Structure> st = Structures().peek(MakeStructureKey(spec, device));
  if (!st) return false;
  const int64_t first = st->first_seqlens.load();
  return first >= 0 && first != SeqlensWord(spec);
}

// The plan of spec on the current device: from the cache (a warm call), else a smaller plan to
// run in batch chunks, else (route given: a dense problem) a built ragged plan of larger extents
// to run through, else built. A call that builds gets its own plan (the dense kernels); when its
// structure's lengths vary (FUSEDATTN_CUDNN_SEQLEN_ROUTE=eager: always), the ragged plan of its
// extents is built with it, so that later lengths up to them build nothing. With needs_build
// given, nothing is built: *needs_build is set and the answer is NotSupported instead.
Status GetPlan(const SdpaGraphSpec& spec, const DeviceInfo& device, const SeqlenRoute* route,
               std::shared_ptr<PlanEntry>* entry, bool* needs_build = nullptr) {
  PlanKey key = MakePlanKey(spec, device);
  if (key.used > PlanKey::kWords)
    return InternalError("cuDNN plan key needs %zu words, more than %zu", key.used,
                         PlanKey::kWords);
  if ((*entry = Cache().find(key))) return Status::Ok();
  if ((*entry = FindChunkPlans(spec, device, key))) return Status::Ok();
  const SeqlenRouteMode mode = CurrentSettings()->seqlen_route;
  const bool routable = route != nullptr && mode != SeqlenRouteMode::kOff &&
                        SeqlenRouteRefusal(*route->problem, spec).ok();
  if (routable && (*entry = FindRoutedPlan(device, key, *route))) return Status::Ok();
  if (needs_build) {  // asked not to build (check_or_defer)
    *needs_build = true;
    return NotSupported("the %s plan is not built", DirectionName(spec.direction));
  }
  FUSEDATTN_RETURN_IF_ERROR(BuildPlan(spec, device, key, entry));
  if (routable && (*entry)->status.ok() &&
      (mode == SeqlenRouteMode::kEager || SeqlensVary(spec, device))) {
    std::shared_ptr<PlanEntry> plan;  // for later lengths; cuDNN's refusal is cached with it
    FUSEDATTN_RETURN_IF_ERROR(MakeRaggedPlan(device, *route, &plan));
  }
  return Status::Ok();
}

// The problem a call's graph runs: p itself, or for an entry that runs p through a ragged plan
// (the sequence-length route) the THD form of p with that plan's extents, made in *storage.
const Problem& GraphProblem(const Problem& p, const PlanEntry& entry, Problem* storage) {
  if (!entry.routed) return p;
  *storage = RoutedProblem(p, entry.route_extents);
  return *storage;
}

// The stride the prepare kernel multiplies a sequence's start by for a tensor's ragged offsets:
// THD: its token stride (starts in tokens); a dense tensor through a ragged plan: its step from
// one sequence to the next (starts in sequences; plan_spec.h RouteSequenceStep).
int64_t RaggedStride(const Problem& p, const TensorView& view, bool kv_side) {
  if (p.thd) return view.stride_s;
  return RouteSequenceStep(view, p.config.batch,
                           kv_side ? p.config.max_seqlen_kv : p.config.max_seqlen_q);
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

// The sequences of the caller's problem (its batch, lengths and tensors) in the graph of `graph`
// (its sequence extents): the effective problem (a THD bucket), or the THD form of a dense
// problem run through a ragged plan (RoutedProblem).
template <typename Tensors>
Sequences SequencesOf(const Problem& p, const Problem& graph, const Tensors& t,
                      bool const_lengths) {
  const auto& c = p.config;
  Sequences s;
  s.batch = c.batch;
  s.max_seqlen_q = graph.config.max_seqlen_q;
  s.max_seqlen_kv = graph.config.max_seqlen_kv;
  s.rows_q = c.max_seqlen_q;
  s.rows_kv = c.max_seqlen_kv;
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
  // Only a plan for other strides than the canonical ones (which *_workspace_size sized) can
  // need more: a run-time refusal, so that selection tries the next backend.
  if (out->needed > bytes)
    return NotSupported("the cuDNN plan for these tensors' strides needs %zu bytes of workspace "
                        "but %zu were given",
                        out->needed, bytes);
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

void Advance(GraphPointers* ptrs, Uid uid, int64_t bytes) {
  if (ptrs->at[uid] != nullptr && bytes != 0)
    ptrs->at[uid] = static_cast<char*>(ptrs->at[uid]) + bytes;
}

// Runs the plan: once, or once per batch chunk with that chunk's plan over each tensor's slice
// of its sequences (the per-sequence lengths: the chunk's own array, written so by the prepare
// kernel).
Status Execute(const PlanEntry& entry, const SdpaGraphSpec& spec, int device, void* stream,
               const GraphPointers& ptrs, void* workspace) {
  HandleLease handle;
  FUSEDATTN_RETURN_IF_ERROR(handle.acquire(device));
  FUSEDATTN_RETURN_IF_ERROR(handle.set_stream(static_cast<cudaStream_t>(stream)));
  const BatchChunks& chunks = entry.chunks;
  if (chunks.count == 0) return ExecuteSdpaGraph(*entry.graph, handle.get(), ptrs, workspace);
  const SequenceBytes per = SequenceBytesOf(spec);
  for (int i = 0; i < chunks.count; ++i) {
    const int64_t first = chunks.first[i];
    const int64_t lengths = chunks.seq_len_offset(i) * int64_t{sizeof(int32_t)};
    GraphPointers at = ptrs;
    const struct {
      Uid uid;
      int64_t bytes;
    } moves[] = {{kUidQ, per.q * first},          {kUidK, per.k * first},
                 {kUidV, per.v * first},          {kUidO, per.o * first},
                 {kUidDO, per.d_o * first},       {kUidDQ, per.dq * first},
                 {kUidDK, per.dk * first},        {kUidDV, per.dv * first},
                 {kUidStats, per.stats * first},  {kUidBias, per.bias * first},
                 {kUidDBias, per.dbias * first},  {kUidSeqLenQ, lengths},
                 {kUidSeqLenKv, lengths}};
    for (const auto& m : moves) Advance(&at, m.uid, m.bytes);
    FUSEDATTN_RETURN_IF_ERROR(
        ExecuteSdpaGraph(*entry.chunk_plans[i]->graph, handle.get(), at, workspace));
  }
  return Status::Ok();
}

// ------------------------------------------------------------------------------------------------
// Background builds (README.md "Background builds"; plan_spec.h ParseBackgroundBuild)
// ------------------------------------------------------------------------------------------------
// One worker thread for the process builds the plans check_or_defer deferred, one problem at a
// time in the order asked (at most kMaxQueued waiting: beyond that the call builds, so that a
// stream of new shapes cannot queue stale builds); a problem asked again while its build waits
// or runs shares it. A build that leaves the plans missing (a handle or device that failed; a
// refusal by cuDNN is cached with the plans and does not count) is remembered, and that problem
// is not deferred again. The worker runs in relaxed stream-capture mode, so that its cuDNN calls
// are not refused while another thread captures a CUDA graph; at exit the queue is dropped and
// the build under way waited for, so that CUDA is not torn down under it. A forked child starts
// without the worker: its first deferral starts its own.
class BackgroundBuilder {
 public:
  using Ready = std::shared_ptr<const std::atomic<bool>>;
  static constexpr size_t kMaxQueued = 8;

  // The readiness flag of problem's build on device: the one under way, or a new one; null when
  // the problem is not to be deferred (queue full, an earlier build of it failed, the process is
  // exiting, no thread could be started). build returns whether the plans exist afterwards.
  Ready start(const Problem& problem, int device, std::function<bool()> build) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pid_ != getpid()) {  // a forked child: the parent's worker and jobs are not here
      pid_ = getpid();
      started_ = busy_ = false;
      queue_.clear();
      pending_.clear();
    }
    if (stopping_) return nullptr;
    Key key{KeyOf(problem), device};
    auto it = pending_.find(key);
    if (it != pending_.end()) return it->second;
    if (failed_.count(key) != 0 || queue_.size() >= kMaxQueued) return nullptr;
    if (!started_) {
      try {
        std::thread([this] { Work(); }).detach();
      } catch (...) {
        return nullptr;
      }
      started_ = true;
      if (!atexit_registered_) {
        atexit_registered_ = true;
        std::atexit([] { Builder().stop(); });
      }
    }
    auto ready = std::make_shared<std::atomic<bool>>(false);
    pending_.emplace(key, ready);
    queue_.push_back(Job{std::move(key), std::move(build), ready});
    wake_.notify_one();
    return ready;
  }

  // Until no build waits or runs (tests, benchmarks, clearing the plan cache).
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (pid_ != getpid()) return;  // a forked child: nothing of the parent's runs here
    idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }

  static BackgroundBuilder& Builder() {
    static BackgroundBuilder* builder = new BackgroundBuilder();  // the worker outlives statics
    return *builder;
  }

 private:
  struct Key {
    ProblemKey problem;
    int device;
    bool operator==(const Key& o) const { return device == o.device && problem == o.problem; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return ProblemKeyHash()(k.problem) * 31 + static_cast<size_t>(k.device);
    }
  };
  struct Job {
    Key key;
    std::function<bool()> build;
    std::shared_ptr<std::atomic<bool>> ready;
  };

  void stop() {
    std::unique_lock<std::mutex> lock(mutex_);
    stopping_ = true;
    if (pid_ != getpid()) return;
    queue_.clear();
    idle_.wait(lock, [this] { return !busy_; });
    wake_.notify_all();
  }

  void Work() {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return !queue_.empty() || stopping_; });
        if (stopping_) return;
        job = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      bool built = false;
      if (cudaSetDevice(job.key.device) == cudaSuccess) {
        try {
          built = job.build();  // its result (plans, or cuDNN's refusal) is in the plan cache
        } catch (...) {
        }
        ++Count().background_builds;
      } else {
        cudaGetLastError();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!built) failed_.insert(job.key);
        pending_.erase(job.key);
        job.ready->store(true, std::memory_order_release);  // before idle: wait_idle sees it set
        busy_ = false;
      }
      idle_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<Job> queue_;
  std::unordered_map<Key, std::shared_ptr<std::atomic<bool>>, KeyHash> pending_;
  std::unordered_set<Key, KeyHash> failed_;
  pid_t pid_ = getpid();
  bool started_ = false, busy_ = false, stopping_ = false, atexit_registered_ = false;
};

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

  Status check(const Problem& problem) override { return CheckPlans(problem, nullptr); }

  // A problem whose plans are all built (or cached as refused) answers at once. One that would
  // build waits for nothing when background builds are on and its structure was built before:
  // its plans are built on the worker (BackgroundBuilder) while selection runs it elsewhere.
  Status check_or_defer(const Problem& problem,
                        std::shared_ptr<const std::atomic<bool>>* ready) override {
    const std::shared_ptr<const Settings> settings = CurrentSettings();
    if (!settings->background) return check(problem);
    Problem storage;
    const Problem& p = EffectiveProblem(problem, &storage);
    if (!BackgroundBuildRefusal(p).ok()) return check(problem);
    bool needs_build = false;
    Status s = CheckPlans(problem, &needs_build);
    if (!needs_build) return s;
    DeviceInfo device;
    FUSEDATTN_RETURN_IF_ERROR(CurrentDevice(&device));
    const std::shared_ptr<Structure> st =
        Structures().peek(MakeStructureKey(ForwardSpec(p, CanonicalFwdTensors(p)), device));
    if (!st || !st->has_plan.load()) return check(problem);  // a new structure
    BackgroundBuilder::Ready flag =
        BackgroundBuilder::Builder().start(problem, device.ordinal, [this, problem] {
          (void)check(problem);
          bool missing = false;  // a refusal cuDNN gave is cached: only a missing plan fails
          (void)CheckPlans(problem, &missing);
          return !missing;
        });
    if (!flag) return check(problem);  // not deferred (BackgroundBuilder::start)
    *ready = std::move(flag);
    return NotSupported(
        "the plans of this new shape of a problem it built before are being built in the "
        "background (FUSEDATTN_CUDNN_BACKGROUND_BUILD=0 builds them in the call instead); "
        "selection comes back to cuDNN once they are built");
  }

  // check(), or with needs_build given: the same without building (GetPlan's needs_build).
  Status CheckPlans(const Problem& problem, bool* needs_build) {
    Problem storage;
    const Problem& p = EffectiveProblem(problem, &storage);
    FUSEDATTN_RETURN_IF_ERROR(PreCheck(p));
    DeviceInfo device;
    FUSEDATTN_RETURN_IF_ERROR(CurrentDevice(&device));
    FUSEDATTN_RETURN_IF_ERROR(PagedVersionRefusal(p, device.cudnn_version));
    const FwdTensors fwd = CanonicalFwdTensors(p);
    const SeqlenRoute fwd_route{&p, [&fwd](const Problem& r) { return ForwardSpec(r, fwd); }};
    std::shared_ptr<PlanEntry> entry;
    FUSEDATTN_RETURN_IF_ERROR(
        GetPlan(ForwardSpec(p, fwd), device, &fwd_route, &entry, needs_build));
    FUSEDATTN_RETURN_IF_ERROR(PlanStatus(*entry, Direction::kForward));
    if (p.config.is_training) {
      const BwdTensors bwd = CanonicalBwdTensors(p);
      const SeqlenRoute bwd_route{&p, [&bwd](const Problem& r) { return BackwardSpec(r, bwd); }};
      FUSEDATTN_RETURN_IF_ERROR(
          GetPlan(BackwardSpec(p, bwd), device, &bwd_route, &entry, needs_build));
      FUSEDATTN_RETURN_IF_ERROR(PlanStatus(*entry, Direction::kBackward));
    }
    return Status::Ok();
  }

  Status fwd_workspace_size(const Problem& problem, size_t* bytes) override {
    Problem storage;
    const Problem& p = EffectiveProblem(problem, &storage);
    DeviceInfo device;
    FUSEDATTN_RETURN_IF_ERROR(CurrentDevice(&device));
    const FwdTensors canonical = CanonicalFwdTensors(p);
    const SeqlenRoute route{&p,
                            [&canonical](const Problem& r) { return ForwardSpec(r, canonical); }};
    std::shared_ptr<PlanEntry> entry;
    FUSEDATTN_RETURN_IF_ERROR(GetPlan(ForwardSpec(p, canonical), device, &route, &entry));
    FUSEDATTN_RETURN_IF_ERROR(PlanStatus(*entry, Direction::kForward));
    // The scratch for the largest call plan (of the problem the graph runs: p, or its THD form
    // for a ragged plan): a caller's LSE that is not packed, or sink logits that are strided or
    // misaligned, need staging.
    Problem routed_storage;
    const Problem& run = GraphProblem(p, *entry, &routed_storage);
    CallPlan call = ForwardCallPlan(run, canonical);
    if (p.needs_lse()) call.stage_stats = true;
    if (p.config.softmax_type != FUSEDATTN_SOFTMAX_VANILLA) call.stage_sink = true;
    *bytes = WorkspaceBytes(ForwardScratch(run, call).bytes, entry->workspace);
    return Status::Ok();
  }

  Status bwd_workspace_size(const Problem& problem, size_t* bytes) override {
    Problem storage;
    const Problem& p = EffectiveProblem(problem, &storage);
    DeviceInfo device;
    FUSEDATTN_RETURN_IF_ERROR(CurrentDevice(&device));
    const BwdTensors canonical = CanonicalBwdTensors(p);
    const SeqlenRoute route{&p,
                            [&canonical](const Problem& r) { return BackwardSpec(r, canonical); }};
    std::shared_ptr<PlanEntry> entry;
    FUSEDATTN_RETURN_IF_ERROR(GetPlan(BackwardSpec(p, canonical), device, &route, &entry));
    FUSEDATTN_RETURN_IF_ERROR(PlanStatus(*entry, Direction::kBackward));
    // The scratch for the largest call plan (as in fwd_workspace_size): a caller's LSE that is
    // not packed needs staging.
    Problem routed_storage;
    const Problem& run = GraphProblem(p, *entry, &routed_storage);
    CallPlan call = BackwardCallPlan(run, canonical);
    call.stage_stats = true;
    *bytes = WorkspaceBytes(BackwardScratch(run, call).bytes, entry->workspace);
    return Status::Ok();
  }

  Status forward(const Problem& p, const FwdTensors& t, void* workspace, size_t workspace_bytes,
                 void* stream) override;
  Status backward(const Problem& p, const BwdTensors& t, void* workspace, size_t workspace_bytes,
                  void* stream) override;

  fusedattn_cache_stats cache_stats() const override { return Cache().stats(); }

  // How check()'s plans were built, and where kernel caches go.
  std::string note(const Problem& problem) override {
    Problem storage;
    const Problem& p = EffectiveProblem(problem, &storage);
    DeviceInfo device;
    if (!CurrentDevice(&device).ok()) return {};
    std::string text;
    bool dynamic = false;
    std::string last_reason;  // the backward's reason is given once when it is the forward's
    auto describe = [&](const char* direction, const SdpaGraphSpec& spec) {
      std::shared_ptr<PlanEntry> e = Cache().peek(MakePlanKey(spec, device));
      if (!e || !e->status.ok()) return;
      if (e->routed) {
        const RouteExtents& x = e->route_extents;
        text += Format("%s%s: through the ragged (THD) plan for %lld sequences of up to %lld x "
                       "%lld rows (sequence-length route: no plan of its own; that plan: %s)",
                       text.empty() ? "plans: " : "; ", direction, (long long)x.batch,
                       (long long)x.seqlen_q, (long long)x.seqlen_kv, RouteName(e->route));
        return;
      }
      text += Format("%s%s: %s", text.empty() ? "plans: " : "; ", direction, RouteName(e->route));
      if (e->kernels_from_disk) text += " (kernels read from disk)";
      if (e->chunks.count != 0) {
        text += " in batch chunks of";
        for (int i = 0; i < e->chunks.count; ++i)
          text += Format("%s%lld", i == 0 ? " " : " + ", (long long)e->chunks.batch[i]);
        text += Format(" sequences (%d launches)", e->chunks.count);
      }
      if (e->route == BuildRoute::kStatic && !e->per_shape_reason.empty())
        text += e->per_shape_reason == last_reason ? " (as the forward)"
                                                   : " (" + e->per_shape_reason + ")";
      if (e->route == BuildRoute::kStatic) last_reason = e->per_shape_reason;
      dynamic = dynamic || e->route == BuildRoute::kDynamic;
    };
    describe("forward", ForwardSpec(p, CanonicalFwdTensors(p)));
    if (p.config.is_training) describe("backward", BackwardSpec(p, CanonicalBwdTensors(p)));
    if (dynamic) {
      std::shared_ptr<const Settings> settings = CurrentSettings();
      text += Format("; %s (FUSEDATTN_CUDNN_DYNAMIC_SHAPES=%s, shapes %s at execution)",
                     kDynamicShapesWarning,
                     settings->dynamic == DynamicShapesMode::kOn ? "1" : "no-override",
                     settings->dynamic == DynamicShapesMode::kOn ? "passed" : "not passed");
      if (settings->disk->enabled())
        text += "; kernel caches on disk in " + settings->disk->directory();
      else
        text += "; kernel caches in memory only (" + settings->disk_off + ")";
      std::lock_guard<std::mutex> lock(g_disk_error_mutex);
      if (!g_disk_error.empty()) text += "; " + g_disk_error;
    }
    if (!text.empty()) {
      std::shared_ptr<const Settings> settings = CurrentSettings();
      text += settings->plans->enabled()
                  ? "; plans stored in " + settings->plans->directory()
                  : "; plans not stored (" + settings->plans_off + ")";
      std::lock_guard<std::mutex> lock(g_disk_error_mutex);
      if (!g_plan_store_error.empty()) text += "; " + g_plan_store_error;
    }
    return text;
  }

};

// FP8: the graph's scaling factors and amax outputs at the caller's pointers (sdpa_graph.h; a
// factor the problem does not read is a constant inside the graph and has no pointer).
void SetFp8Pointers(const Fp8FwdScales& f, GraphPointers* ptrs) {
  ptrs->at[kUidDescaleQ] = const_cast<float*>(f.descale_q);
  ptrs->at[kUidDescaleK] = const_cast<float*>(f.descale_k);
  ptrs->at[kUidDescaleV] = const_cast<float*>(f.descale_v);
  ptrs->at[kUidDescaleS] = const_cast<float*>(f.descale_s);
  ptrs->at[kUidScaleS] = const_cast<float*>(f.scale_s);
  ptrs->at[kUidScaleO] = const_cast<float*>(f.scale_o);
  ptrs->at[kUidAmaxS] = f.amax_s;
  ptrs->at[kUidAmaxO] = f.amax_o;
}

void SetFp8Pointers(const Fp8BwdScales& f, GraphPointers* ptrs) {
  ptrs->at[kUidDescaleQ] = const_cast<float*>(f.descale_q);
  ptrs->at[kUidDescaleK] = const_cast<float*>(f.descale_k);
  ptrs->at[kUidDescaleV] = const_cast<float*>(f.descale_v);
  ptrs->at[kUidDescaleO] = const_cast<float*>(f.descale_o);
  ptrs->at[kUidDescaleDO] = const_cast<float*>(f.descale_do);
  ptrs->at[kUidDescaleS] = const_cast<float*>(f.descale_s);
  ptrs->at[kUidDescaleDP] = const_cast<float*>(f.descale_dp);
  ptrs->at[kUidScaleS] = const_cast<float*>(f.scale_s);
  ptrs->at[kUidScaleDP] = const_cast<float*>(f.scale_dp);
  ptrs->at[kUidScaleDQ] = const_cast<float*>(f.scale_dq);
  ptrs->at[kUidScaleDK] = const_cast<float*>(f.scale_dk);
  ptrs->at[kUidScaleDV] = const_cast<float*>(f.scale_dv);
  ptrs->at[kUidAmaxDP] = f.amax_dp;
  ptrs->at[kUidAmaxDQ] = f.amax_dq;
  ptrs->at[kUidAmaxDK] = f.amax_dk;
  ptrs->at[kUidAmaxDV] = f.amax_dv;
}

// FP8 problems run the graph alone (Fp8PreCheck refused what needs our kernels); what is left
// is a call whose LSE is laid out otherwise than packed [batch, heads, seqlen_q], which the
// fix-up kernel would copy.
Status Fp8CallRefusal(const Problem& p, const CallPlan& call) {
  if (!p.fp8 || !(call.prep || call.fixup || call.fixup_dbias || call.dsink))
    return Status::Ok();
  return NotSupported(
      "FP8 with an LSE laid out otherwise than packed [batch, heads_q, max_seqlen_q]: the copy "
      "needs this backend's fix-up kernel, which has no FP8 version yet (the reference runs it)");
}

Status CudnnBackendImpl::forward(const Problem& problem, const FwdTensors& t, void* workspace,
                                 size_t workspace_bytes, void* stream) {
  Problem storage;
  const Problem& p = EffectiveProblem(problem, &storage);
  const auto& c = p.config;
  // Paged pools are checked as tensors of num_pages "sequences" of page_size tokens (never
  // ragged: their pages are found through the page table).
  const int64_t kv_batch = p.paged ? t.num_pages : c.batch;
  const int64_t kv_rows = p.paged ? c.page_size : c.max_seqlen_kv;
  const bool kv_ragged = p.thd && !p.paged;
  const struct {
    const char* name;
    const TensorView& view;
    int64_t batch, heads, seqlen, dim;
    bool ragged;
  } operands[] = {{"args.q", t.q, c.batch, c.heads_q, c.max_seqlen_q, c.head_dim_qk, p.thd},
                  {"args.k", t.k, kv_batch, c.heads_kv, kv_rows, c.head_dim_qk, kv_ragged},
                  {"args.v", t.v, kv_batch, c.heads_kv, kv_rows, c.head_dim_v, kv_ragged},
                  {"args.o", t.o, c.batch, c.heads_q, c.max_seqlen_q, c.head_dim_v, p.thd}};
  for (const auto& op : operands) {
    FUSEDATTN_RETURN_IF_ERROR(CheckRuntimeLayout(op.name, op.view, op.batch, op.heads, op.seqlen,
                                                 op.dim, op.ragged));
  }

  DeviceInfo device;
  FUSEDATTN_RETURN_IF_ERROR(CurrentDevice(&device));
  FUSEDATTN_RETURN_IF_ERROR(PagedVersionRefusal(p, device.cudnn_version));
  const SdpaGraphSpec spec = ForwardSpec(p, t);
  std::shared_ptr<PlanEntry> entry;
  const SeqlenRoute route{&p, [&t](const Problem& routed) { return ForwardSpec(routed, t); }};
  FUSEDATTN_RETURN_IF_ERROR(GetPlan(spec, device, &route, &entry));
  FUSEDATTN_RETURN_IF_ERROR(PlanStatus(*entry, Direction::kForward));

  // The problem the graph runs: p, or the THD form of it for a ragged plan (the sequence-length
  // route), whose call plan and scratch the call then has.
  Problem routed_storage;
  const Problem& run = GraphProblem(p, *entry, &routed_storage);
  const PlanEntry& plan = entry->routed ? *entry->routed : *entry;
  const CallPlan call = ForwardCallPlan(run, t);
  FUSEDATTN_RETURN_IF_ERROR(Fp8CallRefusal(p, call));
  const Scratch scratch = ForwardScratch(run, call);
  WorkspaceLayout ws;
  FUSEDATTN_RETURN_IF_ERROR(LayOut(workspace, workspace_bytes, scratch, plan.workspace, &ws));

  Sequences seq = SequencesOf(problem, run, t, call.const_lengths);
  if (p.paged) seq.seqlens_kv = t.seqlens_kv;  // the key lengths (clamped where they are read)
  const cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  if (call.prep) {
    PrepareParams prep;
    prep.seq = seq;
    prep.graph_batch = GraphBatch(run);
    prep.seq_len_q = At<int32_t>(ws, scratch.seq_len_q);
    prep.seq_len_kv = At<int32_t>(ws, scratch.seq_len_kv);
    prep.chunks = entry->chunks;
    if (call.page_table) {  // the caller's table as cuDNN reads it (kernels.h)
      prep.page_table = At<int32_t>(ws, scratch.page_table);
      prep.page_table_src = t.page_table;
      prep.page_table_stride = t.page_table_stride;
      prep.table_pages = spec.table_pages;
      prep.page_size = c.page_size;
      prep.num_pages = t.num_pages;
    }
    const TensorView* ragged_views[kRaggedSlots] = {&t.q, &t.k, &t.v, &t.o};
    for (int slot : {kRaggedQ, kRaggedK, kRaggedV, kRaggedO}) {
      prep.ragged[slot] = At<int32_t>(ws, scratch.ragged[slot]);
      prep.ragged_kv_side[slot] = slot == kRaggedK || slot == kRaggedV;
      prep.ragged_stride[slot] =
          RaggedStride(p, *ragged_views[slot], prep.ragged_kv_side[slot]);
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
  ptrs.at[kUidSink] = call.stage_sink ? At<float>(ws, scratch.sink)
                                      : const_cast<float*>(t.sink_logits);
  ptrs.at[kUidRaggedQ] = At<int32_t>(ws, scratch.ragged[kRaggedQ]);
  ptrs.at[kUidRaggedK] = At<int32_t>(ws, scratch.ragged[kRaggedK]);
  ptrs.at[kUidRaggedV] = At<int32_t>(ws, scratch.ragged[kRaggedV]);
  ptrs.at[kUidRaggedO] = At<int32_t>(ws, scratch.ragged[kRaggedO]);
  ptrs.at[kUidPageTableK] = At<int32_t>(ws, scratch.page_table);
  ptrs.at[kUidPageTableV] = At<int32_t>(ws, scratch.page_table);
  SetScoreModPointers(t, scratch, ws, &ptrs);
  if (p.fp8) SetFp8Pointers(t.fp8, &ptrs);
  FUSEDATTN_RETURN_IF_ERROR(Execute(plan, spec, device.ordinal, stream, ptrs, ws.cudnn));

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
    FUSEDATTN_RETURN_IF_ERROR(
        CheckRuntimeLayout(op.name, op.view, c.batch, op.heads, op.seqlen, op.dim, p.thd));
  }

  DeviceInfo device;
  FUSEDATTN_RETURN_IF_ERROR(CurrentDevice(&device));
  const SdpaGraphSpec spec = BackwardSpec(p, t);
  std::shared_ptr<PlanEntry> entry;
  const SeqlenRoute route{&p, [&t](const Problem& routed) { return BackwardSpec(routed, t); }};
  FUSEDATTN_RETURN_IF_ERROR(GetPlan(spec, device, &route, &entry));
  FUSEDATTN_RETURN_IF_ERROR(PlanStatus(*entry, Direction::kBackward));

  Problem routed_storage;  // as in forward()
  const Problem& run = GraphProblem(p, *entry, &routed_storage);
  const PlanEntry& plan = entry->routed ? *entry->routed : *entry;
  const CallPlan call = BackwardCallPlan(run, t);
  FUSEDATTN_RETURN_IF_ERROR(Fp8CallRefusal(p, call));
  const Scratch scratch = BackwardScratch(run, call);
  WorkspaceLayout ws;
  FUSEDATTN_RETURN_IF_ERROR(LayOut(workspace, workspace_bytes, scratch, plan.workspace, &ws));

  const Sequences seq = SequencesOf(problem, run, t, call.const_lengths);
  const Band band = BandOf(p);
  const cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  if (call.prep) {
    PrepareParams prep;
    prep.seq = seq;
    prep.graph_batch = GraphBatch(run);
    prep.seq_len_q = At<int32_t>(ws, scratch.seq_len_q);
    prep.seq_len_kv = At<int32_t>(ws, scratch.seq_len_kv);
    prep.chunks = entry->chunks;
    const TensorView* ragged_views[kRaggedSlots] = {&t.q,   &t.k,  &t.v,  &t.o,
                                                    &t.d_o, &t.dq, &t.dk, &t.dv};
    for (int slot = 0; slot < kRaggedSlots; ++slot) {
      prep.ragged[slot] = At<int32_t>(ws, scratch.ragged[slot]);
      prep.ragged_kv_side[slot] =
          slot == kRaggedK || slot == kRaggedV || slot == kRaggedDK || slot == kRaggedDV;
      prep.ragged_stride[slot] =
          RaggedStride(p, *ragged_views[slot], prep.ragged_kv_side[slot]);
    }
    prep.heads_q = c.heads_q;
    prep.stats = At<float>(ws, scratch.stats);
    prep.lse = ViewOf(t.lse);
    prep.lse_packed = t.lse_packed;
    prep.band = band;
    prep.zero_counter = At<unsigned int>(ws, scratch.dsink_done);
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
  if (p.fp8) SetFp8Pointers(t.fp8, &ptrs);
  FUSEDATTN_RETURN_IF_ERROR(Execute(plan, spec, device.ordinal, stream, ptrs, ws.cudnn));

  BackwardEpilogueParams after;
  after.do_fixup = call.fixup;
  if (call.fixup) {
    BackwardFixupParams& fix = after.fixup;
    fix.seq = seq;
    fix.band = band;
    fix.heads_q = c.heads_q, fix.heads_kv = c.heads_kv;
    fix.head_dim_qk = c.head_dim_qk, fix.head_dim_v = c.head_dim_v;
    fix.dq = ViewOf(t.dq), fix.dk = ViewOf(t.dk), fix.dv = ViewOf(t.dv);
  }
  after.do_dbias = call.fixup_dbias;
  if (call.fixup_dbias) {
    DbiasFixupParams& fix = after.dbias_fixup;
    fix.seq = seq;
    fix.band = band;
    fix.bias_batch = c.bias_batch, fix.bias_heads = c.bias_heads;
    fix.dbias = t.dbias.data;
    fix.element_bytes = static_cast<int>(DtypeSize(t.dbias.dtype));
    fix.stride_b = t.dbias.stride_b, fix.stride_h = t.dbias.stride_h;
    fix.stride_q = t.dbias.stride_q, fix.stride_kv = t.dbias.stride_kv;
  }
  after.do_dsink = call.dsink;
  if (call.dsink) {
    DsinkParams& ds = after.dsink;
    ds.seq = seq;
    ds.band = band;
    ds.heads_q = c.heads_q, ds.head_dim_v = c.head_dim_v;
    ds.bf16 = c.o_dtype == FUSEDATTN_DTYPE_BFLOAT16;
    ds.o = ViewOf(t.o), ds.d_o = ViewOf(t.d_o), ds.lse = ViewOf(t.lse);
    ds.lse_packed = t.lse_packed;
    ds.sink = t.sink_logits, ds.sink_stride = t.sink_stride;
    ds.partials = At<float>(ws, scratch.dsink_partials);
    ds.done = At<unsigned int>(ws, scratch.dsink_done);
    ds.dsink = t.dsink, ds.dsink_stride = t.dsink_stride;
  }
  FUSEDATTN_CUDA_CHECK(LaunchBackwardEpilogue(after, cuda_stream));
  return Status::Ok();
}

}  // namespace

void WaitForBackgroundBuilds() { BackgroundBuilder::Builder().wait_idle(); }

void ReloadPlanCacheCapacity() { Cache().set_capacity(CacheCapacityFromEnv()); }

void ClearPlanCache() {
  // The builds asked for so far finish first, so that they do not store plans after the clear
  // (one asked for meanwhile by another thread may).
  BackgroundBuilder::Builder().wait_idle();
  Cache().clear();
  Structures().clear();
  // Selections keep the workspace sizes of the plans they were made with; a rebuilt plan may
  // need another size, and check() should build the plans again, not the first call.
  ClearSelectionCache();
}

void ReloadSettings() {
  {
    std::lock_guard<std::mutex> lock(g_settings_mutex);
    g_settings.reset();
  }
  {
    std::lock_guard<std::mutex> lock(g_disk_error_mutex);
    g_disk_error.clear();
    g_plan_store_error.clear();
  }
  ClearPlanCache();
}

PlanBuildStats GetPlanBuildStats() {
  const Counters& c = Count();
  PlanBuildStats s;
  s.builds = c.builds.load(), s.unified = c.unified.load(), s.dynamic = c.dynamic.load();
  s.per_shape = c.per_shape.load(), s.failed = c.failed.load();
  s.batch_chunked = c.batch_chunked.load();
  s.seqlen_routed = c.seqlen_routed.load(), s.route_plans = c.route_plans.load();
  s.background_builds = c.background_builds.load();
  s.plans_read = c.plans_read.load(), s.plan_read_failures = c.plan_read_failures.load();
  s.plans_written = c.plans_written.load(), s.plan_write_failures = c.plan_write_failures.load();
  s.read_ms = static_cast<double>(c.read_us.load()) / 1000.0;
  s.kernel_caches_loaded = c.loaded.load(), s.kernel_cache_load_failures = c.load_failures.load();
  s.kernel_caches_saved = c.saved.load(), s.kernel_cache_save_failures = c.save_failures.load();
  s.build_ms = static_cast<double>(c.build_us.load()) / 1000.0;
  return s;
}

std::string DiskCacheDirectory() {
  std::shared_ptr<const Settings> settings = CurrentSettings();
  return settings->disk->enabled() ? settings->disk->directory() : std::string();
}

std::string DiskCacheOffReason() { return CurrentSettings()->disk_off; }

std::string PlanStoreDirectory() {
  std::shared_ptr<const Settings> settings = CurrentSettings();
  return settings->plans->enabled() ? settings->plans->directory() : std::string();
}

std::string PlanStoreOffReason() { return CurrentSettings()->plans_off; }

std::string DynamicShapesOffReason() { return CurrentSettings()->dynamic_off; }

}  // namespace cudnn

Backend* CudnnBackend() {
  static cudnn::CudnnBackendImpl* backend = new cudnn::CudnnBackendImpl();
  return backend;
}

}  // namespace fusedattn
