// The CUDA interpreter's device side (kernels/cuda/interpret), checked against what CUDA
// specifies, so that the real kernels passing under it means something: __syncthreads is a
// barrier and launch coordinates are CUDA's in 1, 2 and 3 dimensions; warp shuffles exchange
// within each warp as CUDA's (width segments included); launches a GPU refuses get the same
// error, not sticky; divergent barriers and shuffles after a lane exited are sticky launch
// failures that name the block and thread; a kernel's out-of-bounds device accesses are caught
// (AddressSanitizer). Its runtime is checked in cuda_interpret_runtime_test.cc, its half/bf16
// conversions and cublasGemmEx in cuda_interpret_numerics_test.cc.
//
// Built only in an interpret build (tests/kernels_cuda/CMakeLists.txt): its kernels are host
// C++ run by the interpreter, and it asks the interpreter for counters and failure text.
#ifndef PREFIXD_CUDA_INTERPRET
#error "this test checks the CUDA interpreter: build with -DPREFIXD_CUDA_INTERPRET=ON"
#endif

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

}  // namespace
}  // namespace prefixd
