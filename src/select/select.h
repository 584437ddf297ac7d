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

// The backend forced by the environment (FUSEDATTN_BACKEND), read once per process.
fusedattn_backend EnvironmentBackend();

// Drops cached selections (tests, or after FUSEDATTN_BACKEND changed).
void ClearSelectionCache();
// Re-reads FUSEDATTN_BACKEND (tests).
void ReloadEnvironmentBackend();

}  // namespace fusedattn
