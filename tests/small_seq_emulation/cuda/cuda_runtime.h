// Emulation shim: the part of the CUDA runtime and device builtins that the small_seq kernels
// use, for compiling those kernels as host C++ and running them with one OS thread per CUDA
// thread (see warp_emulator.h). Only the emulation test puts this folder on the include path.
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

// Vector types with CUDA's alignment, so that UBSan's alignment check sees misaligned vector
// accesses (which fault on a GPU).
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned int x, y;
};
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
  return uint4{x, y, z, w};
}
inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
};

namespace emulation {
// The calling thread's CUDA coordinates (set by the launcher).
const dim3& ThreadIdx();
const dim3& BlockIdx();
const dim3& BlockDim();
float ShuffleFrom(float value, int source_lane);
void SyncBlock();
int AtomicMax(int* address, int value);
unsigned int AtomicMin(unsigned int* address, unsigned int value);
// Checks that a vector access is aligned as a GPU requires (aborts otherwise).
void CheckAligned(const void* address, size_t alignment);
int Lane();
}  // namespace emulation

#define threadIdx (::emulation::ThreadIdx())
#define blockIdx (::emulation::BlockIdx())
#define blockDim (::emulation::BlockDim())

template <typename T>
inline T __ldg(const T* address) {
  emulation::CheckAligned(address, alignof(T));
  return *address;
}

template <typename T>
inline void __stwb(T* address, T value) {
  emulation::CheckAligned(address, alignof(T));
  *address = value;
}

inline float __shfl_sync(unsigned int, float value, int source_lane) {
  return emulation::ShuffleFrom(value, source_lane & 31);
}
inline float __shfl_xor_sync(unsigned int, float value, int lane_mask) {
  return emulation::ShuffleFrom(value, (emulation::Lane() ^ lane_mask) & 31);
}
inline void __syncthreads() { emulation::SyncBlock(); }
inline int atomicMax(int* address, int value) { return emulation::AtomicMax(address, value); }
inline unsigned int atomicMin(unsigned int* address, unsigned int value) {
  return emulation::AtomicMin(address, value);
}

inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, 4);
  return i;
}

using cudaStream_t = void*;
