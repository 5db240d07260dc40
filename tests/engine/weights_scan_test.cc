// FirstNonFinite against each dtype's NaN and infinity encodings, at every position around
// its chunk boundary, and the finite extremes it must let through.
#include "engine/weights_scan.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace prefixd {
namespace {

template <typename T>
absl::Span<const std::byte> Bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

TEST(WeightsScanTest, F32) {
  const float kFinite[] = {0.0f,
                           -0.0f,
                           1.0f,
                           std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::denorm_min()};
  std::vector<float> v(10000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = kFinite[i % 6];
  EXPECT_EQ(FirstNonFinite(DType::kF32, Bytes(v)), -1);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (size_t at : {size_t{0}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{9999}}) {
      std::vector<float> w = v;
      w[at] = bad;
      w[9999 - at / 2] = bad;  // a later hit must not win
      EXPECT_EQ(FirstNonFinite(DType::kF32, Bytes(w)),
                static_cast<int64_t>(at < 9999 - at / 2 ? at : 9999 - at / 2));
    }
  }
  EXPECT_EQ(FirstNonFinite(DType::kF32, {}), -1);
}

TEST(WeightsScanTest, F16AndBF16) {
  // f16: exponent 0x7c00 (inf 0x7c00, NaN 0x7e00, -inf 0xfc00); 0x7bff is the largest finite.
  // bf16: exponent 0x7f80 (inf 0x7f80, NaN 0x7fc0); 0x7f7f is the largest finite.
  struct Case {
    DType dtype;
    uint16_t finite_max;
    std::vector<uint16_t> bad;
  };
  for (const Case& c : {Case{DType::kF16, 0x7bff, {0x7c00, 0x7e00, 0xfc00, 0x7c01}},
                        Case{DType::kBF16, 0x7f7f, {0x7f80, 0x7fc0, 0xff80, 0x7f81}}}) {
    std::vector<uint16_t> v(9000);
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<uint16_t>(i % 3 == 0 ? c.finite_max : i % 3 == 1 ? 0x8001 : 0x3c00);
    }
    EXPECT_EQ(FirstNonFinite(c.dtype, Bytes(v)), -1) << DTypeName(c.dtype);
    for (uint16_t bad : c.bad) {
      for (size_t at : {size_t{0}, size_t{4096}, size_t{8999}}) {
        std::vector<uint16_t> w = v;
        w[at] = bad;
        EXPECT_EQ(FirstNonFinite(c.dtype, Bytes(w)), static_cast<int64_t>(at))
            << DTypeName(c.dtype) << " " << bad << " at " << at;
      }
    }
  }
}

}  // namespace
}  // namespace prefixd
