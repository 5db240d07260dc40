// The error vocabulary of the CUDA backend, checked on any machine: CUDA failures become
// INTERNAL statuses that name the statement and location and are marked fatal; out of memory
// is RESOURCE_EXHAUSTED and leaves no error behind; a failed graph capture on a healthy
// context is recoverable; a machine without a usable device, or a listed device on which no
// context can be made, gets UNAVAILABLE from both the probe and the factory. The last two
// tests need a device and skip without one.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gelu.cuh"
#include "tests/kernels_cuda/cuda_test_util.h"
#ifdef PREFIXD_CUDA_INTERPRET
#include "kernels/cuda/interpret/interpret.h"
#endif

namespace prefixd {
namespace {

absl::Status FailingCall() {
  PREFIXD_CUDA_RETURN_IF_ERROR(cudaErrorIllegalAddress);
  return absl::OkStatus();
}

absl::Status FailingCublasCall() {
  PREFIXD_CUBLAS_RETURN_IF_ERROR(CUBLAS_STATUS_EXECUTION_FAILED);
  return absl::OkStatus();
}

absl::Status PassingCall() {
  PREFIXD_CUDA_RETURN_IF_ERROR(cudaSuccess);
  return absl::OkStatus();
}

TEST(CudaErrorsTest, CudaFailureIsFatalInternalWithStatementAndLocation) {
  const absl::Status s = FailingCall();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(IsFatalDeviceError(s));
  EXPECT_NE(s.message().find("cuda_errors_test.cc:"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("cudaErrorIllegalAddress"), absl::string_view::npos) << s;
  EXPECT_TRUE(PassingCall().ok());
}

TEST(CudaErrorsTest, CublasFailureIsFatalInternal) {
  const absl::Status s = FailingCublasCall();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(IsFatalDeviceError(s));
  EXPECT_NE(s.message().find("CUBLAS_STATUS_EXECUTION_FAILED"), absl::string_view::npos) << s;
}

TEST(CudaErrorsTest, OrdinaryErrorsAreNotFatal) {
  EXPECT_FALSE(IsFatalDeviceError(absl::OkStatus()));
  EXPECT_FALSE(IsFatalDeviceError(absl::InternalError("x")));
  EXPECT_FALSE(IsFatalDeviceError(absl::InvalidArgumentError("x")));
}

TEST(CudaErrorsTest, MissingDeviceIsUnavailable) {
#ifdef PREFIXD_CUDA_INTERPRET
  // The interpreter's device answers like a machine without a driver for this test.
  cuda_interpret::SimulateMissingDriver(true);
  struct Restore {
    ~Restore() { cuda_interpret::SimulateMissingDriver(false); }
  } restore;
#endif
  const absl::Status s = CudaDeviceAvailable();
  if (s.ok()) GTEST_SKIP() << "a CUDA device is present";
#ifdef PREFIXD_CUDA_INTERPRET
  EXPECT_NE(s.message().find("cudaErrorInsufficientDriver"), absl::string_view::npos) << s;
#endif
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_FALSE(s.message().empty());
  EXPECT_EQ(CudaDeviceAvailable(4096).code(), absl::StatusCode::kUnavailable);
}

TEST(CudaErrorsTest, NonexistentDeviceIsUnavailable) {
  EXPECT_EQ(CudaDeviceAvailable(-1).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CudaDeviceAvailable(1 << 20).code(), absl::StatusCode::kUnavailable);
}

TEST(CudaErrorsTest, FactoryRejectsMissingModel) {
  CudaBackendOptions options;
  EXPECT_EQ(CreateCudaBackend(options).status().code(), absl::StatusCode::kInvalidArgument);
}

using cuda::AfterGraphFailure;
using cuda::AllocationStatus;
using cuda::DeviceProbe;
using cuda::DeviceProbeStatus;
using cuda::GraphFailureAction;
using cuda::IsStickyCudaError;
using cuda::MemoryKind;
using ::testing::HasSubstr;

TEST(CudaErrorsTest, StickyErrorsAreTheOnesThatBreakTheContext) {
  for (cudaError_t e :
       {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorAssert, cudaErrorLaunchTimeout,
        cudaErrorMisalignedAddress, cudaErrorIllegalInstruction, cudaErrorECCUncorrectable}) {
    EXPECT_TRUE(IsStickyCudaError(e)) << cudaGetErrorName(e);
  }
  for (cudaError_t e :
       {cudaSuccess, cudaErrorMemoryAllocation, cudaErrorInvalidValue, cudaErrorNotSupported,
        cudaErrorStreamCaptureInvalidated, cudaErrorStreamCaptureUnsupported,
        cudaErrorDevicesUnavailable, cudaErrorInsufficientDriver}) {
    EXPECT_FALSE(IsStickyCudaError(e)) << cudaGetErrorName(e);
  }
}

TEST(CudaErrorsTest, OutOfMemoryIsResourceExhaustedAndNotFatal) {
  EXPECT_TRUE(AllocationStatus(cudaSuccess, 1024, MemoryKind::kDevice).ok());
  const absl::Status device =
      AllocationStatus(cudaErrorMemoryAllocation, 1024, MemoryKind::kDevice);
  EXPECT_EQ(device.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(IsFatalDeviceError(device));
  EXPECT_THAT(std::string(device.message()), HasSubstr("cudaMalloc of 1024 bytes"));
  EXPECT_THAT(std::string(device.message()), HasSubstr("device memory"));
  const absl::Status pinned =
      AllocationStatus(cudaErrorMemoryAllocation, 4096, MemoryKind::kPinnedHost);
  EXPECT_EQ(pinned.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(IsFatalDeviceError(pinned));
  EXPECT_THAT(std::string(pinned.message()), HasSubstr("cudaMallocHost of 4096 bytes"));
  EXPECT_THAT(std::string(pinned.message()), HasSubstr("pinned host memory"));
}

TEST(CudaErrorsTest, OtherAllocationFailuresStayFatalInternal) {
  const absl::Status s = AllocationStatus(cudaErrorIllegalAddress, 8, MemoryKind::kPinnedHost);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(IsFatalDeviceError(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("cudaMallocHost"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("cudaErrorIllegalAddress"));
}

TEST(CudaErrorsTest, FailedAllocationReturnsNullAndAnError) {
  void* p = reinterpret_cast<void*>(1);
  EXPECT_FALSE(cuda::PinnedAlloc(size_t{1} << 50, &p).ok());  // 1 PiB
  EXPECT_EQ(p, nullptr);
  p = reinterpret_cast<void*>(1);
  EXPECT_FALSE(cuda::DeviceAlloc(size_t{1} << 50, &p).ok());
  EXPECT_EQ(p, nullptr);
}

TEST(CudaErrorsTest, FailedGraphCaptureOnAHealthyContextRunsEagerly) {
  for (cudaError_t failure :
       {cudaSuccess, cudaErrorStreamCaptureInvalidated, cudaErrorStreamCaptureUnsupported,
        cudaErrorMemoryAllocation, cudaErrorNotSupported}) {
    EXPECT_EQ(AfterGraphFailure(failure, cudaSuccess), GraphFailureAction::kRunEagerly)
        << cudaGetErrorName(failure);
  }
}

TEST(CudaErrorsTest, FailedGraphCaptureWithABrokenContextIsFatal) {
  EXPECT_EQ(AfterGraphFailure(cudaErrorIllegalAddress, cudaSuccess), GraphFailureAction::kFatal);
  EXPECT_EQ(AfterGraphFailure(cudaErrorStreamCaptureInvalidated, cudaErrorLaunchFailure),
            GraphFailureAction::kFatal);
  EXPECT_EQ(AfterGraphFailure(cudaSuccess, cudaErrorIllegalAddress), GraphFailureAction::kFatal);
}

TEST(CudaErrorsTest, ProbeOfAListedDeviceWithAContextIsOk) {
  DeviceProbe p;
  p.count = 2;
  p.device = 1;
  EXPECT_TRUE(DeviceProbeStatus(p).ok());
}

TEST(CudaErrorsTest, ProbeWithoutDriverOrDeviceIsUnavailable) {
  DeviceProbe p;
  p.count_error = cudaErrorInsufficientDriver;
  const absl::Status no_driver = DeviceProbeStatus(p);
  EXPECT_EQ(no_driver.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(no_driver.message()), HasSubstr("cudaErrorInsufficientDriver"));
  p.count_error = cudaSuccess;
  p.count = 1;
  p.device = 1;
  const absl::Status missing = DeviceProbeStatus(p);
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("device 1 does not exist (1 devices)"));
}

// An exclusive-process device held by another process, or a MIG GPU without an instance, is
// listed by cudaGetDeviceCount but fails when a context is made: UNAVAILABLE (so --device auto
// falls back to the CPU), saying so.
TEST(CudaErrorsTest, ListedDeviceWithoutAContextIsUnavailable) {
  DeviceProbe p;
  p.count = 1;
  p.context_error = cudaErrorDevicesUnavailable;
  const absl::Status busy = DeviceProbeStatus(p);
  EXPECT_EQ(busy.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(IsFatalDeviceError(busy));
  EXPECT_THAT(std::string(busy.message()), HasSubstr("device 0 is listed"));
  EXPECT_THAT(std::string(busy.message()), HasSubstr("cudaErrorDevicesUnavailable"));
  EXPECT_THAT(std::string(busy.message()), HasSubstr("exclusive-process"));
  p.context_error = cudaErrorInvalidDevice;
  const absl::Status other = DeviceProbeStatus(p);
  EXPECT_EQ(other.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(other.message()), HasSubstr("MIG"));
}

// The tests below need a device: without a driver, CUDA's initialisation error is reported
// by every call, cudaPeekAtLastError included, and cannot be cleared.

// Pinned and device memory running out is RESOURCE_EXHAUSTED, not fatal, leaves no last
// error behind, and the next kernel launch's own check passes.
TEST(CudaErrorsTest, ExhaustionDoesNotFailTheNextLaunch) {
  PREFIXD_SKIP_WITHOUT_CUDA();
  void* p = nullptr;
  const absl::Status s = cuda::PinnedAlloc(size_t{1} << 50, &p);  // 1 PiB
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_FALSE(IsFatalDeviceError(s));
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  const absl::Status d = cuda::DeviceAlloc(size_t{1} << 50, &p);
  EXPECT_EQ(d.code(), absl::StatusCode::kResourceExhausted) << d;
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  cuda_test::DeviceBuffer fc(std::vector<float>(8, 0.5f));
  cuda_test::DeviceBuffer bias(std::vector<float>(4, 0.0f));
  cuda_test::DeviceBuffer out(8 * sizeof(float));
  ASSERT_TRUE(fc.ok() && bias.ok() && out.ok());
  EXPECT_EQ(
      cuda::LaunchBiasGelu(DType::kF32, fc.get<float>(), bias.get(), 2, 4, out.get(), nullptr),
      cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaErrorsTest, ProbeLeavesNoLastError) {
  PREFIXD_SKIP_WITHOUT_CUDA();
  EXPECT_TRUE(CudaDeviceAvailable(0).ok());
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  EXPECT_FALSE(CudaDeviceAvailable(1 << 20).ok());
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  int device = -1;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 0);
}

}  // namespace
}  // namespace prefixd
