// The cuDNN backend's plan and host costs, on a GPU:
//   cold plan build   check() with an empty plan cache (builds the forward, or forward and
//                      backward graphs, as fusedattn_get_backend does on a new problem)
//   warm lookup       check() again (plan cache hit)
//   host overhead     wall time per fusedattn_fwd / fusedattn_bwd call on a warm cache, calls
//                      queued back to back (the GPU work is tiny and runs behind)
// Usage: cudnn_overhead [iterations]   (prints one line per figure; exits 0 without a GPU)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cudnn/cudnn_backend.h"
#include "fusedattn/fusedattn.h"
#include "problem/problem.h"
#include "select/backend.h"
#include "select/select.h"
#include "testing/tensors.h"

using namespace fusedattn;
using Clock = std::chrono::steady_clock;

namespace {

double Microseconds(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

bool Check(fusedattn_status status, const char* what, const char* msg) {
  if (status == FUSEDATTN_SUCCESS) return true;
  std::printf("%s failed: %s: %s\n", what, fusedattn_status_string(status), msg);
  return false;
}

fusedattn_config SmallConfig(fusedattn_mask mask) {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  c.batch = 2, c.heads_q = 8, c.heads_kv = 8, c.max_seqlen_q = 128, c.max_seqlen_kv = 128;
  c.head_dim_qk = 64, c.head_dim_v = 64;
  c.qkv_dtype = c.o_dtype = FUSEDATTN_DTYPE_BFLOAT16;
  c.mask = mask;
  c.backend = FUSEDATTN_BACKEND_CUDNN;
  c.device = FUSEDATTN_DEVICE_CUDA;
  return c;
}

// Cold and warm check() of one config.
void PlanTimes(const char* label, fusedattn_config c) {
  Problem p;
  Status s = MakeProblem(&c, true, &p);
  if (!s.ok()) {
    std::printf("%s: %s\n", label, s.message().c_str());
    return;
  }
  Backend* backend = CudnnBackend();
  cudnn::ClearPlanCache();
  auto t0 = Clock::now();
  s = backend->check(p);
  auto t1 = Clock::now();
  if (!s.ok()) {
    std::printf("%s: check refused: %s\n", label, s.message().c_str());
    return;
  }
  const int kLookups = 10000;
  auto t2 = Clock::now();
  for (int i = 0; i < kLookups; ++i) (void)backend->check(p);
  auto t3 = Clock::now();
  std::printf("%-40s cold plan build %9.1f ms   warm check (cache hit) %6.2f us\n", label,
              Microseconds(t1 - t0) / 1000.0, Microseconds(t3 - t2) / kLookups);
}

// Where the host time of one fusedattn_fwd goes: each stage of the entry point on its own,
// run `iterations` times (median of per-call wall time), on a warm cache.
void StageTimes(const fusedattn_config& c, const fusedattn_fwd_args& fa, void* workspace,
                size_t bytes, cudaStream_t stream, int iterations) {
  Problem p;
  FwdTensors t;
  Backend* backend = nullptr;
  size_t needed = 0;
  std::vector<double> times[5];
  for (int i = 0; i < iterations; ++i) {
    auto t0 = Clock::now();
    Status s = MakeProblem(&c, true, &p);
    auto t1 = Clock::now();
    if (s.ok()) s = MakeFwdTensors(p, &fa, &t);
    auto t2 = Clock::now();
    if (s.ok()) s = SelectBackend(p, false, &backend, nullptr);
    auto t3 = Clock::now();
    if (s.ok()) s = backend->fwd_workspace_size(p, &needed);
    auto t4 = Clock::now();
    if (s.ok()) s = backend->forward(p, t, workspace, bytes, stream);
    auto t5 = Clock::now();
    if (!s.ok()) {
      std::printf("stage breakdown failed: %s\n", s.message().c_str());
      return;
    }
    const Clock::time_point marks[6] = {t0, t1, t2, t3, t4, t5};
    for (int k = 0; k < 5; ++k) times[k].push_back(Microseconds(marks[k + 1] - marks[k]));
    if (i % 64 == 63) cudaStreamSynchronize(stream);
  }
  cudaStreamSynchronize(stream);
  const char* names[5] = {"MakeProblem", "MakeFwdTensors", "SelectBackend",
                          "fwd_workspace_size", "backend forward (plan lookup + cuDNN execute)"};
  for (int k = 0; k < 5; ++k) {
    std::sort(times[k].begin(), times[k].end());
    std::printf("    stage %-46s median %6.2f us\n", names[k], times[k][times[k].size() / 2]);
  }
}

// Host wall time per call of fusedattn_fwd (and fusedattn_bwd when training) on a warm cache.
void HostOverhead(const char* label, fusedattn_config c, int iterations, bool breakdown = false) {
  testing::TensorOptions options;
  options.bias_dtype = c.qkv_dtype;
  testing::ProblemTensors host = testing::MakeProblemTensors(c, options);
  testing::DeviceProblem dev;
  std::string error;
  if (!dev.upload(host, &error)) {
    std::printf("%s: upload failed: %s\n", label, error.c_str());
    return;
  }
  char msg[2048];
  size_t fwd_bytes = 0, bwd_bytes = 0;
  if (!Check(fusedattn_fwd_workspace_size(&c, &fwd_bytes, msg, sizeof msg), "fwd workspace", msg))
    return;
  if (c.is_training &&
      !Check(fusedattn_bwd_workspace_size(&c, &bwd_bytes, msg, sizeof msg), "bwd workspace", msg))
    return;
  size_t bytes = std::max<size_t>(std::max(fwd_bytes, bwd_bytes), 1);
  void* workspace = nullptr;
  if (cudaMalloc(&workspace, bytes) != cudaSuccess) {
    std::printf("%s: cudaMalloc of %zu bytes failed\n", label, bytes);
    return;
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreate(&stream);
  fusedattn_fwd_args fa = dev.fwd_args();
  fusedattn_bwd_args ba = dev.bwd_args();

  auto run_fwd = [&] { return fusedattn_fwd(&c, &fa, workspace, bytes, stream, msg, sizeof msg); };
  auto run_bwd = [&] { return fusedattn_bwd(&c, &ba, workspace, bytes, stream, msg, sizeof msg); };
  for (int i = 0; i < 10; ++i) {  // warm: selection, plans, handles, lazy module loading
    if (!Check(run_fwd(), "fusedattn_fwd", msg)) return;
    if (c.is_training && !Check(run_bwd(), "fusedattn_bwd", msg)) return;
  }
  cudaStreamSynchronize(stream);

  std::vector<double> fwd_us, bwd_us;
  for (int i = 0; i < iterations; ++i) {
    auto t0 = Clock::now();
    fusedattn_status st = run_fwd();
    auto t1 = Clock::now();
    if (!Check(st, "fusedattn_fwd", msg)) return;
    fwd_us.push_back(Microseconds(t1 - t0));
    if (c.is_training) {
      t0 = Clock::now();
      st = run_bwd();
      t1 = Clock::now();
      if (!Check(st, "fusedattn_bwd", msg)) return;
      bwd_us.push_back(Microseconds(t1 - t0));
    }
    // Keep the launch queue short so that a full queue never blocks the host.
    if (i % 64 == 63) cudaStreamSynchronize(stream);
  }
  cudaStreamSynchronize(stream);
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto minimum = [](const std::vector<double>& v) {
    return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
  };
  if (breakdown) StageTimes(c, fa, workspace, bytes, stream, iterations);
  std::printf("%-40s host per fusedattn_fwd: median %6.2f us, min %6.2f us", label,
              median(fwd_us), minimum(fwd_us));
  if (c.is_training)
    std::printf("   per fusedattn_bwd: median %6.2f us, min %6.2f us", median(bwd_us),
                minimum(bwd_us));
  std::printf("\n");
  cudaStreamDestroy(stream);
  cudaFree(workspace);
}

}  // namespace

int main(int argc, char** argv) {
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
  std::printf("cuDNN %lld, b=2 h=8 s=128 d=64 bf16\n", (long long)fusedattn_cudnn_version());

  fusedattn_config inference = SmallConfig(FUSEDATTN_MASK_NONE);
  fusedattn_config causal = SmallConfig(FUSEDATTN_MASK_CAUSAL);
  fusedattn_config training = SmallConfig(FUSEDATTN_MASK_CAUSAL);
  training.is_training = 1;
  fusedattn_config padded = SmallConfig(FUSEDATTN_MASK_PADDING_CAUSAL);
  padded.is_training = 1;
  fusedattn_config thd = SmallConfig(FUSEDATTN_MASK_PADDING_CAUSAL);
  thd.q_format = thd.kv_format = thd.o_format = thd.do_format = thd.dqkv_format =
      FUSEDATTN_FORMAT_THD;
  thd.is_training = 1;

  // Load cuDNN's engine libraries and create a handle first, so the cold builds below time the
  // graphs alone.
  fusedattn_config warmup = SmallConfig(FUSEDATTN_MASK_NONE);
  warmup.max_seqlen_q = warmup.max_seqlen_kv = 64;
  PlanTimes("(warm-up: first build in the process)", warmup);

  PlanTimes("forward, no mask", inference);
  PlanTimes("forward + backward, causal", training);
  PlanTimes("forward + backward, padding causal", padded);
  PlanTimes("forward + backward, THD causal", thd);

  ClearSelectionCache();
  HostOverhead("no mask, inference", inference, iterations, /*breakdown=*/true);
  HostOverhead("causal, inference", causal, iterations);
  HostOverhead("causal, training", training, iterations);
  HostOverhead("padding causal (prep + fix-up kernels)", padded, iterations);
  HostOverhead("THD causal (prep + fix-up kernels)", thd, iterations);

  fusedattn_cache_stats stats{};
  fusedattn_get_cache_stats(FUSEDATTN_BACKEND_CUDNN, &stats);
  std::printf("plan cache: %llu hits, %llu misses, %llu evictions, %llu entries of %llu\n",
              (unsigned long long)stats.hits, (unsigned long long)stats.misses,
              (unsigned long long)stats.evictions, (unsigned long long)stats.entries,
              (unsigned long long)stats.capacity);
  return 0;
}
