// Small helper kernels of the small_seq backend: max_logit's -inf start and the fixed-order sums
// of per-(b, h) partials (dsink, broadcast dbias).
#pragma once

#include "backends/small_seq/device.cuh"

namespace fusedattn::small_seq {

__global__ void FillKernel(float* data, int64_t count, int64_t stride, float value) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < count) data[i * stride] = value;
}

// Which partials an output element [out_b, out_head, j] sums: a broadcast output axis (size 1)
// sums over all of that axis, otherwise the axis is the output's own index.
struct PartialSum {
  int64_t j, out_b, out_head;
  int64_t b_first, b_count, h_first, h_count;
  __host__ __device__ int64_t items() const { return b_count * h_count; }
  // Item i (in the fixed summation order) is partial (b, h) = (b_first + i / h_count, ...).
  __host__ __device__ int64_t partial_index(int64_t item, int64_t heads, int64_t keys) const {
    const int64_t b = b_first + item / h_count, h = h_first + item % h_count;
    return (b * heads + h) * keys + j;
  }
};

__host__ __device__ inline PartialSum PartialSumOf(int64_t output, int64_t batch, int64_t heads,
                                                   int64_t keys, int64_t out_batch,
                                                   int64_t out_heads) {
  PartialSum s;
  s.j = output % keys;
  s.out_head = (output / keys) % out_heads;
  s.out_b = output / keys / out_heads;
  s.b_count = out_batch == 1 ? batch : 1;
  s.b_first = out_batch == 1 ? 0 : s.out_b;
  s.h_count = out_heads == 1 ? heads : 1;
  s.h_first = out_heads == 1 ? 0 : s.out_head;
  return s;
}

__device__ inline void StoreSum(const KernelBias& out, const PartialSum& s, float value) {
  StoreScalarOfDtype(out.data, out.dtype,
                     s.out_b * out.stride_b + s.out_head * out.stride_h + s.j * out.stride_kv,
                     value);
}

// Few items per output (at most kItemsPerThread): one thread per output adds them in order.
constexpr int64_t kItemsPerThread = 64;
constexpr int kThreadSumThreads = 256;

__global__ void __launch_bounds__(kThreadSumThreads)
    SumPartialsByThreadKernel(const float* partials, int64_t batch, int64_t heads, int64_t keys,
                              int64_t out_batch, int64_t out_heads, int64_t outputs,
                              KernelBias out) {
  const int64_t output = int64_t{blockIdx.x} * kThreadSumThreads + threadIdx.x;
  if (output >= outputs) return;
  const PartialSum s = PartialSumOf(output, batch, heads, keys, out_batch, out_heads);
  float sum = 0.0f;
  for (int64_t item = 0; item < s.items(); ++item)
    sum += partials[s.partial_index(item, heads, keys)];
  StoreSum(out, s, sum);
}

// Many items per output: one block per output. Thread t adds items t, t + kSumThreads, ... in
// order, then the block adds the threads' sums in a fixed tree: the same result on every run.
constexpr int kSumThreads = 512;

__global__ void __launch_bounds__(kSumThreads)
    SumPartialsKernel(const float* partials, int64_t batch, int64_t heads, int64_t keys,
                      int64_t out_batch, int64_t out_heads, KernelBias out) {
  const PartialSum s = PartialSumOf(blockIdx.x, batch, heads, keys, out_batch, out_heads);
  float sum = 0.0f;
#pragma unroll 4
  for (int64_t item = threadIdx.x; item < s.items(); item += kSumThreads)
    sum += partials[s.partial_index(item, heads, keys)];
  __shared__ float sums[kSumThreads];
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kSumThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) sums[threadIdx.x] += sums[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) StoreSum(out, s, sums[0]);
}

}  // namespace fusedattn::small_seq
