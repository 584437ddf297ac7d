// The cuDNN backend's plan and host costs, on a GPU, as markdown tables on stdout:
//
//   plans      cuDNN's start-up; the cold forward + backward build of a structure; each new batch
//              size 1..8 of it (in batch chunks of the plans built before: the library's default);
//              new sequence lengths (the first builds its plans and the structure's ragged ones,
//              later ones run through those: the sequence-length route, the default; and with it
//              off); a repeated size; the forward of a no-mask problem (the unified node's plans).
//   auto       automatic selection of new shapes of a built structure (background builds, the
//              default): the time selection takes, the backend it picks while cuDNN builds the
//              shape's plans on its worker, and how long until cuDNN is chosen again.
//   dynamic    only when FUSEDATTN_CUDNN_DYNAMIC_SHAPES asks for dynamic shapes (1, or
//              no-override) in this program's environment: the same sweep with dynamic-shape
//              plans from a structure's kernel cache, and a second process of this program started
//              with the kernel caches the first one wrote to disk. Experimental, labelled so: on
//              cuDNN 9.19 (2026-11-24) such plans gave wrong results after a shape change
//              (src/backends/cudnn/README.md, "Dynamic shapes: status").
//   device     device time of back-to-back forward + backward calls on a per-shape plan (and on a
//              dynamic-shape plan of the same problem, with the dynamic rows); larger batches in
//              batch chunks of built plans and on plans of their own, per 4 sequences; lengths
//              run through a ragged plan (the sequence-length route) and on plans of their own.
//   host       warm host time per fusedattn_fwd / fusedattn_bwd call (median of back-to-back
//              calls, the GPU work runs behind) for dense BSHD (on its own plan and through a
//              ragged plan), padded BSHD and THD problems, with the number of our own kernel
//              launches around cuDNN's graph; and where the time of one dense forward goes, stage
//              by stage.
//
// Usage: [FUSEDATTN_CUDNN_DYNAMIC_SHAPES=1] cudnn_overhead [iterations]
//        (default 2000; exits 0 saying so without a GPU)
// The dynamic rows use a fresh on-disk cache directory (printed) so that "cold" is cold; the
// second process is this program re-run with --child and that directory.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backends/cudnn/cudnn_backend.h"
#include "backends/cudnn/plan_spec.h"
#include "fusedattn/fusedattn.h"
#include "problem/problem.h"
#include "select/backend.h"
#include "select/select.h"
#include "testing/tensors.h"

using namespace fusedattn;
using Clock = std::chrono::steady_clock;

namespace {

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }
double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

bool Check(fusedattn_status status, const char* what, const char* msg) {
  if (status == FUSEDATTN_SUCCESS) return true;
  std::printf("\n%s failed: %s: %s\n", what, fusedattn_status_string(status), msg);
  return false;
}

// The structure of the plan figures: causal self-attention, training (forward and backward).
fusedattn_config Structure(int64_t batch, int64_t seqlen) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = batch, c.heads_q = 8, c.heads_kv = 8, c.max_seqlen_q = seqlen;
  c.max_seqlen_kv = seqlen, c.head_dim_qk = 64, c.head_dim_v = 64;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  c.mask = FUSEDATTN_MASK_CAUSAL;
  c.is_training = 1;
  c.backend = FUSEDATTN_BACKEND_CUDNN;
  c.device = FUSEDATTN_DEVICE_CUDA;
  return c;
}

// One plan figure: the time of fusedattn_get_backend on a new problem, whose check() builds (or
// finds) the forward and, for training, the backward plan; and how they were built.
struct Build {
  double ms = -1;
  cudnn::PlanBuildStats delta;
  std::string how;
};

Build TimeBuild(const fusedattn_config& c) {
  Build b;
  char msg[8192];
  fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
  const cudnn::PlanBuildStats before = cudnn::GetPlanBuildStats();
  const auto t0 = Clock::now();
  fusedattn_status s = fusedattn_get_backend(&c, &chosen, msg, sizeof msg);
  b.ms = Ms(Clock::now() - t0);
  const cudnn::PlanBuildStats after = cudnn::GetPlanBuildStats();
  if (!Check(s, "fusedattn_get_backend", msg)) return Build{};
  b.delta.builds = after.builds - before.builds;
  b.delta.dynamic = after.dynamic - before.dynamic;
  b.delta.unified = after.unified - before.unified;
  b.delta.per_shape = after.per_shape - before.per_shape;
  b.delta.kernel_caches_loaded = after.kernel_caches_loaded - before.kernel_caches_loaded;
  b.delta.kernel_caches_saved = after.kernel_caches_saved - before.kernel_caches_saved;
  b.delta.batch_chunked = after.batch_chunked - before.batch_chunked;
  b.delta.seqlen_routed = after.seqlen_routed - before.seqlen_routed;
  b.delta.route_plans = after.route_plans - before.route_plans;
  b.delta.plans_read = after.plans_read - before.plans_read;
  b.delta.plans_written = after.plans_written - before.plans_written;
  std::string how;
  auto add = [&](uint64_t n, const char* what) {
    if (n) how += Format("%s%llu %s", how.empty() ? "" : ", ", (unsigned long long)n, what);
  };
  add(b.delta.dynamic, "dynamic");
  add(b.delta.unified, "unified");
  add(b.delta.per_shape, "per-shape");
  add(b.delta.kernel_caches_loaded, "kernel caches read");
  add(b.delta.kernel_caches_saved, "kernel caches written");
  add(b.delta.batch_chunked, "in batch chunks of a built plan");
  add(b.delta.route_plans, "ragged for the sequence-length route (of those above)");
  add(b.delta.seqlen_routed, "through a ragged plan");
  add(b.delta.plans_read, "read from the plan store");
  add(b.delta.plans_written, "stored");
  b.how = how.empty() ? "cached plans" : how;
  return b;
}

void Row(const std::string& what, const Build& b) {
  if (b.ms < 0)
    std::printf("| %s | failed | | |\n", what.c_str());
  else
    std::printf("| %s | %.1f | %llu | %s |\n", what.c_str(), b.ms,
                (unsigned long long)b.delta.builds, b.how.c_str());
}

// Automatic selection of new shapes (background builds, the default; cuDNN README "Background
// builds"): the structure's first shape builds in the call; a new length or batch beyond what
// built plans cover is chosen at once for the next backend while its plans build on the worker,
// and cuDNN is chosen again once they are built. The time of fusedattn_get_backend, the backend
// chosen, and how long until cuDNN is chosen again (polled every 0.2 ms).
void AutoNewShapes() {
  std::printf("\n### Automatic selection of new shapes (background builds, the default)\n\n");
  std::printf("| what (auto) | selection ms | chosen | cuDNN chosen again after ms |\n"
              "|---|---|---|---|\n");
  auto row = [](const char* what, int64_t batch, int64_t seqlen) {
    fusedattn_config c = Structure(batch, seqlen);
    c.backend = FUSEDATTN_BACKEND_AUTO;
    char msg[8192];
    fusedattn_backend chosen = FUSEDATTN_BACKEND_AUTO;
    const auto t0 = Clock::now();
    if (!Check(fusedattn_get_backend(&c, &chosen, msg, sizeof msg), "fusedattn_get_backend", msg))
      return;
    const double ms = Ms(Clock::now() - t0);
    std::string again = chosen == FUSEDATTN_BACKEND_CUDNN ? "(chosen)" : "never (5 s)";
    if (chosen != FUSEDATTN_BACKEND_CUDNN) {
      const auto t1 = Clock::now();
      while (Ms(Clock::now() - t1) < 5000) {
        fusedattn_backend now = FUSEDATTN_BACKEND_AUTO;
        if (fusedattn_get_backend(&c, &now, msg, sizeof msg) == FUSEDATTN_SUCCESS &&
            now == FUSEDATTN_BACKEND_CUDNN) {
          again = Format("%.1f", Ms(Clock::now() - t1) + ms);
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    std::printf("| %s | %.2f | %s | %s |\n", what, ms, fusedattn_backend_name(chosen),
                again.c_str());
  };
  row("s=128, b=2 (the structure's first shape: built in the call)", 2, 128);
  row("new sequence length s=256, b=2", 2, 256);
  row("new sequence length s=200, b=2 (within the ragged plans of 2 x 256)", 2, 200);
  row("new sequence length s=600, b=2 (beyond them)", 2, 600);
  row("new batch b=16, s=1000", 16, 1000);
  cudnn::WaitForBackgroundBuilds();
}

// A plan lookup on a warm cache: check() of a built problem, many times.
double WarmCheckUs(const fusedattn_config& c) {
  Problem p;
  if (!MakeProblem(&c, true, &p).ok()) return -1;
  Backend* backend = CudnnBackend();
  const int kLookups = 2000;
  const auto t0 = Clock::now();
  for (int i = 0; i < kLookups; ++i) (void)backend->check(p);
  return Us(Clock::now() - t0) / kLookups;
}

// ------------------------------------------------------------------------------------------------
// The second process
// ------------------------------------------------------------------------------------------------
// --child: cuDNN's start-up (a tiny no-mask forward, as in the parent), then the structure at
// batch 1 (the plans the parent built first) and at batch 5; one line of figures for the parent.
int Child() {
  if (!testing::CudaDeviceAvailable()) return 1;
  const auto t0 = Clock::now();
  fusedattn_config warmup = Structure(1, 64);
  warmup.mask = FUSEDATTN_MASK_NONE, warmup.is_training = 0;
  Build start = TimeBuild(warmup);
  const double startup_ms = Ms(Clock::now() - t0);
  Build first = TimeBuild(Structure(1, 128));  // the parent's first plans of the structure
  Build batch5 = TimeBuild(Structure(5, 128));
  // New lengths (the sequence-length route; with dynamic shapes, which turn it off, dynamic-shape
  // plans of their own): s=256 reads its plans and the ragged ones of 2 x 256 the parent stored,
  // s=200 runs through those.
  Build seqlen = TimeBuild(Structure(2, 256));
  Build routed = TimeBuild(Structure(2, 200));
  if (start.ms < 0 || first.ms < 0 || batch5.ms < 0 || seqlen.ms < 0 || routed.ms < 0) return 1;
  std::printf("CHILD startup_ms=%.3f build_ms=%.3f build_plans=%llu loaded=%llu dynamic=%llu "
              "saved=%llu read=%llu new_batch_ms=%.3f new_seqlen_ms=%.3f new_seqlen_read=%llu "
              "routed_seqlen_ms=%.3f routed_seqlen_plans=%llu\n",
              startup_ms, first.ms, (unsigned long long)first.delta.builds,
              (unsigned long long)first.delta.kernel_caches_loaded,
              (unsigned long long)first.delta.dynamic,
              (unsigned long long)first.delta.kernel_caches_saved,
              (unsigned long long)first.delta.plans_read, batch5.ms, seqlen.ms,
              (unsigned long long)seqlen.delta.plans_read, routed.ms,
              (unsigned long long)routed.delta.builds);
  return 0;
}

// label: "experimental: " for the dynamic rows, "" for the default (plans from the plan store).
void SecondProcess(const char* self, const char* label) {
  const std::string command = std::string("'") + self + "' --child";
  FILE* p = popen(command.c_str(), "r");
  double startup = -1, build = -1, new_batch = -1, new_seqlen = -1, routed_seqlen = -1;
  unsigned long long plans = 0, loaded = 0, dynamic = 0, saved = 0, read = 0, seqlen_read = 0;
  unsigned long long routed_plans = 0;
  if (p != nullptr) {
    char line[1024];
    while (std::fgets(line, sizeof line, p))
      if (std::strncmp(line, "CHILD ", 6) == 0)
        std::sscanf(line,
                    "CHILD startup_ms=%lf build_ms=%lf build_plans=%llu loaded=%llu dynamic=%llu "
                    "saved=%llu read=%llu new_batch_ms=%lf new_seqlen_ms=%lf new_seqlen_read=%llu "
                    "routed_seqlen_ms=%lf routed_seqlen_plans=%llu",
                    &startup, &build, &plans, &loaded, &dynamic, &saved, &read, &new_batch,
                    &new_seqlen, &seqlen_read, &routed_seqlen, &routed_plans);
    pclose(p);
  }
  if (build < 0) {
    std::printf("| %ssecond process | failed (run `%s --child` to see why) | | |\n", label,
                self);
    return;
  }
  std::printf("| %ssecond process, cuDNN start-up (first handle, tiny forward) | %.1f | | |\n",
              label, startup);
  std::printf("| %ssecond process, forward + backward of the structure, b=1 | %.1f | %llu | "
              "%llu dynamic, %llu kernel caches read from disk, %llu written, %llu plans read "
              "from the plan store |\n",
              label, build, plans, dynamic, loaded, saved, read);
  std::printf("| %ssecond process, then batch 5 | %.1f | | |\n", label, new_batch);
  std::printf("| %ssecond process, then new sequence length s=256, b=2 | %.1f | | %llu plans "
              "read from the plan store |\n",
              label, new_seqlen, seqlen_read);
  std::printf("| %ssecond process, then new sequence length s=200, b=2 | %.1f | %llu | |\n",
              label, routed_seqlen, routed_plans);
}

// ------------------------------------------------------------------------------------------------
// Device time
// ------------------------------------------------------------------------------------------------
// Device time per back-to-back forward + backward (cudaEvents around `iterations` pairs).
double DeviceMsPerStep(const fusedattn_config& c, int iterations) {
  testing::ProblemTensors host = testing::MakeProblemTensors(c, {});
  testing::DeviceProblem dev;
  std::string error;
  if (!dev.upload(host, &error)) return -1;
  char msg[4096];
  size_t fb = 0, bb = 0;
  if (!Check(fusedattn_fwd_workspace_size(&c, &fb, msg, sizeof msg), "fwd workspace", msg) ||
      !Check(fusedattn_bwd_workspace_size(&c, &bb, msg, sizeof msg), "bwd workspace", msg))
    return -1;
  void* ws = nullptr;
  const size_t bytes = std::max<size_t>(std::max(fb, bb), 1);
  if (cudaMalloc(&ws, bytes) != cudaSuccess) return -1;
  fusedattn_fwd_args fa = dev.fwd_args();
  fusedattn_bwd_args ba = dev.bwd_args();
  auto step = [&] {
    return fusedattn_fwd(&c, &fa, ws, bytes, nullptr, msg, sizeof msg) == FUSEDATTN_SUCCESS &&
           fusedattn_bwd(&c, &ba, ws, bytes, nullptr, msg, sizeof msg) == FUSEDATTN_SUCCESS;
  };
  double ms = -1;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  bool ok = step() && step();  // warm
  if (ok) {
    cudaEventRecord(start);
    for (int i = 0; i < iterations && ok; ++i) ok = step();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float total = 0;
    cudaEventElapsedTime(&total, start, stop);
    if (ok) ms = total / iterations;
  }
  if (!ok) std::printf("\ndevice time run failed: %s\n", msg);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(ws);
  return ms;
}

// ------------------------------------------------------------------------------------------------
// Host cost
// ------------------------------------------------------------------------------------------------
struct HostCost {
  double fwd_us = -1, bwd_us = -1;
  int fwd_launches = 0, bwd_launches = 0;  // ours, around cuDNN's graph
};

// Our kernel launches per call, from the call plans of these tensors (routed: of the THD form the
// sequence-length route runs, at the problem's own extents).
void CountLaunches(const fusedattn_config& c, const testing::DeviceProblem& dev, bool routed,
                   HostCost* out) {
  Problem p;
  if (!MakeProblem(&c, true, &p).ok()) return;
  fusedattn_fwd_args fa = dev.fwd_args();
  fusedattn_bwd_args ba = dev.bwd_args();
  FwdTensors ft;
  BwdTensors bt;
  if (!MakeFwdTensors(p, &fa, &ft).ok() || !MakeBwdTensors(p, &ba, &bt).ok()) return;
  Problem e = cudnn::EffectiveProblem(p);
  if (routed) e = cudnn::RoutedProblem(e, cudnn::RouteExtentsOf(e));
  const cudnn::CallPlan f = cudnn::ForwardCallPlan(e, ft);
  const cudnn::CallPlan b = cudnn::BackwardCallPlan(e, bt);
  out->fwd_launches = (f.prep ? 1 : 0) + (f.fixup ? 1 : 0);
  out->bwd_launches = (b.prep ? 1 : 0) + ((b.fixup || b.fixup_dbias || b.dsink) ? 1 : 0);
}

HostCost MeasureHost(const fusedattn_config& c, int iterations, bool routed = false) {
  HostCost cost;
  testing::ProblemTensors host = testing::MakeProblemTensors(c, {});
  testing::DeviceProblem dev;
  std::string error;
  if (!dev.upload(host, &error)) {
    std::printf("\nupload failed: %s\n", error.c_str());
    return cost;
  }
  char msg[4096];
  size_t fb = 0, bb = 0;
  if (!Check(fusedattn_fwd_workspace_size(&c, &fb, msg, sizeof msg), "fwd workspace", msg) ||
      !Check(fusedattn_bwd_workspace_size(&c, &bb, msg, sizeof msg), "bwd workspace", msg))
    return cost;
  const size_t bytes = std::max<size_t>(std::max(fb, bb), 1);
  void* ws = nullptr;
  if (cudaMalloc(&ws, bytes) != cudaSuccess) return cost;
  cudaStream_t stream = nullptr;
  cudaStreamCreate(&stream);
  fusedattn_fwd_args fa = dev.fwd_args();
  fusedattn_bwd_args ba = dev.bwd_args();
  std::vector<double> fwd, bwd;
  bool ok = true;
  for (int i = 0; i < iterations + 10 && ok; ++i) {  // the first 10: warm-up, not counted
    auto t0 = Clock::now();
    ok = Check(fusedattn_fwd(&c, &fa, ws, bytes, stream, msg, sizeof msg), "fusedattn_fwd", msg);
    auto t1 = Clock::now();
    ok = ok && Check(fusedattn_bwd(&c, &ba, ws, bytes, stream, msg, sizeof msg), "fusedattn_bwd",
                     msg);
    auto t2 = Clock::now();
    if (i >= 10) fwd.push_back(Us(t1 - t0)), bwd.push_back(Us(t2 - t1));
    // Keep the queue short so that a full launch queue never blocks the host.
    if (i % 64 == 63) cudaStreamSynchronize(stream);
  }
  cudaStreamSynchronize(stream);
  if (ok) {
    cost.fwd_us = Median(fwd);
    cost.bwd_us = Median(bwd);
    CountLaunches(c, dev, routed, &cost);
  }
  cudaStreamDestroy(stream);
  cudaFree(ws);
  return cost;
}

// Where the host time of one dense forward goes: each stage of the entry point on its own (median
// over `iterations` calls, warm).
void StageTimes(const fusedattn_config& c, int iterations) {
  testing::ProblemTensors host = testing::MakeProblemTensors(c, {});
  testing::DeviceProblem dev;
  std::string error;
  if (!dev.upload(host, &error)) return;
  char msg[4096];
  size_t bytes = 0;
  if (!Check(fusedattn_fwd_workspace_size(&c, &bytes, msg, sizeof msg), "fwd workspace", msg))
    return;
  void* ws = nullptr;
  if (cudaMalloc(&ws, std::max<size_t>(bytes, 1)) != cudaSuccess) return;
  const fusedattn_fwd_args fa = dev.fwd_args();
  const char* names[4] = {"MakeProblem", "MakeFwdTensors", "SelectBackendAndWorkspace",
                          "cuDNN backend forward (plan lookup, launches)"};
  std::vector<double> times[4];
  for (int i = 0; i < iterations; ++i) {
    Problem p;
    FwdTensors t;
    Backend* backend = nullptr;
    size_t needed = 0;
    auto t0 = Clock::now();
    Status s = MakeProblem(&c, true, &p);
    auto t1 = Clock::now();
    if (s.ok()) s = MakeFwdTensors(p, &fa, &t);
    auto t2 = Clock::now();
    if (s.ok()) s = SelectBackendAndWorkspace(p, false, &backend, &needed);
    auto t3 = Clock::now();
    if (s.ok()) s = backend->forward(p, t, ws, std::max<size_t>(bytes, 1), nullptr);
    auto t4 = Clock::now();
    if (!s.ok()) {
      std::printf("\nstage breakdown failed: %s\n", s.message().c_str());
      break;
    }
    const Clock::time_point marks[5] = {t0, t1, t2, t3, t4};
    for (int k = 0; k < 4; ++k) times[k].push_back(Us(marks[k + 1] - marks[k]));
    if (i % 64 == 63) cudaDeviceSynchronize();
  }
  cudaDeviceSynchronize();
  std::printf("\n| stage of a warm dense forward | median µs |\n|---|---|\n");
  for (int k = 0; k < 4; ++k) std::printf("| %s | %.2f |\n", names[k], Median(times[k]));
  cudaFree(ws);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--child") == 0) return Child();
  int iterations = argc > 1 ? std::atoi(argv[1]) : 2000;
  if (iterations < 1) iterations = 1;
  if (!testing::CudaDeviceAvailable()) {
    std::printf("cudnn_overhead: no CUDA device, nothing measured\n");
    return 0;
  }
  char msg[512];
  if (!fusedattn_backend_available(FUSEDATTN_BACKEND_CUDNN, msg, sizeof msg)) {
    std::printf("cudnn_overhead: cuDNN backend unavailable: %s\n", msg);
    return 0;
  }
  // Per-shape plans (the default) for every figure but the dynamic rows, which use what
  // FUSEDATTN_CUDNN_DYNAMIC_SHAPES asked for (when it asks for dynamic shapes) and a fresh on-disk
  // cache, so that their cold figures are cold; the child inherits both.
  const char* asked = std::getenv("FUSEDATTN_CUDNN_DYNAMIC_SHAPES");
  const std::string dynamic_value = asked != nullptr ? asked : "";
  const cudnn::DynamicShapesSetting dynamic_setting = cudnn::ParseDynamicShapes(
      asked, static_cast<int64_t>(fusedattn_cudnn_version()));
  const bool dynamic_rows = dynamic_setting.mode != cudnn::DynamicShapesMode::kOff;
  auto per_shape = [] {
    unsetenv("FUSEDATTN_CUDNN_DYNAMIC_SHAPES");
    unsetenv("FUSEDATTN_CUDNN_BATCH_CHUNKS");
    unsetenv("FUSEDATTN_CUDNN_SEQLEN_ROUTE");
    cudnn::ReloadSettings();
  };
  auto dynamic = [&] {
    setenv("FUSEDATTN_CUDNN_DYNAMIC_SHAPES", dynamic_value.c_str(), 1);
    setenv("FUSEDATTN_CUDNN_BATCH_CHUNKS", "1", 1);  // every new shape builds, dynamically
    setenv("FUSEDATTN_CUDNN_SEQLEN_ROUTE", "0", 1);
    cudnn::ReloadSettings();
  };
  char dir[] = "/tmp/fusedattn_cudnn_overhead_XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    std::printf("cudnn_overhead: cannot make a temporary directory\n");
    return 1;
  }
  setenv("FUSEDATTN_CACHE_DIR", dir, 1);
  per_shape();

  cudaDeviceProp prop{};
  int device = 0;
  cudaGetDevice(&device);
  cudaGetDeviceProperties(&prop, device);
  std::printf("## cuDNN backend: plans and host cost\n\n");
  std::printf("%s, cuDNN %lld, fusedattn %s, %d iterations per host figure\n\n", prop.name,
              (long long)fusedattn_cudnn_version(), fusedattn_version_string(), iterations);
  std::printf("- plans: per shape, a larger batch in batch chunks of a built plan, a new sequence "
              "length through a ragged plan (sequence-length route), plans stored on disk for "
              "later processes (the defaults)\n");
  if (dynamic_rows)
    std::printf("- dynamic-shape rows: EXPERIMENTAL, FUSEDATTN_CUDNN_DYNAMIC_SHAPES=%s (%s; "
                "check their results with FUSEDATTN_TEST_CUDNN_DYNAMIC=1 "
                "fusedattn_gpu_tests --gtest_filter='*CudnnDynamic*')\n\n",
                dynamic_value.c_str(), cudnn::kDynamicShapesWarning);
  else if (asked != nullptr && *asked != '\0')
    std::printf("- dynamic-shape rows: not measured (%s)\n\n", dynamic_setting.off_reason.c_str());
  else
    std::printf("- dynamic-shape rows: not measured (experimental, off by default; "
                "FUSEDATTN_CUDNN_DYNAMIC_SHAPES=1 adds them)\n\n");

  // ---- plans ----
  std::printf("### Plan builds (structure: bf16, h=8, d=64, causal, forward + backward)\n\n");
  std::printf("| what | ms | plans | how |\n|---|---|---|---|\n");
  const auto process_start = Clock::now();
  fusedattn_config warmup = Structure(1, 64);
  warmup.mask = FUSEDATTN_MASK_NONE, warmup.is_training = 0;
  Build start = TimeBuild(warmup);
  start.ms = Ms(Clock::now() - process_start);
  Row("cuDNN start-up (first handle, tiny no-mask forward)", start);
  for (int64_t batch = 1; batch <= 8; ++batch)
    Row(batch == 1 ? "cold: s=128, b=1 (the structure's first plans)"
                   : Format("new batch size b=%lld", (long long)batch),
        TimeBuild(Structure(batch, 128)));
  // Sequence lengths, with the sequence-length route (the default): the structure's second length
  // builds its plans and the ragged ones of its extents (2 sequences of 256 x 256 rows), later
  // lengths and batches within them (or within twice their own extents) run through those.
  Row("first new sequence length s=256, b=2 (its plans and the ragged ones of 2 x 256)",
      TimeBuild(Structure(2, 256)));
  Row("new sequence length s=200, b=2 (through them)", TimeBuild(Structure(2, 200)));
  Row("smaller batch b=1, s=256 (through them)", TimeBuild(Structure(1, 256)));
  {
    std::vector<double> ms;
    uint64_t built = 0, routed = 0;
    for (int64_t seqlen = 136; seqlen < 256; seqlen += 8) {
      if (seqlen == 200) continue;
      const Build b = TimeBuild(Structure(2, seqlen));
      ms.push_back(b.ms);
      built += b.delta.builds, routed += b.delta.seqlen_routed;
    }
    std::printf("| each of %zu more new lengths s=136..248, b=2: median / max ms | %.2f / %.2f | "
                "%llu | %llu through a ragged plan |\n",
                ms.size(), Median(ms), *std::max_element(ms.begin(), ms.end()),
                (unsigned long long)built, (unsigned long long)routed);
  }
  Row("new sequence length s=200, b=3 (a batch beyond them: its plans and the ragged ones of "
      "4 x 256)",
      TimeBuild(Structure(3, 200)));
  Row("new sequence length s=100, b=4 (through the ragged plans of 4 x 256)",
      TimeBuild(Structure(4, 100)));
  Row("new sequence length s=300, b=2 (beyond them: its plans and the ragged ones of 2 x 512)",
      TimeBuild(Structure(2, 300)));
  Row("repeated size b=3, s=128 (selection cache)", TimeBuild(Structure(3, 128)));
  std::fflush(stdout);
  SecondProcess(argv[0], "");  // reads the plans this process stored
  std::printf("| repeated size b=3, s=128: the plan lookup of check() alone | %.4f | 0 | |\n",
              WarmCheckUs(Structure(3, 128)) / 1000.0);
  // A new length with the route off: a plan of its own, what every new length cost before.
  setenv("FUSEDATTN_CUDNN_SEQLEN_ROUTE", "0", 1);
  cudnn::ReloadSettings();  // drops the plans: the structure's first ones again (plan store)
  TimeBuild(Structure(2, 128));
  Row("route off (FUSEDATTN_CUDNN_SEQLEN_ROUTE=0): new sequence length s=200, b=2",
      TimeBuild(Structure(2, 200)));
  unsetenv("FUSEDATTN_CUDNN_SEQLEN_ROUTE");
  cudnn::ReloadSettings();
  std::fflush(stdout);
  AutoNewShapes();

  fusedattn_config unified = Structure(1, 128);
  unified.mask = FUSEDATTN_MASK_NONE, unified.is_training = 0;
  for (int64_t batch = 1; batch <= 3; ++batch) {
    unified.batch = batch;
    Row(Format("no-mask forward only, b=%lld%s", (long long)batch,
               batch == 1 ? " (cold)" : ""),
        TimeBuild(unified));
  }

  if (dynamic_rows) {
    dynamic();  // also drops the plans above: the structure starts afresh
    const std::string disk = cudnn::DiskCacheDirectory();
    std::printf("\n### EXPERIMENTAL: dynamic-shape plans (FUSEDATTN_CUDNN_DYNAMIC_SHAPES=%s; "
                "on-disk kernel caches: %s)\n\n",
                dynamic_value.c_str(),
                disk.empty() ? cudnn::DiskCacheOffReason().c_str() : disk.c_str());
    std::printf("| what | ms | plans | how |\n|---|---|---|---|\n");
    for (int64_t batch = 1; batch <= 8; ++batch)
      Row(batch == 1 ? "experimental: s=128, b=1 (the structure's first plans, empty kernel "
                       "cache; cuDNN already started)"
                     : Format("experimental: new batch size b=%lld", (long long)batch),
          TimeBuild(Structure(batch, 128)));
    Row("experimental: new sequence length s=256, b=2", TimeBuild(Structure(2, 256)));
    Row("experimental: new sequence length s=200, b=3", TimeBuild(Structure(3, 200)));
    std::fflush(stdout);
    SecondProcess(argv[0], "experimental: ");
    per_shape();
  }

  // ---- device ----
  std::printf("\n### Device time per forward + backward, back to back (b=4, h=16, s=2048, "
              "d=128, causal, bf16)\n\n| plans | ms |\n|---|---|\n");
  fusedattn_config big = Structure(4, 2048);
  big.heads_q = big.heads_kv = 16, big.head_dim_qk = big.head_dim_v = 128;
  std::printf("| per shape | %.3f |\n", DeviceMsPerStep(big, 20));
  // New batch sizes of it: in batch chunks of built plans (the default: 8 = 4 + 4, and 5 = 4 + 1
  // once b=1 is built), and on plans of their own (batch chunks off); per 4 sequences.
  fusedattn_config one = big, five = big, eight = big;
  one.batch = 1, five.batch = 5, eight.batch = 8;
  std::printf("| b=8 in batch chunks 4 + 4 (per 4 sequences) | %.3f |\n",
              DeviceMsPerStep(eight, 20) / 2);
  std::printf("| b=1 (per 4 sequences) | %.3f |\n", DeviceMsPerStep(one, 20) * 4);
  std::printf("| b=5 in batch chunks 4 + 1 (per 4 sequences) | %.3f |\n",
              DeviceMsPerStep(five, 20) * 4 / 5);
  setenv("FUSEDATTN_CUDNN_BATCH_CHUNKS", "1", 1);
  cudnn::ReloadSettings();
  std::printf("| b=8 on a plan of its own (FUSEDATTN_CUDNN_BATCH_CHUNKS=1; per 4 sequences) | "
              "%.3f |\n",
              DeviceMsPerStep(eight, 20) / 2);
  std::printf("| b=5 on a plan of its own (FUSEDATTN_CUDNN_BATCH_CHUNKS=1; per 4 sequences) | "
              "%.3f |\n",
              DeviceMsPerStep(five, 20) * 4 / 5);
  unsetenv("FUSEDATTN_CUDNN_BATCH_CHUNKS");
  cudnn::ReloadSettings();
  // New lengths of it (b=4) through the ragged plans of 4 x 2048 x 2048 (the sequence-length
  // route, the default: s=1024 builds the structure's first plans, s=1500 its own and those
  // ragged ones), and on plans of their own (the route off); per 4 sequences of that length.
  {
    fusedattn_config s1900 = big, s1500 = big, s1100 = big, s1024 = big;
    s1900.max_seqlen_q = s1900.max_seqlen_kv = 1900;
    s1500.max_seqlen_q = s1500.max_seqlen_kv = 1500;
    s1100.max_seqlen_q = s1100.max_seqlen_kv = 1100;
    s1024.max_seqlen_q = s1024.max_seqlen_kv = 1024;
    DeviceMsPerStep(s1024, 1);
    DeviceMsPerStep(s1500, 1);
    const double routed_2048 = DeviceMsPerStep(big, 20);
    const double routed_1900 = DeviceMsPerStep(s1900, 20);
    const double routed_1100 = DeviceMsPerStep(s1100, 20);
    setenv("FUSEDATTN_CUDNN_SEQLEN_ROUTE", "0", 1);
    cudnn::ReloadSettings();
    const double own_1900 = DeviceMsPerStep(s1900, 20);
    const double own_1100 = DeviceMsPerStep(s1100, 20);
    unsetenv("FUSEDATTN_CUDNN_SEQLEN_ROUTE");
    cudnn::ReloadSettings();
    std::printf("| s=2048 through the ragged plans of 4 x 2048 (sequence-length route; its own: "
                "the first row) | %.3f |\n",
                routed_2048);
    std::printf("| s=1900 through the ragged plans of 4 x 2048 | %.3f |\n", routed_1900);
    std::printf("| s=1900 on a plan of its own (FUSEDATTN_CUDNN_SEQLEN_ROUTE=0) | %.3f |\n",
                own_1900);
    std::printf("| s=1100 through the ragged plans of 4 x 2048 | %.3f |\n", routed_1100);
    std::printf("| s=1100 on a plan of its own (FUSEDATTN_CUDNN_SEQLEN_ROUTE=0) | %.3f |\n",
                own_1100);
  }
  if (dynamic_rows) {
    dynamic();
    std::printf("| experimental: dynamic shapes (kernel cache) | %.3f |\n",
                DeviceMsPerStep(big, 20));
    per_shape();
  }

  // ---- host ----
  std::printf("\n### Warm host cost per call (b=2, h=8, s=128, d=64, bf16, causal masks; median "
              "µs of back-to-back calls)\n\n");
  std::printf("| problem | fusedattn_fwd µs | fusedattn_bwd µs | our launches fwd / bwd |\n"
              "|---|---|---|---|\n");
  struct HostCase {
    const char* name;
    fusedattn_config config;
    bool routed;  // a new length after the one above: through a ragged plan
  } cases[] = {{"dense BSHD, causal", Structure(2, 128), false},
               {"dense BSHD, causal, s=120 through the ragged plan of 2 x 128 (sequence-length "
                "route)",
                Structure(2, 120), true},
               {"padded BSHD, padding_causal", Structure(2, 128), false},
               {"THD, padding_causal", Structure(2, 128), false},
               {"BSHD causal, learnable sink", Structure(2, 128), false}};
  cases[2].config.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
  cases[3].config.mask = FUSEDATTN_MASK_PADDING_CAUSAL;
  cases[3].config.q_format = cases[3].config.kv_format = cases[3].config.o_format =
      cases[3].config.do_format = cases[3].config.dqkv_format = FUSEDATTN_FORMAT_THD;
  cases[4].config.softmax_type = FUSEDATTN_SOFTMAX_LEARNABLE_SINK;
  cudnn::ReloadSettings();  // the dense structure's first length is s=128 below
  for (const HostCase& k : cases) {
    // s=100 builds its plans and the ragged ones of 2 x 128, which s=120 then runs through.
    if (k.routed) TimeBuild(Structure(2, 100));
    const HostCost cost = MeasureHost(k.config, iterations, k.routed);
    std::printf("| %s | %.2f | %.2f | %d / %d |\n", k.name, cost.fwd_us, cost.bwd_us,
                cost.fwd_launches, cost.bwd_launches);
  }
  fusedattn_config dense_inference = Structure(2, 128);
  dense_inference.is_training = 0;
  StageTimes(dense_inference, iterations);

  const std::string remove = std::string("rm -rf '") + dir + "'";
  if (std::system(remove.c_str()) != 0) std::printf("\n(could not remove %s)\n", dir);
  return 0;
}
