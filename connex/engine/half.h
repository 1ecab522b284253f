// Conversions between fp32 and the 16-bit float formats of checkpoints (IEEE binary16 "F16" and
// bfloat16 "BF16"), rounding to nearest even. Thread-safe (pure functions).
#ifndef CONNEX_ENGINE_HALF_H_
#define CONNEX_ENGINE_HALF_H_

#include <bit>
#include <cstdint>

namespace connex::engine {

inline float BF16ToFloat(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

inline uint16_t FloatToBF16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float F16ToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: renormalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | ((112u - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t FloatToF16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x47800000u) {                      // >= 65536: overflow to inf (after rounding)
    return sign | 0x7c00u;
  }
  if (abs >= 0x38800000u) {  // normal half: exponent >= -14
    uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    uint32_t half = (rounded >> 13) - (112u << 10);
    if (half >= 0x7c00u) return sign | 0x7c00u;
    return sign | static_cast<uint16_t>(half);
  }
  if (abs < 0x33000000u) return sign;  // < 2^-25: rounds to zero
  // Subnormal half: value = mant * 2^-24.
  uint32_t exp = abs >> 23;
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126u - exp;  // 14..24 (so that the result is mant >> (shift - ...))
  uint32_t value = mant >> shift;
  uint32_t rest = mant & ((1u << shift) - 1u);
  uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (value & 1u))) ++value;
  return sign | static_cast<uint16_t>(value);
}

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_HALF_H_
