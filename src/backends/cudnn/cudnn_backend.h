// Internals of the cuDNN backend that tests and the overhead benchmark reach.
#pragma once

#include <cstdint>
#include <string>

namespace fusedattn::cudnn {

// Re-reads FUSEDATTN_PLAN_CACHE_SIZE (default 256) and resizes the plan cache; read once at
// first use otherwise.
void ReloadPlanCacheCapacity();

// Drops every cached plan and structure (with its kernel cache) and the selections made with
// them, after the background builds asked for so far have finished; counters keep counting.
void ClearPlanCache();

// Returns when no background build (README.md "Background builds") waits or runs.
void WaitForBackgroundBuilds();

// Re-reads FUSEDATTN_CUDNN_DYNAMIC_SHAPES and the on-disk cache's variables (FUSEDATTN_CACHE_DIR,
// FUSEDATTN_CACHE_MAX_MB, XDG_CACHE_HOME, HOME), then clears the plan cache; read once at first
// use otherwise.
void ReloadSettings();

// How plans were built since the process started (or since the counters were last read by a
// test, which compares differences).
struct PlanBuildStats {
  uint64_t builds = 0;     // plans built (every attempt that reached cuDNN, failures included)
  uint64_t unified = 0;    // ... by the unified SDPA node, per shape
  uint64_t dynamic = 0;    // ... as dynamic-shape graphs from a structure's kernel cache
  uint64_t per_shape = 0;  // ... as per-shape composite graphs
  uint64_t failed = 0;     // ... refused by cuDNN
  uint64_t batch_chunked = 0;  // specs given a plan for fewer sequences to run in batch chunks
  // The sequence-length route (plan_spec.h RouteExtents):
  uint64_t seqlen_routed = 0;  // dense specs given a ragged plan of larger extents to run through
  uint64_t route_plans = 0;    // ragged plans asked for by it (built or read from the plan
                               // store: also counted above and below)
  uint64_t background_builds = 0;  // problems whose plans the background worker built (or
                                   // found refused) after check_or_defer deferred them
  uint64_t kernel_caches_loaded = 0;  // structures whose kernel cache came from disk
  uint64_t kernel_cache_load_failures = 0;  // damaged files, or kernel caches cuDNN refused
  uint64_t kernel_caches_saved = 0;   // files written
  uint64_t kernel_cache_save_failures = 0;
  double build_ms = 0;     // total time of the builds
  // The on-disk plan store (per-shape plans of earlier processes):
  uint64_t plans_read = 0;           // plans read and made executable instead of built
  uint64_t plan_read_failures = 0;   // damaged files, or stored plans cuDNN refused (rebuilt)
  uint64_t plans_written = 0;
  uint64_t plan_write_failures = 0;  // e.g. an engine cuDNN cannot serialize
  double read_ms = 0;                // total time of the reads
};
PlanBuildStats GetPlanBuildStats();

// Where kernel caches are written ("" when they are not) and, when not, why.
std::string DiskCacheDirectory();
std::string DiskCacheOffReason();
// Where per-shape plans are stored for later processes ("" when they are not) and, when not, why.
std::string PlanStoreDirectory();
std::string PlanStoreOffReason();
// Why no structure uses dynamic shapes: plans are per shape unless FUSEDATTN_CUDNN_DYNAMIC_SHAPES
// asks for them (experimental; plan_spec.h ParseDynamicShapes); "" when they are on.
std::string DynamicShapesOffReason();

}  // namespace fusedattn::cudnn
