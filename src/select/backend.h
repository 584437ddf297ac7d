// The one interface every backend implements. Selection (select.cpp) asks the backends in order
// of expected speed and runs the first whose check() accepts.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "common/status.h"
#include "problem/problem.h"

namespace fusedattn {

class Backend {
 public:
  virtual ~Backend() = default;

  virtual fusedattn_backend id() const = 0;
  virtual const char* name() const = 0;

  // Built in, and (for GPU backends) a device it can use is present. The reason otherwise, e.g.
  // "not built: cuDNN headers not found (searched: ...)", "no CUDA device", "no kernel for sm_75
  // in this build (built for sm_80, sm_90a)".
  virtual Status available() const = 0;

  // Whether this backend runs the problem: the forward, and also the backward when
  // problem.config.is_training is set. A problem that passes check() must not fail for a reason
  // the check could have known. Must be thread-safe.
  virtual Status check(const Problem& problem) = 0;

  // check() as automatic selection asks it. A backend whose answer would take long to prepare
  // (cuDNN: the plans of a new shape of a structure it built before) may instead start that
  // preparation in the background, answer NotSupported with its reason and set *ready to a flag
  // that turns true when check() would answer without waiting: selection then runs the problem
  // on the next backend that accepts it and decides again once the flag is set (select.cpp,
  // "Deferred backends"). Otherwise it answers as check() and leaves *ready alone. Forced
  // backends are asked check() itself. Must be thread-safe.
  virtual Status check_or_defer(const Problem& problem,
                                std::shared_ptr<const std::atomic<bool>>* ready) {
    return check(problem);
  }

  virtual Status fwd_workspace_size(const Problem& problem, size_t* bytes) = 0;
  virtual Status bwd_workspace_size(const Problem& problem, size_t* bytes) = 0;

  // stream is a cudaStream_t for GPU backends. Tensors have been validated against problem, and
  // the workspace holds what *_workspace_size asked for. NotSupported means "not these tensors":
  // a reason check() could not know (strides, alignment, the workspace a plan for the caller's
  // layout needs), returned before anything is written; selection then gives the call to the
  // next backend (select.h, RunForward). Any other error ends the call.
  virtual Status forward(const Problem& problem, const FwdTensors& tensors, void* workspace,
                         size_t workspace_bytes, void* stream) = 0;
  virtual Status backward(const Problem& problem, const BwdTensors& tensors, void* workspace,
                          size_t workspace_bytes, void* stream) = 0;

  virtual fusedattn_cache_stats cache_stats() const { return {}; }

  // How this backend runs a problem it was chosen for (cuDNN: how its plans are built and where
  // its kernel caches go), for the selection's diagnostic; empty for nothing to say. Called
  // after check() accepted the problem.
  virtual std::string note(const Problem& problem) { return {}; }
};

// A backend that is not compiled in: available() and check() return the reason.
class UnavailableBackend final : public Backend {
 public:
  UnavailableBackend(fusedattn_backend id, const char* name, const char* reason)
      : id_(id), name_(name), reason_(reason) {}
  fusedattn_backend id() const override { return id_; }
  const char* name() const override { return name_; }
  Status available() const override { return NotSupported("%s", reason_); }
  Status check(const Problem&) override { return available(); }
  Status fwd_workspace_size(const Problem&, size_t*) override { return available(); }
  Status bwd_workspace_size(const Problem&, size_t*) override { return available(); }
  Status forward(const Problem&, const FwdTensors&, void*, size_t, void*) override {
    return available();
  }
  Status backward(const Problem&, const BwdTensors&, void*, size_t, void*) override {
    return available();
  }

 private:
  fusedattn_backend id_;
  const char* name_;
  const char* reason_;
};

// Factories, one per backend folder. Each returns a process-lifetime singleton.
Backend* ReferenceBackend();
#ifdef FUSEDATTN_WITH_CUDNN
Backend* CudnnBackend();
#endif
#ifdef FUSEDATTN_WITH_FLASH
Backend* FlashBackend();
#endif
#ifdef FUSEDATTN_WITH_SMALL_SEQ
Backend* SmallSeqBackend();
#endif

}  // namespace fusedattn
