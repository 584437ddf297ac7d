// Device memory for the gpu tests, freed with the object. In a build without CUDA nothing is
// allocated (ptr stays null): the tests skip before they would use it.
#pragma once

#include <algorithm>
#include <cstddef>

#ifdef FUSEDATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "testing/tensors.h"

namespace fusedattn::testing {

// n bytes of device memory (ptr null when the allocation failed).
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
#ifdef FUSEDATTN_WITH_CUDA
    if (n > 0 && cudaMalloc(&ptr, n) != cudaSuccess) ptr = nullptr;
#endif
  }
  ~DeviceBuffer() {
#ifdef FUSEDATTN_WITH_CUDA
    if (ptr) cudaFree(ptr);
#endif
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// A device copy of a host tensor (same layout; at least 16 bytes, so that an empty tensor still
// has an address).
struct DeviceCopy {
  void* ptr = nullptr;
  explicit DeviceCopy(const HostTensor& t) {
#ifdef FUSEDATTN_WITH_CUDA
    if (cudaMalloc(&ptr, std::max<size_t>(t.storage_bytes(), 16)) != cudaSuccess) ptr = nullptr;
    if (ptr) cudaMemcpy(ptr, t.data(), t.storage_bytes(), cudaMemcpyHostToDevice);
#endif
  }
  ~DeviceCopy() {
#ifdef FUSEDATTN_WITH_CUDA
    if (ptr) cudaFree(ptr);
#endif
  }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
};

}  // namespace fusedattn::testing
