// The CUDA interpreter's runtime (kernels/cuda/interpret), checked against what CUDA
// specifies: copies and sets reaching outside a device allocation are cudaErrorInvalidValue,
// not sticky, and do nothing; device memory starts as NaN and is accounted; captured work runs
// only when its graph is launched, reading pinned memory as it is then; calls a capture
// forbids invalidate it, in each capture mode as CUDA's do. Its device side is checked in
// cuda_interpret_device_test.cc, its half/bf16 conversions and cublasGemmEx in
// cuda_interpret_numerics_test.cc.
//
// Built only in an interpret build (tests/kernels_cuda/CMakeLists.txt): its kernels are host
// C++ run by the interpreter, and it asks the interpreter for counters.
#ifndef PREFIXD_CUDA_INTERPRET
#error "this test checks the CUDA interpreter: build with -DPREFIXD_CUDA_INTERPRET=ON"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/interpret/interpret.h"
#include "kernels/cuda/launch.cuh"
#include "tests/kernels_cuda/cuda_test_util.h"

namespace prefixd {
namespace {

using cuda::Launch;
using cuda_test::DeviceBuffer;

int64_t KernelLaunches() { return cuda_interpret::GetCounters().kernel_launches; }

// ---- 1. device memory -----------------------------------------------------------------------

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

// ---- 2. streams, capture and graphs ---------------------------------------------------------

__global__ void CountThreads(int* count) { atomicAdd(count, 1); }

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

}  // namespace
}  // namespace prefixd
