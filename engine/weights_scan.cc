#include "engine/weights_scan.h"

#include <cstring>

namespace prefixd {
namespace {

// An IEEE value is NaN or infinite exactly when its exponent bits are all ones; `kExp` is
// that field's mask for the element type `T`.
template <typename T, T kExp>
int64_t FirstNonFiniteBits(const std::byte* data, int64_t n) {
  // Chunks of a fixed size: the inner loop has no early exit, so it vectorises (an OR of
  // compares), and a hit costs at most one chunk more than a scalar loop would read.
  constexpr int64_t kChunk = 4096;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t end = start + kChunk < n ? start + kChunk : n;
    T bad = 0;
    for (int64_t i = start; i < end; ++i) {
      T v;
      std::memcpy(&v, data + i * sizeof(T), sizeof(T));
      bad |= static_cast<T>((v & kExp) == kExp);
    }
    if (bad == 0) continue;
    for (int64_t i = start; i < end; ++i) {
      T v;
      std::memcpy(&v, data + i * sizeof(T), sizeof(T));
      if ((v & kExp) == kExp) return i;
    }
  }
  return -1;
}

}  // namespace

int64_t FirstNonFinite(DType dtype, absl::Span<const std::byte> bytes) {
  const int64_t n = static_cast<int64_t>(bytes.size()) / DTypeSize(dtype);
  switch (dtype) {
    case DType::kF32:
      return FirstNonFiniteBits<uint32_t, 0x7f800000u>(bytes.data(), n);
    case DType::kF16:
      return FirstNonFiniteBits<uint16_t, 0x7c00u>(bytes.data(), n);
    case DType::kBF16:
      return FirstNonFiniteBits<uint16_t, 0x7f80u>(bytes.data(), n);
    case DType::kI8:  // integers are finite
      return -1;
  }
  return -1;
}

}  // namespace prefixd
