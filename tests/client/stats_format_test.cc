// What `prefixctl stats` prints for a CacheStats: the person's lines (the disk tier's only when
// the server has one) and the JSON object with every field.
#include <sstream>
#include <string>

#include "client/commands.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace prefixd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::CacheStats PoolOnly() {
  v1::CacheStats s;
  s.set_queried_tokens(200);
  s.set_hit_tokens(150);
  s.set_blocks_total(64);
  s.set_blocks_free(40);
  s.set_blocks_active(4);
  s.set_blocks_cached(20);
  s.set_evictions(3);
  s.set_cow_copies(2);
  s.set_cow_rows(9);
  s.set_pool_bytes(1048576);
  return s;
}

v1::CacheStats WithDiskTier() {
  v1::CacheStats s = PoolOnly();
  s.set_disk_hit_tokens(96);
  s.set_disk_blocks(7);
  s.set_disk_bytes(114912);
  s.set_disk_cap_bytes(268435456);
  s.set_disk_spills(8);
  s.set_disk_spills_dropped(1);
  s.set_disk_loads(6);
  s.set_disk_corrupt_blocks(2);
  return s;
}

std::string Print(const v1::CacheStats& s, bool json) {
  std::ostringstream out;
  PrintCacheStats(s, json, out);
  return out.str();
}

TEST(StatsFormatTest, WithoutADiskTierThePoolLinesOnly) {
  const std::string text = Print(PoolOnly(), /*json=*/false);
  EXPECT_THAT(text,
              HasSubstr("prefix cache     150 of 200 prompt tokens served from cache (75.0%)"));
  EXPECT_THAT(text, HasSubstr("KV blocks        64 total: 40 free, 4 active, 20 cached"));
  EXPECT_THAT(text, Not(HasSubstr("disk")));
}

TEST(StatsFormatTest, ADiskTierAddsItsBlocksBytesAndTraffic) {
  const std::string text = Print(WithDiskTier(), /*json=*/false);
  EXPECT_THAT(text, HasSubstr("disk tier        7 blocks, 114912 of 268435456 bytes; 96 of the "
                              "prompt tokens above came from it\n"));
  EXPECT_THAT(text, HasSubstr("disk traffic     8 blocks written, 1 dropped, 6 read back, 2 "
                              "corrupt (recomputed)\n"));
}

TEST(StatsFormatTest, JsonHasEveryField) {
  const nlohmann::json j = nlohmann::json::parse(Print(WithDiskTier(), /*json=*/true));
  EXPECT_EQ(j["hit_tokens"], 150);
  EXPECT_EQ(j["cow_rows"], 9);
  EXPECT_EQ(j["disk_hit_tokens"], 96);
  EXPECT_EQ(j["disk_blocks"], 7);
  EXPECT_EQ(j["disk_bytes"], 114912);
  EXPECT_EQ(j["disk_cap_bytes"], 268435456);
  EXPECT_EQ(j["disk_spills"], 8);
  EXPECT_EQ(j["disk_spills_dropped"], 1);
  EXPECT_EQ(j["disk_loads"], 6);
  EXPECT_EQ(j["disk_corrupt_blocks"], 2);
  EXPECT_EQ(j["remote_configured"], false);
  EXPECT_EQ(j.size(), 26u);  // every CacheStats field
}

TEST(StatsFormatTest, ARemoteTierAddsItsStateAndTraffic) {
  v1::CacheStats s = PoolOnly();
  s.set_remote_configured(true);
  s.set_remote_up(false);
  s.set_remote_hit_tokens(64);
  s.set_remote_stores(10);
  s.set_remote_stores_dropped(3);
  s.set_remote_loads(4);
  s.set_remote_corrupt_blocks(1);
  s.set_remote_errors(5);
  const std::string text = Print(s, /*json=*/false);
  EXPECT_THAT(text, HasSubstr("remote tier      DOWN; 64 of the prompt tokens above came from it\n"));
  EXPECT_THAT(text, HasSubstr("remote traffic   10 blocks published, 3 dropped, 4 read, 1 corrupt "
                              "(recomputed), 5 faults\n"));
  EXPECT_THAT(Print(PoolOnly(), false), Not(HasSubstr("remote")));
  const nlohmann::json j = nlohmann::json::parse(Print(s, /*json=*/true));
  EXPECT_EQ(j["remote_up"], false);
  EXPECT_EQ(j["remote_hit_tokens"], 64);
  EXPECT_EQ(j["remote_errors"], 5);
}

}  // namespace
}  // namespace prefixd
