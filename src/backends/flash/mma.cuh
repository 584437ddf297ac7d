// Warp-level tensor-core building blocks of the fast path (sm_80+): cp.async tile copies,
// ldmatrix fragment loads and mma.sync m16n8k16 with float32 accumulators.
//
// Fragments of mma.m16n8k16 (lane = 4 * g + t, g = lane / 4, t = lane % 4):
//   A (16x16, 4 regs of 2 elements): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][8+2t..],
//                                    a3 = A[g+8][8+2t..]
//   B (16x8,  2 regs):               b0 = B[2t..2t+1][g], b1 = B[8+2t..8+2t+1][g]
//   C (16x8,  4 floats):             c0, c1 = C[g][2t], C[g][2t+1]; c2, c3 = C[g+8][2t], C[g+8][2t+1]
// A C fragment pair of columns (8n..8n+15) is therefore an A fragment of a following product
// (P kept in registers as the A operand of P V): a0 = (c0, c1) of tile 2n, a1 = (c2, c3) of tile
// 2n, a2 = (c0, c1) of tile 2n+1, a3 = (c2, c3) of tile 2n+1.
//
// Shared-memory tiles are row-major with a row stride of (columns + 8) elements: rows start 16
// bytes apart modulo 128, so the 8 rows an ldmatrix phase reads fall into 8 different bank
// groups (no conflicts) and every 16-byte piece stays aligned.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backends/flash/kernels.h"

namespace fusedattn::flash {

template <typename Element>
struct ElementTraits;
template <>
struct ElementTraits<Half> {
  using Type = __half;
  static constexpr fusedattn_dtype kDtype = FUSEDATTN_DTYPE_FLOAT16;
};
template <>
struct ElementTraits<Bfloat16> {
  using Type = __nv_bfloat16;
  static constexpr fusedattn_dtype kDtype = FUSEDATTN_DTYPE_BFLOAT16;
};

__device__ __forceinline__ uint32_t SmemAddress(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (nothing is read then).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddress(smem)),
               "l"(gmem), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void Ldmatrix4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void Ldmatrix4Trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a * b, m16n8k16, float32 accumulators.
template <typename Element>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1);
template <>
__device__ __forceinline__ void Mma<Half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void Mma<Bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as one register of two 16-bit elements (the first in the low half).
template <typename Element>
__device__ __forceinline__ uint32_t Pack(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t Pack<Half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t Pack<Bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// ---- Fragment loads from row-major shared-memory tiles (stride in elements) ----
// A (16 x 16) at rows m0.., columns k0.. of a tile holding A[m][k].
template <typename T>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const T* tile, int stride, int m0,
                                      int k0, int lane) {
  Ldmatrix4(a, SmemAddress(tile + (m0 + (lane & 15)) * stride + k0 + (lane >> 4) * 8));
}
// A (16 x 16) from a tile holding A transposed, At[k][m] (rows k0.., columns m0..).
template <typename T>
__device__ __forceinline__ void LoadATransposed(uint32_t (&a)[4], const T* tile, int stride,
                                                int m0, int k0, int lane) {
  Ldmatrix4Trans(a, SmemAddress(tile + (k0 + (lane & 7) + ((lane >> 4) << 3)) * stride + m0 +
                                ((lane >> 3) & 1) * 8));
}
// Two B fragments (16 x 8 each: columns n0..n0+7 in b[0], b[1]; n0+8.. in b[2], b[3]) from a
// tile holding B transposed, Bt[n][k] (e.g. K for Q K^T).
template <typename T>
__device__ __forceinline__ void LoadBFromRows(uint32_t (&b)[4], const T* tile, int stride, int n0,
                                              int k0, int lane) {
  Ldmatrix4(b, SmemAddress(tile + (n0 + (lane & 7) + ((lane >> 4) << 3)) * stride + k0 +
                           ((lane >> 3) & 1) * 8));
}
// Two B fragments from a tile holding B[k][n] (e.g. V for P V).
template <typename T>
__device__ __forceinline__ void LoadBFromColumns(uint32_t (&b)[4], const T* tile, int stride,
                                                 int n0, int k0, int lane) {
  Ldmatrix4Trans(b, SmemAddress(tile + (k0 + (lane & 15)) * stride + n0 + (lane >> 4) * 8));
}

// Copies a tile of kRows x kCols elements (kCols % 8 == 0) from global rows
// `source + r * row_stride` into shared memory (row stride kStride) with cp.async. Rows
// r >= valid_rows and 8-element pieces at columns >= valid_cols are zero-filled; `any` is a
// pointer the copies may name when they read nothing. Thread x copies the piece at column
// 8 (x % kPieces) of rows x / kPieces + k * (kThreads / kPieces): one running pointer per thread
// (cheap in registers, which the kernels are short of), and consecutive threads read consecutive
// 16 bytes of a row.
template <int kRows, int kCols, int kStride, int kThreads, typename T>
__device__ __forceinline__ void LoadTile(T* tile, const T* source, int64_t row_stride,
                                         int valid_rows, int valid_cols, const void* any) {
  constexpr int kPieces = kCols / 8;
  static_assert(kThreads % kPieces == 0, "a whole number of rows per pass");
  constexpr int kRowsPerPass = kThreads / kPieces;
  constexpr int kPasses = (kRows + kRowsPerPass - 1) / kRowsPerPass;
  const int c = (threadIdx.x % kPieces) * 8;
  int r = threadIdx.x / kPieces;
  const T* src = source + r * row_stride + c;
  const int64_t step = kRowsPerPass * row_stride;
  const bool column_valid = c < valid_cols;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    if (kRows % kRowsPerPass == 0 || r < kRows) {
      const bool valid = column_valid && r < valid_rows;
      CpAsync16(tile + r * kStride + c, valid ? static_cast<const void*>(src) : any, valid);
    }
    r += kRowsPerPass;
    src += step;
  }
}

// Stores a pair of adjacent values (x, x+1) of a row, as one 32-bit store when the pair is
// contiguous and aligned, else element by element.
template <typename Element>
__device__ __forceinline__ void StorePair(void* base, int64_t offset, int64_t stride_d, float v0,
                                          float v1) {
  using T = typename ElementTraits<Element>::Type;
  T* p = static_cast<T*>(base) + offset;
  if (stride_d == 1 && (reinterpret_cast<uintptr_t>(p) & 3) == 0) {
    *reinterpret_cast<uint32_t*>(p) = Pack<Element>(v0, v1);
  } else {
    p[0] = static_cast<T>(v0);
    p[stride_d] = static_cast<T>(v1);
  }
}

}  // namespace fusedattn::flash
