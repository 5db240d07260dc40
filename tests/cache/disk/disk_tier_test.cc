// DiskTier (cache/disk/disk_tier.h) on a real directory: spill, load, restart, corruption,
// the cap, the lock, foreign layouts, a full queue, failed writes, and the pool's match
// continuing into the tier.
#include "cache/disk/disk_tier.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "cache/block_key.h"
#include "cache/kv_cache.h"
#include "cache/token_chain.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/disk/disk_test_util.h"
#include "tests/testing/files.h"

namespace prefixd {
namespace {

using testing::ExpectationOf;
using testing::MakeChain;
using testing::ScratchDir;
using testing::SmallLayout;

constexpr absl::Duration kWait = absl::Seconds(30);

class DiskTierTest : public ::testing::Test {
 protected:
  std::unique_ptr<DiskTier> Open(int64_t max_bytes = int64_t{1} << 20,
                                 const DiskLayout& layout = SmallLayout(), int32_t queue = 64) {
    DiskTierOptions o;
    o.dir = dir_.path();
    o.max_bytes = max_bytes;
    o.max_queued_blocks = queue;
    o.clock = [this] { return ++now_; };
    auto t = DiskTier::Open(o, layout);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }

  // Spills every record (they must be accepted) and waits for the writer.
  static void SpillAll(DiskTier& tier, const std::vector<BlockRecord>& records) {
    for (const BlockRecord& r : records) {
      ASSERT_TRUE(tier.WantsSpill(r.key));
      tier.Spill(r);
    }
    ASSERT_TRUE(tier.Flush(absl::Now() + kWait));
  }

  static absl::Status LoadInto(DiskTier& tier, const BlockRecord& r, std::vector<uint8_t>* out) {
    out->assign(static_cast<size_t>(tier.layout().data_bytes()), 0);
    return tier.Load(ExpectationOf(r), absl::MakeSpan(*out));
  }

  ScratchDir dir_{"tier"};
  int64_t now_ = 0;
};

TEST_F(DiskTierTest, SpilledBlocksLoadBackAndSurviveARestart) {
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 1, 3);
  {
    auto tier = Open();
    ASSERT_NE(tier, nullptr);
    SpillAll(*tier, chain);
    // Already on disk: not written twice.
    EXPECT_FALSE(tier->WantsSpill(chain[0].key));
    const DiskTierStats s = tier->Stats();
    EXPECT_EQ(s.spills, 3u);
    EXPECT_EQ(s.spills_dropped, 0u);
    EXPECT_EQ(s.blocks, 3);
    EXPECT_EQ(s.bytes, 3 * SmallLayout().file_bytes());
    EXPECT_TRUE(std::filesystem::exists(tier->PathOf(chain[2].key)));
  }
  auto tier = Open();  // a restart: the index comes from the directory
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->Stats().blocks, 3);
  std::vector<uint8_t> data;
  for (const BlockRecord& r : chain) {
    ASSERT_TRUE(LoadInto(*tier, r, &data).ok());
    EXPECT_EQ(data, r.data);
  }
  EXPECT_EQ(tier->Stats().loads, 3u);
  EXPECT_EQ(tier->Stats().corrupt_blocks, 0u);
}

TEST_F(DiskTierTest, MatchFromStopsAtTheFirstMissingBlock) {
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 1, 4);
  auto tier = Open();
  ASSERT_NE(tier, nullptr);
  SpillAll(*tier, {chain[0], chain[1], chain[3]});  // block 2 missing
  std::vector<uint32_t> tokens;
  for (const BlockRecord& r : chain) tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
  tokens.push_back(7);  // a partial block has no key
  const TokenChain request(testing::TestRoot(), 4, tokens);
  ASSERT_EQ(request.keys().size(), 4u);
  EXPECT_EQ(tier->MatchFrom(request.keys()), 2u);  // blocks 0 and 1
  // From block 3 on, block 3 is there.
  EXPECT_EQ(tier->MatchFrom(request.keys().subspan(3)), 1u);
  // Another tenant's chain shares no key.
  const TokenChain other(CacheRootKey("manifest-1", CacheNamespace("other", "")), 4, tokens);
  EXPECT_EQ(tier->MatchFrom(other.keys()), 0u);
}

// The pool's longest-prefix match ends where its blocks were evicted; the tier holds them
// (the eviction hook spilled them) and continues the match.
TEST_F(DiskTierTest, PoolMatchContinuesIntoTheTier) {
  const DiskLayout layout = SmallLayout();
  auto tier = Open();
  ASSERT_NE(tier, nullptr);
  KvCacheOptions o;
  o.num_blocks = 4;
  o.block_size = 4;
  o.bytes_per_token = 1;
  std::vector<Digest> evicted;
  o.on_evict = [&](const EvictedBlock& e) {
    evicted.push_back(*e.key);
    if (!tier->WantsSpill(*e.key)) return;
    BlockRecord r;
    r.root = *e.root;
    r.parent_key = *e.parent_key;
    r.key = *e.key;
    r.tokens.assign(e.tokens.begin(), e.tokens.end());
    r.data.assign(static_cast<size_t>(layout.data_bytes()), static_cast<uint8_t>(r.tokens[0]));
    tier->Spill(std::move(r));
  };
  auto cache = *KvCache::Create(o);
  const Digest root = testing::TestRoot();
  auto prefill = [&](const std::vector<uint32_t>& prompt) {
    AdmissionRequest r{.chain = std::make_shared<TokenChain>(root, 4, prompt),
                       .reserve_tokens = static_cast<int32_t>(prompt.size())};
    auto a = cache->Admit(r);
    ASSERT_TRUE(a.ok()) << a.status();
    cache->MarkComputed(a->seq, static_cast<int32_t>(prompt.size()));
    cache->Release(a->seq);
  };
  std::vector<uint32_t> a(12), b(12);
  for (uint32_t i = 0; i < 12; ++i) a[i] = i;
  for (uint32_t i = 0; i < 12; ++i) b[i] = 1000 + i;
  prefill(a);  // blocks of a: a0 <- a1 <- a2, all cached; one block free
  prefill(b);  // needs 3 blocks: the free one, then evicts a2 and a1 (leaves first)
  ASSERT_EQ(evicted.size(), 2u);
  ASSERT_TRUE(tier->Flush(absl::Now() + kWait));
  cache->CheckInvariants();

  std::vector<uint32_t> prompt = a;
  prompt.push_back(99);
  auto chain = std::make_shared<TokenChain>(root, 4, prompt);
  AdmissionRequest r{.chain = chain, .reserve_tokens = static_cast<int32_t>(prompt.size())};
  auto plan = cache->PlanAdmission(r);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->matched_tokens, 4);  // a0 only in the pool
  const absl::Span<const Digest> after_pool = chain->keys().subspan(1);
  ASSERT_EQ(tier->MatchFrom(after_pool), 2u);  // a1 and a2 from disk
  const std::vector<Digest> more(after_pool.begin(), after_pool.end());
  EXPECT_EQ(more[0], evicted[1]);
  EXPECT_EQ(more[1], evicted[0]);
  std::vector<uint8_t> data(static_cast<size_t>(layout.data_bytes()));
  BlockExpectation e{
      .root = root, .key = more[1], .tokens = absl::MakeConstSpan(prompt).subspan(8, 4)};
  ASSERT_TRUE(tier->Load(e, absl::MakeSpan(data)).ok());
  EXPECT_EQ(data[0], 8);  // the pattern written by the hook for a2
}

TEST_F(DiskTierTest, CorruptTruncatedOrMissingFilesAreDroppedAndCounted) {
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 1, 3);
  auto tier = Open();
  ASSERT_NE(tier, nullptr);
  SpillAll(*tier, chain);
  {  // one flipped data byte
    std::fstream f(tier->PathOf(chain[0].key), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kBlockFileHeaderBytes + 40);
    f.put('\x5a');
  }
  std::filesystem::resize_file(tier->PathOf(chain[1].key), 100);  // truncated
  std::filesystem::remove(tier->PathOf(chain[2].key));            // deleted behind our back
  std::vector<uint8_t> data;
  EXPECT_EQ(LoadInto(*tier, chain[0], &data).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(LoadInto(*tier, chain[1], &data).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(LoadInto(*tier, chain[2], &data).code(), absl::StatusCode::kNotFound);
  const DiskTierStats s = tier->Stats();
  EXPECT_EQ(s.corrupt_blocks, 2u);
  EXPECT_EQ(s.loads, 0u);
  EXPECT_EQ(s.blocks, 0);
  EXPECT_EQ(s.bytes, 0);
  EXPECT_FALSE(std::filesystem::exists(tier->PathOf(chain[0].key)));
  EXPECT_FALSE(std::filesystem::exists(tier->PathOf(chain[1].key)));
  // Gone from the index: a second try is a plain miss, and the block may be spilled again.
  EXPECT_EQ(LoadInto(*tier, chain[0], &data).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(tier->WantsSpill(chain[0].key));
}

TEST_F(DiskTierTest, TheCapDeletesForeignFilesFirstThenTheLeastRecentlyUsed) {
  const int64_t file = SmallLayout().file_bytes();
  // Files of another model's layout, left by an earlier run.
  {
    auto other = Open(int64_t{1} << 20, SmallLayout("manifest-2"));
    ASSERT_NE(other, nullptr);
    SpillAll(*other, MakeChain(SmallLayout("manifest-2"), 5, 2));
  }
  std::ofstream(dir_.path() + "/notes.txt") << "not a block file";
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 1, 4);
  auto tier = Open(3 * file);
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->Stats().foreign_files, 2);
  EXPECT_EQ(tier->Stats().blocks, 0);
  SpillAll(*tier, {chain[0]});  // 3 files: fits
  EXPECT_EQ(tier->Stats().foreign_files, 2);
  SpillAll(*tier, {chain[1]});
  EXPECT_EQ(tier->Stats().foreign_files, 1);  // one foreign file made room
  SpillAll(*tier, {chain[2]});
  EXPECT_EQ(tier->Stats().foreign_files, 0);
  EXPECT_EQ(tier->Stats().evicted_files, 2u);
  std::vector<uint8_t> data;
  ASSERT_TRUE(LoadInto(*tier, chain[0], &data).ok());  // chain[0] is now the most recent
  SpillAll(*tier, {chain[3]});                         // evicts chain[1], the LRU
  EXPECT_TRUE(tier->Contains(chain[0].key));
  EXPECT_FALSE(tier->Contains(chain[1].key));
  EXPECT_FALSE(std::filesystem::exists(tier->PathOf(chain[1].key)));
  EXPECT_TRUE(tier->Contains(chain[2].key));
  EXPECT_TRUE(tier->Contains(chain[3].key));
  EXPECT_EQ(tier->Stats().bytes, 3 * file);
  EXPECT_LE(tier->Stats().bytes, tier->cap_bytes());
  EXPECT_TRUE(std::filesystem::exists(dir_.path() + "/notes.txt"));  // never ours to delete
}

TEST_F(DiskTierTest, ASecondTierOnTheSameDirectoryIsRefused) {
  auto first = Open();
  ASSERT_NE(first, nullptr);
  DiskTierOptions o;
  o.dir = dir_.path();
  o.max_bytes = 1 << 20;
  auto second = DiskTier::Open(o, SmallLayout());
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(second.status().message(), "in use by another prefixd process"))
      << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), std::to_string(::getpid())));
  first.reset();
  EXPECT_TRUE(DiskTier::Open(o, SmallLayout()).ok());  // the lock went with the first
}

TEST_F(DiskTierTest, UnusableDirectoriesAreRefusedClearly) {
  DiskTierOptions o;
  o.max_bytes = 1 << 20;
  o.dir = dir_.path() + "/a/b";  // missing parents are created
  EXPECT_TRUE(DiskTier::Open(o, SmallLayout()).ok());
  std::ofstream(dir_.path() + "/file") << "x";
  o.dir = dir_.path() + "/file/sub";  // under a regular file
  auto under_file = DiskTier::Open(o, SmallLayout());
  EXPECT_EQ(under_file.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(under_file.status().message(), "cannot create cache dir"));
  o.dir = "/proc/self";  // exists, refuses new files even to root
  auto read_only = DiskTier::Open(o, SmallLayout());
  EXPECT_EQ(read_only.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(read_only.status().message(), "not writable"))
      << read_only.status();
  o.dir = "";
  EXPECT_EQ(DiskTier::Open(o, SmallLayout()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DiskTierTest, DefaultCapIsAtMostHalfTheFreeSpaceAndEightGiB) {
  DiskTierOptions o;
  o.dir = dir_.path();
  auto tier = DiskTier::Open(o, SmallLayout());
  ASSERT_TRUE(tier.ok()) << tier.status();
  const std::filesystem::space_info space = std::filesystem::space(dir_.path());
  EXPECT_GT((*tier)->cap_bytes(), 0);
  EXPECT_LE((*tier)->cap_bytes(), kDefaultDiskTierMaxBytes);
  EXPECT_LE((*tier)->cap_bytes(), static_cast<int64_t>(space.available / 2) + (1 << 20));
}

// A writer stuck on a slow disk (here: the temporary file is a FIFO nobody reads yet) must not
// stall the engine: spills beyond the queue are dropped and counted.
TEST_F(DiskTierTest, AFullQueueDropsSpillsAndCountsThem) {
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 1, 3);
  auto tier = Open(int64_t{1} << 20, SmallLayout(), /*queue=*/1);
  ASSERT_NE(tier, nullptr);
  const std::string fifo = tier->PathOf(chain[0].key) + ".tmp";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_TRUE(tier->WantsSpill(chain[0].key));
  tier->Spill(chain[0]);
  // The writer takes chain[0] and blocks opening the FIFO; chain[1] then fills the queue.
  while (tier->Stats().queued_blocks != 0) std::this_thread::yield();
  ASSERT_TRUE(tier->WantsSpill(chain[1].key));
  tier->Spill(chain[1]);
  EXPECT_FALSE(tier->WantsSpill(chain[2].key));  // full: dropped, never waited for
  EXPECT_FALSE(tier->WantsSpill(chain[2].key, absl::Now() + absl::Milliseconds(20)));
  EXPECT_EQ(tier->Stats().spills_dropped, 2u);
  // Unblock the writer: read the FIFO to its end.
  std::thread reader([&] { testing::ReadFile(fifo); });
  ASSERT_TRUE(tier->Flush(absl::Now() + kWait));
  reader.join();
  EXPECT_TRUE(tier->Contains(chain[1].key));
  std::vector<uint8_t> data;
  ASSERT_TRUE(LoadInto(*tier, chain[1], &data).ok());
  EXPECT_EQ(data, chain[1].data);
}

TEST_F(DiskTierTest, AFailedWriteIsCountedAndNothingIsIndexed) {
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 1, 1);
  auto tier = Open();
  ASSERT_NE(tier, nullptr);
  // A directory where the temporary file would go: open() fails as on a broken disk.
  std::filesystem::create_directory(tier->PathOf(chain[0].key) + ".tmp");
  SpillAll(*tier, chain);
  const DiskTierStats s = tier->Stats();
  EXPECT_EQ(s.spills, 0u);
  EXPECT_EQ(s.write_errors, 1u);
  EXPECT_EQ(s.spills_dropped, 1u);
  EXPECT_FALSE(tier->Contains(chain[0].key));
}

TEST_F(DiskTierTest, ABlockLargerThanTheCapIsDropped) {
  auto tier = Open(/*max_bytes=*/100);
  ASSERT_NE(tier, nullptr);
  SpillAll(*tier, MakeChain(SmallLayout(), 1, 1));
  EXPECT_EQ(tier->Stats().spills, 0u);
  EXPECT_EQ(tier->Stats().spills_dropped, 1u);
  EXPECT_EQ(tier->Stats().write_errors, 0u);
}

}  // namespace
}  // namespace prefixd
