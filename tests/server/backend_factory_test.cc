#include "server/backend_factory.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "engine/model_config.h"
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

TEST(PlanDeviceTest, RejectsUnknownNames) {
  EXPECT_EQ(PlanDevice("tpu", "auto", kNoCuda).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanDevice("cpu", "f64", kNoCuda).status().code(), absl::StatusCode::kInvalidArgument);
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

TEST(PlanDeviceTest, CpuTakesHalfPrecisionWeights) {
  for (const char* name : {"f16", "bf16"}) {
    absl::StatusOr<DevicePlan> p = PlanDevice("cpu", name, absl::OkStatus());
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_FALSE(p->use_cuda);
    EXPECT_EQ(p->dtype, *ParseDType(name));
  }
  EXPECT_EQ(PlanDevice("auto", "f16", kNoCuda)->dtype, DType::kF16);
  EXPECT_EQ(PlanDevice("cpu", "auto", absl::OkStatus())->dtype, DType::kF32);
}

// int8 weights exist on the CPU only: asked for on CUDA, a clear error; with auto on a machine
// whose CUDA is usable, the CPU and a note saying why.
TEST(PlanDeviceTest, Int8IsCpuOnly) {
  absl::StatusOr<DevicePlan> cpu = PlanDevice("cpu", "int8", absl::OkStatus());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_FALSE(cpu->use_cuda);
  EXPECT_EQ(cpu->dtype, DType::kI8);
  absl::StatusOr<DevicePlan> cuda = PlanDevice("cuda", "int8", absl::OkStatus());
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cuda.status().message()), HasSubstr("--dtype=int8 is CPU only"));
  absl::StatusOr<DevicePlan> automatic = PlanDevice("auto", "int8", absl::OkStatus());
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_FALSE(automatic->use_cuda);
  EXPECT_EQ(automatic->dtype, DType::kI8);
  EXPECT_THAT(automatic->note, HasSubstr("int8 is CPU only"));
  EXPECT_EQ(PlanDevice("auto", "int8", kNoCuda)->use_cuda, false);
}

TEST(DefaultCpuKvBudgetTest, SixteenFullContextSequencesUnderAQuarterOfMemory) {
  ModelConfig gpt2;  // GPT-2 small's shape
  gpt2.n_layer = 12;
  gpt2.n_head = 12;
  gpt2.n_embd = 768;
  gpt2.n_positions = 1024;
  gpt2.vocab_size = 50257;
  // 12 layers x 2 (K, V) x 768 x 4 bytes = 73,728 bytes per token; x 1,024 positions x 16.
  const int64_t want = int64_t{16} * 1024 * 73728;
  const KvBudget roomy = DefaultCpuKvBudget(gpt2, int64_t{24} << 30);
  EXPECT_EQ(roomy.bytes, want);
  EXPECT_THAT(roomy.derivation, HasSubstr("16 sequences x 1024 positions x 73728 bytes per token"));
  EXPECT_THAT(roomy.derivation, HasSubstr("under the cap"));
  const KvBudget capped = DefaultCpuKvBudget(gpt2, int64_t{4} << 30);
  EXPECT_EQ(capped.bytes, int64_t{1} << 30);
  EXPECT_THAT(capped.derivation, HasSubstr("1/4 of 4294967296 bytes"));
  EXPECT_THAT(capped.derivation, HasSubstr(absl::StrCat("would be ", want)));
  // Unknown memory: no cap.
  EXPECT_EQ(DefaultCpuKvBudget(gpt2, 0).bytes, want);
  // A smaller model asks for less.
  ModelConfig small = gpt2;
  small.n_layer = 2;
  small.n_positions = 64;
  EXPECT_EQ(DefaultCpuKvBudget(small, int64_t{24} << 30).bytes, int64_t{16} * 64 * 2 * 2 * 768 * 4);
}

TEST(DefaultCpuKvBudgetTest, UsableMemoryIsKnownHere) {
  const int64_t pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  const int64_t bytes = UsableMemoryBytes();
  EXPECT_GT(bytes, 0);
  EXPECT_LE(bytes, pages * page_size);
}

}  // namespace
}  // namespace prefixd
