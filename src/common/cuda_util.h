// The CUDA runtime as the library uses it from host code: is there a device, error checks, and
// copies between host and device for the reference backend. Compiles to "no device" without CUDA.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"

namespace fusedattn {

// True when the CUDA runtime sees at least one device. Queried once per process.
bool HasCudaDevice();
// The reason HasCudaDevice() is false ("built without CUDA", "no CUDA device: ...").
std::string NoCudaDeviceReason();

// Synchronous copies on `stream` (a cudaStream_t): device -> host and host -> device.
Status CopyToHost(void* host, const void* device, size_t bytes, void* stream);
Status CopyToDevice(void* device, const void* host, size_t bytes, void* stream);

// Compute capability (major * 10 + minor) of the current device, 0 if none.
int CurrentDeviceComputeCapability();
// The current CUDA device's ordinal, -1 if none.
int CurrentCudaDevice();

// The GPU architectures this build compiled kernels for, as "sm_80, sm_90a"
// (CMAKE_CUDA_ARCHITECTURES / CUDAARCHS when fusedattn was built); "" without CUDA.
const char* BuiltCudaArchitectures();
// A backend whose kernels have no image for the current device says this:
// "no kernel for sm_75 in this build (built for sm_80, sm_90a); rebuild with CUDAARCHS including
// 75", followed by ": <detail>" (the CUDA error) when detail is not empty.
std::string NoKernelForDeviceReason(const std::string& detail);

}  // namespace fusedattn

#ifdef FUSEDATTN_WITH_CUDA
#include <cuda_runtime_api.h>

#define FUSEDATTN_CUDA_CHECK(expr)                                                          \
  do {                                                                                      \
    cudaError_t err_ = (expr);                                                              \
    if (err_ != cudaSuccess)                                                                \
      return ::fusedattn::Status(FUSEDATTN_ERROR_CUDA,                                      \
                                 ::fusedattn::Format("%s failed: %s (%s:%d)", #expr,        \
                                                     cudaGetErrorString(err_), __FILE__, __LINE__)); \
  } while (0)
#endif
