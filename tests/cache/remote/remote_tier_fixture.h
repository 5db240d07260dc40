// What the remote tier's tests share: a fixture that starts a real redis-server
// (tests/testing/redis_server.h) and opens tiers on it, and helpers that fetch and wait.
#ifndef PREFIXD_TESTS_CACHE_REMOTE_REMOTE_TIER_FIXTURE_H_
#define PREFIXD_TESTS_CACHE_REMOTE_REMOTE_TIER_FIXTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cache/remote/remote_tier.h"
#include "gtest/gtest.h"
#include "tests/cache/tier_test_util.h"
#include "tests/testing/redis_server.h"

namespace prefixd::testing {

inline std::vector<Digest> KeysOf(const std::vector<BlockRecord>& chain) {
  std::vector<Digest> keys;
  for (const BlockRecord& r : chain) keys.push_back(r.key);
  return keys;
}

// Fetches `records` (consecutive blocks of one chain) and waits until the fetch is done; null
// when the tier refused to start it.
inline std::shared_ptr<const TierFetch> FetchNow(RemoteTier& tier,
                                                 const std::vector<BlockRecord>& records) {
  std::vector<Digest> keys;
  std::vector<uint32_t> tokens;
  for (const BlockRecord& r : records) {
    keys.push_back(r.key);
    tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
  }
  absl::Notification done;
  absl::StatusOr<std::shared_ptr<const TierFetch>> started =
      tier.Fetch(records.front().root, keys, tokens, [&done] { done.Notify(); });
  std::shared_ptr<const TierFetch> f = started.ok() ? *started : nullptr;
  if (f != nullptr) {
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_TRUE(f->done());
    EXPECT_EQ(f->seconds.size(), f->data.size());
  }
  return f;
}

// How many blocks a fetch of `records` brought back (-1: refused).
inline int Fetched(RemoteTier& tier, const std::vector<BlockRecord>& records) {
  std::shared_ptr<const TierFetch> f = FetchNow(tier, records);
  return f == nullptr ? -1 : static_cast<int>(f->data.size());
}

// Options with a timeout that a loaded test machine always meets (the default 20 ms is for a
// production network; the timeout tests set their own).
inline RemoteTierOptions TestOptions() {
  RemoteTierOptions o;
  o.timeout = absl::Seconds(2);
  return o;
}

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> s = RedisServer::Start(extra_);
    ASSERT_TRUE(s.ok()) << s.status();
    redis_ = *std::move(s);
  }

  std::unique_ptr<RemoteTier> Open(RemoteTierOptions o = TestOptions(),
                                   const BlockLayout& layout = SmallLayout()) {
    if (o.url.empty()) o.url = redis_->url();
    absl::StatusOr<std::unique_ptr<RemoteTier>> t = RemoteTier::Open(o, layout);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }

  // Publishes `chain` through `tier` and waits until it is stored.
  static void PublishAll(RemoteTier& tier, const std::vector<BlockRecord>& chain) {
    for (const BlockRecord& r : chain) {
      ASSERT_TRUE(tier.WantsPublish(r.key));
      tier.Publish(r);
    }
    ASSERT_TRUE(tier.Flush(absl::Now() + absl::Seconds(10)));
  }

  std::vector<std::string> extra_;
  std::unique_ptr<RedisServer> redis_;
};

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_CACHE_REMOTE_REMOTE_TIER_FIXTURE_H_
