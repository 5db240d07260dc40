// PlanKvPool: the CUDA backend's KV pool size, decided from the budget, the free device
// memory, the headroom and the scratch block. Pure host arithmetic, so these run everywhere.
#include "kernels/cuda/kv_budget.h"

#include <climits>
#include <cstdint>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd::cuda {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

KvPoolRequest Request(int64_t budget, int64_t free_bytes, int64_t block_bytes) {
  KvPoolRequest r;
  r.budget_bytes = budget;
  r.free_bytes = free_bytes;
  r.block_bytes = block_bytes;
  r.block_size = 16;
  return r;
}

TEST(KvBudgetTest, ScratchBlockComesOutOfAnExplicitBudget) {
  absl::StatusOr<KvPoolPlan> p = PlanKvPool(Request(10 * kMiB, 8 * kGiB, kMiB));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->num_blocks, 9);
  EXPECT_EQ(p->pool_bytes, 10 * kMiB);
  EXPECT_EQ(p->budget_bytes, 10 * kMiB);
  // A budget that is not a multiple of the block: the remainder stays unused.
  p = PlanKvPool(Request(10 * kMiB + kMiB / 2, 8 * kGiB, kMiB));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->num_blocks, 9);
  EXPECT_EQ(p->pool_bytes, 10 * kMiB);
}

TEST(KvBudgetTest, PoolNeverExceedsTheBudget) {
  for (int64_t budget = 2 * 1000; budget < 40 * 1000; budget += 777) {
    absl::StatusOr<KvPoolPlan> p = PlanKvPool(Request(budget, 8 * kGiB, 1000));
    ASSERT_TRUE(p.ok()) << budget;
    EXPECT_LE(p->pool_bytes, budget);
    EXPECT_GT(p->pool_bytes + 1000, budget);  // and wastes less than one block
    EXPECT_EQ(p->pool_bytes, (p->num_blocks + 1) * 1000);
  }
}

TEST(KvBudgetTest, FractionOfFreeMemoryKeepsTheHeadroom) {
  // 0.8 x 10 GiB leaves far more than the headroom: the fraction decides.
  KvPoolRequest r = Request(0, 10 * kGiB, kMiB);
  absl::StatusOr<KvPoolPlan> p = PlanKvPool(r);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->budget_bytes, 8 * kGiB);
  EXPECT_EQ(p->num_blocks, 8 * 1024 - 1);
  // A fraction of 1 would take everything: the headroom caps it.
  r.fraction = 1.0;
  p = PlanKvPool(r);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->budget_bytes, 10 * kGiB - kDeviceHeadroomBytes);
  EXPECT_LE(p->pool_bytes, 10 * kGiB - kDeviceHeadroomBytes);
  EXPECT_EQ(p->num_blocks, (10 * kGiB - kDeviceHeadroomBytes) / kMiB - 1);
}

TEST(KvBudgetTest, ExplicitBudgetPastFreeMemoryLessHeadroomIsResourceExhausted) {
  const int64_t free_bytes = 4 * kGiB;
  absl::StatusOr<KvPoolPlan> p =
      PlanKvPool(Request(free_bytes - kDeviceHeadroomBytes, free_bytes, kMiB));
  ASSERT_TRUE(p.ok()) << p.status();  // exactly what may be taken
  p = PlanKvPool(Request(free_bytes - kDeviceHeadroomBytes + 1, free_bytes, kMiB));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(p.status().message()),
              HasSubstr(std::to_string(free_bytes - kDeviceHeadroomBytes)));
  p = PlanKvPool(Request(free_bytes, free_bytes, kMiB));  // all free memory
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(KvBudgetTest, BudgetWithoutRoomBesideTheScratchBlockIsResourceExhausted) {
  absl::StatusOr<KvPoolPlan> p = PlanKvPool(Request(2 * kMiB - 1, 8 * kGiB, kMiB));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("scratch block"));
  ASSERT_TRUE(PlanKvPool(Request(2 * kMiB, 8 * kGiB, kMiB)).ok());
  // Free memory below the headroom: nothing for the pool.
  p = PlanKvPool(Request(0, kDeviceHeadroomBytes - 1, kMiB));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(KvBudgetTest, BlockCountKeepsSlotsInInt32) {
  // Tiny blocks and a huge budget: slots block * block_size + row, scratch included, stay
  // below INT32_MAX.
  KvPoolRequest r = Request(int64_t{1} << 40, int64_t{1} << 41, 64);
  absl::StatusOr<KvPoolPlan> p = PlanKvPool(r);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->num_blocks, INT32_MAX / 16 - 2);
  EXPECT_LE((p->num_blocks + 1) * 16 + 15, int64_t{INT32_MAX});
  EXPECT_EQ(p->pool_bytes, (p->num_blocks + 1) * 64);
}

}  // namespace
}  // namespace prefixd::cuda
