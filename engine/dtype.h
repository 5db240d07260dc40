// Element types of weights and KV storage. kI8 is a storage of the CPU backend's weight matrices
// only (8-bit integers with an fp32 scale per block of K, kernels/cpu/matmul.h): never a
// checkpoint tensor's type, a KV element or a CUDA dtype.
#ifndef PREFIXD_ENGINE_DTYPE_H_
#define PREFIXD_ENGINE_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace prefixd {

// The values are stable: the disk tier stores them in its block files' layout.
enum class DType { kF32 = 0, kF16 = 1, kBF16 = 2, kI8 = 3 };

// Bytes of one element (for kI8 without its share of the block scales).
constexpr int64_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : t == DType::kI8 ? 1 : 2; }
// "f32" | "f16" | "bf16" | "int8": the names the API, flags and tools use.
constexpr std::string_view DTypeName(DType t) {
  return t == DType::kF32 ? "f32" : t == DType::kF16 ? "f16" : t == DType::kI8 ? "int8" : "bf16";
}
inline std::optional<DType> ParseDType(std::string_view s) {
  if (s == "f32") return DType::kF32;
  if (s == "f16") return DType::kF16;
  if (s == "bf16") return DType::kBF16;
  if (s == "int8") return DType::kI8;
  return std::nullopt;
}

// IEEE binary16 -> binary32, exact (subnormals, inf and NaN included).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// binary32 -> binary16, round to nearest even.
inline uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN
    return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u);
  }
  if (absx >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (absx < 0x38800000u) {                        // below the smallest normal half
    if (absx < 0x33000000u) return sign;           // below half the smallest subnormal
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t half = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t half = ((absx >> 13) - ((127 - 15) << 10));
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;
  return sign | static_cast<uint16_t>(half);
}

inline float BF16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// binary32 -> bfloat16, round to nearest even (NaN stays NaN).
inline uint16_t FloatToBF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_DTYPE_H_
