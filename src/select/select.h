// Backend registry and selection: the one place that decides which backend runs a problem.
#pragma once

#include <string>
#include <vector>

#include "select/backend.h"

namespace fusedattn {

// Every backend, compiled in or not, in a fixed order.
const std::vector<Backend*>& AllBackends();
Backend* FindBackend(fusedattn_backend id);

// Chooses the backend for a problem (one that also runs its backward when need_backward or
// problem.config.is_training). diagnostic: the chosen backend and every earlier refusal, or, on
// failure, every backend's reason. Warm calls hit a cache keyed by the problem.
Status SelectBackend(const Problem& problem, bool need_backward, Backend** chosen,
                     std::string* diagnostic);

// SelectBackend, and the chosen backend's workspace for the forward (backward = false) or the
// backward: asked of the backend once and kept with the selection, so that a warm
// fusedattn_fwd/bwd does not plan its workspace again on every call.
Status SelectBackendAndWorkspace(const Problem& problem, bool backward, Backend** chosen,
                                 size_t* workspace_bytes);

// Runs the forward (RunForward) or backward (RunBackward) of a problem on the selected backend,
// after checking that the caller's workspace holds what that backend asked for. When the backend
// answers NotSupported for these tensors (a run-time reason check() could not know: strides,
// alignment, a plan for the caller's layout that needs more workspace than was given), the
// backends after it in preference order that accept the problem get the call in turn (first,
// waited for, a backend before it that deferred its answer: backend.h check_or_defer), each only
// when the given workspace covers its own size; a forced backend (config or FUSEDATTN_BACKEND)
// is never replaced. Errors other than NotSupported end the call as they are. The final error
// names every backend tried with its reason.
Status RunForward(const Problem& problem, const FwdTensors& tensors, void* workspace,
                  size_t workspace_bytes, void* stream);
Status RunBackward(const Problem& problem, const BwdTensors& tensors, void* workspace,
                   size_t workspace_bytes, void* stream);

// Tests: selection asks exactly these backends, in this order, for every problem (FindBackend
// finds them by id first), until ResetBackendsForTesting. Both clear the selection cache. The
// backends must outlive their use.
void SetBackendsForTesting(std::vector<Backend*> backends);
void ResetBackendsForTesting();

// The backend forced by the environment (FUSEDATTN_BACKEND), read once per process.
fusedattn_backend EnvironmentBackend();

// Drops cached selections (tests, or after FUSEDATTN_BACKEND changed).
void ClearSelectionCache();
// Re-reads FUSEDATTN_BACKEND (tests).
void ReloadEnvironmentBackend();

}  // namespace fusedattn
