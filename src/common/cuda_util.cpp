#include "common/cuda_util.h"

#include <mutex>

#ifndef FUSEDATTN_CUDA_ARCH_NAMES
#define FUSEDATTN_CUDA_ARCH_NAMES ""
#endif

namespace fusedattn {

const char* BuiltCudaArchitectures() { return FUSEDATTN_CUDA_ARCH_NAMES; }

std::string NoKernelForDeviceReason(const std::string& detail) {
  const int cc = CurrentDeviceComputeCapability();
  std::string text = Format("no kernel for sm_%d in this build (built for %s); rebuild with "
                            "CUDAARCHS including %d",
                            cc, BuiltCudaArchitectures(), cc);
  if (!detail.empty()) text += ": " + detail;
  return text;
}

#ifdef FUSEDATTN_WITH_CUDA

namespace {
struct DeviceProbe {
  bool present = false;
  std::string reason;
};
const DeviceProbe& Probe() {
  static const DeviceProbe probe = [] {
    DeviceProbe p;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls start clean
      p.reason = Format("no CUDA device (%s)", cudaGetErrorString(err));
    } else if (count == 0) {
      p.reason = "no CUDA device";
    } else {
      p.present = true;
    }
    return p;
  }();
  return probe;
}
}  // namespace

bool HasCudaDevice() { return Probe().present; }
std::string NoCudaDeviceReason() { return Probe().reason; }

Status CopyToHost(void* host, const void* device, size_t bytes, void* stream) {
  if (bytes == 0) return Status::Ok();
  auto s = static_cast<cudaStream_t>(stream);
  FUSEDATTN_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDefault, s));
  FUSEDATTN_CUDA_CHECK(cudaStreamSynchronize(s));
  return Status::Ok();
}

Status CopyToDevice(void* device, const void* host, size_t bytes, void* stream) {
  if (bytes == 0) return Status::Ok();
  auto s = static_cast<cudaStream_t>(stream);
  FUSEDATTN_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyDefault, s));
  FUSEDATTN_CUDA_CHECK(cudaStreamSynchronize(s));
  return Status::Ok();
}

int CurrentDeviceComputeCapability() {
  if (!HasCudaDevice()) return 0;
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major * 10 + minor;
}

int CurrentCudaDevice() {
  if (!HasCudaDevice()) return -1;
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) return -1;
  return device;
}

#else

bool HasCudaDevice() { return false; }
std::string NoCudaDeviceReason() { return "built without CUDA"; }
Status CopyToHost(void*, const void*, size_t, void*) {
  return NotSupported("built without CUDA: cannot copy from device memory");
}
Status CopyToDevice(void*, const void*, size_t, void*) {
  return NotSupported("built without CUDA: cannot copy to device memory");
}
int CurrentDeviceComputeCapability() { return 0; }
int CurrentCudaDevice() { return -1; }

#endif

}  // namespace fusedattn
