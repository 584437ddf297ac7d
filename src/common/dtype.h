// Host conversions between float and the 16-bit float formats (round to nearest even), and typed
// load/store by fusedattn_dtype. Used by the reference backend and by tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "fusedattn/fusedattn.h"

namespace fusedattn {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToHalf(float f) {
  uint32_t u = FloatBits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal or zero in half: round abs * 2^24 to an integer
    float magnitude = BitsFloat(abs);
    float scaled = magnitude * 16777216.0f;  // exact in float (power of two)
    uint32_t q = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t mantissa = abs + 0xC8000FFFu + ((abs >> 13) & 1u);  // rebias exponent and round
  return static_cast<uint16_t>(sign | (mantissa >> 13));
}

inline float HalfToFloat(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0) {
    float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return BitsFloat(FloatBits(magnitude) | sign);
  }
  if (exponent == 31) return BitsFloat(sign | 0x7F800000u | (mantissa << 13));
  return BitsFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// Reads element `index` of a buffer of `dtype` as double.
inline double LoadAsDouble(const void* data, fusedattn_dtype dtype, int64_t index) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT32: return static_cast<const float*>(data)[index];
    case FUSEDATTN_DTYPE_FLOAT16: return HalfToFloat(static_cast<const uint16_t*>(data)[index]);
    case FUSEDATTN_DTYPE_BFLOAT16: return Bf16ToFloat(static_cast<const uint16_t*>(data)[index]);
    case FUSEDATTN_DTYPE_INT32: return static_cast<const int32_t*>(data)[index];
    default: return NAN;
  }
}

// Writes a double into element `index` of a buffer of `dtype`, rounding once.
inline void StoreFromDouble(void* data, fusedattn_dtype dtype, int64_t index, double value) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT32: static_cast<float*>(data)[index] = static_cast<float>(value); break;
    case FUSEDATTN_DTYPE_FLOAT16:
      static_cast<uint16_t*>(data)[index] = FloatToHalf(static_cast<float>(value));
      break;
    case FUSEDATTN_DTYPE_BFLOAT16:
      static_cast<uint16_t*>(data)[index] = FloatToBf16(static_cast<float>(value));
      break;
    case FUSEDATTN_DTYPE_INT32: static_cast<int32_t*>(data)[index] = static_cast<int32_t>(value); break;
    default: break;
  }
}

}  // namespace fusedattn
