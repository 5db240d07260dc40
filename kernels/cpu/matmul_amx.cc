// The int8 blocks of MatMul on AMX tiles (Intel Sapphire Rapids and later): the integer sum of
// each 16-row x 16-column x 32-k block is one tdpbsud, and the fp32 steps of the int8
// invariant (matmul_int8.h) follow on AVX-512, in the same order as every other path, so the
// bits are MatMulReferenceInt8's. As in matmul_avx512.cc, a target pragma covers only what
// follows the includes.
//
// The tiles read the int8 panels exactly as packed for VNNI (matmul_kernels.h): one K block of a
// 16-column slice is 8 quad rows of 64 bytes at a stride of kInt8QuadRowBytes, which is a B tile
// of 8 rows as tileloadd takes it, and the bytes are qw + 128, the unsigned operand of tdpbsud
// (signed activations x unsigned weights). So no second packing exists: the weights are held
// once, and the integer sum is corrected by -128 x (the row block's sum of qa) as on VNNI.
//
// Per row tile (16 rows) and column tile (16 columns) the 16 fp32 accumulators stay in zmm
// registers across all K blocks; each block's int32 sums go through a 1 KiB buffer (tilestored,
// then a vector load per row: the fp32 step needs them in vector registers). Two C tiles take
// turns, so one block's tdpbsud runs while the previous block's sums are scaled.
//
// Rows are taken 16 at a time; a remainder under 16 rows (and any call of fewer) goes to the
// AVX-512 VNNI blocks, which give the same bits.
//
// Tiles need two things from the OS and the thread: the process asks the kernel for the tile
// data state once (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), in CpuHasAmx), and each
// thread loads the tile configuration below before its first tile instruction (lazily, on its
// first call: thread_local). Nothing else in the process uses tiles, so the configuration
// stays loaded.
//
// For tests on CPUs without AMX, the same kernel runs with the tile instructions done in scalar
// code (EmulatedTiles, SetAmxEmulationForTesting): that proves the tiling, the operand layout
// and the fp32 order, not the speed, and not the hardware's reading of the configuration.
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"

// As in matmul_avx512.cc: g++ 12's avx512fintrin.h trips -Wmaybe-uninitialized on its own
// unused merge sources.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace prefixd::internal {
namespace {

std::atomic<bool> g_amx_emulation{false};

// The kernel's own request for the tile data state (Linux 5.16+; asm/prctl.h's names).
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

}  // namespace

// Outside the target: runs on every CPU. CPUID leaf 7 sub-leaf 0, EDX bit 24 (AMX-TILE) and
// bit 25 (AMX-INT8), then the permission request: without it the first tile instruction
// faults. One line on stderr when the CPU has the tiles but the kernel refuses them.
bool CpuHasAmx() {
  static const bool has = [] {
    if (!CpuHasAvx512Vnni()) return false;  // the fp32 steps and the tails are AVX-512's
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    if ((edx & (1u << 24)) == 0 || (edx & (1u << 25)) == 0) return false;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
      std::fprintf(stderr,
                   "prefixd: the CPU has AMX tiles but the kernel refused them "
                   "(arch_prctl ARCH_REQ_XCOMP_PERM: %s); int8 uses AVX-512 VNNI\n",
                   std::strerror(errno));
      return false;
    }
    return true;
  }();
  return has;
}

bool AmxEmulated() { return g_amx_emulation.load(std::memory_order_relaxed); }

void SetAmxEmulation(bool on) {
  PREFIXD_CHECK(!on || CpuHasAvx512Vnni());
  g_amx_emulation.store(on, std::memory_order_relaxed);
}

}  // namespace prefixd::internal

#if defined(__clang__)
#pragma clang attribute push(                                                                 \
    __attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni,fma,f16c,amx-tile,amx-int8"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni,fma,f16c,amx-tile,amx-int8")
#endif

namespace prefixd::internal {
namespace {

constexpr int kTileRows = 16;  // rows of a C tile (and of A)
constexpr int kTileCols = 16;  // int32 columns of a C tile
// Tiles: two C (16 x 16 int32), two A (16 rows x 32 bytes: a K block of 16 rows of qa), two B
// (8 quad rows x 64 bytes: a K block of 16 columns of the panel). A pair each, taking turns.
constexpr int kC0 = 0, kC1 = 1, kA0 = 2, kA1 = 3, kB0 = 4, kB1 = 5;

// The tile configuration (palette 1) in LDTILECFG's 64-byte layout.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row, by tile
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

constexpr TileConfig MakeTileConfig() {
  TileConfig c;
  for (int t : {kC0, kC1}) {
    c.rows[t] = kTileRows;
    c.colsb[t] = kTileCols * 4;
  }
  for (int t : {kA0, kA1}) {
    c.rows[t] = kTileRows;
    c.colsb[t] = kInt8BlockK;
  }
  for (int t : {kB0, kB1}) {
    c.rows[t] = kInt8QuadRows;
    c.colsb[t] = kTileCols * 4;
  }
  return c;
}
constexpr TileConfig kTileConfig = MakeTileConfig();

// The tile instructions the kernel uses. g++'s intrinsics paste the tile number into the
// assembly text, so each takes a literal: one branch per tile the kernel names.
struct HardwareTiles {
  static void Configure() {
    thread_local bool configured = false;
    if (!configured) {
      _tile_loadconfig(&kTileConfig);
      configured = true;
    }
  }
  template <int T>
  static void Zero() {
    static_assert(T == kC0 || T == kC1);
    if constexpr (T == kC0) {
      _tile_zero(0);
    } else {
      _tile_zero(1);
    }
  }
  template <int T>
  static void Load(const void* p, int64_t stride) {
    static_assert(T == kA0 || T == kA1 || T == kB0 || T == kB1);
    if constexpr (T == kA0) {
      _tile_loadd(2, p, stride);
    } else if constexpr (T == kA1) {
      _tile_loadd(3, p, stride);
    } else if constexpr (T == kB0) {
      _tile_loadd(4, p, stride);
    } else {
      _tile_loadd(5, p, stride);
    }
  }
  template <int T>
  static void Store(void* p, int64_t stride) {
    static_assert(T == kC0 || T == kC1);
    if constexpr (T == kC0) {
      _tile_stored(0, p, stride);
    } else {
      _tile_stored(1, p, stride);
    }
  }
  template <int C, int A, int B>
  static void DotSignedUnsigned() {
    static_assert((C == kC0 && A == kA0 && B == kB0) || (C == kC1 && A == kA1 && B == kB1));
    if constexpr (C == kC0) {
      _tile_dpbsud(0, 2, 4);
    } else {
      _tile_dpbsud(1, 3, 5);
    }
  }
};

// The same instructions in scalar code, as the ISA reference describes them, over the
// configuration above (per thread, as tile registers are).
struct EmulatedTiles {
  struct State {
    alignas(64) uint8_t tile[8][16][64];
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  static void Configure() {}
  template <int T>
  static void Zero() {
    std::memset(state().tile[T], 0, sizeof(state().tile[T]));
  }
  template <int T>
  static void Load(const void* p, int64_t stride) {
    for (int r = 0; r < kTileConfig.rows[T]; ++r) {
      std::memcpy(state().tile[T][r], static_cast<const uint8_t*>(p) + r * stride,
                  kTileConfig.colsb[T]);
    }
  }
  template <int T>
  static void Store(void* p, int64_t stride) {
    for (int r = 0; r < kTileConfig.rows[T]; ++r) {
      std::memcpy(static_cast<uint8_t*>(p) + r * stride, state().tile[T][r], kTileConfig.colsb[T]);
    }
  }
  // TDPBSUD: C[m, n] += sum over k < colsb(A) / 4 and i < 4 of
  // int8 A[m, 4k + i] x uint8 B[k, 4n + i], in int32 (wrapping, which these sums never reach).
  template <int C, int A, int B>
  static void DotSignedUnsigned() {
    static_assert(kTileConfig.colsb[A] / 4 == kTileConfig.rows[B]);
    static_assert(kTileConfig.colsb[C] == kTileConfig.colsb[B]);
    static_assert(kTileConfig.rows[C] == kTileConfig.rows[A]);
    State& s = state();
    for (int m = 0; m < kTileConfig.rows[C]; ++m) {
      for (int n = 0; n < kTileConfig.colsb[C] / 4; ++n) {
        int32_t acc;
        std::memcpy(&acc, &s.tile[C][m][4 * n], 4);
        for (int k = 0; k < kTileConfig.colsb[A] / 4; ++k) {
          for (int i = 0; i < 4; ++i) {
            acc += int32_t{static_cast<int8_t>(s.tile[A][m][4 * k + i])} *
                   int32_t{s.tile[B][k][4 * n + i]};
          }
        }
        std::memcpy(&s.tile[C][m][4 * n], &acc, 4);
      }
    }
  }
};

// Starts block b's integer sums for a row tile and a column tile in tile C (from A and B).
template <class Tiles, int C, int A, int B>
__attribute__((always_inline)) inline void IssueBlock(const int8_t* qa, int64_t q_stride,
                                                      const uint8_t* panel, int64_t col0,
                                                      int64_t b) {
  Tiles::template Zero<C>();
  Tiles::template Load<A>(qa + b * kInt8BlockK, q_stride);
  Tiles::template Load<B>(panel + b * kInt8BlockBytes + col0 * 4, kInt8QuadRowBytes);
  Tiles::template DotSignedUnsigned<C, A, B>();
}

// Takes block b's sums from tile C and adds them to the accumulators, the int8 invariant's
// fp32 step: acc = fma(float(isum), sa * sw, acc), with isum = the tile's sum - 128 x sum(qa).
template <class Tiles, int C>
__attribute__((always_inline)) inline void RetireBlock(const Int8Rows& a, int64_t row,
                                                       const uint8_t* panel, int64_t col0,
                                                       int64_t b, int32_t* sums, __m512* acc) {
  Tiles::template Store<C>(sums, kTileCols * 4);
  const __m512 sw = _mm512_load_ps(
      reinterpret_cast<const float*>(panel + b * kInt8BlockBytes + kInt8BlockWeightBytes) + col0);
#pragma GCC unroll 16
  for (int r = 0; r < kTileRows; ++r) {
    const int64_t rb = (row + r) * a.blocks + b;
    const __m512i isum = _mm512_add_epi32(_mm512_load_si512(sums + r * kTileCols),
                                          _mm512_set1_epi32(-128 * a.sum[rb]));
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(_mm512_set1_ps(a.scale[rb]), sw),
                             acc[r]);
  }
}

// out[r, col0 .. col0 + 16) for the 16 rows from `row` over all K blocks, in block order.
template <class Tiles>
void TileProduct(const Int8Rows& a, int64_t row, const uint8_t* panel, int64_t blocks,
                 int64_t col0, float* out) {
  alignas(64) int32_t sums[kTileRows * kTileCols];
  __m512 acc[kTileRows];
  for (__m512& x : acc) x = _mm512_setzero_ps();
  const int8_t* qa = a.q + row * a.q_stride;
  IssueBlock<Tiles, kC0, kA0, kB0>(qa, a.q_stride, panel, col0, 0);
  for (int64_t b = 0; b < blocks; b += 2) {
    if (b + 1 < blocks) IssueBlock<Tiles, kC1, kA1, kB1>(qa, a.q_stride, panel, col0, b + 1);
    RetireBlock<Tiles, kC0>(a, row, panel, col0, b, sums, acc);
    if (b + 1 < blocks) {
      if (b + 2 < blocks) IssueBlock<Tiles, kC0, kA0, kB0>(qa, a.q_stride, panel, col0, b + 2);
      RetireBlock<Tiles, kC1>(a, row, panel, col0, b + 1, sums, acc);
    }
  }
  for (int r = 0; r < kTileRows; ++r) _mm512_store_ps(out + r * kPanelWidth + col0, acc[r]);
}

// out[r, 0..64) for `row_tiles` x 16 rows from row0. Column tiles outermost: each 16-column
// slice of the panel (K/32 x 2.3 KiB) stays in L1 while every row tile passes over it.
template <class Tiles>
void TiledRows(const Int8Rows& a, int64_t row0, int64_t row_tiles, const uint8_t* panel,
               int64_t blocks, float* out) {
  Tiles::Configure();
  for (int64_t col0 = 0; col0 < kPanelWidth; col0 += kTileCols) {
    for (int64_t t = 0; t < row_tiles; ++t) {
      TileProduct<Tiles>(a, row0 + t * kTileRows, panel, blocks, col0,
                         out + t * kTileRows * kPanelWidth);
    }
  }
}

}  // namespace

void PanelInt8Amx(const Int8Rows& a, int64_t row0, int64_t rows, PanelRef panel, float* out) {
  PREFIXD_CHECK(panel.dtype == DType::kI8 && rows >= 1 && rows <= kMaxBatchRows);
  const int64_t blocks = (panel.k + kInt8BlockK - 1) / kInt8BlockK;
  const int64_t row_tiles = rows / kTileRows;
  const uint8_t* data = static_cast<const uint8_t*>(panel.data);
  if (row_tiles > 0) {
    if (AmxEmulated()) {
      TiledRows<EmulatedTiles>(a, row0, row_tiles, data, blocks, out);
    } else {
      PREFIXD_CHECK(CpuHasAmx());  // a tile instruction would be SIGILL
      TiledRows<HardwareTiles>(a, row0, row_tiles, data, blocks, out);
    }
  }
  const int64_t tiled = row_tiles * kTileRows;
  if (rows > tiled) {
    PanelInt8Avx512(a, row0 + tiled, rows - tiled, panel, out + tiled * kPanelWidth);
  }
}

}  // namespace prefixd::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
