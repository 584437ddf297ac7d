// Launchers of the helper kernels (reduce.cuh) and the device-code probe.
#include "backends/small_seq/reduce.cuh"
#include "common/cuda_util.h"

namespace fusedattn::small_seq {
namespace {

Status LaunchStatus(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return Status(FUSEDATTN_ERROR_CUDA,
                  Format("small_seq: launching the %s kernel failed: %s", what,
                         cudaGetErrorString(err)));
  return Status::Ok();
}

}  // namespace

Status LaunchFillNegativeInfinity(float* data, int64_t count, int64_t stride, void* stream) {
  if (count <= 0) return Status::Ok();
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>((count + kThreads - 1) / kThreads);
  FillKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(data, count, stride,
                                                                          -INFINITY);
  return LaunchStatus("max_logit fill");
}

Status LaunchSumPartials(const float* partials, int64_t batch, int64_t heads, int64_t keys,
                         int64_t out_batch, int64_t out_heads, const KernelBias& out,
                         void* stream) {
  const int64_t outputs = out_batch * out_heads * keys;
  if (outputs <= 0) return Status::Ok();
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t items = PartialSumOf(0, batch, heads, keys, out_batch, out_heads).items();
  if (items <= kItemsPerThread) {
    const auto blocks = static_cast<unsigned>((outputs + kThreadSumThreads - 1) / kThreadSumThreads);
    SumPartialsByThreadKernel<<<blocks, kThreadSumThreads, 0, s>>>(
        partials, batch, heads, keys, out_batch, out_heads, outputs, out);
  } else {
    SumPartialsKernel<<<static_cast<unsigned>(outputs), kSumThreads, 0, s>>>(
        partials, batch, heads, keys, out_batch, out_heads, out);
  }
  return LaunchStatus("partial sums");
}

Status KernelsRunOnCurrentDevice() {
  // The kernels are compiled for CMAKE_CUDA_ARCHITECTURES only; a device of another architecture
  // has no machine code for them (and no PTX to JIT when only sm_XXa is built).
  cudaFuncAttributes attributes;
  cudaError_t err = cudaFuncGetAttributes(&attributes, FillKernel);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    return NotSupported("%s", NoKernelForDeviceReason(cudaGetErrorString(err)).c_str());
  }
  return Status::Ok();
}

}  // namespace fusedattn::small_seq
