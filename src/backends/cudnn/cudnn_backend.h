// Internals of the cuDNN backend that tests and the overhead benchmark reach.
#pragma once

namespace fusedattn::cudnn {

// Re-reads FUSEDATTN_PLAN_CACHE_SIZE (default 256) and resizes the plan cache; read once at
// first use otherwise.
void ReloadPlanCacheCapacity();

// Drops every cached plan (counters keep counting).
void ClearPlanCache();

}  // namespace fusedattn::cudnn
