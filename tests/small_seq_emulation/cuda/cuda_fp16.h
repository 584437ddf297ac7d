// Emulation shim of cuda_fp16.h: __half as 16 bits, converted with the library's host rounding
// (round to nearest even, as the device intrinsics).
#pragma once

#include "common/dtype.h"
#include "cuda_runtime.h"

struct __half {
  unsigned short bits;
};
inline float __half2float(__half h) { return fusedattn::HalfToFloat(h.bits); }
inline __half __float2half_rn(float f) { return __half{fusedattn::FloatToHalf(f)}; }
inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
