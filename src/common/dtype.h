// Host conversions between float and the 16-bit float formats (round to nearest even), and typed
// load/store by fusedattn_dtype. Used by the reference backend and by tests.
#pragma once

#include <algorithm>
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

// FP8 (the OCP formats the hardware implements). e4m3: exponent bias 7, 3 mantissa bits, no
// infinities, NaN = S.1111.111, largest finite 448. e5m2: bias 15, 2 mantissa bits, IEEE-like
// (S.11111.00 is inf, S.11111.xx NaN), largest finite 57344.
struct Fp8Format {
  int mantissa_bits;
  int bias;
  double max_finite;
};
inline Fp8Format Fp8FormatOf(fusedattn_dtype dtype) {
  return dtype == FUSEDATTN_DTYPE_FP8_E5M2 ? Fp8Format{2, 15, 57344.0} : Fp8Format{3, 7, 448.0};
}

inline double Fp8ToDouble(uint8_t bits, fusedattn_dtype dtype) {
  const Fp8Format f = Fp8FormatOf(dtype);
  const double sign = (bits & 0x80u) ? -1.0 : 1.0;
  const int exponent_bits = 7 - f.mantissa_bits;
  const unsigned exponent = (bits & 0x7Fu) >> f.mantissa_bits;
  const unsigned mantissa = bits & ((1u << f.mantissa_bits) - 1u);
  const unsigned exponent_max = (1u << exponent_bits) - 1u;
  if (dtype == FUSEDATTN_DTYPE_FP8_E4M3 && (bits & 0x7Fu) == 0x7Fu) return NAN;
  if (dtype == FUSEDATTN_DTYPE_FP8_E5M2 && exponent == exponent_max)
    return mantissa == 0 ? sign * INFINITY : NAN;
  if (exponent == 0) return sign * std::ldexp(mantissa, 1 - f.bias - f.mantissa_bits);
  return sign * std::ldexp((1u << f.mantissa_bits) + mantissa,
                           static_cast<int>(exponent) - f.bias - f.mantissa_bits);
}

// x rounded to the nearest FP8 value, ties to even, saturated to the largest finite value (also
// for infinities); NaN stays NaN. The hardware's cvt.rn.satfinite, from the exact value x.
inline uint8_t DoubleToFp8(double x, fusedattn_dtype dtype) {
  const Fp8Format f = Fp8FormatOf(dtype);
  const uint8_t sign = std::signbit(x) ? 0x80u : 0u;
  if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7Fu);
  double a = std::fabs(x);
  const int min_exponent = 1 - f.bias;  // of the smallest normal value
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int unit_exponent = std::max(e - 1, min_exponent) - f.mantissa_bits;
  double q = a >= f.max_finite ? f.max_finite
                               : std::ldexp(std::nearbyint(std::ldexp(a, -unit_exponent)),
                                            unit_exponent);  // exact scaling, then round to even
  if (q > f.max_finite) q = f.max_finite;
  if (q == 0.0) return sign;
  std::frexp(q, &e);
  if (e - 1 < min_exponent)  // subnormal
    return static_cast<uint8_t>(
        sign | static_cast<unsigned>(std::ldexp(q, f.bias - 1 + f.mantissa_bits)));
  const unsigned exponent_field = static_cast<unsigned>(e - 1 + f.bias);
  const unsigned mantissa =
      static_cast<unsigned>(std::ldexp(q, f.mantissa_bits - (e - 1))) - (1u << f.mantissa_bits);
  return static_cast<uint8_t>(sign | (exponent_field << f.mantissa_bits) | mantissa);
}

inline bool IsFp8Dtype(fusedattn_dtype dtype) {
  return dtype == FUSEDATTN_DTYPE_FP8_E4M3 || dtype == FUSEDATTN_DTYPE_FP8_E5M2;
}

// x quantized to FP8 and read back: the value Q8(x) of fusedattn.h's "FP8 attention".
inline double QuantizeFp8(double x, fusedattn_dtype dtype) {
  return Fp8ToDouble(DoubleToFp8(x, dtype), dtype);
}

// Reads element `index` of a buffer of `dtype` as double.
inline double LoadAsDouble(const void* data, fusedattn_dtype dtype, int64_t index) {
  switch (dtype) {
    case FUSEDATTN_DTYPE_FLOAT32: return static_cast<const float*>(data)[index];
    case FUSEDATTN_DTYPE_FLOAT16: return HalfToFloat(static_cast<const uint16_t*>(data)[index]);
    case FUSEDATTN_DTYPE_BFLOAT16: return Bf16ToFloat(static_cast<const uint16_t*>(data)[index]);
    case FUSEDATTN_DTYPE_INT32: return static_cast<const int32_t*>(data)[index];
    case FUSEDATTN_DTYPE_FP8_E4M3:
    case FUSEDATTN_DTYPE_FP8_E5M2:
      return Fp8ToDouble(static_cast<const uint8_t*>(data)[index], dtype);
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
    case FUSEDATTN_DTYPE_FP8_E4M3:
    case FUSEDATTN_DTYPE_FP8_E5M2:
      static_cast<uint8_t*>(data)[index] = DoubleToFp8(value, dtype);
      break;
    default: break;
  }
}

}  // namespace fusedattn
