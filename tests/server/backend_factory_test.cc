#include "server/backend_factory.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

}  // namespace
}  // namespace prefixd
