#include "select/select.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "common/cuda_util.h"
#include "common/lru_cache.h"

namespace fusedattn {

// Why a backend is not built, as CMake found it when fusedattn was built (CMakeLists.txt passes
// these): "not built: nvcc not found when fusedattn was built", "not built: cuDNN headers not found
// (searched: ...)".
#ifndef FUSEDATTN_NO_CUDA_REASON
#define FUSEDATTN_NO_CUDA_REASON "not built (needs the CUDA toolkit when fusedattn is built)"
#endif
#ifndef FUSEDATTN_NO_CUDNN_REASON
#define FUSEDATTN_NO_CUDNN_REASON "not built (cuDNN or cudnn-frontend not found when fusedattn was built)"
#endif

const std::vector<Backend*>& AllBackends() {
  static const std::vector<Backend*> backends = [] {
    std::vector<Backend*> list;
#ifdef FUSEDATTN_WITH_SMALL_SEQ
    list.push_back(SmallSeqBackend());
#else
    static UnavailableBackend small_seq(FUSEDATTN_BACKEND_SMALL_SEQ, "small_seq",
                                        FUSEDATTN_NO_CUDA_REASON);
    list.push_back(&small_seq);
#endif
#ifdef FUSEDATTN_WITH_CUDNN
    list.push_back(CudnnBackend());
#else
    static UnavailableBackend cudnn(FUSEDATTN_BACKEND_CUDNN, "cudnn", FUSEDATTN_NO_CUDNN_REASON);
    list.push_back(&cudnn);
#endif
#ifdef FUSEDATTN_WITH_FLASH
    list.push_back(FlashBackend());
#else
    static UnavailableBackend flash(FUSEDATTN_BACKEND_FLASH, "flash", FUSEDATTN_NO_CUDA_REASON);
    list.push_back(&flash);
#endif
    list.push_back(ReferenceBackend());
    return list;
  }();
  return backends;
}

Backend* FindBackend(fusedattn_backend id) {
  for (Backend* b : AllBackends())
    if (b->id() == id) return b;
  return nullptr;
}

namespace {

// -1: not read yet; -2: set to an unknown name (kept in g_env_bad_name); else a backend id.
std::atomic<int> g_env_backend{-1};
std::string g_env_bad_name;
std::mutex g_env_mutex;

int ReadEnvironmentBackend() {
  std::lock_guard<std::mutex> lock(g_env_mutex);
  const char* value = std::getenv("FUSEDATTN_BACKEND");
  fusedattn_backend id = FUSEDATTN_BACKEND_AUTO;
  if (value == nullptr || *value == '\0') return FUSEDATTN_BACKEND_AUTO;
  if (fusedattn_backend_from_name(value, &id) != FUSEDATTN_SUCCESS) {
    g_env_bad_name = value;
    return -2;
  }
  return id;
}

int EnvironmentState() {
  int v = g_env_backend.load(std::memory_order_acquire);
  if (v == -1) {
    v = ReadEnvironmentBackend();
    g_env_backend.store(v, std::memory_order_release);
  }
  return v;
}

// The order in which backends are asked: the fastest one expected for this problem first.
std::vector<fusedattn_backend> PreferenceOrder(const Problem& p) {
  if (p.device == Device::kCpu) return {FUSEDATTN_BACKEND_REFERENCE};
  // small_seq refuses anything but sq = 1 against a short K/V at once; cuDNN is the fastest for
  // the problems it accepts; our flash kernels run everything else; the reference runs on CUDA
  // tensors only when forced (it copies everything to the host).
  return {FUSEDATTN_BACKEND_SMALL_SEQ, FUSEDATTN_BACKEND_CUDNN, FUSEDATTN_BACKEND_FLASH,
          FUSEDATTN_BACKEND_REFERENCE};
}

struct Choice {
  Backend* backend = nullptr;  // nullptr: none
  Status status;
  std::string diagnostic;
  // The chosen backend's forward and backward workspace bytes, -1 until first asked. (cuDNN also
  // checks the workspace against the plan it runs, should a rebuilt plan ever need more.)
  std::atomic<int64_t> workspace[2] = {-1, -1};
};

// Workspace sizes depend on the device (cuDNN plans are built per device), so the device is part
// of the key of CUDA problems.
struct SelectionKey {
  ProblemKey problem;
  bool need_backward;
  int forced;
  int cuda_device;  // -1 for CPU problems
  bool operator==(const SelectionKey& o) const {
    return need_backward == o.need_backward && forced == o.forced &&
           cuda_device == o.cuda_device && problem == o.problem;
  }
};
struct SelectionKeyHash {
  size_t operator()(const SelectionKey& k) const {
    return (ProblemKeyHash()(k.problem) * 31 + (k.need_backward ? 7 : 0) + k.forced) * 31 +
           static_cast<size_t>(k.cuda_device + 1);
  }
};

LruCache<SelectionKey, Choice, SelectionKeyHash>& SelectionCache() {
  static LruCache<SelectionKey, Choice, SelectionKeyHash> cache(4096);
  return cache;
}

void Decide(const Problem& problem, bool need_backward, fusedattn_backend forced, Choice* out) {
  Problem p = problem;
  if (need_backward) p.config.is_training = 1;
  Choice& choice = *out;
  if (forced != FUSEDATTN_BACKEND_AUTO) {
    Backend* b = FindBackend(forced);
    Status s = b->available();
    if (s.ok()) s = b->check(p);
    if (!s.ok()) {
      choice.status = Status(FUSEDATTN_ERROR_NOT_SUPPORTED,
                             Format("forced backend %s cannot run this problem (%s): %s",
                                    b->name(), p.describe().c_str(), s.message().c_str()));
      choice.diagnostic = choice.status.message();
      return;
    }
    choice.backend = b;
    choice.diagnostic = Format("%s (forced)", b->name());
    return;
  }
  std::string refusals;
  for (fusedattn_backend id : PreferenceOrder(p)) {
    Backend* b = FindBackend(id);
    Status s = b->available();
    if (s.ok()) s = b->check(p);
    if (s.ok() && id == FUSEDATTN_BACKEND_REFERENCE && p.device == Device::kCuda)
      s = NotSupported("not chosen automatically for CUDA tensors (it computes on the host; "
                       "force it with backend=reference)");
    if (s.ok()) {
      choice.backend = b;
      choice.diagnostic = refusals.empty() ? Format("%s", b->name())
                                           : Format("%s; not chosen: %s", b->name(),
                                                    refusals.c_str());
      return;
    }
    if (!refusals.empty()) refusals += "; ";
    refusals += Format("%s: %s", b->name(), s.message().c_str());
  }
  // Backends not asked for this device still get a line, so the user sees all of them.
  for (Backend* b : AllBackends()) {
    bool asked = false;
    for (fusedattn_backend id : PreferenceOrder(p)) asked |= id == b->id();
    if (!asked)
      refusals += Format("; %s: runs on CUDA tensors only, and config.device is CPU", b->name());
  }
  choice.status = Status(FUSEDATTN_ERROR_NOT_SUPPORTED,
                         Format("no backend runs this problem (%s): %s", p.describe().c_str(),
                                refusals.c_str()));
  choice.diagnostic = choice.status.message();
}

}  // namespace

fusedattn_backend EnvironmentBackend() {
  int v = EnvironmentState();
  return v < 0 ? FUSEDATTN_BACKEND_AUTO : static_cast<fusedattn_backend>(v);
}

void ReloadEnvironmentBackend() { g_env_backend.store(-1); }

void ClearSelectionCache() { SelectionCache().clear(); }

namespace {

Status Select(const Problem& problem, bool need_backward, std::shared_ptr<Choice>* out) {
  fusedattn_backend forced = problem.config.backend;
  if (forced == FUSEDATTN_BACKEND_AUTO) {
    int env = EnvironmentState();
    if (env == -2) {
      std::lock_guard<std::mutex> lock(g_env_mutex);
      return InvalidArgument(
          "FUSEDATTN_BACKEND = '%s' is not a backend (auto, reference, cudnn, flash, small_seq)",
          g_env_bad_name.c_str());
    }
    forced = static_cast<fusedattn_backend>(env);
  }
  SelectionKey key{KeyOf(problem), need_backward || problem.config.is_training != 0,
                   static_cast<int>(forced),
                   problem.device == Device::kCuda ? CurrentCudaDevice() : -1};
  std::shared_ptr<Choice> choice = SelectionCache().find(key);
  if (!choice) {
    choice = std::make_shared<Choice>();
    Decide(problem, key.need_backward, forced, choice.get());
    choice = SelectionCache().insert(key, choice);
  }
  *out = std::move(choice);
  return Status::Ok();
}

}  // namespace

Status SelectBackend(const Problem& problem, bool need_backward, Backend** chosen,
                     std::string* diagnostic) {
  std::shared_ptr<Choice> choice;
  FUSEDATTN_RETURN_IF_ERROR(Select(problem, need_backward, &choice));
  if (diagnostic) *diagnostic = choice->diagnostic;
  if (!choice->backend) return choice->status;
  *chosen = choice->backend;
  return Status::Ok();
}

Status SelectBackendAndWorkspace(const Problem& problem, bool backward, Backend** chosen,
                                 size_t* workspace_bytes) {
  std::shared_ptr<Choice> choice;
  FUSEDATTN_RETURN_IF_ERROR(Select(problem, backward, &choice));
  if (!choice->backend) return choice->status;
  *chosen = choice->backend;
  std::atomic<int64_t>& known = choice->workspace[backward ? 1 : 0];
  int64_t bytes = known.load(std::memory_order_acquire);
  if (bytes < 0) {
    size_t asked = 0;
    FUSEDATTN_RETURN_IF_ERROR(backward ? choice->backend->bwd_workspace_size(problem, &asked)
                                       : choice->backend->fwd_workspace_size(problem, &asked));
    bytes = static_cast<int64_t>(asked);
    known.store(bytes, std::memory_order_release);
  }
  *workspace_bytes = static_cast<size_t>(bytes);
  return Status::Ok();
}

}  // namespace fusedattn
