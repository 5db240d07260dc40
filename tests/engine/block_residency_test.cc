#include "engine/block_residency.h"

#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class BlockResidencyTest : public ::testing::Test {
 protected:
  void Advance(double seconds) { now_ += absl::Seconds(seconds); }
  BlockResidency::Observations Drain() {
    BlockResidency::Observations o;
    residency_.Drain(&o);
    return o;
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  BlockResidency residency_{4, [this] { return now_; }};
};

// Lifetime runs from indexing to eviction; idle from the last use (indexing or a reuse) to
// eviction; each reuse observes the gap since the block's previous use.
TEST_F(BlockResidencyTest, ObservesLifetimeIdleAndReuseGaps) {
  residency_.OnIndexed(2);
  Advance(3);
  residency_.OnIndexed(0);
  Advance(1);
  residency_.OnReused({2, 0});  // 4 s after block 2's indexing, 1 s after block 0's
  Advance(10);
  residency_.OnReused({2});
  Advance(5);
  residency_.OnEvicted(2);  // lived 19 s, idle 5 s
  Advance(1);
  residency_.OnEvicted(0);  // lived 17 s, idle 16 s
  const BlockResidency::Observations o = Drain();
  EXPECT_THAT(o.reuse_gap, ElementsAre(4, 1, 10));
  EXPECT_THAT(o.lifetime, ElementsAre(19, 17));
  EXPECT_THAT(o.idle_before_eviction, ElementsAre(5, 16));
  // Drained once: the next drain starts empty.
  const BlockResidency::Observations again = Drain();
  EXPECT_THAT(again.lifetime, IsEmpty());
  EXPECT_THAT(again.reuse_gap, IsEmpty());
}

// A block evicted and indexed again (its id handed out anew) starts a new residency.
TEST_F(BlockResidencyTest, AReindexedBlockStartsAfresh) {
  residency_.OnIndexed(1);
  Advance(7);
  residency_.OnEvicted(1);
  Advance(100);
  residency_.OnIndexed(1);
  Advance(2);
  residency_.OnReused({1});
  residency_.OnEvicted(1);
  const BlockResidency::Observations o = Drain();
  EXPECT_THAT(o.lifetime, ElementsAre(7, 2));
  EXPECT_THAT(o.idle_before_eviction, ElementsAre(7, 0));
  EXPECT_THAT(o.reuse_gap, ElementsAre(2));
}

// The invariant: state exactly while indexed. A hook out of order is a bug in the caller.
TEST_F(BlockResidencyTest, HooksOutOfOrderAreCaught) {
  EXPECT_DEATH(residency_.OnEvicted(3), "not indexed");
  EXPECT_DEATH(residency_.OnReused({3}), "not indexed");
  residency_.OnIndexed(3);
  EXPECT_DEATH(residency_.OnIndexed(3), "indexed twice");
}

}  // namespace
}  // namespace prefixd
