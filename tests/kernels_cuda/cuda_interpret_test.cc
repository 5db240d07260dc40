// The CUDA interpreter itself (kernels/cuda/interpret), checked against what CUDA specifies, so
// that the real kernels passing under it means something: __syncthreads is a barrier and
// launch coordinates are CUDA's in 1, 2 and 3 dimensions; warp shuffles exchange within each
// warp as CUDA's (width segments included); launches a GPU refuses get the same error, not
// sticky; divergent barriers and shuffles after a lane exited are sticky launch failures that
// name the block and thread; out-of-bounds device accesses are caught (AddressSanitizer, or
// cudaErrorInvalidValue for copies); device memory starts as NaN and is accounted; captured
// work runs only when its graph is launched; half/bf16 conversions round bit for bit as
// CUDA's; cublasGemmEx has cuBLAS's column-major semantics and argument checks.
//
// Built only in an interpret build (tests/kernels_cuda/CMakeLists.txt): its kernels are host
// C++ run by the interpreter, and it asks the interpreter for counters and failure text.
#ifndef PREFIXD_CUDA_INTERPRET
#error "cuda_interpret_test tests the CUDA interpreter: build with -DPREFIXD_CUDA_INTERPRET=ON"
#endif

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cuda/interpret/interpret.h"
#include "kernels/cuda/launch.cuh"
#include "tests/kernels_cuda/cuda_test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define PREFIXD_TEST_HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PREFIXD_TEST_HAVE_ASAN 1
#endif
#endif

namespace prefixd {
namespace {

using cuda::Launch;
using cuda_test::DeviceBuffer;

constexpr unsigned kFullMask = 0xffffffffu;

int64_t KernelLaunches() { return cuda_interpret::GetCounters().kernel_launches; }

// ---- 1. barriers and coordinates ------------------------------------------------------------

// Each thread publishes its value, waits, reads its right neighbour's; then, through the same
// shared array, publishes 2 * that + 1 and reads its left neighbour's (its own input, doubled
// plus one). The interpreter runs thread 0 first until it blocks, so without real barriers
// thread 0 would read slots nobody has written yet in this block.
__global__ void RotateThroughShared(const int* in, int* right, int* left) {  // [grid * block]
  __shared__ int s[256];
  const int t = threadIdx.x, n = blockDim.x, base = blockIdx.x * blockDim.x;
  s[t] = in[base + t];
  __syncthreads();
  const int r = s[(t + 1) % n];
  __syncthreads();  // everyone has read before anyone overwrites
  s[t] = 2 * r + 1;
  __syncthreads();
  right[base + t] = r;
  left[base + t] = s[(t + n - 1) % n];
}

// The classic shared-memory tree reduction: a barrier per level.
__global__ void BlockSum(const int* in, int* out) {  // in [grid * block], out [grid]
  __shared__ int s[256];
  s[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

TEST(CudaInterpretBarrierTest, SyncThreadsIsABarrierInEveryBlock) {
  constexpr int kBlocks = 3, kThreads = 256, kN = kBlocks * kThreads;
  std::vector<int> in(kN);
  // Distinct across blocks too: a block reading another block's leftovers shows.
  for (int i = 0; i < kN; ++i) in[i] = 1000 * i + 7;
  DeviceBuffer d_in(in), right(kN * sizeof(int)), left(kN * sizeof(int));
  DeviceBuffer sums(kBlocks * sizeof(int));
  ASSERT_TRUE(d_in.ok() && right.ok() && left.ok() && sums.ok());
  Launch(RotateThroughShared, dim3(kBlocks), dim3(kThreads), 0, nullptr, d_in.get<int>(),
         right.get<int>(), left.get<int>());
  Launch(BlockSum, dim3(kBlocks), dim3(kThreads), 0, nullptr, d_in.get<int>(), sums.get<int>());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess) << cuda_interpret::LastFailure();
  const std::vector<int> r = right.Download<int>(), l = left.Download<int>();
  const std::vector<int> s = sums.Download<int>();
  for (int b = 0; b < kBlocks; ++b) {
    int64_t sum = 0;
    for (int t = 0; t < kThreads; ++t) {
      const int i = b * kThreads + t;
      sum += in[i];
      EXPECT_EQ(r[i], in[b * kThreads + (t + 1) % kThreads]) << "block " << b << " thread " << t;
      EXPECT_EQ(l[i], 2 * in[i] + 1) << "block " << b << " thread " << t;
    }
    EXPECT_EQ(s[b], sum) << "block " << b;
  }
}

// Every thread writes its coordinates, the launch's dimensions and, in blocks of whole warps,
// the value its lane partner (lane ^ 1) passed to a shuffle: CUDA numbers lanes by the linear
// thread index, x fastest.
constexpr int kRecordInts = 13;
__global__ void RecordCoordinates(int* out, int* threads_run) {  // [blocks * threads, 13], [1]
  const int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int per_block = blockDim.x * blockDim.y * blockDim.z;
  int* r = out + (block * per_block + thread) * kRecordInts;
  const unsigned v[12] = {threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z,
                          blockDim.x,  blockDim.y,  blockDim.z,  gridDim.x,  gridDim.y,  gridDim.z};
  for (int i = 0; i < 12; ++i) r[i] = static_cast<int>(v[i]);
  r[12] = per_block % 32 == 0 ? __shfl_xor_sync(kFullMask, thread, 1) : -2;
  atomicAdd(threads_run, 1);
}

TEST(CudaInterpretBarrierTest, MultiDimensionalCoordinatesAreCudas) {
  struct Shape {
    dim3 grid, block;
  };
  for (const Shape& shape : {Shape{dim3(3, 2, 2), dim3(4, 4, 4)},      // 64 threads, 2 warps
                             Shape{dim3(2, 3, 4), dim3(3, 5, 2)},      // 30: no whole warp
                             Shape{dim3(1, 1, 2), dim3(1, 1, 64)}}) {  // the largest block.z
    const dim3 g = shape.grid, b = shape.block;
    SCOPED_TRACE(
        absl::StrCat("grid ", g.x, "x", g.y, "x", g.z, " block ", b.x, "x", b.y, "x", b.z));
    const int per_block = b.x * b.y * b.z, blocks = g.x * g.y * g.z;
    DeviceBuffer out(static_cast<size_t>(blocks) * per_block * kRecordInts * sizeof(int));
    std::vector<int> zero(1, 0);
    DeviceBuffer count(zero);
    ASSERT_TRUE(out.ok() && count.ok());
    Launch(RecordCoordinates, g, b, 0, nullptr, out.get<int>(), count.get<int>());
    ASSERT_EQ(cudaGetLastError(), cudaSuccess) << cuda_interpret::LastFailure();
    EXPECT_EQ(count.Download<int>()[0], blocks * per_block);  // each thread ran exactly once
    const std::vector<int> got = out.Download<int>();
    for (int blk = 0; blk < blocks; ++blk) {
      for (int t = 0; t < per_block; ++t) {
        const int want[kRecordInts] = {static_cast<int>(t % b.x),
                                       static_cast<int>(t / b.x % b.y),
                                       static_cast<int>(t / (b.x * b.y)),
                                       static_cast<int>(blk % g.x),
                                       static_cast<int>(blk / g.x % g.y),
                                       static_cast<int>(blk / (g.x * g.y)),
                                       static_cast<int>(b.x),
                                       static_cast<int>(b.y),
                                       static_cast<int>(b.z),
                                       static_cast<int>(g.x),
                                       static_cast<int>(g.y),
                                       static_cast<int>(g.z),
                                       per_block % 32 == 0 ? t ^ 1 : -2};
        for (int i = 0; i < kRecordInts; ++i) {
          ASSERT_EQ(got[(static_cast<size_t>(blk) * per_block + t) * kRecordInts + i], want[i])
              << "block " << blk << " thread " << t << " field " << i;
        }
      }
    }
  }
}

// ---- 2. warp shuffles -----------------------------------------------------------------------

constexpr int kShuffleOutputs = 7;
// out [7, grid * block], wide [grid * block]; blocks of whole warps.
__global__ void WarpShuffles(const int* in, int* out, double* wide) {
  const int total = gridDim.x * blockDim.x;
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int v = in[g];
  int sum = v;
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
  out[0 * total + g] = sum;
  out[1 * total + g] = __shfl_sync(kFullMask, v, 7);
  out[2 * total + g] = __shfl_down_sync(kFullMask, v, 5);
  // Warp w rotates by w + 1 lanes: the warps of a block make different numbers of exchanges.
  int r = v;
  for (int i = 0; i <= warp; ++i) r = __shfl_sync(kFullMask, r, (lane + 1) % 32);
  out[3 * total + g] = r;
  // Segments of `width` lanes: an xor reaching a later segment returns the caller's own value,
  // one reaching an earlier segment reads it; an index is taken modulo the width (as
  // PTX shfl's bit mask: -1 is the segment's last lane); down never leaves the segment.
  out[4 * total + g] = __shfl_xor_sync(kFullMask, v, 16, 16);
  out[5 * total + g] = __shfl_sync(kFullMask, v, -1, 8);
  out[6 * total + g] = __shfl_down_sync(kFullMask, v, 3, 16);
  // 64-bit values travel whole.
  wide[g] = __shfl_xor_sync(kFullMask, v * (1.0 + std::ldexp(1.0, -40)), 3);
}

TEST(CudaInterpretWarpTest, ShufflesExchangeWithinEachWarpAsCudas) {
  constexpr int kBlocks = 2, kThreads = 128, kN = kBlocks * kThreads;
  std::vector<int> in(kN);
  for (int i = 0; i < kN; ++i) in[i] = 3 * i * i + 1;  // distinct, and a distinct sum per warp
  DeviceBuffer d_in(in), out(kShuffleOutputs * kN * sizeof(int)), wide(kN * sizeof(double));
  ASSERT_TRUE(d_in.ok() && out.ok() && wide.ok());
  Launch(WarpShuffles, dim3(kBlocks), dim3(kThreads), 0, nullptr, d_in.get<int>(), out.get<int>(),
         wide.get<double>());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess) << cuda_interpret::LastFailure();
  const std::vector<int> got = out.Download<int>();
  const std::vector<double> got_wide = wide.Download<double>();
  for (int g = 0; g < kN; ++g) {
    const int lane = g % 32, warp_base = g - lane, warp_in_block = (g % kThreads) / 32;
    auto at = [&](int l) { return in[warp_base + l]; };
    int sum = 0;
    for (int l = 0; l < 32; ++l) sum += at(l);
    const int want[kShuffleOutputs] = {sum,
                                       at(7),
                                       lane + 5 < 32 ? at(lane + 5) : at(lane),
                                       at((lane + warp_in_block + 1) % 32),
                                       lane < 16 ? at(lane) : at(lane - 16),
                                       at(lane / 8 * 8 + 7),
                                       lane % 16 + 3 < 16 ? at(lane + 3) : at(lane)};
    for (int o = 0; o < kShuffleOutputs; ++o) {
      EXPECT_EQ(got[o * kN + g], want[o]) << "output " << o << " thread " << g;
    }
    EXPECT_EQ(got_wide[g], at(lane ^ 3) * (1.0 + std::ldexp(1.0, -40))) << "thread " << g;
  }
}

// ---- 3. launches a GPU refuses --------------------------------------------------------------

__global__ void CountThreads(int* count) { atomicAdd(count, 1); }

TEST(CudaInterpretLaunchTest, RefusedConfigurationsGetCudasErrorsAndAreNotSticky) {
  struct Refused {
    const char* what;
    dim3 grid, block;
    size_t shared_bytes;
    cudaError_t error;
  };
  const Refused kRefused[] = {
      {"1025 threads", dim3(1), dim3(1025), 0, cudaErrorInvalidConfiguration},
      {"32 x 32 x 2 threads", dim3(1), dim3(32, 32, 2), 0, cudaErrorInvalidConfiguration},
      {"block.x 0", dim3(1), dim3(0), 0, cudaErrorInvalidConfiguration},
      {"block.y 0", dim3(1), dim3(32, 0, 1), 0, cudaErrorInvalidConfiguration},
      {"block.z 0", dim3(1), dim3(32, 1, 0), 0, cudaErrorInvalidConfiguration},
      {"grid.x 0", dim3(0), dim3(32), 0, cudaErrorInvalidConfiguration},
      {"grid.y 0", dim3(1, 0, 1), dim3(32), 0, cudaErrorInvalidConfiguration},
      {"grid.z 0", dim3(1, 1, 0), dim3(32), 0, cudaErrorInvalidConfiguration},
      {"block.z 65", dim3(1), dim3(1, 1, 65), 0, cudaErrorInvalidConfiguration},
      {"grid.x 2^31", dim3(0x80000000u), dim3(1), 0, cudaErrorInvalidConfiguration},
      {"grid.y 65536", dim3(1, 65536, 1), dim3(1), 0, cudaErrorInvalidConfiguration},
      {"grid.z 65536", dim3(1, 1, 65536), dim3(1), 0, cudaErrorInvalidConfiguration},
      {"48 KiB + 1 of dynamic shared memory", dim3(1), dim3(32), (48 << 10) + 1,
       cudaErrorInvalidValue},
  };
  std::vector<int> zero(1, 0);
  DeviceBuffer count(zero);
  ASSERT_TRUE(count.ok());
  for (const Refused& r : kRefused) {
    SCOPED_TRACE(r.what);
    const int64_t launches = KernelLaunches();
    Launch(CountThreads, r.grid, r.block, r.shared_bytes, nullptr, count.get<int>());
    EXPECT_EQ(cudaPeekAtLastError(), r.error);
    EXPECT_EQ(cudaGetLastError(), r.error);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read and cleared: not sticky
    EXPECT_EQ(KernelLaunches(), launches);       // nothing ran
    EXPECT_NE(cuda_interpret::LastFailure().find("refused"), std::string::npos);
  }
  EXPECT_EQ(count.Download<int>()[0], 0);
  // The limits themselves are accepted, and the device is healthy after the refusals.
  Launch(CountThreads, dim3(2), dim3(1024), 48 << 10, nullptr, count.get<int>());
  Launch(CountThreads, dim3(1, 2, 3), dim3(1, 1, 64), 0, nullptr, count.get<int>());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << cuda_interpret::LastFailure();
  EXPECT_EQ(count.Download<int>()[0], 2 * 1024 + 6 * 64);
}

// ---- 4. sticky launch failures (death tests: a sticky error poisons the process) -------------

// In the death test's child: prints what did not match and exits 1, or exits 0.
[[noreturn]] void ExitWith(const std::string& mismatches) {
  std::fprintf(stderr, "%s", mismatches.c_str());
  std::_Exit(mismatches.empty() ? 0 : 1);
}

// Checks, after a launch that failed while it ran, that the failure is cudaErrorLaunchFailure
// from then on whatever is called, that nothing runs any more, and that LastFailure() says
// `where`. Returns what did not match.
std::string CheckStickyLaunchFailure(int64_t launches_before, const std::string& where) {
  std::string bad;
  auto expect = [&bad](const char* call, int got, int want) {
    if (got != want) absl::StrAppend(&bad, call, " returned ", got, ", want ", want, "\n");
  };
  expect("launches", KernelLaunches() - launches_before, 1);
  expect("cudaGetLastError", cudaGetLastError(), cudaErrorLaunchFailure);
  expect("cudaGetLastError again", cudaGetLastError(), cudaErrorLaunchFailure);
  expect("cudaPeekAtLastError", cudaPeekAtLastError(), cudaErrorLaunchFailure);
  expect("cudaDeviceSynchronize", cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  expect("cudaStreamSynchronize", cudaStreamSynchronize(nullptr), cudaErrorLaunchFailure);
  void* p = nullptr;
  expect("cudaMalloc", cudaMalloc(&p, 256), cudaErrorLaunchFailure);
  int host = 0;
  int* device = nullptr;
  expect("cudaMemcpy", cudaMemcpy(&host, &host, sizeof(host), cudaMemcpyHostToHost),
         cudaErrorLaunchFailure);
  Launch(CountThreads, dim3(1), dim3(32), 0, nullptr, device);
  expect("launches after the failure", KernelLaunches() - launches_before, 1);
  expect("cudaGetLastError after a launch", cudaGetLastError(), cudaErrorLaunchFailure);
  const std::string failure = cuda_interpret::LastFailure();
  if (failure.find(where) == std::string::npos) {
    absl::StrAppend(&bad, "LastFailure() is \"", failure, "\", want it to contain \"", where,
                    "\"\n");
  }
  return bad;
}

// The thread (exit_block, exit_thread) returns before a barrier the rest of its block waits at.
__global__ void DivergentBarrier(int* out, int exit_block, int exit_thread) {  // [grid * block]
  if (static_cast<int>(blockIdx.x) == exit_block && static_cast<int>(threadIdx.x) == exit_thread) {
    return;
  }
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

std::string DivergentBarrierChild(int exit_block, int exit_thread, const std::string& where) {
  DeviceBuffer out(2 * 64 * sizeof(int));
  if (!out.ok()) return "cudaMalloc failed\n";
  const int64_t launches = KernelLaunches();
  Launch(DivergentBarrier, dim3(2), dim3(64), 0, nullptr, out.get<int>(), exit_block, exit_thread);
  return CheckStickyLaunchFailure(launches, where);
}

// Lane `exit_lane` returns before a shuffle the rest of its warp makes.
__global__ void ShuffleAfterExit(int* out, int exit_lane) {  // [block]
  if (static_cast<int>(threadIdx.x) == exit_lane) return;
  out[threadIdx.x] = __shfl_xor_sync(kFullMask, static_cast<int>(threadIdx.x), 1);
}

std::string ShuffleAfterExitChild(int exit_lane, const std::string& where) {
  DeviceBuffer out(64 * sizeof(int));
  if (!out.ok()) return "cudaMalloc failed\n";
  const int64_t launches = KernelLaunches();
  Launch(ShuffleAfterExit, dim3(1), dim3(64), 0, nullptr, out.get<int>(), exit_lane);
  return CheckStickyLaunchFailure(launches, where);
}

class CudaInterpretDeathTest : public ::testing::Test {
 protected:
  // OpenBLAS starts threads; a re-executed child is safe where a forked one may not be.
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CudaInterpretDeathTest, ThreadExitingBeforeABarrierOthersWaitAtIsStickyLaunchFailure) {
  // Threads 0-4 of block 1 wait at the barrier when thread 5 exits (threads run in order).
  EXPECT_EXIT(ExitWith(DivergentBarrierChild(1, 5, "block (1, 0, 0) thread (5, 0, 0) exited")),
              ::testing::ExitedWithCode(0),
              "cudaErrorLaunchFailure: kernel of grid \\(2, 1, 1\\) x block \\(64, 1, 1\\): "
              "block \\(1, 0, 0\\) thread \\(5, 0, 0\\) exited while 5 threads of its block "
              "wait at __syncthreads");
  // Thread 0 exits before anyone waits; thread 1 is the first to reach the barrier.
  EXPECT_EXIT(ExitWith(DivergentBarrierChild(0, 0, "block (0, 0, 0) thread (1, 0, 0)")),
              ::testing::ExitedWithCode(0),
              "cudaErrorLaunchFailure: .*block \\(0, 0, 0\\) thread \\(1, 0, 0\\): "
              "__syncthreads after 1 threads of the block exited");
}

TEST_F(CudaInterpretDeathTest, ShuffleAfterALaneExitedIsStickyLaunchFailure) {
  EXPECT_EXIT(ExitWith(ShuffleAfterExitChild(3, "block (0, 0, 0) thread (3, 0, 0) exited")),
              ::testing::ExitedWithCode(0),
              "cudaErrorLaunchFailure: .*block \\(0, 0, 0\\) thread \\(3, 0, 0\\) exited while "
              "3 lanes of its warp wait for it");
  // In the second warp: lanes 32-34 wait, warp 0 has finished and is not involved.
  EXPECT_EXIT(ExitWith(ShuffleAfterExitChild(35, "block (0, 0, 0) thread (35, 0, 0) exited")),
              ::testing::ExitedWithCode(0),
              "thread \\(35, 0, 0\\) exited while 3 lanes of its warp wait for it");
  EXPECT_EXIT(ExitWith(ShuffleAfterExitChild(0, "block (0, 0, 0) thread (1, 0, 0)")),
              ::testing::ExitedWithCode(0),
              "thread \\(1, 0, 0\\): warp operation with mask 0xffffffff after lane 0 of the "
              "warp exited");
}

// ---- 5. out-of-bounds accesses --------------------------------------------------------------

__global__ void ReadAt(const float* in, int index, float* out) { out[0] = in[index]; }
__global__ void WriteAt(float* out, int index) { out[index] = 1.0f; }

TEST_F(CudaInterpretDeathTest, OutOfBoundsDeviceAccessIsCaughtByAddressSanitizer) {
#ifndef PREFIXD_TEST_HAVE_ASAN
  GTEST_SKIP() << "kernels are built without AddressSanitizer (PREFIXD_CUDA_INTERPRET_ASAN=OFF)";
#else
  auto read = [](int index) {
    DeviceBuffer in(16 * sizeof(float)), out(sizeof(float));
    Launch(ReadAt, dim3(1), dim3(1), 0, nullptr, in.get<const float>(), index, out.get<float>());
  };
  auto write = [](int index) {
    DeviceBuffer out(16 * sizeof(float));
    Launch(WriteAt, dim3(1), dim3(1), 0, nullptr, out.get<float>(), index);
  };
  auto read_freed = [] {
    float* in = nullptr;
    DeviceBuffer out(sizeof(float));
    cudaMalloc(reinterpret_cast<void**>(&in), 16 * sizeof(float));
    cudaFree(in);
    Launch(ReadAt, dim3(1), dim3(1), 0, nullptr, in, 0, out.get<float>());
  };
  EXPECT_DEATH(read(16), "AddressSanitizer: heap-buffer-overflow.*READ of size 4");
  EXPECT_DEATH(write(-1), "AddressSanitizer: heap-buffer-overflow.*WRITE of size 4");
  EXPECT_DEATH(read_freed(), "AddressSanitizer: heap-use-after-free.*READ of size 4");
  // The last element is in bounds.
  read(15);
  write(15);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
#endif
}

TEST(CudaInterpretMemoryTest, CopiesAndSetsOutsideAnAllocationAreInvalidValue) {
  constexpr int kN = 64;
  std::vector<float> host(kN), back(kN + 1);
  for (int i = 0; i < kN; ++i) host[i] = static_cast<float>(i);
  DeviceBuffer d(host), other(kN * sizeof(float));
  ASSERT_TRUE(d.ok() && other.ok());
  float* p = d.get<float>();
  float* q = other.get<float>();
  struct Case {
    const char* what;
    std::function<cudaError_t()> call;
  };
  const Case kCases[] = {
      {"H2D one element past the end",
       [&] { return cudaMemcpy(p + 1, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice); }},
      {"H2D starting before the allocation",
       [&] { return cudaMemcpy(p - 1, host.data(), sizeof(float), cudaMemcpyHostToDevice); }},
      {"D2H one element past the end",
       [&] {
         return cudaMemcpy(back.data(), p, (kN + 1) * sizeof(float), cudaMemcpyDeviceToHost);
       }},
      {"D2D one element past the end",
       [&] { return cudaMemcpy(q, p + 1, kN * sizeof(float), cudaMemcpyDeviceToDevice); }},
      {"H2D into host memory",
       [&] { return cudaMemcpy(back.data(), host.data(), sizeof(float), cudaMemcpyHostToDevice); }},
      {"D2D from host memory",
       [&] { return cudaMemcpy(p, host.data(), sizeof(float), cudaMemcpyDeviceToDevice); }},
      {"memset one byte past the end", [&] { return cudaMemset(p, 0, kN * sizeof(float) + 1); }},
      {"async memset just past the end", [&] { return cudaMemsetAsync(p + kN, 0, 1, nullptr); }},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(c.call(), cudaErrorInvalidValue);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  }
  // Nothing of the refused calls was done, and the device still works.
  EXPECT_EQ(d.Download<float>(), host);
  // Freeing what is not an allocation's start is refused and frees nothing.
  int local = 0;
  EXPECT_EQ(cudaFree(p + 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(&local), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(d.Download<float>(), host);
  void* freed = nullptr;
  ASSERT_EQ(cudaMalloc(&freed, 64), cudaSuccess);
  ASSERT_EQ(cudaFree(freed), cudaSuccess);
  EXPECT_EQ(cudaFree(freed), cudaErrorInvalidValue);  // twice
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
}

// ---- 6. device memory -----------------------------------------------------------------------

__global__ void FlagNaN(const float* in, int* is_nan, int* as_int) {  // [block] each
  is_nan[threadIdx.x] = std::isnan(in[threadIdx.x]) ? 1 : 0;
  as_int[threadIdx.x] = reinterpret_cast<const int*>(in)[threadIdx.x];
}

TEST(CudaInterpretMemoryTest, FreshAllocationsHoldNaN) {
  DeviceBuffer fresh(64 * sizeof(float)), is_nan(64 * sizeof(int)), as_int(64 * sizeof(int));
  ASSERT_TRUE(fresh.ok() && is_nan.ok() && as_int.ok());
  const std::vector<uint8_t> bytes = fresh.Download<uint8_t>();
  for (size_t i = 0; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], 0xff) << "byte " << i;
  Launch(FlagNaN, dim3(1), dim3(64), 0, nullptr, fresh.get<const float>(), is_nan.get<int>(),
         as_int.get<int>());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(is_nan.Download<int>(), std::vector<int>(64, 1));
  EXPECT_EQ(as_int.Download<int>(), std::vector<int>(64, -1));
  // Half and bfloat16 reads of the same bytes are NaN too.
  EXPECT_TRUE(std::isnan(__half2float(__half{0xffff})));
  EXPECT_TRUE(std::isnan(__bfloat162float(__nv_bfloat16{0xffff})));
}

TEST(CudaInterpretMemoryTest, MemGetInfoAccountsAllocationsAndOverAllocationIsNotSticky) {
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  ASSERT_LE(free0, total);
  constexpr size_t kBytes = 3 << 20;
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, kBytes), cudaSuccess);
  size_t free1 = 0, total1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total1), cudaSuccess);
  EXPECT_EQ(total1, total);
  EXPECT_EQ(free1, free0 - kBytes);
  // Pinned host memory is not device memory.
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&free1, &total1), cudaSuccess);
  EXPECT_EQ(free1, free0 - kBytes);
  ASSERT_EQ(cudaFreeHost(pinned), cudaSuccess);
  // One byte more than is free: refused before anything is taken.
  void* too_big = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(cudaMalloc(&too_big, free1 + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(too_big, reinterpret_cast<void*>(0x1));
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  size_t free2 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free2, &total1), cudaSuccess);
  EXPECT_EQ(free2, free1);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&free2, &total1), cudaSuccess);
  EXPECT_EQ(free2, free0);
  // And allocations work afterwards.
  ASSERT_EQ(cudaMalloc(&p, 256), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

// ---- 7. streams, capture and graphs ---------------------------------------------------------

__global__ void Affine(const float* in, float* out, float a, float b, int n) {  // [n] each
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * in[i] + b;
}

TEST(CudaInterpretGraphTest, CapturedWorkRunsOnlyWhenLaunchedAndReadsPinnedMemoryThen) {
  constexpr int kN = 300;  // not a multiple of the block: the bounds check matters
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  float *pinned_in = nullptr, *pinned_out = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned_in), kN * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned_out), kN * sizeof(float)), cudaSuccess);
  for (int i = 0; i < kN; ++i) {
    pinned_in[i] = static_cast<float>(i);
    pinned_out[i] = -7.0f;
  }
  DeviceBuffer d_in(kN * sizeof(float)), d_out(kN * sizeof(float));
  ASSERT_TRUE(d_in.ok() && d_out.ok());
  const cuda_interpret::Counters before = cuda_interpret::GetCounters();

  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(
      cudaMemcpyAsync(d_in.get(), pinned_in, kN * sizeof(float), cudaMemcpyHostToDevice, stream),
      cudaSuccess);
  Launch(Affine, dim3((kN + 127) / 128), dim3(128), 0, stream, d_in.get<const float>(),
         d_out.get<float>(), 2.0f, 1.0f, kN);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(
      cudaMemcpyAsync(pinned_out, d_out.get(), kN * sizeof(float), cudaMemcpyDeviceToHost, stream),
      cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_NE(graph, nullptr);

  // Capture ran nothing: no kernel, no copy.
  EXPECT_EQ(cuda_interpret::GetCounters().kernel_launches, before.kernel_launches);
  for (int i = 0; i < kN; ++i) ASSERT_EQ(pinned_out[i], -7.0f) << i;
  for (float v : d_in.Download<float>()) ASSERT_TRUE(std::isnan(v));
  for (float v : d_out.Download<float>()) ASSERT_TRUE(std::isnan(v));

  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (int i = 0; i < kN; ++i) ASSERT_EQ(pinned_out[i], 2.0f * i + 1.0f) << i;
  // A replay copies what the pinned buffer holds when it runs, not what it held at capture.
  for (int i = 0; i < kN; ++i) pinned_in[i] = -3.0f * i;
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (int i = 0; i < kN; ++i) ASSERT_EQ(pinned_out[i], -6.0f * i + 1.0f) << i;
  const cuda_interpret::Counters after = cuda_interpret::GetCounters();
  EXPECT_EQ(after.kernel_launches - before.kernel_launches, 2);
  EXPECT_EQ(after.graph_launches - before.graph_launches, 2);

  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned_in), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned_out), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Captures a launch, makes `unsafe_call` (which must fail with `want`), and checks that the
// capture is invalidated, that the captured launch never runs, and that the process is
// healthy afterwards: plain launches and a new capture work.
void ExpectCaptureInvalidatedBy(cudaStreamCaptureMode mode,
                                cudaError_t (*unsafe_call)(cudaStream_t), cudaError_t want) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::vector<int> zero(1, 0);
  DeviceBuffer count(zero);
  ASSERT_TRUE(count.ok());
  const int64_t launches = KernelLaunches();
  ASSERT_EQ(cudaStreamBeginCapture(stream, mode), cudaSuccess);
  Launch(CountThreads, dim3(1), dim3(32), 0, stream, count.get<int>());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(unsafe_call(stream), want);
  EXPECT_EQ(cudaGetLastError(), want);
  // Work recorded into an invalidated capture is refused as such.
  Launch(CountThreads, dim3(1), dim3(32), 0, stream, count.get<int>());
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
  cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(0x1);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  EXPECT_EQ(KernelLaunches(), launches);
  EXPECT_EQ(count.Download<int>()[0], 0);
  // Healthy: a launch runs, and a new capture on the same stream replays.
  Launch(CountThreads, dim3(1), dim3(32), 0, stream, count.get<int>());
  ASSERT_EQ(cudaStreamBeginCapture(stream, mode), cudaSuccess);
  Launch(CountThreads, dim3(2), dim3(32), 0, stream, count.get<int>());
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(count.Download<int>()[0], 32 + 64);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(CudaInterpretGraphTest, SynchronizeDuringCaptureInvalidatesIt) {
  ExpectCaptureInvalidatedBy(cudaStreamCaptureModeGlobal, cudaStreamSynchronize,
                             cudaErrorStreamCaptureUnsupported);
}

TEST(CudaInterpretGraphTest, MallocDuringGlobalCaptureInvalidatesIt) {
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  static void* allocated = nullptr;
  ExpectCaptureInvalidatedBy(
      cudaStreamCaptureModeGlobal, [](cudaStream_t) { return cudaMalloc(&allocated, 256); },
      cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(allocated, nullptr);
  size_t free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_EQ(free1, free0);
}

TEST(CudaInterpretGraphTest, SynchronousCopyDuringGlobalCaptureInvalidatesIt) {
  ExpectCaptureInvalidatedBy(
      cudaStreamCaptureModeGlobal,
      [](cudaStream_t) {
        int a = 1, b = 2;
        return cudaMemcpy(&a, &b, sizeof(a), cudaMemcpyHostToHost);
      },
      cudaErrorStreamCaptureUnsupported);
}

TEST(CudaInterpretGraphTest, MallocDuringThisThreadsThreadLocalCaptureInvalidatesIt) {
  // The backend captures in thread-local mode: its own unsafe calls are still refused.
  static void* allocated = nullptr;
  ExpectCaptureInvalidatedBy(
      cudaStreamCaptureModeThreadLocal, [](cudaStream_t) { return cudaMalloc(&allocated, 256); },
      cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(allocated, nullptr);
}

// Begins a capture in `mode` on this thread, calls cudaMalloc on `other_thread` or this one,
// and returns {cudaMalloc's result, cudaStreamEndCapture's}.
std::pair<cudaError_t, cudaError_t> MallocDuringCapture(cudaStreamCaptureMode mode,
                                                        bool other_thread) {
  cudaStream_t stream = nullptr;
  cudaStreamCreate(&stream);
  cudaStreamBeginCapture(stream, mode);
  void* p = nullptr;
  cudaError_t malloc_result = cudaErrorUnknown;
  if (other_thread) {
    std::thread([&] { malloc_result = cudaMalloc(&p, 256); }).join();
  } else {
    malloc_result = cudaMalloc(&p, 256);
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end_result = cudaStreamEndCapture(stream, &graph);
  cudaGetLastError();
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (p != nullptr) cudaFree(p);
  cudaStreamDestroy(stream);
  return {malloc_result, end_result};
}

TEST(CudaInterpretGraphTest, CaptureModesProhibitUnsafeCallsAsCudas) {
  using Results = std::pair<cudaError_t, cudaError_t>;
  // Global: every thread is prohibited.
  EXPECT_EQ(MallocDuringCapture(cudaStreamCaptureModeGlobal, /*other_thread=*/true),
            Results(cudaErrorStreamCaptureUnsupported, cudaErrorStreamCaptureInvalidated));
  // Thread-local: only the capturing thread.
  EXPECT_EQ(MallocDuringCapture(cudaStreamCaptureModeThreadLocal, /*other_thread=*/false),
            Results(cudaErrorStreamCaptureUnsupported, cudaErrorStreamCaptureInvalidated));
  EXPECT_EQ(MallocDuringCapture(cudaStreamCaptureModeThreadLocal, /*other_thread=*/true),
            Results(cudaSuccess, cudaSuccess));
  // Relaxed: nobody.
  EXPECT_EQ(MallocDuringCapture(cudaStreamCaptureModeRelaxed, /*other_thread=*/false),
            Results(cudaSuccess, cudaSuccess));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// ---- 8. half and bfloat16 -------------------------------------------------------------------

uint16_t HalfBits(float f) { return __float2half_rn(f).__x; }
uint16_t BF16Bits(float f) { return __float2bfloat16_rn(f).__x; }

TEST(CudaInterpretHalfTest, ConversionsRoundAsCudas) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(HalfBits(1.0f), 0x3c00);
  EXPECT_EQ(HalfBits(-2.5f), 0xc100);
  EXPECT_EQ(HalfBits(0.0f), 0x0000);
  EXPECT_EQ(HalfBits(-0.0f), 0x8000);
  EXPECT_EQ(HalfBits(65504.0f), 0x7bff);   // the largest half
  EXPECT_EQ(HalfBits(65519.99f), 0x7bff);  // just below the midpoint to infinity
  EXPECT_EQ(HalfBits(65520.0f), 0x7c00);   // the midpoint: rounds (to even) to infinity
  EXPECT_EQ(HalfBits(-65520.0f), 0xfc00);
  EXPECT_EQ(HalfBits(inf), 0x7c00);
  EXPECT_EQ(HalfBits(-inf), 0xfc00);
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -14)), 0x0400);  // the smallest normal
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -25)), 0x0000);  // a tie: to the even zero
  EXPECT_EQ(HalfBits(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(HalfBits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(HalfBits(3 * std::ldexp(1.0f, -25)), 0x0002);  // a tie: to the even 2
  EXPECT_EQ(HalfBits(5 * std::ldexp(1.0f, -25)), 0x0002);  // a tie: to the even 2
  // The largest subnormal's midpoint to the smallest normal: a tie, to the even 0x0400.
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);
  EXPECT_EQ(HalfBits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even
  EXPECT_EQ(HalfBits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, even
  EXPECT_EQ(HalfBits(nan), 0x7fff);
  EXPECT_EQ(HalfBits(-nan), 0x7fff);

  EXPECT_EQ(BF16Bits(1.0f), 0x3f80);
  EXPECT_EQ(BF16Bits(-2.5f), 0xc020);
  EXPECT_EQ(BF16Bits(1.00390625f), 0x3f80);  // 1 + 2^-8, a tie: to even
  EXPECT_EQ(BF16Bits(1.01171875f), 0x3f82);  // 1 + 3 * 2^-8, a tie: to even
  EXPECT_EQ(BF16Bits(std::nextafter(1.00390625f, 2.0f)), 0x3f81);
  EXPECT_EQ(BF16Bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to infinity
  EXPECT_EQ(BF16Bits(-inf), 0xff80);
  EXPECT_EQ(BF16Bits(nan), 0x7fff);
  EXPECT_EQ(BF16Bits(-nan), 0x7fff);
  EXPECT_EQ(__bfloat162float(__nv_bfloat16{0x3f81}), 1.0078125f);
}

TEST(CudaInterpretHalfTest, EveryHalfDecodesExactlyAndRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = __half2float(__half{bits});
    const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (exp == 0x1f && mant != 0) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(HalfBits(f), 0x7fff) << std::hex << h;
      continue;
    }
    const double want = exp == 0x1f ? sign * std::numeric_limits<double>::infinity()
                        : exp == 0  ? sign * std::ldexp(mant, -24)
                                    : sign * std::ldexp(1024 + mant, exp - 25);
    ASSERT_EQ(static_cast<double>(f), want) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
    ASSERT_EQ(HalfBits(f), bits) << std::hex << h;
  }
}

TEST(CudaInterpretHalfTest, AgreesWithTheEnginesConversionsOnFiniteFloats) {
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<uint32_t> bits;
  // Half the draws near the half range (exponents 2^-27 .. 2^17), the rest anywhere.
  std::uniform_int_distribution<uint32_t> near_exp(100, 144);
  for (int i = 0; i < 1 << 20; ++i) {
    uint32_t u = bits(rng);
    if (i % 2 == 0) u = (u & 0x807fffffu) | (near_exp(rng) << 23);
    float f;
    std::memcpy(&f, &u, 4);
    if (!std::isfinite(f)) continue;
    ASSERT_EQ(HalfBits(f), FloatToHalf(f)) << std::hexfloat << f;
    ASSERT_EQ(BF16Bits(f), FloatToBF16(f)) << std::hexfloat << f;
    ASSERT_EQ(__half2float(__half{HalfBits(f)}), HalfToFloat(HalfBits(f))) << std::hexfloat << f;
  }
}

// ---- 9. cublasGemmEx ------------------------------------------------------------------------

// A column-major rows x cols matrix with leading dimension ld in dtype t; the padding rows
// hold NaN, so a product that read them would show it.
struct Matrix {
  int rows, cols, ld;
  std::vector<float> values;  // [cols, ld], dtype-rounded, NaN in the padding
};

Matrix RandomMatrix(int rows, int cols, int ld, DType t, std::mt19937* rng) {
  Matrix m{
      rows, cols, ld,
      std::vector<float>(static_cast<size_t>(ld) * cols, std::numeric_limits<float>::quiet_NaN())};
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int c = 0; c < cols; ++c) {
    for (int r = 0; r < rows; ++r) m.values[static_cast<size_t>(c) * ld + r] = dist(*rng);
  }
  m.values = cuda_test::Round(m.values, t);
  return m;
}

cudaDataType CudaType(DType t) {
  return t == DType::kF32 ? CUDA_R_32F : t == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
}

class CudaInterpretGemmTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS); }
  void TearDown() override { cublasDestroy(handle_); }
  cublasHandle_t handle_ = nullptr;
};

TEST_F(CudaInterpretGemmTest, MatchesADoubleReferenceForEveryOpAndDtype) {
  constexpr int kM = 5, kN = 4, kK = 7, kLdc = kM + 2;
  std::mt19937 rng(7);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      for (cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
        for (float beta : {-1.25f, 0.0f}) {
          SCOPED_TRACE(absl::StrCat(std::string(DTypeName(t)), " op(A) ",
                                    ta == CUBLAS_OP_T ? "T" : "N", " op(B) ",
                                    tb == CUBLAS_OP_T ? "T" : "N", " beta ", beta));
          const bool a_t = ta == CUBLAS_OP_T, b_t = tb == CUBLAS_OP_T;
          const int a_rows = a_t ? kK : kM, a_cols = a_t ? kM : kK;
          const int b_rows = b_t ? kN : kK, b_cols = b_t ? kK : kN;
          const Matrix a = RandomMatrix(a_rows, a_cols, a_rows + 3, t, &rng);
          const Matrix b = RandomMatrix(b_rows, b_cols, b_rows + 1, t, &rng);
          // C's padding holds a sentinel the product must leave alone; with beta = 0 its
          // values are NaN, which cuBLAS does not read.
          std::vector<float> c(static_cast<size_t>(kLdc) * kN, 4242.0f);
          std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
          for (int j = 0; j < kN; ++j) {
            for (int i = 0; i < kM; ++i) {
              c[j * kLdc + i] = beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : dist(rng);
            }
          }
          DeviceBuffer d_a(cuda_test::Encode(a.values, t)), d_b(cuda_test::Encode(b.values, t));
          DeviceBuffer d_c(c);
          ASSERT_TRUE(d_a.ok() && d_b.ok() && d_c.ok());
          const float alpha = 0.75f;
          ASSERT_EQ(cublasGemmEx(handle_, ta, tb, kM, kN, kK, &alpha, d_a.get(), CudaType(t), a.ld,
                                 d_b.get(), CudaType(t), b.ld, &beta, d_c.get(), CUDA_R_32F, kLdc,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    CUBLAS_STATUS_SUCCESS);
          const std::vector<float> got = d_c.Download<float>();
          for (int j = 0; j < kN; ++j) {
            for (int i = 0; i < kLdc; ++i) {
              const size_t at = static_cast<size_t>(j) * kLdc + i;
              if (i >= kM) {
                EXPECT_EQ(got[at], 4242.0f) << "C padding row " << i << " col " << j;
                continue;
              }
              double want = 0;
              for (int l = 0; l < kK; ++l) {
                const double av = a_t ? a.values[i * a.ld + l] : a.values[l * a.ld + i];
                const double bv = b_t ? b.values[l * b.ld + j] : b.values[j * b.ld + l];
                want += av * bv;
              }
              want = alpha * want + (beta == 0.0f ? 0.0 : beta * static_cast<double>(c[at]));
              // f16 and bf16 products are exact in fp32: only fp32 accumulation of 7 terms
              // of magnitude <= 1 (plus beta * C) rounds, well inside 1e-5.
              EXPECT_NEAR(got[at], want, 1e-5 + 1e-5 * std::fabs(want))
                  << "C(" << i << ", " << j << ")";
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaInterpretGemmTest, KZeroScalesCByBeta) {
  std::vector<float> c = {1.0f, -2.0f, 3.0f, 4.0f};
  DeviceBuffer d_a(sizeof(float)), d_b(sizeof(float)), d_c(c);
  ASSERT_TRUE(d_a.ok() && d_b.ok() && d_c.ok());
  const float alpha = 1.0f, beta = 0.5f;
  ASSERT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 0, &alpha, d_a.get(), CUDA_R_32F,
                         2, d_b.get(), CUDA_R_32F, 1, &beta, d_c.get(), CUDA_R_32F, 2,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(d_c.Download<float>(), (std::vector<float>{0.5f, -1.0f, 1.5f, 2.0f}));
}

TEST_F(CudaInterpretGemmTest, BadArgumentsAreRefusedAndLeaveCAlone) {
  constexpr int kM = 5, kN = 4, kK = 7;
  const std::vector<float> c(kM * kN, 9.0f);
  DeviceBuffer d_a(64 * 64 * sizeof(float)), d_b(64 * 64 * sizeof(float)), d_c(c);
  ASSERT_TRUE(d_a.ok() && d_b.ok() && d_c.ok());
  const float alpha = 1.0f, beta = 1.0f;
  struct Case {
    const char* what;
    cublasOperation_t ta, tb;
    int lda, ldb, ldc;
    cudaDataType a_type, b_type, c_type;
    cublasStatus_t want;
  };
  const Case kCases[] = {
      {"lda < m (A not transposed)", CUBLAS_OP_N, CUBLAS_OP_N, kM - 1, kK, kM, CUDA_R_32F,
       CUDA_R_32F, CUDA_R_32F, CUBLAS_STATUS_INVALID_VALUE},
      {"lda < k (A transposed), though >= m", CUBLAS_OP_T, CUBLAS_OP_N, kM, kK, kM, CUDA_R_32F,
       CUDA_R_32F, CUDA_R_32F, CUBLAS_STATUS_INVALID_VALUE},
      {"ldb < k (B not transposed)", CUBLAS_OP_N, CUBLAS_OP_N, kM, kK - 1, kM, CUDA_R_32F,
       CUDA_R_32F, CUDA_R_32F, CUBLAS_STATUS_INVALID_VALUE},
      {"ldb < n (B transposed)", CUBLAS_OP_N, CUBLAS_OP_T, kM, kN - 1, kM, CUDA_R_32F, CUDA_R_32F,
       CUDA_R_32F, CUBLAS_STATUS_INVALID_VALUE},
      {"ldc < m", CUBLAS_OP_N, CUBLAS_OP_N, kM, kK, kM - 1, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
       CUBLAS_STATUS_INVALID_VALUE},
      {"A f16, B bf16", CUBLAS_OP_N, CUBLAS_OP_N, kM, kK, kM, CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F,
       CUBLAS_STATUS_NOT_SUPPORTED},
      {"A, B f32, C f16", CUBLAS_OP_N, CUBLAS_OP_N, kM, kK, kM, CUDA_R_32F, CUDA_R_32F, CUDA_R_16F,
       CUBLAS_STATUS_NOT_SUPPORTED},
  };
  const int64_t gemms = cuda_interpret::GetCounters().gemms;
  for (const Case& k : kCases) {
    SCOPED_TRACE(k.what);
    EXPECT_EQ(cublasGemmEx(handle_, k.ta, k.tb, kM, kN, kK, &alpha, d_a.get(), k.a_type, k.lda,
                           d_b.get(), k.b_type, k.ldb, &beta, d_c.get(), k.c_type, k.ldc,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              k.want);
  }
  EXPECT_EQ(cuda_interpret::GetCounters().gemms, gemms);
  EXPECT_EQ(d_c.Download<float>(), c);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cuBLAS argument errors are not CUDA errors
}

}  // namespace
}  // namespace prefixd
