#include "select/select.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "common/cuda_util.h"
#include "common/lru_cache.h"
#include "select/measured_speed.h"

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

namespace {

// SetBackendsForTesting's list; null: the built-in registry.
std::atomic<const std::vector<Backend*>*> g_test_backends{nullptr};

// The backends selection asks: the test list when set, else every built-in one.
const std::vector<Backend*>& Registry() {
  const std::vector<Backend*>* test = g_test_backends.load(std::memory_order_acquire);
  return test != nullptr ? *test : AllBackends();
}

}  // namespace

Backend* FindBackend(fusedattn_backend id) {
  for (Backend* b : Registry())
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
// speed (when given) gets the measured-speed answer that ordered cuDNN and flash.
std::vector<fusedattn_backend> PreferenceOrder(const Problem& p, SpeedOrder* speed = nullptr) {
  if (const std::vector<Backend*>* test = g_test_backends.load(std::memory_order_acquire)) {
    std::vector<fusedattn_backend> ids;
    for (Backend* b : *test) ids.push_back(b->id());
    return ids;
  }
  if (p.device == Device::kCpu) return {FUSEDATTN_BACKEND_REFERENCE};
  // small_seq refuses anything but sq = 1 against a short K/V at once; cuDNN and our flash
  // kernels run nearly everything else, in the order their measured speed gives for this problem
  // (measured_speed.h), cuDNN first where nothing was measured (paged K/V: measured_speed.h);
  // the reference runs on CUDA tensors only when forced (it copies everything to the host).
  SpeedOrder order = OrderByMeasuredSpeed(p, CurrentDeviceComputeCapability(),
                                          p.config.is_training != 0);
  const bool flash_first = order.flash_first;
  if (speed) *speed = std::move(order);
  if (flash_first)
    return {FUSEDATTN_BACKEND_SMALL_SEQ, FUSEDATTN_BACKEND_FLASH, FUSEDATTN_BACKEND_CUDNN,
            FUSEDATTN_BACKEND_REFERENCE};
  return {FUSEDATTN_BACKEND_SMALL_SEQ, FUSEDATTN_BACKEND_CUDNN, FUSEDATTN_BACKEND_FLASH,
          FUSEDATTN_BACKEND_REFERENCE};
}

// A backend after the chosen one in preference order, asked only when the chosen one cannot run
// a call's tensors (RunForward / RunBackward).
struct Alternative {
  Backend* backend = nullptr;
  Status check;              // its answer for the problem (forward, and backward when training)
  size_t workspace[2] = {};  // forward, backward bytes (when check is ok)
};

// Deferred backends: a backend earlier in the order than the chosen one may have deferred its
// answer (Backend::check_or_defer: cuDNN building a new shape's plans in the background). The
// choice then keeps it and its flag, and the first selection after the flag turns true decides
// again (Select), replacing the cached choice; the new choice keeps the old one as `previous`
// when the backend changed, because a caller may hold a workspace sized for it (asked just
// before the new decision): a call whose workspace is too small for the new choice runs on the
// previous one (Run). A call whose tensors the chosen backend cannot read goes to the deferred
// backend first (waiting for it), then to the ones after the chosen one. So no call waits for the
// preparation while another backend can run the problem, and none fails for the switch.
struct Choice {
  Backend* backend = nullptr;  // nullptr: none
  bool forced = false;         // by config.backend or FUSEDATTN_BACKEND: never replaced
  Status status;
  std::string diagnostic;
  // Set: a backend before the chosen one deferred its answer; true once it can answer.
  Backend* deferred = nullptr;
  std::shared_ptr<const std::atomic<bool>> deferred_ready;
  std::shared_ptr<Choice> previous;  // the choice of another backend this one replaced, or null
  // The chosen backend's forward and backward workspace bytes, -1 until first asked. (cuDNN also
  // checks the workspace against the plan it runs, should a rebuilt plan ever need more.)
  std::atomic<int64_t> workspace[2] = {-1, -1};
  // The order selection asks the backends in: the alternatives follow it.
  std::vector<fusedattn_backend> order;
  // The backends after it, made on the first call whose tensors it cannot run.
  std::once_flag alternatives_once;
  std::vector<Alternative> alternatives;
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

// Whether selection may pick b for p (p.config.is_training set when the backward must run too).
// With ready given, b may defer its answer (Backend::check_or_defer) and set *ready.
Status AutomaticCheck(Backend* b, const Problem& p,
                      std::shared_ptr<const std::atomic<bool>>* ready = nullptr) {
  Status s = b->available();
  if (s.ok()) s = ready ? b->check_or_defer(p, ready) : b->check(p);
  if (s.ok() && b->id() == FUSEDATTN_BACKEND_REFERENCE && p.device == Device::kCuda)
    s = NotSupported("not chosen automatically for CUDA tensors (it computes on the host; "
                     "force it with backend=reference)");
  return s;
}

// The chosen backend's note, bracketed, or nothing.
std::string NoteOf(Backend* b, const Problem& p) {
  std::string note = b->note(p);
  return note.empty() ? note : " [" + note + "]";
}

void Decide(const Problem& problem, bool need_backward, fusedattn_backend forced, Choice* out) {
  Problem p = problem;
  if (need_backward) p.config.is_training = 1;
  Choice& choice = *out;
  SpeedOrder speed;
  choice.order = PreferenceOrder(p, &speed);  // a forced backend's error names the others too
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
    choice.forced = true;
    choice.diagnostic = Format("%s (forced)%s", b->name(), NoteOf(b, p).c_str());
    return;
  }
  std::string refusals;  // of every backend asked, the deferred one's included
  std::string others;    // of every backend asked but the deferred one
  Backend* deferred = nullptr;  // the first backend that deferred its answer
  std::shared_ptr<const std::atomic<bool>> deferred_ready;
  auto choose = [&](Backend* b, const std::string& not_chosen) {
    choice.backend = b;
    std::string chosen = b->name() + NoteOf(b, p);
    // cuDNN or flash: say what ordered the two (without asking the other one: a cuDNN
    // check builds its plan), unless the one ranked first deferred its answer.
    const bool ranked = b->id() == FUSEDATTN_BACKEND_CUDNN || b->id() == FUSEDATTN_BACKEND_FLASH;
    if (deferred && deferred != b)
      chosen += Format(" (%s is preparing the problem)", deferred->name());
    else if (ranked && !speed.basis.empty())
      chosen += " (" + speed.basis + ")";
    choice.diagnostic = not_chosen.empty()
                            ? chosen
                            : Format("%s; not chosen: %s", chosen.c_str(), not_chosen.c_str());
  };
  for (fusedattn_backend id : choice.order) {
    Backend* b = FindBackend(id);
    std::shared_ptr<const std::atomic<bool>> ready;
    Status s = AutomaticCheck(b, p, deferred ? nullptr : &ready);
    if (s.ok()) {
      choose(b, refusals);
      choice.deferred = deferred;
      choice.deferred_ready = std::move(deferred_ready);
      return;
    }
    const std::string refusal = Format("%s: %s", b->name(), s.message().c_str());
    if (ready && !deferred) {
      deferred = b, deferred_ready = std::move(ready);
    } else {
      others += (others.empty() ? "" : "; ") + refusal;
    }
    refusals += (refusals.empty() ? "" : "; ") + refusal;
  }
  if (deferred) {
    // Nobody else runs the problem: wait for the deferred one.
    Status s = deferred->check(p);
    if (s.ok()) {
      Backend* waited = deferred;
      deferred = nullptr;  // chosen: no longer "preparing"
      choose(waited, others);
      return;
    }
    refusals += Format("; then %s was waited for: %s", deferred->name(), s.message().c_str());
  }
  // Backends not asked for this device still get a line, so the user sees all of them.
  for (Backend* b : Registry()) {
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
  } else if (choice->deferred_ready && choice->deferred_ready->load(std::memory_order_acquire)) {
    // The deferred backend can answer now: decide again (see "Deferred backends").
    auto again = std::make_shared<Choice>();
    Decide(problem, key.need_backward, forced, again.get());
    again->previous = again->backend == choice->backend ? choice->previous : choice;
    choice = SelectionCache().replace(key, choice, std::move(again));
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

namespace {

// The chosen backend's workspace for one direction, asked once and kept with the choice.
Status ChosenWorkspace(Choice& choice, const Problem& problem, bool backward, size_t* bytes) {
  std::atomic<int64_t>& known = choice.workspace[backward ? 1 : 0];
  int64_t cached = known.load(std::memory_order_acquire);
  if (cached < 0) {
    size_t asked = 0;
    FUSEDATTN_RETURN_IF_ERROR(backward ? choice.backend->bwd_workspace_size(problem, &asked)
                                       : choice.backend->fwd_workspace_size(problem, &asked));
    cached = static_cast<int64_t>(asked);
    known.store(cached, std::memory_order_release);
  }
  *bytes = static_cast<size_t>(cached);
  return Status::Ok();
}

Status CheckWorkspace(const char* direction, size_t needed, void* workspace, size_t bytes) {
  if (needed == 0) return Status::Ok();
  if (workspace == nullptr || bytes < needed)
    return Status(FUSEDATTN_ERROR_WORKSPACE,
                  Format("%s workspace: %llu bytes given at %p but %llu are needed (ask "
                         "fusedattn_%s_workspace_size)",
                         direction, (unsigned long long)bytes, workspace,
                         (unsigned long long)needed, direction));
  return Status::Ok();
}

// The backends after the chosen one in preference order, after the one that deferred its answer
// (if any), with their answers for the problem.
const std::vector<Alternative>& AlternativesOf(Choice& choice, const Problem& problem,
                                               bool need_backward) {
  std::call_once(choice.alternatives_once, [&] {
    Problem p = problem;
    if (need_backward) p.config.is_training = 1;
    auto add = [&](Backend* b) {
      Alternative alt;
      alt.backend = b;
      alt.check = AutomaticCheck(b, p);  // check() itself: a deferred backend is waited for
      if (alt.check.ok()) alt.check = b->fwd_workspace_size(p, &alt.workspace[0]);
      if (alt.check.ok() && p.config.is_training)
        alt.check = b->bwd_workspace_size(p, &alt.workspace[1]);
      choice.alternatives.push_back(std::move(alt));
    };
    // A backend that deferred its answer comes first: it ranked before the chosen one.
    if (choice.deferred) add(choice.deferred);
    bool after = false;
    for (fusedattn_backend id : choice.order) {
      Backend* b = FindBackend(id);
      if (b == choice.backend) {
        after = true;
        continue;
      }
      if (!after || b == nullptr || b == choice.deferred) continue;
      add(b);
    }
  });
  return choice.alternatives;
}

// Runs call(backend) on the chosen backend, then on the alternatives while each answers
// NotSupported (see RunForward in select.h).
template <typename Call>
Status Run(const Problem& problem, bool backward, void* workspace, size_t workspace_bytes,
           Call&& call) {
  std::shared_ptr<Choice> choice;
  FUSEDATTN_RETURN_IF_ERROR(Select(problem, backward, &choice));
  if (!choice->backend) return choice->status;
  size_t needed = 0;
  FUSEDATTN_RETURN_IF_ERROR(ChosenWorkspace(*choice, problem, backward, &needed));
  // A choice made again after a deferred backend got ready may need more workspace than the
  // caller sized from the choice before it: that one runs the call ("Deferred backends").
  auto too_small = [&](size_t bytes) {
    return bytes > 0 && (workspace == nullptr || workspace_bytes < bytes);
  };
  const char* direction = backward ? "bwd" : "fwd";
  if (too_small(needed)) {
    std::shared_ptr<Choice> fits = choice;
    size_t fits_needed = needed;
    while (too_small(fits_needed) && fits->previous && fits->previous->backend) {
      fits = fits->previous;
      FUSEDATTN_RETURN_IF_ERROR(ChosenWorkspace(*fits, problem, backward, &fits_needed));
    }
    // None fits: the error names what the workspace size functions answer now.
    FUSEDATTN_RETURN_IF_ERROR(CheckWorkspace(direction, too_small(fits_needed) ? needed : 0,
                                             workspace, workspace_bytes));
    choice = std::move(fits);
  }
  Status first = call(choice->backend);
  if (first.code() != FUSEDATTN_ERROR_NOT_SUPPORTED) return first;

  // The chosen backend cannot run these tensors.
  const bool need_backward = backward || problem.config.is_training != 0;
  const std::vector<Alternative>& alternatives = AlternativesOf(*choice, problem, need_backward);
  if (choice->forced) {
    std::string others;
    for (const Alternative& alt : alternatives)
      if (alt.check.ok()) others += Format("%s%s", others.empty() ? "" : ", ", alt.backend->name());
    return NotSupported("forced backend %s cannot run these tensors: %s%s", choice->backend->name(),
                        first.message().c_str(),
                        others.empty() ? ""
                                       : Format(" (with backend = auto, selection would go on to "
                                                "%s)",
                                                others.c_str())
                                             .c_str());
  }
  std::string reasons = Format("%s: %s", choice->backend->name(), first.message().c_str());
  for (const Alternative& alt : alternatives) {
    const char* name = alt.backend->name();
    if (!alt.check.ok()) {
      reasons += Format("; %s: %s", name, alt.check.message().c_str());
      continue;
    }
    const size_t alt_needed = alt.workspace[backward ? 1 : 0];
    if (alt_needed > 0 && (workspace == nullptr || workspace_bytes < alt_needed)) {
      reasons += Format("; %s: needs %zu bytes of %s workspace, %zu were given", name, alt_needed,
                        direction, workspace_bytes);
      continue;
    }
    Status s = call(alt.backend);
    if (s.ok()) return s;
    if (s.code() != FUSEDATTN_ERROR_NOT_SUPPORTED)
      return Status(s.code(), Format("%s: %s (it ran because %s)", name, s.message().c_str(),
                                     reasons.c_str()));
    reasons += Format("; %s: %s", name, s.message().c_str());
  }
  return NotSupported("no backend runs these tensors (%s): %s", problem.describe().c_str(),
                      reasons.c_str());
}

std::unique_ptr<const std::vector<Backend*>>& TestBackendsStorage() {
  static std::unique_ptr<const std::vector<Backend*>> storage;
  return storage;
}

}  // namespace

Status SelectBackendAndWorkspace(const Problem& problem, bool backward, Backend** chosen,
                                 size_t* workspace_bytes) {
  std::shared_ptr<Choice> choice;
  FUSEDATTN_RETURN_IF_ERROR(Select(problem, backward, &choice));
  if (!choice->backend) return choice->status;
  *chosen = choice->backend;
  return ChosenWorkspace(*choice, problem, backward, workspace_bytes);
}

Status RunForward(const Problem& problem, const FwdTensors& tensors, void* workspace,
                  size_t workspace_bytes, void* stream) {
  return Run(problem, false, workspace, workspace_bytes, [&](Backend* b) {
    return b->forward(problem, tensors, workspace, workspace_bytes, stream);
  });
}

Status RunBackward(const Problem& problem, const BwdTensors& tensors, void* workspace,
                   size_t workspace_bytes, void* stream) {
  return Run(problem, true, workspace, workspace_bytes, [&](Backend* b) {
    return b->backward(problem, tensors, workspace, workspace_bytes, stream);
  });
}

void SetBackendsForTesting(std::vector<Backend*> backends) {
  auto list = std::make_unique<const std::vector<Backend*>>(std::move(backends));
  g_test_backends.store(list.get(), std::memory_order_release);
  TestBackendsStorage() = std::move(list);  // tests switch lists between calls, never during
  ClearSelectionCache();
}

void ResetBackendsForTesting() {
  g_test_backends.store(nullptr, std::memory_order_release);
  TestBackendsStorage().reset();
  ClearSelectionCache();
}

}  // namespace fusedattn
