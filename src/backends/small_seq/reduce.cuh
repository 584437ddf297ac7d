// Small helper kernels of the small_seq backend: max_logit's -inf start and the fixed-order sums
// of per-(b, h) partials (dsink, broadcast dbias).
#pragma once

#include "backends/small_seq/device.cuh"

namespace fusedattn::small_seq {

__global__ void FillKernel(float* data, int64_t count, int64_t stride, float value) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < count) data[i * stride] = value;
}

// One block per output element. Thread t sums items t, t + kSumThreads, ... in order, then the
// block adds the threads' sums in a fixed tree: the same result on every run.
constexpr int kSumThreads = 512;

__global__ void __launch_bounds__(kSumThreads)
    SumPartialsKernel(const float* partials, int64_t batch, int64_t heads, int64_t keys,
                      int64_t out_batch, int64_t out_heads, KernelBias out) {
  const int64_t output = blockIdx.x;
  const int64_t j = output % keys;
  const int64_t out_head = (output / keys) % out_heads;
  const int64_t out_b = output / keys / out_heads;
  // A broadcast output axis sums over all of that axis; otherwise it is the output's own index.
  const int64_t b_count = out_batch == 1 ? batch : 1, b_first = out_batch == 1 ? 0 : out_b;
  const int64_t h_count = out_heads == 1 ? heads : 1, h_first = out_heads == 1 ? 0 : out_head;
  const int64_t items = b_count * h_count;
  float sum = 0.0f;
#pragma unroll 4
  for (int64_t item = threadIdx.x; item < items; item += kSumThreads) {
    const int64_t b = b_first + item / h_count, h = h_first + item % h_count;
    sum += partials[(b * heads + h) * keys + j];
  }
  __shared__ float sums[kSumThreads];
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kSumThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) sums[threadIdx.x] += sums[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    StoreScalarOfDtype(out.data, out.dtype,
                       out_b * out.stride_b + out_head * out.stride_h + j * out.stride_kv,
                       sums[0]);
}

}  // namespace fusedattn::small_seq
