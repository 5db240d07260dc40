// __half and __nv_bfloat16 for the interpreter: 16-bit storage types whose conversions round
// exactly as CUDA's do (cuda_fp16.hpp / cuda_bf16.hpp): float -> half and float -> bf16 round
// to nearest even, overflow to infinity, and every NaN becomes the canonical NaN 0x7fff.
#ifndef PREFIXD_KERNELS_CUDA_INTERPRET_HALF_H_
#define PREFIXD_KERNELS_CUDA_INTERPRET_HALF_H_

#include <cstdint>
#include <cstring>

namespace prefixd::cuda_interpret {

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

inline uint16_t FloatToHalfBits(float f) {
  uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return x == 0x7f800000u ? static_cast<uint16_t>(sign | 0x7c00u) : 0x7fffu;
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: infinity
  if (x <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: ties to even zero
  const uint32_t exp = x >> 23;
  uint32_t mant = x & 0x7fffffu;
  uint32_t result, rem, half;
  if (exp < 113) {  // below 2^-14: a subnormal half, mant24 * 2^(exp - 150) in units of 2^-24
    mant |= 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24
    result = mant >> shift;
    rem = mant & ((1u << shift) - 1);
    half = 1u << (shift - 1);
  } else {
    result = ((exp - 112) << 10) | (mant >> 13);
    rem = mant & 0x1fffu;
    half = 0x1000u;
  }
  if (rem > half || (rem == half && (result & 1u))) ++result;  // a carry moves the exponent up
  return static_cast<uint16_t>(sign | result);
}

inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return BitsFloat(sign);
  int e = 113;  // normalise the subnormal
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return BitsFloat(sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13));
}

inline uint16_t FloatToBF16Bits(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float BF16BitsToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

}  // namespace prefixd::cuda_interpret

// Storage only, as the kernels use them: converted through the functions below.
struct __half {
  uint16_t __x;
};
struct __nv_bfloat16 {
  uint16_t __x;
};

inline float __half2float(__half h) { return prefixd::cuda_interpret::HalfBitsToFloat(h.__x); }
inline __half __float2half_rn(float f) { return {prefixd::cuda_interpret::FloatToHalfBits(f)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __bfloat162float(__nv_bfloat16 b) {
  return prefixd::cuda_interpret::BF16BitsToFloat(b.__x);
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return {prefixd::cuda_interpret::FloatToBF16Bits(f)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

#endif  // PREFIXD_KERNELS_CUDA_INTERPRET_HALF_H_
