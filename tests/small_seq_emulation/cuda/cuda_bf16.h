// Emulation shim of cuda_bf16.h: __nv_bfloat16 as 16 bits, converted with the library's host
// rounding (round to nearest even, as the device intrinsics).
#pragma once

#include "common/dtype.h"
#include "cuda_runtime.h"

struct __nv_bfloat16 {
  unsigned short bits;
};
inline float __bfloat162float(__nv_bfloat16 h) { return fusedattn::Bf16ToFloat(h.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return __nv_bfloat16{fusedattn::FloatToBf16(f)};
}
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return __nv_bfloat16{bits}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
