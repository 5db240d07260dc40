// The remote tier against a real redis-server that misbehaves: late answers (a fetch is one
// round trip and ends by its deadline), a server that is down, hung or restarted, a match not
// answered in time, and a full server; each costs counted errors and never a wrong block.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/check.h"
#include "cache/remote/remote_tier.h"
#include "gtest/gtest.h"
#include "tests/cache/remote/remote_tier_fixture.h"
#include "tests/cache/tier_test_util.h"
#include "tests/testing/delay_proxy.h"
#include "tests/testing/redis_server.h"

namespace prefixd {
namespace {

using ::prefixd::testing::DelayProxy;
using ::prefixd::testing::Fetched;
using ::prefixd::testing::FetchNow;
using ::prefixd::testing::KeysOf;
using ::prefixd::testing::MakeChain;
using ::prefixd::testing::RedisServer;
using ::prefixd::testing::RemoteTierTest;
using ::prefixd::testing::ScoredLayout;
using ::prefixd::testing::SmallLayout;
using ::prefixd::testing::TestOptions;
using ::prefixd::testing::WithScores;

// A TCP proxy in front of the test's Redis for one client connection, which holds the
// server's replies until the client has sent `release_after` GETRANGE commands: a server whose
// every answer comes late, as seen by a client that waits for each answer before it asks
// again (it never gets one) and by one that asks for everything in one round trip.
class HoldingProxy {
 public:
  HoldingProxy(int redis_port, int release_after)
      : redis_port_(redis_port), release_after_(release_after) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    PREFIXD_CHECK(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    PREFIXD_CHECK(listen(listen_fd_, 4) == 0);
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~HoldingProxy() {
    stop_ = true;
    thread_.join();
    close(listen_fd_);
  }
  std::string url() const { return absl::StrCat("redis://127.0.0.1:", port_); }

 private:
  void Run() {
    pollfd lp{.fd = listen_fd_, .events = POLLIN, .revents = 0};
    while (!stop_ && poll(&lp, 1, 50) == 0) {
    }
    if (stop_) return;
    const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    const int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(redis_port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    PREFIXD_CHECK(connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    std::string asked, held;
    char buf[65536];
    bool open = true;
    while (!stop_ && open) {
      pollfd p[2] = {{.fd = client, .events = POLLIN, .revents = 0},
                     {.fd = server, .events = POLLIN, .revents = 0}};
      if (poll(p, 2, 50) <= 0) continue;
      if (p[0].revents != 0) {
        const ssize_t n = read(client, buf, sizeof(buf));
        if (n <= 0) break;
        asked.append(buf, static_cast<size_t>(n));
        PREFIXD_CHECK(write(server, buf, static_cast<size_t>(n)) == n);
      }
      if (p[1].revents != 0) {
        const ssize_t n = read(server, buf, sizeof(buf));
        if (n <= 0) break;
        held.append(buf, static_cast<size_t>(n));
      }
      size_t asked_ranges = 0;
      for (size_t at = asked.find("GETRANGE"); at != std::string::npos;
           at = asked.find("GETRANGE", at + 1)) {
        ++asked_ranges;
      }
      if (asked_ranges >= static_cast<size_t>(release_after_) && !held.empty()) {
        open = ::send(client, held.data(), held.size(), MSG_NOSIGNAL) ==
               static_cast<ssize_t>(held.size());
        held.clear();
      }
    }
    close(client);
    close(server);
  }

  const int redis_port_;
  const int release_after_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A fetch is one round trip however many blocks it has: every block's commands go out before
// the first answer is read, so a server that is late to answer costs its delay once (16
// blocks from a Redis 200 ms late took 3.2 s one GET at a time).
TEST_F(RemoteTierTest, AFetchIsOneRoundTripForAllItsBlocks) {
  std::unique_ptr<RemoteTier> writer = Open();
  const BlockLayout layout = SmallLayout();
  const std::vector<BlockRecord> chain = MakeChain(layout, /*seed=*/8, /*n=*/16);
  PublishAll(*writer, chain);
  HoldingProxy proxy(redis_->port(), /*release_after=*/16);
  RemoteTierOptions o = TestOptions();
  o.url = proxy.url();
  std::unique_ptr<RemoteTier> reader = Open(o);
  std::shared_ptr<const TierFetch> f = FetchNow(*reader, chain);
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->data.size(), chain.size()) << "the fetch waited for an answer before asking on";
  for (size_t i = 0; i < chain.size(); ++i) EXPECT_EQ(f->data[i], chain[i].data) << i;
  EXPECT_EQ(reader->Stats().load_errors, 0u);
  EXPECT_EQ(reader->Stats().loads, chain.size());
}

// A fetch is bounded as a whole (fetch_timeout; by default twice the command timeout), not
// only reply by reply: from a server whose replies trickle in, each piece well within the
// timeout but 16 blocks' in about 1.7 s, the fetch ends by its deadline with the blocks that
// arrived and verified (a prefix of the chain); the rest are the caller's to compute, and
// the connection, cut mid-pipeline, is closed and counted.
TEST_F(RemoteTierTest, AFetchEndsByItsDeadlineWithTheBlocksThatArrived) {
  std::unique_ptr<RemoteTier> writer = Open();
  const BlockLayout layout = SmallLayout();
  const std::vector<BlockRecord> chain = MakeChain(layout, /*seed=*/18, /*n=*/16);
  PublishAll(*writer, chain);
  const size_t record = EncodeBlockRecord(layout, chain[0]).size();
  // About two pieces per block, 50 ms apart: 100 ms a block.
  DelayProxy proxy(redis_->port(), {.chunk_bytes = record / 2 + 16, .gap = absl::Milliseconds(50)});
  RemoteTierOptions o = TestOptions();
  o.url = proxy.url();
  o.timeout = absl::Milliseconds(200);  // and so a deadline of 400 ms
  std::unique_ptr<RemoteTier> reader = Open(o);
  const absl::Time t0 = absl::Now();
  std::shared_ptr<const TierFetch> f = FetchNow(*reader, chain);
  const absl::Duration took = absl::Now() - t0;
  ASSERT_NE(f, nullptr);
  // 400 ms, and a margin for a loaded test machine; the whole fetch takes 1.7 s.
  EXPECT_LT(took, absl::Milliseconds(700)) << "the fetch was not cut at its deadline";
  EXPECT_GE(f->data.size(), 1u) << "the blocks that arrived in time were not kept";
  EXPECT_LT(f->data.size(), chain.size());
  for (size_t i = 0; i < f->data.size(); ++i) EXPECT_EQ(f->data[i], chain[i].data) << i;
  EXPECT_EQ(reader->Stats().loads, f->data.size());
  EXPECT_EQ(reader->Stats().load_errors, 1u);
  EXPECT_EQ(reader->Stats().corrupt_blocks, 0u);
}

// Fetches asked for together share one round trip: a fetch's commands go out as soon as it
// is queued, also while the fetcher waits for an earlier fetch's replies, so four fetches
// from a server 300 ms late all end, whole, within 450 ms (one after another they ended
// after 0.3, 0.6, 0.9 and 1.2 s).
TEST_F(RemoteTierTest, FetchesAskedTogetherNeverWaitPastTheirDeadline) {
  std::unique_ptr<RemoteTier> writer = Open();
  const BlockLayout layout = SmallLayout();
  std::vector<std::vector<BlockRecord>> chains;
  for (uint32_t seed = 30; seed < 34; ++seed) {
    chains.push_back(MakeChain(layout, seed, /*n=*/4));
    PublishAll(*writer, chains.back());
  }
  DelayProxy proxy(redis_->port(), {.delay = absl::Milliseconds(300)});
  RemoteTierOptions o = TestOptions();
  o.url = proxy.url();
  o.timeout = absl::Milliseconds(450);
  std::unique_ptr<RemoteTier> reader = Open(o);
  std::vector<std::shared_ptr<const TierFetch>> fetches;
  std::vector<absl::Notification> done(chains.size());
  std::vector<absl::Time> ended(chains.size());
  const absl::Time t0 = absl::Now();
  for (size_t c = 0; c < chains.size(); ++c) {
    std::vector<Digest> keys;
    std::vector<uint32_t> tokens;
    for (const BlockRecord& r : chains[c]) {
      keys.push_back(r.key);
      tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
    }
    absl::StatusOr<std::shared_ptr<const TierFetch>> f =
        reader->Fetch(chains[c].front().root, keys, tokens, [&ended, &done, c] {
          ended[c] = absl::Now();
          done[c].Notify();
        });
    ASSERT_TRUE(f.ok()) << f.status();
    fetches.push_back(*f);
  }
  for (size_t c = 0; c < chains.size(); ++c) {
    ASSERT_TRUE(done[c].WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_LT(ended[c] - t0, absl::Milliseconds(450 + 250)) << "fetch " << c << " queued";
    ASSERT_EQ(fetches[c]->data.size(), 4u) << "fetch " << c;
    for (size_t i = 0; i < fetches[c]->data.size(); ++i) {
      EXPECT_EQ(fetches[c]->data[i], chains[c][i].data) << c << " " << i;
    }
  }
  EXPECT_EQ(reader->Stats().loads, 16u);
  EXPECT_EQ(reader->Stats().load_errors, 0u);
}

// A fetch that stops in the middle (a damaged value, an absent key) keeps the blocks before
// it, deletes only the damaged value, and leaves the connection in step: the answers to the
// commands already sent for the blocks after it are read, so the next fetch gets its own.
TEST_F(RemoteTierTest, AFetchStoppedMidChainKeepsWhatCameBeforeAndLeavesTheConnectionInStep) {
  std::unique_ptr<RemoteTier> tier = Open();
  const BlockLayout layout = SmallLayout();
  const std::vector<BlockRecord> chain = MakeChain(layout, 4, 5);
  PublishAll(*tier, chain);
  const std::vector<BlockRecord> tail(chain.begin() + 3, chain.end());
  auto expect_tail = [&] {
    std::shared_ptr<const TierFetch> f = FetchNow(*tier, tail);
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(f->data.size(), tail.size());
    for (size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(f->data[i], tail[i].data) << i;
  };
  std::string value = EncodeBlockRecord(layout, chain[2]);
  value[value.size() / 2] ^= 0x01;
  ASSERT_EQ(redis_->Command({"SET", tier->KeyOf(chain[2].key), value}), "OK");
  std::shared_ptr<const TierFetch> f = FetchNow(*tier, chain);
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->data.size(), 2u);
  EXPECT_EQ(f->data[0], chain[0].data);
  EXPECT_EQ(f->data[1], chain[1].data);
  f.reset();
  EXPECT_EQ(redis_->Command({"EXISTS", tier->KeyOf(chain[2].key)}), "0");
  EXPECT_EQ(redis_->Command({"EXISTS", tier->KeyOf(chain[3].key)}), "1");
  EXPECT_EQ(tier->Stats().corrupt_blocks, 1u);
  expect_tail();
  // An absent key (evicted since the match) ends the fetch; it is no fault.
  EXPECT_EQ(Fetched(*tier, chain), 2);
  EXPECT_EQ(tier->Stats().corrupt_blocks, 1u);
  expect_tail();
  EXPECT_EQ(tier->Stats().load_errors, 0u);
}

TEST_F(RemoteTierTest, ADownServerIsCountedAndBackedOffAndFoundAgainAfterARestart) {
  RemoteTierOptions o = TestOptions();
  o.backoff_min = absl::Milliseconds(200);
  o.backoff_max = absl::Milliseconds(200);
  std::unique_ptr<RemoteTier> tier = Open(o);
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 5, 2);
  PublishAll(*tier, chain);
  EXPECT_EQ(tier->MatchFrom(KeysOf(chain)), 2u);

  redis_->Kill();
  EXPECT_EQ(tier->MatchFrom(KeysOf(chain)), 0u);  // the connection breaks
  const RemoteTierStats down = tier->Stats();
  EXPECT_FALSE(down.up);
  EXPECT_EQ(down.match_errors + down.connect_errors, 1u);
  // Backing off: not asked again, nothing counted, nothing queued.
  EXPECT_EQ(tier->MatchFrom(KeysOf(chain)), 0u);
  const RemoteTierStats backing_off = tier->Stats();
  EXPECT_EQ(backing_off.match_errors + backing_off.connect_errors, 1u);
  // The fetcher's own connection finds the server gone too: nothing fetched, one fault.
  EXPECT_EQ(Fetched(*tier, {chain[0]}), 0);
  EXPECT_EQ(tier->Stats().load_errors + tier->Stats().connect_errors + tier->Stats().match_errors,
            2u);
  EXPECT_EQ(Fetched(*tier, {chain[0]}), -1) << "refused while backing off";

  ASSERT_TRUE(redis_->Restart().ok());  // empty
  absl::SleepFor(absl::Milliseconds(250));
  EXPECT_EQ(tier->MatchFrom(KeysOf(chain)), 0u);
  EXPECT_TRUE(tier->Stats().up);
  // The publisher's connection broke too; after its backoff it publishes again.
  const std::vector<BlockRecord> again = MakeChain(SmallLayout(), 6, 2);
  bool published = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!published && absl::Now() < deadline) {
    if (tier->WantsPublish(again[0].key)) {
      tier->Publish(again[0]);
      ASSERT_TRUE(tier->Flush(absl::Now() + absl::Seconds(5)));
      published = tier->MatchFrom(KeysOf(again)) == 1;
    }
    if (!published) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(published);
}

TEST_F(RemoteTierTest, AHungServerCostsOneTimeoutThenIsSkipped) {
  RemoteTierOptions o = TestOptions();
  o.timeout = absl::Milliseconds(300);
  o.backoff_min = absl::Seconds(30);
  o.backoff_max = absl::Seconds(30);
  std::unique_ptr<RemoteTier> tier = Open(o);
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 7, 2);
  EXPECT_EQ(tier->MatchFrom(KeysOf(chain)), 0u);  // connected, nothing there
  redis_->Pause();
  EXPECT_EQ(tier->MatchFrom(KeysOf(chain)), 0u);  // times out
  EXPECT_EQ(tier->Stats().match_errors, 1u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(tier->MatchFrom(KeysOf(chain)), 0u);
  EXPECT_EQ(tier->Stats().match_errors, 1u);  // skipped while backing off
  redis_->Resume();
}
// A match has a deadline of its own (match_timeout), shorter here than the command timeout:
// while the server hangs, the match is answered 0 (a miss) by then, counted as a timeout and
// a fault, and wakes its caller; matches asked once the server answers again are answered.
TEST_F(RemoteTierTest, AMatchNotAnsweredByItsDeadlineIsAMissAndCounted) {
  std::unique_ptr<RemoteTier> writer = Open();
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 9, 2);
  PublishAll(*writer, chain);
  RemoteTierOptions o = TestOptions();
  o.timeout = kMaxRemoteTierTimeout;  // never reached: the match's deadline comes first
  o.match_timeout = absl::Milliseconds(200);
  o.backoff_min = o.backoff_max = absl::Milliseconds(1);
  std::unique_ptr<RemoteTier> tier = Open(o);
  const std::vector<Digest> keys = KeysOf(chain);
  ASSERT_EQ(tier->MatchFrom(keys), 2u);  // connected
  redis_->Pause();
  absl::Notification woken;
  const absl::Time asked = absl::Now();
  absl::StatusOr<std::shared_ptr<const TierMatch>> m =
      tier->StartMatch(keys, {}, [&woken] { woken.Notify(); });
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(woken.WaitForNotificationWithTimeout(absl::Seconds(30)));
  const absl::Duration took = absl::Now() - asked;
  ASSERT_TRUE((*m)->done());
  EXPECT_EQ((*m)->blocks, 0u);
  EXPECT_LT(took, kMaxRemoteTierTimeout / 2) << "bounded by the command timeout, not its own";
  EXPECT_EQ(tier->Stats().match_timeouts, 1u);
  EXPECT_EQ(tier->Stats().match_errors, 1u);
  redis_->Resume();
  size_t found = 0;
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (found != 2 && absl::Now() < until) found = tier->MatchFrom(keys);  // after the backoff
  EXPECT_EQ(found, 2u);
  EXPECT_EQ(tier->Stats().match_timeouts, 1u);
}

// A match is answered on the matcher thread: StartMatch returns at once while the server
// hangs, and the answer (with every match queued meanwhile, in one round trip) comes, and
// wakes its caller, once the server answers again.
TEST_F(RemoteTierTest, AMatchIsAnsweredOffTheCallersThread) {
  std::unique_ptr<RemoteTier> writer = Open();
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 8, 3);
  PublishAll(*writer, {chain[0], chain[1]});
  RemoteTierOptions o = TestOptions();
  o.timeout = kMaxRemoteTierTimeout;  // not reached: the server resumes first
  std::unique_ptr<RemoteTier> tier = Open(o);
  const std::vector<Digest> keys = KeysOf(chain);
  ASSERT_EQ(tier->MatchFrom(keys), 2u);  // connected
  redis_->Pause();
  std::atomic<int> woken{0};
  absl::StatusOr<std::shared_ptr<const TierMatch>> all =
      tier->StartMatch(keys, {}, [&woken] { ++woken; });
  ASSERT_TRUE(all.ok()) << all.status();
  absl::StatusOr<std::shared_ptr<const TierMatch>> tail =
      tier->StartMatch(absl::MakeConstSpan(keys).subspan(1), {}, [&woken] { ++woken; });
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_FALSE((*all)->WaitFor(absl::Milliseconds(50)));
  EXPECT_FALSE((*tail)->done());
  EXPECT_EQ(woken.load(), 0);
  redis_->Resume();
  ASSERT_TRUE((*all)->WaitFor(absl::Seconds(30)));
  ASSERT_TRUE((*tail)->WaitFor(absl::Seconds(30)));
  EXPECT_EQ((*all)->blocks, 2u);
  EXPECT_EQ((*tail)->blocks, 1u);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (woken.load() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(woken.load(), 2);
  EXPECT_EQ(tier->Stats().match_errors, 0u);
}

class FullRedisTest : public RemoteTierTest {
 protected:
  FullRedisTest() { extra_ = {"--maxmemory-policy", "noeviction"}; }
};

// The used_memory line of INFO memory.
int64_t UsedMemory(const RedisServer& redis) {
  const std::string info = redis.Command({"INFO", "memory"});
  const size_t at = info.find("used_memory:");
  return at == std::string::npos ? -1 : std::stoll(info.substr(at + 12));
}

TEST_F(FullRedisTest, AFullServerRefusesStoresWhichAreCountedNotFatal) {
  // Room for about 8 of 24 64-KiB values, without eviction: the rest answer OOM.
  const int64_t used = UsedMemory(*redis_);
  ASSERT_GT(used, 0);
  ASSERT_EQ(redis_->Command({"CONFIG", "SET", "maxmemory", std::to_string(used + (512 << 10))}),
            "OK");
  BlockLayout big = SmallLayout();
  big.head_dim = 1024;  // 64 KiB blocks
  std::unique_ptr<RemoteTier> tier = Open(TestOptions(), big);
  const std::vector<BlockRecord> chain = MakeChain(big, 10, 24);
  for (const BlockRecord& r : chain) {
    if (tier->WantsPublish(r.key)) tier->Publish(r);
    ASSERT_TRUE(tier->Flush(absl::Now() + absl::Seconds(10)));
  }
  const RemoteTierStats s = tier->Stats();
  EXPECT_GT(s.stores, 0u);
  EXPECT_GT(s.store_errors, 0u);
  EXPECT_EQ(s.stores + s.stores_dropped, chain.size());
  // What was stored still reads back whole.
  std::shared_ptr<const TierFetch> f = FetchNow(*tier, {chain[0]});
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->data.size(), 1u);
  EXPECT_EQ(f->data[0], chain[0].data);
}

// A store that fails forgets its key, so that a later computation offers the block again;
// but when a record with a score section was accepted for the key meanwhile (the failed one
// had none), that record is still queued: once it is stored, an offer without scores must
// not be taken, or its SET would overwrite the score section in Redis.
TEST_F(FullRedisTest, AFailedStoreWithoutScoresForgetsNoScoredRecordQueuedAfterIt) {
  const BlockLayout layout = ScoredLayout();
  const BlockRecord plain = MakeChain(layout, 12, 2)[1];
  const BlockRecord scored = WithScores(plain, layout);
  ASSERT_EQ(redis_->Command({"CONFIG", "SET", "maxmemory", "1"}), "OK");  // every SET: OOM
  absl::Notification failed, go;
  std::atomic<int> faults{0};
  RemoteTierOptions o = TestOptions();
  o.backoff_min = o.backoff_max = absl::Nanoseconds(1);  // no backoff in the way
  // Runs on the publisher thread after the failed SET, before the tier handles the failure.
  o.log = [&](const std::string&) {
    if (faults.fetch_add(1) > 0) return;
    failed.Notify();
    go.WaitForNotification();
  };
  std::unique_ptr<RemoteTier> tier = Open(o, layout);
  ASSERT_TRUE(tier->WantsPublish(plain.key, {.scored = false}));
  tier->Publish(plain);
  ASSERT_TRUE(failed.WaitForNotificationWithTimeout(absl::Seconds(30)));
  const std::string unlimited = redis_->Command({"CONFIG", "SET", "maxmemory", "0"});
  const bool wants_scored = tier->WantsPublish(scored.key, {.scored = true});
  if (wants_scored) tier->Publish(scored);
  go.Notify();  // before any ASSERT: the publisher waits for it
  ASSERT_EQ(unlimited, "OK");
  ASSERT_TRUE(wants_scored);
  ASSERT_TRUE(tier->Flush(absl::Now() + absl::Seconds(10)));
  ASSERT_EQ(tier->Stats().stores, 1u);
  ASSERT_EQ(redis_->Command({"STRLEN", tier->KeyOf(scored.key)}),
            std::to_string(layout.scored_record_bytes()));
  EXPECT_FALSE(tier->WantsPublish(plain.key, {.scored = false}))
      << "an offer without scores would overwrite the stored score section";
  EXPECT_FALSE(tier->WantsPublish(scored.key, {.scored = true}));
}

// A key published again after a failed store is remembered as long as any key published
// then: the failed store's old place in the order of remembered keys must not make the tier
// forget it early, or an offer without scores is taken and overwrites its score section.
TEST_F(FullRedisTest, AKeyStoredAfterAFailedStoreIsRememberedAsLongAsAnyOther) {
  const BlockLayout layout = ScoredLayout();
  const BlockRecord plain = MakeChain(layout, 13, 2)[1];
  const BlockRecord scored = WithScores(plain, layout);
  RemoteTierOptions o = TestOptions();
  o.backoff_min = o.backoff_max = absl::Nanoseconds(1);  // no backoff in the way
  o.max_queued_blocks = static_cast<int32_t>(RemoteTier::kRememberedKeys);
  std::unique_ptr<RemoteTier> tier = Open(o, layout);
  ASSERT_EQ(redis_->Command({"CONFIG", "SET", "maxmemory", "1"}), "OK");  // every SET: OOM
  ASSERT_TRUE(tier->WantsPublish(scored.key, {.scored = true}));
  tier->Publish(scored);
  ASSERT_TRUE(tier->Flush(absl::Now() + absl::Seconds(10)));
  ASSERT_EQ(tier->Stats().store_errors, 1u);
  ASSERT_EQ(redis_->Command({"CONFIG", "SET", "maxmemory", "0"}), "OK");
  ASSERT_TRUE(tier->WantsPublish(scored.key, {.scored = true}));  // forgotten: offered again
  tier->Publish(scored);
  ASSERT_TRUE(tier->Flush(absl::Now() + absl::Seconds(10)));
  ASSERT_EQ(tier->Stats().stores, 1u);
  // Other keys, as many as the tier remembers besides this one.
  for (size_t i = 0; i + 1 < RemoteTier::kRememberedKeys; ++i) {
    BlockRecord r = testing::MakeRecord(layout, testing::TestRoot(), 14, static_cast<uint32_t>(i));
    ASSERT_TRUE(tier->WantsPublish(r.key)) << i;
    tier->Publish(std::move(r));
  }
  EXPECT_FALSE(tier->WantsPublish(plain.key, {.scored = false}))
      << "forgotten early: an offer without scores would overwrite the score section";
  EXPECT_FALSE(tier->WantsPublish(scored.key, {.scored = true}));
}

}  // namespace
}  // namespace prefixd
