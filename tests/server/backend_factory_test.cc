#include "server/backend_factory.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#ifdef PREFIXD_HAVE_CUDA
#include "kernels/cuda/cuda_check.h"
#endif

namespace prefixd {
namespace {

using ::testing::HasSubstr;

const absl::Status kNoCuda = absl::UnavailableError("no driver");

TEST(PlanDeviceTest, AutoFallsBackToCpuWithANote) {
  absl::StatusOr<DevicePlan> p = PlanDevice("auto", "auto", kNoCuda);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->use_cuda);
  EXPECT_EQ(p->dtype, DType::kF32);
  EXPECT_THAT(p->note, HasSubstr("no driver"));
}

TEST(PlanDeviceTest, AutoPicksCudaAndBf16WhenUsable) {
  absl::StatusOr<DevicePlan> p = PlanDevice("auto", "auto", absl::OkStatus());
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->use_cuda);
  EXPECT_EQ(p->dtype, DType::kBF16);
  EXPECT_TRUE(p->note.empty());
  EXPECT_EQ(PlanDevice("cuda", "f16", absl::OkStatus())->dtype, DType::kF16);
}

TEST(PlanDeviceTest, CudaWithoutDeviceIsAnError) {
  absl::StatusOr<DevicePlan> p = PlanDevice("cuda", "auto", kNoCuda);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("no usable CUDA device"));
}

TEST(PlanDeviceTest, RejectsUnknownNamesAndHalfPrecisionOnCpu) {
  EXPECT_EQ(PlanDevice("tpu", "auto", kNoCuda).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanDevice("cpu", "f64", kNoCuda).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(PlanDevice("cpu", "bf16", kNoCuda).status().message()),
              HasSubstr("CPU backend computes in f32"));
  EXPECT_EQ(PlanDevice("cpu", "f32", absl::OkStatus())->use_cuda, false);
}

// Whatever this machine has, --device auto follows the probe: CUDA when it is usable, else
// the CPU with the probe's reason as the log line.
TEST(PlanDeviceTest, AutoFollowsThisMachinesProbe) {
  const absl::Status usable = CudaUsable();
  absl::StatusOr<DevicePlan> p = PlanDevice("auto", "auto", usable);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->use_cuda, usable.ok());
  if (!usable.ok()) {
    EXPECT_EQ(usable.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(p->note, HasSubstr(std::string(usable.message())));
  }
}

#ifdef PREFIXD_HAVE_CUDA
// A device that cudaGetDeviceCount lists but on which no context can be made (exclusive-process
// and held by another process): auto runs on the CPU and says why; --device=cuda refuses.
TEST(PlanDeviceTest, ListedDeviceWithoutAContextFallsBackToCpu) {
  cuda::DeviceProbe busy;
  busy.count = 1;
  busy.context_error = cudaErrorDevicesUnavailable;
  const absl::Status usable = cuda::DeviceProbeStatus(busy);
  absl::StatusOr<DevicePlan> p = PlanDevice("auto", "auto", usable);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->use_cuda);
  EXPECT_EQ(p->dtype, DType::kF32);
  EXPECT_THAT(p->note, HasSubstr("running on the CPU"));
  EXPECT_THAT(p->note, HasSubstr("exclusive-process"));
  absl::StatusOr<DevicePlan> forced = PlanDevice("cuda", "auto", usable);
  EXPECT_EQ(forced.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(forced.status().message()), HasSubstr("cudaErrorDevicesUnavailable"));
}
#endif

}  // namespace
}  // namespace prefixd
