// WgmmaTileSelfTest (sm90.h): one warpgroup MMA tile from the swizzled shared-memory layout, so
// that a descriptor or swizzle mistake shows up apart from the attention kernel's logic.
#include <type_traits>

#include "backends/flash/sm90.h"
#include "backends/flash/wgmma.cuh"
#include "common/cuda_util.h"

namespace fusedattn::flash {
namespace {

struct SelfTestMaps {
  CUtensorMap a, b;
};

// A at 0 (up to 64 x 256 16-bit elements), B at 32 KB (up to 80 x 256), the barrier after B.
constexpr int kSelfTestBOffset = 64 * 256 * 2;
constexpr int kSelfTestBarrierOffset = kSelfTestBOffset + 80 * 256 * 2;
constexpr int kSelfTestSmem = kSelfTestBarrierOffset + 8 + 1024;  // + alignment slack

// Copies a row-major [rows][cols] tile (cols % 64 == 0) into the swizzled layout.
__device__ void StoreSwizzled(unsigned char* tile, const uint16_t* source, int rows, int cols) {
  for (int e = threadIdx.x; e < rows * cols / 8; e += blockDim.x) {
    const int row = e / (cols / 8), col = (e % (cols / 8)) * 8;
    *reinterpret_cast<uint4*>(tile + sm90::Swizzle128Offset(row, col, rows)) =
        *reinterpret_cast<const uint4*>(source + row * cols + col);
  }
}

template <typename Element>
__global__ void __launch_bounds__(128)
    WgmmaSelfTestKernel(const __grid_constant__ SelfTestMaps maps, int mode, const uint16_t* a,
                        const uint16_t* b, float* c) {
#if FUSEDATTN_SM90_DEVICE
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (SmemAddress(smem_raw) & 1023u)) & 1023u);
  unsigned char* a_s = smem;  // 64 x 128 (modes 0, 2), 128 x 64 (mode 3), 64 x 256 (mode 4)
  unsigned char* b_s = smem + kSelfTestBOffset;  // 64 x 128, 128 x 64 (3), 80 x 256 (4, 5)
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + kSelfTestBarrierOffset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  if (mode == 4 || mode == 5) {
    // The d256 forward's shapes: S = Q K^T over 80 keys from four TMA boxes per operand
    // (mode 4), O += P V over 256 columns with V's 80 rows in four column blocks (mode 5).
    if (mode == 4) {
      if (threadIdx.x == 0) {
        sm90::MbarInit(bar, 1);
        sm90::FenceBarrierInit();
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        sm90::MbarArriveExpectTx(bar, 64 * 256 * 2 + 80 * 256 * 2);
        for (int cb = 0; cb < 4; ++cb) {
          sm90::TmaLoad4d(a_s + cb * 64 * 128, &maps.a, bar, cb * 64, 0, 0, 0);
          sm90::TmaLoad4d(b_s + cb * 80 * 128, &maps.b, bar, cb * 64, 0, 0, 0);
        }
      }
      sm90::MbarWait(bar, 0);
      float d[40];
      sm90::WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < 16; ++kk)
        sm90::Wgmma<Element, 80>::template SS<0, 0>(
            d,
            sm90::MakeDesc(SmemAddress(a_s) + (kk / 4) * (64 * 128) + (kk % 4) * 32, 16, 1024),
            sm90::MakeDesc(SmemAddress(b_s) + (kk / 4) * (80 * 128) + (kk % 4) * 32, 16, 1024),
            kk > 0);
      sm90::WgmmaCommit();
      sm90::WgmmaWait<0>();
      sm90::FenceOperands(d);
      for (int i = 0; i < 10; ++i)
        for (int r = 0; r < 2; ++r)
          for (int cc = 0; cc < 2; ++cc)
            c[(warp * 16 + g + 8 * r) * 80 + 8 * i + 2 * t + cc] = d[4 * i + 2 * r + cc];
    } else {
      StoreSwizzled(b_s, b, 80, 256);
      sm90::FenceProxyAsync();
      __syncthreads();
      uint32_t fa[5][4];  // A[64][80] in the m16n8k16 A fragments of this warp's 16 rows
      auto pair = [&](int row, int col) {
        return *reinterpret_cast<const uint32_t*>(a + row * 80 + col);
      };
      for (int kk = 0; kk < 5; ++kk) {
        const int r0 = warp * 16 + g, c0 = 16 * kk + 2 * t;
        fa[kk][0] = pair(r0, c0);
        fa[kk][1] = pair(r0 + 8, c0);
        fa[kk][2] = pair(r0, c0 + 8);
        fa[kk][3] = pair(r0 + 8, c0 + 8);
      }
      float d[128];
      sm90::WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < 5; ++kk)
        sm90::Wgmma<Element, 256>::template RS<1>(
            d, fa[kk], sm90::MakeDesc(SmemAddress(b_s) + kk * 2048, 80 * 128, 1024), kk > 0);
      sm90::WgmmaCommit();
      sm90::WgmmaWait<0>();
      sm90::FenceOperands(d);
      for (int i = 0; i < 32; ++i)
        for (int r = 0; r < 2; ++r)
          for (int cc = 0; cc < 2; ++cc)
            c[(warp * 16 + g + 8 * r) * 256 + 8 * i + 2 * t + cc] = d[4 * i + 2 * r + cc];
    }
    return;
  }

  if (mode == 2) {
    if (threadIdx.x == 0) {
      sm90::MbarInit(bar, 1);
      sm90::FenceBarrierInit();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      sm90::MbarArriveExpectTx(bar, 2 * 64 * 128 * 2);
      for (int cb = 0; cb < 2; ++cb) {
        sm90::TmaLoad4d(a_s + cb * 64 * 128, &maps.a, bar, cb * 64, 0, 0, 0);
        sm90::TmaLoad4d(b_s + cb * 64 * 128, &maps.b, bar, cb * 64, 0, 0, 0);
      }
    }
    sm90::MbarWait(bar, 0);
  } else if (mode == 3) {
    StoreSwizzled(a_s, a, 128, 64);
    StoreSwizzled(b_s, b, 128, 64);
    sm90::FenceProxyAsync();
    __syncthreads();
  } else {
    if (mode == 0) StoreSwizzled(a_s, a, 64, 128);
    StoreSwizzled(b_s, b, 64, 128);
    sm90::FenceProxyAsync();
    __syncthreads();
  }

  if (mode == 0 || mode == 2 || mode == 3) {
    float d[32];
    sm90::WgmmaFence();
    if (mode == 3) {
      // Both MN-major: the k-th 16-row step of the [128][64] tiles is 2048 bytes further.
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
        sm90::Wgmma<Element, 64>::template SS<1, 1>(
            d, sm90::MakeDesc(SmemAddress(a_s) + kk * 2048, 128 * 128, 1024),
            sm90::MakeDesc(SmemAddress(b_s) + kk * 2048, 128 * 128, 1024), kk > 0);
    } else {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const uint32_t off = (kk / 4) * (64 * 128) + (kk % 4) * 32;
        sm90::Wgmma<Element, 64>::template SS<0, 0>(
            d, sm90::MakeDesc(SmemAddress(a_s) + off, 16, 1024),
            sm90::MakeDesc(SmemAddress(b_s) + off, 16, 1024), kk > 0);
      }
    }
    sm90::WgmmaCommit();
    sm90::WgmmaWait<0>();
    sm90::FenceOperands(d);
    for (int i = 0; i < 8; ++i)
      for (int r = 0; r < 2; ++r)
        for (int cc = 0; cc < 2; ++cc)
          c[(warp * 16 + g + 8 * r) * 64 + 8 * i + 2 * t + cc] = d[4 * i + 2 * r + cc];
  } else {
    // A[64][64] from global straight into the m16n8k16 A fragments of this warp's 16 rows.
    uint32_t fa[4][4];
    auto pair = [&](int row, int col) {
      return *reinterpret_cast<const uint32_t*>(a + row * 64 + col);
    };
    for (int kk = 0; kk < 4; ++kk) {
      const int r0 = warp * 16 + g, c0 = 16 * kk + 2 * t;
      fa[kk][0] = pair(r0, c0);
      fa[kk][1] = pair(r0 + 8, c0);
      fa[kk][2] = pair(r0, c0 + 8);
      fa[kk][3] = pair(r0 + 8, c0 + 8);
    }
    float d[64];
    sm90::WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      sm90::Wgmma<Element, 128>::template RS<1>(
          d, fa[kk], sm90::MakeDesc(SmemAddress(b_s) + kk * 2048, 64 * 128, 1024), kk > 0);
    sm90::WgmmaCommit();
    sm90::WgmmaWait<0>();
    sm90::FenceOperands(d);
    for (int i = 0; i < 16; ++i)
      for (int r = 0; r < 2; ++r)
        for (int cc = 0; cc < 2; ++cc)
          c[(warp * 16 + g + 8 * r) * 128 + 8 * i + 2 * t + cc] = d[4 * i + 2 * r + cc];
  }
#endif
}

}  // namespace

Status WgmmaTileSelfTest(int mode, bool bf16, const void* a, const void* b, float* c,
                         cudaStream_t stream) {
  if (mode < 0 || mode > 5) return InternalError("wgmma self test: mode %d", mode);
  SelfTestMaps maps{};
  if (mode == 2 || mode == 4) {
    // Mode 2: A and B [64][128]; mode 4: A [64][256], B [80][256] (boxes of 64 or 80 rows).
    const int cols = mode == 2 ? 128 : 256, b_rows = mode == 2 ? 64 : 80;
    TensorArg ta, tb;
    ta.data = const_cast<void*>(a), tb.data = const_cast<void*>(b);
    ta.stride_s = tb.stride_s = cols;
    ta.stride_d = tb.stride_d = 1;
    if (!EncodeQkvTensorMap(&maps.a, ta, bf16, 64, cols, 1, 1, 64) ||
        !EncodeQkvTensorMap(&maps.b, tb, bf16, b_rows, cols, 1, 1, b_rows))
      return NotSupported("wgmma self test: cuTensorMapEncodeTiled failed");
  }
  auto kernel = bf16 ? WgmmaSelfTestKernel<Bfloat16> : WgmmaSelfTestKernel<Half>;
  FUSEDATTN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSelfTestSmem));
  kernel<<<1, 128, kSelfTestSmem, stream>>>(maps, mode, static_cast<const uint16_t*>(a),
                                            static_cast<const uint16_t*>(b), c);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok();
}

}  // namespace fusedattn::flash
