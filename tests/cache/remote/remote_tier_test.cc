// The remote tier against a real redis-server (tests/testing/redis_server.h): what it
// publishes comes back bit for bit, a match is a prefix, every damaged or foreign value is
// refused and deleted, and a server that is down, hung, restarted, full or asks for a
// password costs counted errors and never a wrong block.
#include "cache/remote/remote_tier.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/cache/disk/disk_test_util.h"
#include "tests/testing/redis_server.h"

namespace prefixd {
namespace {

using ::prefixd::testing::ExpectationOf;
using ::prefixd::testing::MakeChain;
using ::prefixd::testing::RedisServer;
using ::prefixd::testing::SmallLayout;

std::vector<Digest> KeysOf(const std::vector<BlockRecord>& chain) {
  std::vector<Digest> keys;
  for (const BlockRecord& r : chain) keys.push_back(r.key);
  return keys;
}

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> s = RedisServer::Start(extra_);
    ASSERT_TRUE(s.ok()) << s.status();
    redis_ = *std::move(s);
  }

  std::unique_ptr<RemoteTier> Open(RemoteTierOptions o = {},
                                   const DiskLayout& layout = SmallLayout()) {
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
  RemoteTierOptions o;
  o.url = redis_->url();
  o.key_prefix = "has space";
  EXPECT_EQ(RemoteTier::Open(o, SmallLayout()).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.key_prefix = "p:";
  o.timeout = absl::ZeroDuration();
  EXPECT_EQ(RemoteTier::Open(o, SmallLayout()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RemoteTierTest, PublishedBlocksComeBackBitForBitAndMatchAsAPrefix) {
  std::unique_ptr<RemoteTier> writer = Open();
  const DiskLayout layout = SmallLayout();
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
  std::vector<uint8_t> out(static_cast<size_t>(layout.data_bytes()));
  for (int b : {0, 1, 3}) {
    ASSERT_TRUE(reader->Load(ExpectationOf(chain[b]), absl::MakeSpan(out)).ok());
    EXPECT_EQ(out, chain[b].data);
  }
  EXPECT_EQ(reader->Load(ExpectationOf(chain[2]), absl::MakeSpan(out)).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(reader->Stats().loads, 3u);
  // A block published lately is not offered again.
  EXPECT_FALSE(writer->WantsPublish(chain[0].key));
}

TEST_F(RemoteTierTest, AMatchAsksAtMostMaxMatchBlocks) {
  RemoteTierOptions o;
  o.max_match_blocks = 2;
  std::unique_ptr<RemoteTier> tier = Open(o);
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 2, 4);
  PublishAll(*tier, chain);
  EXPECT_EQ(tier->MatchFrom(KeysOf(chain)), 2u);
}

TEST_F(RemoteTierTest, DamagedTruncatedAndForeignValuesAreRefusedAndDeleted) {
  std::unique_ptr<RemoteTier> tier = Open();
  const DiskLayout layout = SmallLayout();
  const std::vector<BlockRecord> chain = MakeChain(layout, 3, 3);
  PublishAll(*tier, chain);
  std::vector<uint8_t> out(static_cast<size_t>(layout.data_bytes()));

  // One flipped data byte.
  std::string value = EncodeBlockFile(layout, chain[0]);
  value[value.size() / 2] ^= 0x01;
  ASSERT_EQ(redis_->Command({"SET", tier->KeyOf(chain[0].key), value}), "OK");
  EXPECT_EQ(tier->Load(ExpectationOf(chain[0]), absl::MakeSpan(out)).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(redis_->Command({"EXISTS", tier->KeyOf(chain[0].key)}), "0");

  // Truncated.
  value = EncodeBlockFile(layout, chain[1]);
  value.resize(value.size() - 7);
  ASSERT_EQ(redis_->Command({"SET", tier->KeyOf(chain[1].key), value}), "OK");
  EXPECT_EQ(tier->Load(ExpectationOf(chain[1]), absl::MakeSpan(out)).code(),
            absl::StatusCode::kDataLoss);

  // Computed by another model, and by other numerics, under this block's key.
  DiskLayout other_model = SmallLayout("manifest-2");
  DiskLayout other_numerics = layout;
  other_numerics.numerics_key = Sha256Of("numerics-2");
  for (const DiskLayout& foreign : {other_model, other_numerics}) {
    ASSERT_EQ(redis_->Command({"SET", tier->KeyOf(chain[2].key), EncodeBlockFile(foreign, chain[2])}),
              "OK");
    EXPECT_EQ(tier->Load(ExpectationOf(chain[2]), absl::MakeSpan(out)).code(),
              absl::StatusCode::kDataLoss);
  }
  // Not a string at all.
  ASSERT_EQ(redis_->Command({"RPUSH", tier->KeyOf(chain[2].key), "x"}), "1");
  EXPECT_EQ(tier->Load(ExpectationOf(chain[2]), absl::MakeSpan(out)).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(tier->Stats().corrupt_blocks, 5u);
  EXPECT_EQ(tier->Stats().loads, 0u);
  EXPECT_EQ(redis_->Command({"DBSIZE"}), "0");
}

TEST_F(RemoteTierTest, LayoutsDoNotShareKeys) {
  std::unique_ptr<RemoteTier> a = Open();
  DiskLayout other = SmallLayout();
  other.numerics_key = Sha256Of("numerics-2");
  std::unique_ptr<RemoteTier> b = Open({}, other);
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 4, 2);
  PublishAll(*a, chain);
  EXPECT_NE(a->KeyOf(chain[0].key), b->KeyOf(chain[0].key));
  EXPECT_EQ(b->MatchFrom(KeysOf(chain)), 0u);
  EXPECT_EQ(a->MatchFrom(KeysOf(chain)), 2u);
}

TEST_F(RemoteTierTest, ADownServerIsCountedAndBackedOffAndFoundAgainAfterARestart) {
  RemoteTierOptions o;
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
  std::vector<uint8_t> out(static_cast<size_t>(SmallLayout().data_bytes()));
  EXPECT_EQ(tier->Load(ExpectationOf(chain[0]), absl::MakeSpan(out)).code(),
            absl::StatusCode::kUnavailable);
  const RemoteTierStats backing_off = tier->Stats();
  EXPECT_EQ(backing_off.match_errors + backing_off.connect_errors, 1u);

  ASSERT_TRUE(redis_->Restart().ok());  // empty
  absl::SleepFor(absl::Milliseconds(250));
  EXPECT_EQ(tier->MatchFrom(KeysOf(chain)), 0u);
  EXPECT_TRUE(tier->Stats().up);
  // The publisher's connection broke too; after its backoff it publishes again.
  const std::vector<BlockRecord> again = MakeChain(SmallLayout(), 6, 2);
  bool published = false;
  for (int i = 0; i < 50 && !published; ++i) {
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
  RemoteTierOptions o;
  o.timeout = absl::Milliseconds(50);
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

TEST_F(RemoteTierTest, UnixSocketsWork) {
  RemoteTierOptions o;
  o.url = redis_->unix_url();
  std::unique_ptr<RemoteTier> tier = Open(o);
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 8, 2);
  PublishAll(*tier, chain);
  EXPECT_EQ(tier->MatchFrom(KeysOf(chain)), 2u);
}

TEST_F(RemoteTierTest, TheDatabaseNumberSelectsTheDatabase) {
  RemoteTierOptions o;
  o.url = redis_->url() + "/3";
  std::unique_ptr<RemoteTier> tier = Open(o);
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 9, 1);
  PublishAll(*tier, chain);
  EXPECT_EQ(redis_->Command({"EXISTS", tier->KeyOf(chain[0].key)}), "0");  // not in db 0
  EXPECT_EQ(tier->MatchFrom(KeysOf(chain)), 1u);
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
  DiskLayout big = SmallLayout();
  big.head_dim = 1024;  // 64 KiB blocks
  std::unique_ptr<RemoteTier> tier = Open({}, big);
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
  std::vector<uint8_t> out(static_cast<size_t>(big.data_bytes()));
  ASSERT_TRUE(tier->Load(ExpectationOf(chain[0]), absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, chain[0].data);
}

class PasswordRedisTest : public RemoteTierTest {
 protected:
  PasswordRedisTest() { extra_ = {"--requirepass", "s3cret"}; }
};

TEST_F(PasswordRedisTest, TheRightPasswordWorksAndAWrongOneIsAConnectError) {
  RemoteTierOptions wrong;
  wrong.password = "nope";
  std::unique_ptr<RemoteTier> bad = Open(wrong);
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 11, 1);
  EXPECT_EQ(bad->MatchFrom(KeysOf(chain)), 0u);
  EXPECT_EQ(bad->Stats().connect_errors, 1u);

  RemoteTierOptions right;
  right.password = "s3cret";
  std::unique_ptr<RemoteTier> good = Open(right);
  PublishAll(*good, chain);
  EXPECT_EQ(good->MatchFrom(KeysOf(chain)), 1u);
}

}  // namespace
}  // namespace prefixd
