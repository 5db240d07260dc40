// TierIndex (cache/disk/tier_index.h): one test per invariant clause, exact eviction orders.
#include "cache/disk/tier_index.h"

#include <string>

#include "cache/block_key.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;

Digest Key(int i) { return Sha256Of(std::to_string(i)); }
std::string Hex(int i) { return DigestHex(Key(i)); }

TEST(TierIndexTest, BytesAreTheSumOfEveryEntry) {
  TierIndex index;
  index.Add(Key(1), 100, 10);
  index.Add(Key(2), 50, 11);
  index.AddForeign("other-a.kvb", 30, 5);
  EXPECT_EQ(index.bytes(), 180);
  index.Add(Key(1), 70, 12);  // replaced, not added twice
  EXPECT_EQ(index.bytes(), 150);
  EXPECT_EQ(index.own_blocks(), 2);
  EXPECT_EQ(index.foreign_files(), 1);
  EXPECT_TRUE(index.Erase(Key(2)));
  EXPECT_FALSE(index.Erase(Key(2)));
  EXPECT_EQ(index.bytes(), 100);
  index.CheckInvariants();
}

TEST(TierIndexTest, ForeignFilesGoFirstOldestFirstThenLeastRecentlyUsed) {
  TierIndex index;
  index.Add(Key(1), 10, 100);
  index.Add(Key(2), 10, 50);  // older than key 1
  index.AddForeign("b.kvb", 10, 300);
  index.AddForeign("a.kvb", 10, 200);
  index.Add(Key(3), 10, 50);  // same time as key 2: insertion order breaks the tie
  EXPECT_THAT(index.EvictionOrder(), ElementsAre("a.kvb", "b.kvb", Hex(2), Hex(3), Hex(1)));
  // A hit makes key 2 the most recently used.
  EXPECT_TRUE(index.Touch(Key(2), 400));
  EXPECT_FALSE(index.Touch(Key(9), 400));
  EXPECT_THAT(index.EvictionOrder(), ElementsAre("a.kvb", "b.kvb", Hex(3), Hex(1), Hex(2)));
  // The own keys alone, in the same order.
  EXPECT_THAT(index.OwnKeys(), ElementsAre(Key(3), Key(1), Key(2)));
  index.CheckInvariants();
}

TEST(TierIndexTest, VictimsAreTakenOnlyUntilTheIncomingBytesFit) {
  TierIndex index;
  index.Add(Key(1), 10, 1);
  index.Add(Key(2), 10, 2);
  index.AddForeign("x.kvb", 10, 3);
  index.Add(Key(3), 10, 4);
  EXPECT_FALSE(index.PopVictim(/*cap=*/40, /*incoming=*/0).has_value());
  auto v = index.PopVictim(40, 10);  // 40 + 10 > 40: one victim, the foreign file
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->foreign);
  EXPECT_EQ(v->name, "x.kvb");
  EXPECT_EQ(v->bytes, 10);
  EXPECT_FALSE(index.PopVictim(40, 10).has_value());  // 30 + 10 fits
  v = index.PopVictim(15, 0);
  ASSERT_TRUE(v.has_value());
  EXPECT_FALSE(v->foreign);
  EXPECT_EQ(v->key, Key(1));
  v = index.PopVictim(15, 0);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->key, Key(2));
  EXPECT_FALSE(index.PopVictim(15, 0).has_value());
  EXPECT_EQ(index.bytes(), 10);
  EXPECT_TRUE(index.Contains(Key(3)));
  // Nothing left to take: no victim even though it does not fit.
  index.PopVictim(0, 0);
  EXPECT_FALSE(index.PopVictim(0, 100).has_value());
  EXPECT_EQ(index.bytes(), 0);
  index.CheckInvariants();
}

}  // namespace
}  // namespace prefixd
