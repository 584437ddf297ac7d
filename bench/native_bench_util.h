// What the native benchmarks (flash_bench, fp8_bench, small_seq_bench) share: dense device
// tensors and event timing. Errors are printed and returned (the caller decides whether to go on),
// so one failing configuration does not end a sweep.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "fusedattn/fusedattn.h"

namespace fusedattn::bench {

inline bool CudaOk(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::printf("%s: %s\n", what, cudaGetErrorString(err));
  return false;
}

inline bool ApiOk(fusedattn_status status, const char* what, const char* msg) {
  if (status == FUSEDATTN_SUCCESS) return true;
  std::printf("%s: %s: %s\n", what, fusedattn_status_string(status), msg);
  return false;
}

inline size_t ElementBytes(fusedattn_dtype dtype) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT32:
    case FUSEDATTN_DTYPE_INT32: return 4;
    case FUSEDATTN_DTYPE_FLOAT16:
    case FUSEDATTN_DTYPE_BFLOAT16: return 2;
    default: return 1;  // FP8
  }
}

// A dense (row-major strides) device tensor of `dtype` and `shape`. `data` is null when the
// allocation failed (said on stdout).
struct DeviceTensor {
  void* data = nullptr;
  fusedattn_tensor desc{};
  int64_t count = 1;  // elements

  // Uninitialized contents.
  DeviceTensor(fusedattn_dtype dtype, const std::vector<int64_t>& shape) {
    desc.dtype = dtype;
    desc.ndim = static_cast<int32_t>(shape.size());
    for (int d = desc.ndim - 1; d >= 0; --d) {
      desc.shape[d] = shape[d];
      desc.strides[d] = count;
      count *= shape[d];
    }
    if (!CudaOk(cudaMalloc(&data, count * ElementBytes(dtype)), "cudaMalloc")) data = nullptr;
    desc.data = data;
  }
  // With `fill`: values uniform in [-1, 1] drawn from `rng` (as float), rounded to the dtype.
  DeviceTensor(fusedattn_dtype dtype, const std::vector<int64_t>& shape, std::mt19937& rng,
               bool fill)
      : DeviceTensor(dtype, shape) {
    if (!data || !fill) return;
    std::vector<unsigned char> host(count * ElementBytes(dtype));
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    for (int64_t i = 0; i < count; ++i) StoreFromDouble(host.data(), dtype, i, dist(rng));
    CudaOk(cudaMemcpy(data, host.data(), host.size(), cudaMemcpyHostToDevice), "upload");
  }
  ~DeviceTensor() {
    if (data) cudaFree(data);
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
};

// Milliseconds per call of `run` (which returns false on an error, said), after two warm-up
// calls, from events on the default stream around `iters` calls; -1 on an error. *host_ms (when
// given): the host's time per call to return, which bounds the device time from below when it
// is the larger (host-bound calls).
template <typename Run>
double TimeMs(int iters, Run&& run, double* host_ms = nullptr) {
  for (int i = 0; i < 2; ++i)
    if (!run()) return -1;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  const auto host_start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i)
    if (!run()) return -1;
  if (host_ms)
    *host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                         host_start)
                   .count() /
               iters;
  cudaEventRecord(stop);
  if (!CudaOk(cudaEventSynchronize(stop), "kernel")) return -1;
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / iters;
}

}  // namespace fusedattn::bench
