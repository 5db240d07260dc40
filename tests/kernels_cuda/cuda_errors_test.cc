// The error vocabulary of the CUDA backend, checked on any machine: CUDA failures become
// INTERNAL statuses that name the statement and location and are marked fatal; a machine
// without a usable device gets UNAVAILABLE from both the probe and the factory.
#include <cuda_runtime.h>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"

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
  const absl::Status s = CudaDeviceAvailable();
  if (s.ok()) GTEST_SKIP() << "a CUDA device is present";
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

}  // namespace
}  // namespace prefixd
