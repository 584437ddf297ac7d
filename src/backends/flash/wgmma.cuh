// Hopper (sm_90a) building blocks of the wgmma forward and backward (fwd_kernel_sm90.cuh,
// bwd_kernel_sm90.cuh): shared-memory matrix descriptors for the 128-byte swizzle, warpgroup MMA
// (wgmma.mma_async), mbarriers, named barriers, TMA tile loads and register reallocation, as
// inline PTX. Everything here compiles only for the
// sm_90a target (FUSEDATTN_SM90_DEVICE); other targets see empty bodies and never run them.
//
// Shared-memory tiles (written by TMA with CU_TENSOR_MAP_SWIZZLE_128B, or by threads with
// Swizzle128Offset): a tile of R rows x C 16-bit columns is stored as C / 64 column blocks of
// R rows x 128 bytes; inside a block, row r's 16-byte chunk c lies at r * 128 + ((c ^ r % 8) * 16).
// Every block starts 1024-byte aligned (the swizzle repeats every 8 rows = 1024 bytes and is a
// function of the address bits, so the hardware and TMA agree only on aligned atoms).
//
// Descriptors (64 bits): start address >> 4 in bits [0, 14), leading byte offset >> 4 in
// [16, 30), stride byte offset >> 4 in [32, 46), base offset 0 in [49, 52), layout 1 = 128-byte
// swizzle in [62, 64).
//  * K-major operand (Q or K for S = Q K^T: rows = M or N, K contiguous): one wgmma reads 16
//    K-columns = 32 bytes of each 128-byte row. SBO = 1024 (next 8 rows), LBO unused (1). The
//    k-th 16-column step inside a column block adds 32 * k bytes to the start address (the
//    hardware applies the swizzle to the final address); the next column block starts R * 128
//    bytes further.
//  * MN-major operand (V for O += P V: rows = keys = K, columns = d = N contiguous, the transpose
//    bit set): 16 keys = two 8-row groups, SBO = 1024 between them; LBO = the distance between
//    64-column blocks (R * 128 bytes). The k-th 16-key step adds 16 * 128 * k bytes. An A operand
//    is described the same way with M in place of N (transpose-A bit, 16-bit types only): the
//    backward's dS^T [keys][queries] read as dS for dQ = dS K.
//
// Accumulator of m64nNk16 (float32, N / 2 registers per thread): thread t of the warpgroup,
// w = t / 32, g = (t % 32) / 4, q = t % 4 holds d[4 i + 2 r + c] = D[16 w + g + 8 r][8 i + 2 q + c]
// (the mma.sync m16n8 C fragment of each 8-column slice, for the warp's 16 rows). The register
// A operand of m64nNk16 is the mma.sync m16n8k16 A fragment of the warp's 16 rows, so
// accumulator slices 2k and 2k+1 packed to 16 bits are the A operand for keys 16k..16k+15.
#pragma once

#include <type_traits>

#ifndef __CUDACC_RTC__  // NVRTC: jit.cpp's source declares CUtensorMap as cuda.h does
#include <cuda.h>  // CUtensorMap (a plain struct; nothing from the driver library is linked)
#include <cuda_runtime.h>
#endif

#include <cstdint>

#include "backends/flash/mma.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FUSEDATTN_SM90_DEVICE 1
#else
#define FUSEDATTN_SM90_DEVICE 0
#endif

namespace fusedattn::flash::sm90 {

// ---- Descriptors and the swizzled layout ----

constexpr uint64_t kSwizzle128 = uint64_t{1} << 62;

__device__ __forceinline__ uint64_t MakeDesc(uint32_t smem_address, uint32_t lbo_bytes,
                                             uint32_t sbo_bytes) {
  return kSwizzle128 | (uint64_t{(sbo_bytes >> 4) & 0x3FFFu} << 32) |
         (uint64_t{(lbo_bytes >> 4) & 0x3FFFu} << 16) | uint64_t{(smem_address >> 4) & 0x3FFFu};
}

// Byte offset of element (row, col) (16-bit elements) in a swizzled tile of `rows` rows whose
// column blocks are rows * 128 bytes apart.
__host__ __device__ __forceinline__ uint32_t Swizzle128Offset(int row, int col, int rows) {
  const int block = col / 64, in_block = col % 64;
  const int chunk = in_block / 8, within = in_block % 8;
  return static_cast<uint32_t>(block * rows * 128 + row * 128 + ((chunk ^ (row % 8)) * 16) +
                               within * 2);
}

// ---- wgmma ----

__device__ __forceinline__ void WgmmaFence() {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void WgmmaCommit() {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Keeps the compiler from moving reads or writes of an accumulator / A register across the
// asynchronous wgmma that owns it (no instruction is emitted).
__device__ __forceinline__ void FenceOperand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void FenceOperand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
template <int kN>
__device__ __forceinline__ void FenceOperands(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) FenceOperand(r[i]);
}

// The columns [0, kN) of an m64nM accumulator (kN <= M) as the accumulator of an m64nkN
// product: the same registers (a thread's floats come in 8-column slices, in column order).
template <int kN, int kFloats>
__device__ __forceinline__ float (&LeadingColumns(float (&r)[kFloats]))[kN / 2] {
  static_assert(kN / 2 <= kFloats, "an m64nM accumulator has M / 2 floats per thread");
  return *reinterpret_cast<float(*)[kN / 2]>(&r[0]);
}

// A compile-time int passed to a generic lambda, so that a runtime test outside the lambda picks
// between fully unrolled loops (wgmma widths, step counts): ptxas serializes wgmmas that have a
// branch between them.
template <int kValue>
using Static = std::integral_constant<int, kValue>;

// m64nNk16 with float32 accumulators for Element (Half, Bfloat16) and N (64, 128; 80 and 256 for
// the d256 forward).
template <typename Element, int kN>
struct Wgmma;

#if FUSEDATTN_SM90_DEVICE
// The accumulators of m64nNk16 (N / 2 floats per thread) as asm operands %0 .. %(N/2 - 1).
#define FUSEDATTN_WGMMA_ACC32(d)                                                              \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),          \
      "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),  \
      "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),            \
      "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),            \
      "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FUSEDATTN_WGMMA_ACC64(d)                                                              \
  FUSEDATTN_WGMMA_ACC32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),   \
      "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),            \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),            \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),            \
      "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),            \
      "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define FUSEDATTN_WGMMA_ACC40(d)                                                              \
  FUSEDATTN_WGMMA_ACC32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),   \
      "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
#define FUSEDATTN_WGMMA_ACC128(d)                                                             \
  FUSEDATTN_WGMMA_ACC64(d), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]),   \
      "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]),            \
      "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),            \
      "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]),            \
      "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]),            \
      "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]),            \
      "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),       \
      "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]),      \
      "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]),      \
      "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]),      \
      "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define FUSEDATTN_WGMMA_ACC32_LIST                                                            \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FUSEDATTN_WGMMA_ACC64_LIST                                                            \
  FUSEDATTN_WGMMA_ACC32_LIST                                                                  \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, "    \
  "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

#define FUSEDATTN_WGMMA_ACC40_LIST                                                            \
  FUSEDATTN_WGMMA_ACC32_LIST ", %32, %33, %34, %35, %36, %37, %38, %39"
#define FUSEDATTN_WGMMA_ACC128_LIST                                                           \
  FUSEDATTN_WGMMA_ACC64_LIST                                                                  \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"          \
  ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"          \
  ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110"     \
  ", %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124"       \
  ", %125, %126, %127"

// Wgmma<Element, N>: SS is d (+)= A B with A from shared memory (K-major, or MN-major when
// kTransA: the M index contiguous, as dS^T [keys][queries] read as dS for dQ = dS K) and B from
// shared memory (K-major, or MN-major when kTransB); RS takes A from registers (the m16n8k16 A
// fragment of this warp's 16 rows). accumulate = false overwrites d. The operands after the
// accumulators are numbered from `first` (= N / 2): SS desc_a, desc_b, accumulate, kTransA,
// kTransB; RS a[0..3], desc_b, accumulate, kTransB.
#define FUSEDATTN_WGMMA(Element, N, ptx_type, ACC, ACC_LIST, A0, A1, A2, A3, A4, A5, A6)        \
  template <>                                                                                  \
  struct Wgmma<Element, N> {                                                                   \
    template <int kTransA, int kTransB>                                                        \
    static __device__ __forceinline__ void SS(float (&d)[N / 2], uint64_t desc_a,              \
                                              uint64_t desc_b, bool accumulate) {              \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " A2 ", 0;\n"                             \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." ptx_type "." ptx_type " {" \
                   ACC_LIST "}, " A0 ", " A1 ", p, 1, 1, " A3 ", " A4 ";\n}\n"                  \
                   : ACC(d)                                                                    \
                   : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(kTransA),             \
                     "n"(kTransB));                                                            \
    }                                                                                          \
    template <int kTransB>                                                                     \
    static __device__ __forceinline__ void RS(float (&d)[N / 2], const uint32_t (&a)[4],       \
                                              uint64_t desc_b, bool accumulate) {              \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " A5 ", 0;\n"                             \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." ptx_type "." ptx_type " {" \
                   ACC_LIST "}, {" A0 ", " A1 ", " A2 ", " A3 "}, " A4 ", p, 1, 1, " A6 ";\n}\n" \
                   : ACC(d)                                                                    \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b),                 \
                     "r"(int(accumulate)), "n"(kTransB));                                      \
    }                                                                                          \
  };

FUSEDATTN_WGMMA(Half, 64, "f16", FUSEDATTN_WGMMA_ACC32, FUSEDATTN_WGMMA_ACC32_LIST, "%32", "%33",
                "%34", "%35", "%36", "%37", "%38")
FUSEDATTN_WGMMA(Bfloat16, 64, "bf16", FUSEDATTN_WGMMA_ACC32, FUSEDATTN_WGMMA_ACC32_LIST, "%32",
                "%33", "%34", "%35", "%36", "%37", "%38")
FUSEDATTN_WGMMA(Half, 128, "f16", FUSEDATTN_WGMMA_ACC64, FUSEDATTN_WGMMA_ACC64_LIST, "%64", "%65",
                "%66", "%67", "%68", "%69", "%70")
FUSEDATTN_WGMMA(Bfloat16, 128, "bf16", FUSEDATTN_WGMMA_ACC64, FUSEDATTN_WGMMA_ACC64_LIST, "%64",
                "%65", "%66", "%67", "%68", "%69", "%70")
// d256's forward: S = Q K^T over 80 keys, O += P V over 256 columns of d.
FUSEDATTN_WGMMA(Half, 80, "f16", FUSEDATTN_WGMMA_ACC40, FUSEDATTN_WGMMA_ACC40_LIST, "%40", "%41",
                "%42", "%43", "%44", "%45", "%46")
FUSEDATTN_WGMMA(Bfloat16, 80, "bf16", FUSEDATTN_WGMMA_ACC40, FUSEDATTN_WGMMA_ACC40_LIST, "%40",
                "%41", "%42", "%43", "%44", "%45", "%46")
FUSEDATTN_WGMMA(Half, 256, "f16", FUSEDATTN_WGMMA_ACC128, FUSEDATTN_WGMMA_ACC128_LIST, "%128",
                "%129", "%130", "%131", "%132", "%133", "%134")
FUSEDATTN_WGMMA(Bfloat16, 256, "bf16", FUSEDATTN_WGMMA_ACC128, FUSEDATTN_WGMMA_ACC128_LIST,
                "%128", "%129", "%130", "%131", "%132", "%133", "%134")
#undef FUSEDATTN_WGMMA

// FP8 (e4m3 x e4m3, float32 accumulators): m64n128k32, the FP8 forward's S = Q K^T (128 keys)
// and O += P V (d128). FP8 wgmma has no transpose bits: both operands are K-major (Q and K rows,
// and V^T with the keys contiguous). SS: A and B from shared memory; RS: A from registers (four
// .b32 of four e4m3 each: the m16n8k32 8-bit A fragment of this warp's 16 rows, sm90_tile.h's
// Sm90Fp8ValueKeyOfColumn). The transpose arguments of the 16-bit interface must be 0.
template <>
struct Wgmma<Fp8E4m3, 128> {
  template <int kTransA, int kTransB>
  static __device__ __forceinline__ void SS(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                            bool accumulate) {
    static_assert(kTransA == 0 && kTransB == 0, "FP8 wgmma reads K-major operands only");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
                 FUSEDATTN_WGMMA_ACC64_LIST "}, %64, %65, p, 1, 1;\n}\n"
                 : FUSEDATTN_WGMMA_ACC64(d)
                 : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
  }
  template <int kTransB>
  static __device__ __forceinline__ void RS(float (&d)[64], const uint32_t (&a)[4],
                                            uint64_t desc_b, bool accumulate) {
    static_assert(kTransB == 0, "FP8 wgmma reads K-major operands only");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
                 FUSEDATTN_WGMMA_ACC64_LIST "}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
                 : FUSEDATTN_WGMMA_ACC64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b),
                   "r"(int(accumulate)));
  }
};

#undef FUSEDATTN_WGMMA_ACC32
#undef FUSEDATTN_WGMMA_ACC64
#undef FUSEDATTN_WGMMA_ACC40
#undef FUSEDATTN_WGMMA_ACC128
#undef FUSEDATTN_WGMMA_ACC32_LIST
#undef FUSEDATTN_WGMMA_ACC64_LIST
#undef FUSEDATTN_WGMMA_ACC40_LIST
#undef FUSEDATTN_WGMMA_ACC128_LIST

#else
template <typename Element, int kN>
struct Wgmma {
  template <int kTransA, int kTransB>
  static __device__ __forceinline__ void SS(float (&)[kN / 2], uint64_t, uint64_t, bool) {}
  template <int kTransB>
  static __device__ __forceinline__ void RS(float (&)[kN / 2], const uint32_t (&)[4], uint64_t,
                                            bool) {}
};
#endif

// Two floats rounded to e4m3 (cvt.rn.satfinite: nearest, ties to even, saturated to +-448, NaN
// stays NaN), lo in the low byte: fusedattn.h's Q8_e4m3.
__device__ __forceinline__ uint32_t PackE4m3x2(float lo, float hi) {
  unsigned short bits = 0;
#if FUSEDATTN_SM90_DEVICE
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(bits) : "f"(hi), "f"(lo));
#endif
  return bits;
}
// Four floats as four e4m3 bytes of one register, x0 in the lowest byte.
__device__ __forceinline__ uint32_t PackE4m3x4(float x0, float x1, float x2, float x3) {
  return PackE4m3x2(x0, x1) | (PackE4m3x2(x2, x3) << 16);
}

// ---- mbarriers ----

__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddress(bar)), "r"(count)
               : "memory");
#endif
}
// Makes the initialized barriers visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void FenceBarrierInit() {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// One arrival that also expects `bytes` of TMA transactions in the current phase.
__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddress(bar)),
               "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SmemAddress(bar)) : "memory");
#endif
}
// Waits until the phase with this parity has completed (a fresh barrier is in phase 0, so a
// wait for parity 1 returns at once). A wait that lasts about 2^34 cycles (seconds; no correct
// wait comes near) traps, so that a wrong transaction count or a lost arrival fails the launch
// instead of hanging the GPU.
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
#if FUSEDATTN_SM90_DEVICE
  const uint32_t address = SmemAddress(bar);
  uint32_t done = 0;
  long long start = 0;
  for (uint32_t polls = 0;; ++polls) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
    if (done) break;
    if (polls == 0) {
      start = clock64();
    } else if ((polls & 1023u) == 0 && clock64() - start > (1ll << 34)) {
      __trap();
    }
  }
#endif
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy accesses
// (wgmma operand reads, TMA) of the same memory.
__device__ __forceinline__ void FenceProxyAsync() {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// st.shared.v4.f32 at a 16-byte aligned shared-memory address (the address as a 32-bit
// register, plus a constant offset folded into the instruction).
template <int kOffset = 0>
__device__ __forceinline__ void StoreShared4(uint32_t address, float a, float b, float c,
                                             float d) {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("st.shared.v4.f32 [%0 + %5], {%1, %2, %3, %4};\n" ::"r"(address), "f"(a),
               "f"(b), "f"(c), "f"(d), "n"(kOffset)
               : "memory");
#endif
}

// stmatrix.x4 (m8n8, 16-bit elements): four 8x8 matrices held in the mma fragment layout (lane
// l holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of each, one 32-bit register per
// matrix: r0 for matrix 0 ...) stored as rows of 16 bytes, row j of matrix m at the address lane
// 8 m + j gives. One instruction for what four 32-bit st.shared per thread store.
__device__ __forceinline__ void StoreMatrix4(uint32_t address, uint32_t r0, uint32_t r1,
                                             uint32_t r2, uint32_t r3) {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
#endif
}

// ---- Named barriers ----

// bar.sync on hardware barrier `id` (1..15; 0 is __syncthreads) for `threads` threads (a
// multiple of 32): the warpgroups that share a buffer meet here without stopping the others.
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

// NamedBarrierSync for threads that reach the barrier from different instructions (the
// backward's consumer with keys and the one without run separately compiled step loops):
// barrier.sync without .aligned, which bar.sync (= barrier.sync.aligned) implies and which
// compute-sanitizer's synccheck then reports. Only there: the non-aligned form everywhere cost
// the d64 backward 28 bytes of spills.
__device__ __forceinline__ void NamedBarrierSyncFromDivergentCode(int id, int threads) {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

// bar.sync (kSync) or bar.arrive on hardware barrier kFirstId + which (which 0 or 1, the same in
// the whole warp) for kThreads threads. Both ids are immediates, picked by predicate rather than
// by a branch: with a barrier id in a register ptxas counts all 16 barriers of the block as used,
// and a branch where wgmmas are in flight can make it serialize them.
template <bool kSync, int kFirstId, int kThreads>
__device__ __forceinline__ void NamedBarrierOfPair(int which) {
#if FUSEDATTN_SM90_DEVICE
  if constexpr (kSync) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n"
                 "@!p bar.sync %1, %3;\n@p bar.sync %2, %3;\n}\n" ::"r"(which),
                 "n"(kFirstId), "n"(kFirstId + 1), "n"(kThreads)
                 : "memory");
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n"
                 "@!p bar.arrive %1, %3;\n@p bar.arrive %2, %3;\n}\n" ::"r"(which),
                 "n"(kFirstId), "n"(kFirstId + 1), "n"(kThreads)
                 : "memory");
  }
#endif
}

// bar.arrive: counts this warp's threads on barrier `id` without waiting; the threads that
// bar.sync there (with the same count) go on once every arrival is in. Producer / consumer
// hand-offs through shared memory: the writer arrives after its stores, the reader syncs.
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

// ---- TMA ----

__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// The box at coordinates (c0 innermost, c1, c2, c3) of a 4-d tensor map into shared memory;
// completion is counted in bytes on `bar`. Out-of-bounds elements are written as zeros.
__device__ __forceinline__ void TmaLoad4d(void* smem, const CUtensorMap* map, uint64_t* bar,
                                          int c0, int c1, int c2, int c3) {
#if FUSEDATTN_SM90_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(SmemAddress(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(SmemAddress(bar)), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
#endif
}

// ---- Bulk copies (non-tensor TMA) ----

// global[0, bytes) += shared[0, bytes) as float32, element-wise atomic in L2, issued by one
// thread into its bulk async-group (BulkCommit). Both addresses 16-byte aligned, bytes a
// multiple of 16. Shared memory written by generic stores needs FenceProxyAsync by the writers
// (before the hand-off to the issuing thread) first.
__device__ __forceinline__ void BulkReduceAddF32(float* global, uint32_t smem_address,
                                                 uint32_t bytes) {
#if FUSEDATTN_SM90_DEVICE
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
          reinterpret_cast<uint64_t>(global)),
      "r"(smem_address), "r"(bytes)
      : "memory");
#endif
}
// Closes this thread's bulk async-group of the operations issued since the last commit.
__device__ __forceinline__ void BulkCommit() {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most kPending of this thread's bulk groups still read their shared-memory
// source (the source may be overwritten after this; the global writes may still be in flight).
template <int kPending>
__device__ __forceinline__ void BulkWaitRead() {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Waits until at most kPending of this thread's bulk groups are still in flight (complete:
// their writes done).
template <int kPending>
__device__ __forceinline__ void BulkWait() {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// ---- Ordering between blocks through global memory (the deterministic backward's dQ order) ----

// Orders this thread's global-memory accesses of the async proxy (bulk copies) and of the generic
// proxy (loads, stores) with each other: after a completed bulk reduce-add and before the store
// that tells another block about it, and after the load that learned of another block's and
// before this thread's next bulk reduce-add.
__device__ __forceinline__ void FenceProxyAsyncGlobal() {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}
// ld.acquire.gpu of an int32 in global memory: later accesses of this thread are ordered after
// it (and after what the releasing thread did before its release store).
__device__ __forceinline__ int LoadAcquireGpu(const int32_t* address) {
  int value = 0;
#if FUSEDATTN_SM90_DEVICE
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n"
               : "=r"(value)
               : "l"(reinterpret_cast<uint64_t>(address))
               : "memory");
#endif
  return value;
}
// st.release.gpu of an int32 in global memory: this thread's earlier accesses are visible to a
// thread whose acquire load reads the value.
__device__ __forceinline__ void StoreReleaseGpu(int32_t* address, int value) {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(reinterpret_cast<uint64_t>(address)),
               "r"(value)
               : "memory");
#endif
}

// ---- Register reallocation between warpgroups ----

template <int kRegs>
__device__ __forceinline__ void RegistersDown() {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void RegistersUp() {
#if FUSEDATTN_SM90_DEVICE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

}  // namespace fusedattn::flash::sm90
