// The int8 blocks of MatMul with AVX-VNNI (256-bit vpdpbusd: Intel since Alder Lake, AMD Zen
// 5), for CPUs that have it without AVX-512 VNNI, or when PREFIXD_CPU_ISA=avxvnni asks. As in
// matmul_avx512.cc, a target pragma covers only what follows the includes, and the int8
// template's functions have internal linkage, so no AVX-VNNI code can stand in for a copy
// that another file compiled for plain AVX2.
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"

namespace prefixd::internal {

// Outside the target: runs on every CPU. CPUID leaf 7 sub-leaf 1, EAX bit 4 (clang 14's
// __builtin_cpu_supports does not know "avxvnni"); the ymm state it needs is AVX2's, which
// this library requires anyway.
bool CpuHasAvxVnni() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 4)) != 0;
  }();
  return has;
}

}  // namespace prefixd::internal

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif

#include "kernels/cpu/matmul_int8.h"

namespace prefixd::internal {
namespace {

// vpdpbusd on 8 lanes, the same encoding as AVX-512's (matmul_avx512.cc Avx512VnniInt8): the
// panel's bytes (qw + 128) unsigned, the row's qa signed, each lane started from -128 x the
// row block's sum of qa, so it ends at exactly sum qw qa.
struct AvxVnniInt8 {
  using I = __m256i;
  using F = __m256;
  using W = __m256i;
  using A = __m256i;
  static constexpr int kLanes = 8;
  // 16 ymm: one row takes half the panel (4 vectors: 4 integer and 4 float accumulators, 4
  // weight vectors and a broadcast), 2 or 3 rows a quarter (2 x 3 x 2 accumulators + 2 + 1).
  static constexpr int kMaxTileRows = 3;
  static constexpr int Tile(int rows) { return rows == 1 ? 4 : 2; }
  static W Weights(const uint8_t* p) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
  }
  static A Acts(const int8_t* p) {
    int32_t x;
    std::memcpy(&x, p, 4);
    return _mm256_set1_epi32(x);
  }
  static I Init(int32_t sum) { return _mm256_set1_epi32(-128 * sum); }
  static I Dot(I acc, W w, A a) { return _mm256_dpbusd_avx_epi32(acc, w, a); }
  static F ToFloat(I x) { return _mm256_cvtepi32_ps(x); }
  static F FLoad(const float* p) { return _mm256_load_ps(p); }
  static void FStore(float* p, F x) { _mm256_store_ps(p, x); }
  static F FZero() { return _mm256_setzero_ps(); }
  static F FSet1(float x) { return _mm256_set1_ps(x); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
};

}  // namespace

void PanelInt8AvxVnni(const Int8Rows& a, int64_t row0, int64_t rows, PanelRef panel, float* out) {
  PREFIXD_CHECK(panel.dtype == DType::kI8 && rows >= 1 && rows <= kMaxBatchRows);
  Int8Panel<AvxVnniInt8>(a, row0, rows, panel.data, (panel.k + kInt8BlockK - 1) / kInt8BlockK, out);
}

}  // namespace prefixd::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
