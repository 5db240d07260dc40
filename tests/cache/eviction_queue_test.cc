#include "cache/eviction_queue.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using Key = EvictionQueue::Key;

// Pops a copy empty, as KvCache does: each victim leaves its tenant's cached count.
std::vector<int32_t> Drain(EvictionQueue q, TenantId (*tenant_of)(int32_t block)) {
  std::vector<int32_t> out;
  while (!q.empty()) {
    out.push_back(q.Pop());
    q.RemoveCached(tenant_of(out.back()));
  }
  return out;
}

TenantId ByHundreds(int32_t block) { return block / 100; }

// Without shares (each tenant's share the pool's size) the order is plain LRU, ties broken
// by the sequence number.
TEST(EvictionQueueTest, WithoutSharesTheOrderIsLru) {
  EvictionQueue q(8);
  q.AddCached(0);
  q.Insert({Key{5, 1, 10}, 0});
  q.AddCached(1);
  q.Insert({Key{3, 2, 11}, 1});
  q.AddCached(1);
  q.Insert({Key{5, 0, 12}, 1});
  EXPECT_THAT(Drain(q, [](int32_t b) { return b == 10 ? 0 : 1; }), ElementsAre(11, 12, 10));
}

// A tenant with more cached blocks than its share loses its own LRU leaf first, however
// recent; back within its share, plain LRU again.
TEST(EvictionQueueTest, ATenantOverItsShareIsEvictedFirst) {
  EvictionQueue q(8);
  q.SetShare(1, 1);
  q.AddCached(0);
  q.Insert({Key{1, 1, 20}, 0});  // the oldest
  for (int i = 0; i < 3; ++i) {
    q.AddCached(1);
    q.Insert({Key{10 + i, 2 + i, 30 + i}, 1});
  }
  EXPECT_EQ(q.Cached(1), 3);
  EXPECT_EQ(q.Pop(), 30);
  q.RemoveCached(1);
  EXPECT_EQ(q.Pop(), 31);
  q.RemoveCached(1);
  // Tenant 1 holds 1 = its share: the LRU leaf of all goes next.
  EXPECT_EQ(q.Pop(), 20);
  q.RemoveCached(0);
  EXPECT_EQ(q.Pop(), 32);
  EXPECT_TRUE(q.empty());
}

// Of two tenants over their shares, the older leaf goes first; a share raised later takes
// a tenant out of the rule at once.
TEST(EvictionQueueTest, OverShareTenantsCompeteByAgeAndSharesCanChange) {
  EvictionQueue q(1);
  for (TenantId t : {1, 2}) {
    for (int i = 0; i < 2; ++i) {
      q.AddCached(t);
      q.Insert({Key{t * 10 + i, 0, t * 100 + i}, t});
    }
  }
  q.AddCached(3);
  q.Insert({Key{0, 0, 300}, 3});  // within its share: last despite being the oldest
  // Each over-share tenant drops to its share, then plain LRU.
  EXPECT_THAT(Drain(q, ByHundreds), ElementsAre(100, 200, 300, 101, 201));
  q.SetShare(1, 5);
  EXPECT_THAT(Drain(q, ByHundreds), ElementsAre(200, 300, 100, 101, 201));
}

// Retained leaves go after every normal one, over-share tenants first within each class.
TEST(EvictionQueueTest, RetainedLeavesGoLast) {
  EvictionQueue q(1);
  constexpr auto kRetained = EvictionQueue::kRetained;
  q.AddCached(1);
  q.Insert({Key{1, 0, 100}, 1, kRetained});  // the oldest of all
  q.AddCached(1);
  q.Insert({Key{5, 0, 101}, 1});
  q.AddCached(2);
  q.Insert({Key{2, 0, 200}, 2, kRetained});
  q.AddCached(3);
  q.Insert({Key{9, 0, 300}, 3});
  // Tenant 1 is over its share (2 > 1): its normal leaf first, then the other normal leaf,
  // then the retained ones by age.
  EXPECT_THAT(Drain(q, ByHundreds), ElementsAre(101, 300, 100, 200));
}

// Check() recomputes the state from scratch and catches a count that drifted.
TEST(EvictionQueueTest, CheckCatchesDrift) {
  EvictionQueue q(1);
  q.AddCached(4);
  q.Insert({Key{1, 1, 7}, 4});
  q.Check({{Key{1, 1, 7}, 4}}, {{4, 1}});
  EXPECT_DEATH(q.Check({{Key{1, 1, 7}, 4}}, {{4, 2}}), "cached count");
  EXPECT_DEATH(q.Check({}, {{4, 1}}), "not exactly the cached leaves");
}

}  // namespace
}  // namespace prefixd
