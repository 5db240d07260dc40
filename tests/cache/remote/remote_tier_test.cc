// The remote tier against a real redis-server (tests/testing/redis_server.h): what it
// publishes comes back bit for bit, a match is a prefix, every damaged or foreign value is
// refused and deleted, layouts and databases keep their keys apart, and a password is used.
// Servers that are slow, down, hung, restarted or full: remote_tier_faults_test.cc.
#include "cache/remote/remote_tier.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/cache/remote/remote_tier_fixture.h"
#include "tests/cache/tier_test_util.h"
#include "tests/testing/redis_server.h"

namespace prefixd {
namespace {

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

TEST(RemoteUrlTest, AcceptsTcpAndUnixForms) {
  absl::StatusOr<RemoteEndpoint> e = ParseRemoteUrl("redis://cache.internal:6380/2");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->host, "cache.internal");
  EXPECT_EQ(e->port, 6380);
  EXPECT_EQ(e->db, 2);
  e = ParseRemoteUrl("redis://[::1]:6379");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->db, 0);
  EXPECT_EQ(e->ToString(), "redis://[::1]:6379/0");
  e = ParseRemoteUrl("unix:///run/redis/redis.sock");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->unix_path, "/run/redis/redis.sock");
}

TEST(RemoteUrlTest, RefusesWhatItCannotUseNamingWhy) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"http://host:1", "unknown scheme"},
      {"rediss://host:1", "TLS"},
      {"redis://host", "missing :PORT"},
      {"redis://host:0", "bad port"},
      {"redis://host:70000", "bad port"},
      {"redis://host:x", "bad port"},
      {"redis://:6379", "missing host"},
      {"redis://:secret@host:6379", "--kv-remote-password-file"},
      {"redis://host:6379/-1", "bad database"},
      {"redis://[::1:6379", "unclosed"},
      {"unix://relative.sock", "absolute"},
  };
  for (const auto& [url, why] : bad) {
    absl::StatusOr<RemoteEndpoint> e = ParseRemoteUrl(url);
    ASSERT_FALSE(e.ok()) << url;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << url;
    EXPECT_NE(e.status().message().find(why), std::string_view::npos)
        << url << ": " << e.status().message();
  }
}

TEST_F(RemoteTierTest, OpenRefusesBadOptions) {
  RemoteTierOptions o = TestOptions();
  o.url = redis_->url();
  o.key_prefix = "has space";
  EXPECT_EQ(RemoteTier::Open(o, SmallLayout()).status().code(), absl::StatusCode::kInvalidArgument);
  o.key_prefix = "p:";
  o.timeout = absl::ZeroDuration();
  EXPECT_EQ(RemoteTier::Open(o, SmallLayout()).status().code(), absl::StatusCode::kInvalidArgument);
  o.timeout = absl::Seconds(1);
  o.match_timeout = -absl::Milliseconds(1);
  EXPECT_EQ(RemoteTier::Open(o, SmallLayout()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RemoteTierTest, PublishedBlocksComeBackBitForBitAndMatchAsAPrefix) {
  std::unique_ptr<RemoteTier> writer = Open();
  const BlockLayout layout = SmallLayout();
  const std::vector<BlockRecord> chain = MakeChain(layout, 1, 5);
  // Blocks 0, 1 and 3: the match stops at the gap.
  PublishAll(*writer, {chain[0], chain[1], chain[3]});
  EXPECT_EQ(writer->Stats().stores, 3u);
  EXPECT_TRUE(writer->Stats().up);
  EXPECT_EQ(redis_->Command({"EXISTS", writer->KeyOf(chain[1].key)}), "1");

  std::unique_ptr<RemoteTier> reader = Open();  // another replica
  const std::vector<Digest> keys = KeysOf(chain);
  EXPECT_EQ(reader->MatchFrom(keys), 2u);
  EXPECT_EQ(reader->MatchFrom(absl::MakeConstSpan(keys).subspan(3)), 1u);
  std::shared_ptr<const TierFetch> f = FetchNow(*reader, {chain[0], chain[1]});
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->data.size(), 2u);
  EXPECT_EQ(f->data[0], chain[0].data);
  EXPECT_EQ(f->data[1], chain[1].data);
  // A fetch stops at the first block that is gone.
  f = FetchNow(*reader, {chain[2], chain[3]});
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->data.empty());
  f = FetchNow(*reader, {chain[3]});
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->data.size(), 1u);
  EXPECT_EQ(f->data[0], chain[3].data);
  EXPECT_EQ(reader->Stats().loads, 3u);
  EXPECT_EQ(reader->Stats().corrupt_blocks, 0u);
  // A block published lately is not offered again.
  EXPECT_FALSE(writer->WantsPublish(chain[0].key));
}

// The fetcher reuses the buffers of fetches that ended: each fetch still holds its own
// blocks' bytes, not a previous fetch's.
TEST_F(RemoteTierTest, ReusedBuffersHoldEachFetchsOwnBytes) {
  std::unique_ptr<RemoteTier> tier = Open();
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 3, 4);
  PublishAll(*tier, chain);
  for (int round = 0; round < 3; ++round) {
    for (size_t first = 0; first < chain.size(); ++first) {
      std::vector<BlockRecord> part(chain.begin() + first, chain.end());
      std::shared_ptr<const TierFetch> f = FetchNow(*tier, part);
      ASSERT_NE(f, nullptr);
      ASSERT_EQ(f->data.size(), part.size());
      for (size_t i = 0; i < part.size(); ++i) {
        EXPECT_EQ(f->data[i], part[i].data) << "round " << round << " block " << first + i;
      }
    }  // each fetch ends here: its buffers serve the next
  }
  EXPECT_EQ(tier->Stats().corrupt_blocks, 0u);
}

// A value with a score section comes back with it; a scored match counts only such values
// (and a key of another type is no match, not a fault); a block published without scores
// is offered again with them, once.
TEST_F(RemoteTierTest, ScoreSectionsTravelWithTheirBlocks) {
  const BlockLayout layout = ScoredLayout();
  std::unique_ptr<RemoteTier> writer = Open(TestOptions(), layout);
  std::vector<BlockRecord> chain = MakeChain(layout, 21, 3);
  chain[0] = WithScores(chain[0], layout);
  chain[1] = WithScores(chain[1], layout);
  // Block 2 without scores first; then with them.
  PublishAll(*writer, chain);
  EXPECT_FALSE(writer->WantsPublish(chain[2].key, {.scored = false}));
  const BlockRecord scored2 = WithScores(chain[2], layout);
  ASSERT_TRUE(writer->WantsPublish(chain[2].key, {.scored = true}));
  writer->Publish(scored2);
  ASSERT_TRUE(writer->Flush(absl::Now() + absl::Seconds(10)));
  EXPECT_FALSE(writer->WantsPublish(chain[2].key, {.scored = true}));

  std::unique_ptr<RemoteTier> reader = Open(TestOptions(), layout);
  const std::vector<Digest> keys = KeysOf(chain);
  EXPECT_EQ(reader->MatchFrom(keys, {.scored_only = true}), 3u);
  std::shared_ptr<const TierFetch> f = FetchNow(*reader, {chain[0], chain[1], scored2});
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->data.size(), 3u);
  ASSERT_EQ(f->scores.size(), 3u);
  EXPECT_EQ(f->scores[0], chain[0].scores);
  EXPECT_EQ(f->scores[1], chain[1].scores);
  EXPECT_EQ(f->scores[2], scored2.scores);

  // An unscored value ends a scored match but not a plain one.
  PublishAll(*writer, {MakeChain(layout, 21, 4)[3]});
  const std::vector<BlockRecord> longer = MakeChain(layout, 21, 4);
  EXPECT_EQ(reader->MatchFrom(KeysOf(longer), {.scored_only = true}), 3u);
  EXPECT_EQ(reader->MatchFrom(KeysOf(longer)), 4u);
  ASSERT_EQ(redis_->Command({"DEL", reader->KeyOf(chain[1].key)}), "1");
  ASSERT_EQ(redis_->Command({"RPUSH", reader->KeyOf(chain[1].key), "x"}), "1");
  EXPECT_EQ(reader->MatchFrom(keys, {.scored_only = true}), 1u);
  EXPECT_TRUE(reader->Stats().up);
  EXPECT_EQ(reader->Stats().match_errors, 0u);
}

TEST_F(RemoteTierTest, AMatchAsksAtMostMaxMatchBlocks) {
  RemoteTierOptions o = TestOptions();
  o.max_match_blocks = 2;
  std::unique_ptr<RemoteTier> tier = Open(o);
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 2, 4);
  PublishAll(*tier, chain);
  EXPECT_EQ(tier->MatchFrom(KeysOf(chain)), 2u);
}

TEST_F(RemoteTierTest, FetchedBlocksCountAgainstTheBudgetUntilReleased) {
  RemoteTierOptions o = TestOptions();
  o.max_fetch_blocks = 2;
  std::unique_ptr<RemoteTier> tier = Open(o);
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 12, 3);
  PublishAll(*tier, chain);
  std::shared_ptr<const TierFetch> held = FetchNow(*tier, {chain[0], chain[1]});
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->data.size(), 2u);
  EXPECT_EQ(tier->Fetch(chain[2].root, {chain[2].key}, chain[2].tokens, nullptr).status().code(),
            absl::StatusCode::kResourceExhausted)
      << "the held fetch still has the budget";
  held.reset();
  EXPECT_EQ(Fetched(*tier, {chain[2]}), 1);
}

TEST_F(RemoteTierTest, DamagedTruncatedAndForeignValuesAreRefusedAndDeleted) {
  std::unique_ptr<RemoteTier> tier = Open();
  const BlockLayout layout = SmallLayout();
  const std::vector<BlockRecord> chain = MakeChain(layout, 3, 3);
  PublishAll(*tier, chain);
  // One flipped data byte.
  std::string value = EncodeBlockRecord(layout, chain[0]);
  value[value.size() / 2] ^= 0x01;
  ASSERT_EQ(redis_->Command({"SET", tier->KeyOf(chain[0].key), value}), "OK");
  EXPECT_EQ(Fetched(*tier, {chain[0]}), 0);
  EXPECT_EQ(redis_->Command({"EXISTS", tier->KeyOf(chain[0].key)}), "0");

  // Truncated.
  value = EncodeBlockRecord(layout, chain[1]);
  value.resize(value.size() - 7);
  ASSERT_EQ(redis_->Command({"SET", tier->KeyOf(chain[1].key), value}), "OK");
  EXPECT_EQ(Fetched(*tier, {chain[1]}), 0);

  // Computed by another model, and by other numerics, under this block's key.
  BlockLayout other_model = SmallLayout("manifest-2");
  BlockLayout other_numerics = layout;
  other_numerics.numerics_key = Sha256Of("numerics-2");
  for (const BlockLayout& foreign : {other_model, other_numerics}) {
    ASSERT_EQ(
        redis_->Command({"SET", tier->KeyOf(chain[2].key), EncodeBlockRecord(foreign, chain[2])}),
        "OK");
    EXPECT_EQ(Fetched(*tier, {chain[2]}), 0);
  }
  // Not a string at all.
  ASSERT_EQ(redis_->Command({"RPUSH", tier->KeyOf(chain[2].key), "x"}), "1");
  EXPECT_EQ(Fetched(*tier, {chain[2]}), 0);
  EXPECT_EQ(tier->Stats().corrupt_blocks, 5u);
  EXPECT_EQ(tier->Stats().loads, 0u);
  EXPECT_EQ(redis_->Command({"DBSIZE"}), "0");
}

// Bytes the server has sent to all its clients so far (INFO stats).
int64_t NetOutputBytes(const RedisServer& redis) {
  const std::string info = redis.Command({"INFO", "stats"});
  const std::string field = "total_net_output_bytes:";
  const size_t at = info.find(field);
  return at == std::string::npos ? -1 : std::stoll(info.substr(at + field.size()));
}

// A value whose length is not a block record's is refused without being read: at most one
// record's bytes cross the network, and it is counted corrupt and deleted like any other.
TEST_F(RemoteTierTest, AValueOfAnotherLengthIsRefusedWithoutReadingIt) {
  std::unique_ptr<RemoteTier> tier = Open();
  const BlockLayout layout = SmallLayout();
  const std::vector<BlockRecord> chain = MakeChain(layout, /*seed=*/5, /*n=*/2);
  PublishAll(*tier, chain);
  const int64_t record = static_cast<int64_t>(EncodeBlockRecord(layout, chain[0]).size());
  // The block's own record with 16 MB of junk after it, and one byte short of it.
  const std::string oversized = EncodeBlockRecord(layout, chain[0]) + std::string(16 << 20, 'j');
  ASSERT_EQ(redis_->Command({"SET", tier->KeyOf(chain[0].key), oversized}), "OK");
  const int64_t before = NetOutputBytes(*redis_);
  ASSERT_GE(before, 0);
  EXPECT_EQ(Fetched(*tier, {chain[0]}), 0);
  const int64_t sent = NetOutputBytes(*redis_) - before;
  EXPECT_LT(sent, record + 65536) << "the oversized value was read";
  EXPECT_EQ(redis_->Command({"EXISTS", tier->KeyOf(chain[0].key)}), "0");
  std::string shorter = EncodeBlockRecord(layout, chain[1]);
  shorter.pop_back();
  ASSERT_EQ(redis_->Command({"SET", tier->KeyOf(chain[1].key), shorter}), "OK");
  EXPECT_EQ(Fetched(*tier, {chain[1]}), 0);
  EXPECT_EQ(tier->Stats().corrupt_blocks, 2u);
  EXPECT_EQ(tier->Stats().loads, 0u);
  EXPECT_EQ(redis_->Command({"DBSIZE"}), "0");
  // The tier goes on: the right record under the key loads.
  ASSERT_EQ(
      redis_->Command({"SET", tier->KeyOf(chain[0].key), EncodeBlockRecord(layout, chain[0])}),
      "OK");
  EXPECT_EQ(Fetched(*tier, {chain[0]}), 1);
}

TEST_F(RemoteTierTest, LayoutsDoNotShareKeys) {
  std::unique_ptr<RemoteTier> a = Open();
  BlockLayout other = SmallLayout();
  other.numerics_key = Sha256Of("numerics-2");
  std::unique_ptr<RemoteTier> b = Open(TestOptions(), other);
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 4, 2);
  PublishAll(*a, chain);
  EXPECT_NE(a->KeyOf(chain[0].key), b->KeyOf(chain[0].key));
  EXPECT_EQ(b->MatchFrom(KeysOf(chain)), 0u);
  EXPECT_EQ(a->MatchFrom(KeysOf(chain)), 2u);
}

TEST_F(RemoteTierTest, UnixSocketsWork) {
  RemoteTierOptions o = TestOptions();
  o.url = redis_->unix_url();
  std::unique_ptr<RemoteTier> tier = Open(o);
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 8, 2);
  PublishAll(*tier, chain);
  EXPECT_EQ(tier->MatchFrom(KeysOf(chain)), 2u);
}

TEST_F(RemoteTierTest, TheDatabaseNumberSelectsTheDatabase) {
  RemoteTierOptions o = TestOptions();
  o.url = redis_->url() + "/3";
  std::unique_ptr<RemoteTier> tier = Open(o);
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 9, 1);
  PublishAll(*tier, chain);
  EXPECT_EQ(redis_->Command({"EXISTS", tier->KeyOf(chain[0].key)}), "0");  // not in db 0
  EXPECT_EQ(tier->MatchFrom(KeysOf(chain)), 1u);
}

class PasswordRedisTest : public RemoteTierTest {
 protected:
  PasswordRedisTest() { extra_ = {"--requirepass", "s3cret"}; }
};

TEST_F(PasswordRedisTest, TheRightPasswordWorksAndAWrongOneIsAConnectError) {
  RemoteTierOptions wrong = TestOptions();
  wrong.password = "nope";
  std::unique_ptr<RemoteTier> bad = Open(wrong);
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 11, 1);
  EXPECT_EQ(bad->MatchFrom(KeysOf(chain)), 0u);
  EXPECT_EQ(bad->Stats().connect_errors, 1u);

  RemoteTierOptions right = TestOptions();
  right.password = "s3cret";
  std::unique_ptr<RemoteTier> good = Open(right);
  PublishAll(*good, chain);
  EXPECT_EQ(good->MatchFrom(KeysOf(chain)), 1u);
}

}  // namespace
}  // namespace prefixd
