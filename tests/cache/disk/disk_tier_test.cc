// DiskTier (cache/disk/disk_tier.h) on a real directory: spill, load, restart, corruption,
// the cap, the lock, foreign layouts, a full queue, failed writes, and the pool's match
// continuing into the tier; and a hostile or failing directory: symlinks and hard links
// planted in it, loose permissions, a full and a read-only filesystem (small tmpfs mounts,
// skipped where the test may not mount).
#include "cache/disk/disk_tier.h"

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/file.h"
#include "cache/block_key.h"
#include "cache/kv_cache.h"
#include "cache/token_chain.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/tier_test_util.h"
#include "tests/testing/files.h"

namespace prefixd {
namespace {

using testing::ExpectationOf;
using testing::MakeChain;
using testing::ScoredLayout;
using testing::ScratchDir;
using testing::SmallLayout;
using testing::WithScores;

constexpr absl::Duration kWait = absl::Seconds(30);

class DiskTierTest : public ::testing::Test {
 protected:
  std::unique_ptr<DiskTier> Open(int64_t max_bytes = int64_t{1} << 20,
                                 const BlockLayout& layout = SmallLayout(), int32_t queue = 64) {
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

// Files with score sections: the index tells them by size (after a restart too), the scored
// match stops at the first file without, a Load returns the section, and a scored spill of a
// block on disk without scores replaces that file, while an unscored one never replaces a
// scored file.
TEST_F(DiskTierTest, ScoredFilesAreMatchedLoadedAndReplaceUnscoredOnes) {
  const BlockLayout layout = ScoredLayout();
  std::vector<BlockRecord> chain = MakeChain(layout, 1, 3);
  const std::vector<BlockRecord> plain = chain;
  chain[0] = WithScores(chain[0], layout);
  chain[2] = WithScores(chain[2], layout);
  const std::vector<Digest> keys = {chain[0].key, chain[1].key, chain[2].key};
  {
    auto tier = Open(int64_t{1} << 20, layout);
    ASSERT_NE(tier, nullptr);
    SpillAll(*tier, chain);
    EXPECT_EQ(tier->MatchFrom(keys), 3u);
    EXPECT_EQ(tier->MatchScoredFrom(keys), 1u);
    EXPECT_EQ(tier->Stats().bytes, 2 * layout.scored_record_bytes() + layout.record_bytes());
    EXPECT_FALSE(tier->WantsSpill(chain[0].key, {.scored = true}));
    EXPECT_FALSE(tier->WantsSpill(chain[1].key));
    EXPECT_FALSE(tier->WantsSpill(chain[2].key));  // scored on disk: no plain rewrite
  }
  auto tier = Open(int64_t{1} << 20, layout);  // a restart: sizes come from the directory
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->MatchScoredFrom(keys), 1u);
  EXPECT_EQ(tier->MatchScoredFrom(absl::MakeConstSpan(keys).subspan(2)), 1u);
  std::vector<uint8_t> data(static_cast<size_t>(layout.data_bytes()));
  std::vector<PositionScore> scores;
  ASSERT_TRUE(tier->Load(ExpectationOf(chain[0]), absl::MakeSpan(data), &scores).ok());
  EXPECT_EQ(scores, chain[0].scores);
  ASSERT_TRUE(tier->Load(ExpectationOf(chain[1]), absl::MakeSpan(data), &scores).ok());
  EXPECT_TRUE(scores.empty());
  EXPECT_EQ(data, chain[1].data);

  // Block 1 gains its scores: the file is replaced, counted once in bytes.
  const BlockRecord upgraded = WithScores(plain[1], layout, 9);
  ASSERT_TRUE(tier->WantsSpill(upgraded.key, {.scored = true}));
  tier->Spill(upgraded);
  ASSERT_TRUE(tier->Flush(absl::Now() + kWait));
  EXPECT_EQ(tier->MatchScoredFrom(keys), 3u);
  EXPECT_EQ(tier->Stats().blocks, 3);
  EXPECT_EQ(tier->Stats().bytes, 3 * layout.scored_record_bytes());
  ASSERT_TRUE(tier->Load(ExpectationOf(upgraded), absl::MakeSpan(data), &scores).ok());
  EXPECT_EQ(scores, upgraded.scores);
  EXPECT_EQ(data, upgraded.data);
}

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
    EXPECT_EQ(s.bytes, 3 * SmallLayout().record_bytes());
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
  const BlockLayout layout = SmallLayout();
  auto tier = Open();
  ASSERT_NE(tier, nullptr);
  KvCacheOptions o;
  o.pool.num_blocks = 4;
  o.pool.block_size = 4;
  o.pool.bytes_per_token = 1;
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
    f.seekp(kBlockRecordHeaderBytes + 40);
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
// As a KvTier (cache/tier.h): a match is answered before StartMatch returns; a fetch is read
// and verified on the loader thread, stops at the first corrupt block (deleted, counted),
// wakes its caller once, and holds the load budget until the last holder lets go.
TEST_F(DiskTierTest, AsAKvTierMatchesAtOnceAndFetchesOnItsLoaderThread) {
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 2, 4);
  DiskTierOptions o;
  o.dir = dir_.path();
  o.max_bytes = int64_t{1} << 20;
  o.max_load_blocks = 4;
  absl::StatusOr<std::unique_ptr<DiskTier>> opened = DiskTier::Open(o, SmallLayout());
  ASSERT_TRUE(opened.ok()) << opened.status();
  DiskTier& tier = **opened;
  SpillAll(tier, chain);
  KvTier& kv = tier;
  EXPECT_EQ(kv.medium(), TierMedium::kDisk);
  EXPECT_EQ(kv.offers(), TierOffers::kEvicted);
  std::vector<Digest> keys;
  KvTier::FetchRequest request{.root = chain[0].root};
  for (const BlockRecord& r : chain) {
    keys.push_back(r.key);
    request.keys.push_back(r.key);
    request.tokens.insert(request.tokens.end(), r.tokens.begin(), r.tokens.end());
  }
  absl::StatusOr<std::shared_ptr<const TierMatch>> m = kv.StartMatch(keys, {}, nullptr);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE((*m)->done());
  EXPECT_EQ((*m)->blocks, 4u);
  m = kv.StartMatch(keys, {.scored_only = true}, nullptr);
  ASSERT_TRUE(m.ok() && (*m)->done());
  EXPECT_EQ((*m)->blocks, 0u);  // no file carries scores
  {                             // block 2 damaged: the fetch keeps blocks 0 and 1
    std::fstream f(tier.PathOf(chain[2].key), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kBlockRecordHeaderBytes + 40);
    f.put('\x5a');
  }
  absl::Notification woken;
  absl::StatusOr<std::shared_ptr<const TierFetch>> f =
      kv.StartFetch(request, [&woken] { woken.Notify(); });
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(tier.fetch_blocks_in_flight(), 4);
  // The budget is in use until the fetch is let go of.
  EXPECT_EQ(kv.StartFetch(request, nullptr).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(woken.WaitForNotificationWithTimeout(kWait));
  const TierFetch& got = **f;
  ASSERT_TRUE(got.done());
  ASSERT_EQ(got.data.size(), 2u);
  ASSERT_EQ(got.seconds.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(std::equal(got.data[i].begin(), got.data[i].end(), chain[i].data.begin(),
                           chain[i].data.end()))
        << i;
    EXPECT_TRUE(got.scores[i].empty());
  }
  EXPECT_EQ(tier.Stats().corrupt_blocks, 1u);
  EXPECT_EQ(tier.Stats().loads, 2u);
  f = absl::StatusOr<std::shared_ptr<const TierFetch>>(nullptr);
  EXPECT_EQ(tier.fetch_blocks_in_flight(), 0);
}

TEST_F(DiskTierTest, TheCapDeletesForeignFilesFirstThenTheLeastRecentlyUsed) {
  const int64_t file = SmallLayout().record_bytes();
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

// The pool evicts leaves before parents, so a chain reaches the disk from its end; a fetch
// reads it from its start. After a fetch the cap must still take the chain's last block
// first: with its first block gone, a match stops there and every block after it stays on
// disk, unreachable.
TEST_F(DiskTierTest, AfterAFetchTheCapDeletesAChainFromItsEnd) {
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 1, 3);
  auto tier = Open(3 * SmallLayout().record_bytes());
  ASSERT_NE(tier, nullptr);
  SpillAll(*tier, {chain[2], chain[1], chain[0]});  // the pool's eviction order
  KvTier::FetchRequest request{.root = chain[0].root};
  std::vector<Digest> keys;
  for (const BlockRecord& r : chain) {
    keys.push_back(r.key);
    request.keys.push_back(r.key);
    request.tokens.insert(request.tokens.end(), r.tokens.begin(), r.tokens.end());
  }
  absl::Notification woken;
  absl::StatusOr<std::shared_ptr<const TierFetch>> f =
      tier->StartFetch(request, [&woken] { woken.Notify(); });
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(woken.WaitForNotificationWithTimeout(kWait));
  ASSERT_EQ((*f)->data.size(), 3u);
  f = absl::StatusOr<std::shared_ptr<const TierFetch>>(nullptr);

  SpillAll(*tier, MakeChain(SmallLayout(), 2, 1));  // one file must go
  EXPECT_EQ(tier->Stats().evicted_files, 1u);
  EXPECT_FALSE(tier->Contains(chain[2].key)) << "the chain's last block goes first";
  EXPECT_EQ(tier->MatchFrom(keys), 2u) << "the rest of the chain is still a hit";
}

// A block the pool evicts while its file is on disk was in use until then: the offer it is
// refused for makes the file recent again. Else a chain's first block, on disk since it was
// a prompt of its own, is the cap's first victim once its children are spilled after it,
// and they are unreachable without it.
TEST_F(DiskTierTest, ABlockThePoolEvictsAgainIsMadeRecentOnDisk) {
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 1, 3);
  auto tier = Open(3 * SmallLayout().record_bytes());
  ASSERT_NE(tier, nullptr);
  SpillAll(*tier, {chain[0]});  // a one-block prompt, evicted
  // A longer prompt read chain[0] back and computed the rest; the pool evicts leaves first.
  SpillAll(*tier, {chain[2], chain[1]});
  EXPECT_FALSE(tier->WantsSpill(chain[0].key));     // on disk already
  SpillAll(*tier, MakeChain(SmallLayout(), 2, 1));  // one file must go
  EXPECT_EQ(tier->Stats().evicted_files, 1u);
  EXPECT_FALSE(tier->Contains(chain[2].key)) << "the chain's last block goes first";
  std::vector<Digest> keys;
  for (const BlockRecord& r : chain) keys.push_back(r.key);
  EXPECT_EQ(tier->MatchFrom(keys), 2u) << "the rest of the chain is still a hit";
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

// A writer stuck on a slow disk (here: a write that waits until the test lets it go) must not
// stall the engine: spills beyond the queue are dropped and counted.
TEST_F(DiskTierTest, AFullQueueDropsSpillsAndCountsThem) {
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 1, 3);
  absl::Notification writing, disk_unstuck;
  DiskTierOptions o;
  o.dir = dir_.path();
  o.max_bytes = int64_t{1} << 20;
  o.max_queued_blocks = 1;
  o.write_file = [&](const std::string& tmp, const std::string& path, std::string_view bytes) {
    if (!writing.HasBeenNotified()) writing.Notify();
    disk_unstuck.WaitForNotification();
    return WriteFileAtomically(tmp, path, bytes, 0644);
  };
  absl::StatusOr<std::unique_ptr<DiskTier>> opened = DiskTier::Open(o, SmallLayout());
  ASSERT_TRUE(opened.ok()) << opened.status();
  DiskTier* tier = opened->get();
  ASSERT_TRUE(tier->WantsSpill(chain[0].key));
  tier->Spill(chain[0]);
  // The writer takes chain[0] and blocks in its write; chain[1] then fills the queue.
  writing.WaitForNotification();
  ASSERT_TRUE(tier->WantsSpill(chain[1].key));
  tier->Spill(chain[1]);
  EXPECT_FALSE(tier->WantsSpill(chain[2].key));  // full: dropped, never waited for
  EXPECT_FALSE(
      tier->WantsSpill(chain[2].key, {.deadline = absl::Now() + absl::Milliseconds(20)}));
  EXPECT_EQ(tier->Stats().spills_dropped, 2u);
  disk_unstuck.Notify();
  ASSERT_TRUE(tier->Flush(absl::Now() + kWait));
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


// ---- a hostile or failing directory ----

// A file outside the tier's directory that nothing may change.
class Precious {
 public:
  explicit Precious(const std::string& path) : path_(path) {
    std::ofstream(path_) << kText;
  }
  const std::string& path() const { return path_; }
  bool Intact() const { return testing::ReadFile(path_) == kText; }

 private:
  static constexpr char kText[] = "precious: not the disk tier's";
  std::string path_;
};

bool IsSymlink(const std::string& path) {
  return std::filesystem::is_symlink(std::filesystem::symlink_status(path));
}

TEST_F(DiskTierTest, SymlinksAndHardLinksInTheDirectoryAreNeverWrittenThroughOrFollowed) {
  ScratchDir outside("outside");
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 1, 5);
  std::string path1;
  {
    auto probe = Open();
    ASSERT_NE(probe, nullptr);
    path1 = probe->PathOf(chain[1].key);
  }
  // Planted before start: at the write probe's name, at a leftover's name, and a link with a
  // block's name to a valid copy of that block outside.
  Precious probe_victim(outside.path() + "/probe");
  Precious leftover_victim(outside.path() + "/leftover");
  const std::string block_copy = outside.path() + "/block.kvb";
  std::ofstream(block_copy, std::ios::binary) << EncodeBlockRecord(SmallLayout(), chain[1]);
  std::filesystem::create_symlink(probe_victim.path(), dir_.path() + "/probe.w.tmp");
  std::filesystem::create_symlink(leftover_victim.path(), dir_.path() + "/stale.tmp");
  std::filesystem::create_symlink(block_copy, path1);

  auto tier = Open(/*max_bytes=*/2 * SmallLayout().record_bytes());
  ASSERT_NE(tier, nullptr);
  EXPECT_TRUE(probe_victim.Intact());
  EXPECT_TRUE(leftover_victim.Intact());
  EXPECT_FALSE(IsSymlink(dir_.path() + "/stale.tmp")) << "a leftover link is removed";
  EXPECT_FALSE(tier->Contains(chain[1].key)) << "a link is never indexed";

  // Planted while running, at the temporary names of the next writes: a symlink and a hard
  // link (same filesystem) to files outside.
  Precious symlink_victim(outside.path() + "/symlinked");
  Precious hardlink_victim(outside.path() + "/hardlinked");
  // The write removes the planted name and creates its own file: the blocks are written.
  std::filesystem::create_symlink(symlink_victim.path(), tier->PathOf(chain[0].key) + ".tmp");
  std::filesystem::create_hard_link(hardlink_victim.path(), tier->PathOf(chain[2].key) + ".tmp");
  SpillAll(*tier, {chain[0], chain[2]});
  EXPECT_TRUE(symlink_victim.Intact());
  EXPECT_TRUE(hardlink_victim.Intact());
  DiskTierStats s = tier->Stats();
  EXPECT_EQ(s.write_errors, 0u);
  EXPECT_EQ(s.spills, 2u);
  for (const BlockRecord* r : {&chain[0], &chain[2]}) {
    EXPECT_FALSE(IsSymlink(tier->PathOf(r->key)));
    std::vector<uint8_t> data;
    ASSERT_TRUE(LoadInto(*tier, *r, &data).ok());
    EXPECT_EQ(data, r->data);
  }
  // A link planted at a block's own name is replaced by the rename, its target untouched.
  Precious renamed_over(outside.path() + "/renamed-over");
  std::filesystem::create_symlink(renamed_over.path(), tier->PathOf(chain[3].key));

  // More than the cap holds (2 files): eviction deletes indexed files only.
  SpillAll(*tier, {chain[3], chain[4]});
  EXPECT_TRUE(renamed_over.Intact());
  EXPECT_TRUE(tier->Contains(chain[4].key));
  EXPECT_FALSE(tier->Contains(chain[0].key)) << "evicted";
  EXPECT_GE(tier->Stats().evicted_files, 2u);
  EXPECT_TRUE(IsSymlink(path1)) << "not the tier's file: never deleted";
  EXPECT_EQ(testing::ReadFile(block_copy), EncodeBlockRecord(SmallLayout(), chain[1]));

  // A block file swapped for a link to a file outside fails verification; deleting it
  // removes the link, never its target.
  const std::string path4 = tier->PathOf(chain[4].key);
  Precious swapped_in(outside.path() + "/swapped-in");
  std::filesystem::remove(path4);
  std::filesystem::create_symlink(swapped_in.path(), path4);
  std::vector<uint8_t> data;
  EXPECT_EQ(LoadInto(*tier, chain[4], &data).code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(path4)));
  EXPECT_TRUE(swapped_in.Intact());
  EXPECT_EQ(tier->Stats().corrupt_blocks, 1u);
}

TEST_F(DiskTierTest, ALockFileThatIsALinkIsRefused) {
  ScratchDir outside("outside");
  Precious victim(outside.path() + "/victim");
  std::filesystem::create_symlink(victim.path(), dir_.path() + "/LOCK");
  DiskTierOptions o;
  o.dir = dir_.path();
  o.max_bytes = 1 << 20;
  auto tier = DiskTier::Open(o, SmallLayout());
  ASSERT_EQ(tier.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tier.status().message()), ::testing::HasSubstr("LOCK"));
  EXPECT_TRUE(victim.Intact());
  std::filesystem::remove(dir_.path() + "/LOCK");
  std::filesystem::create_hard_link(victim.path(), dir_.path() + "/LOCK");
  tier = DiskTier::Open(o, SmallLayout());
  ASSERT_EQ(tier.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tier.status().message()),
              ::testing::HasSubstr("not a regular file of its own"));
  EXPECT_TRUE(victim.Intact()) << "the pid is never written into a linked file";
}

TEST_F(DiskTierTest, ADirectoryOthersMayWriteOrThatAnotherUserOwnsIsRefused) {
  DiskTierOptions o;
  o.dir = dir_.path();
  o.max_bytes = 1 << 20;
  const std::string lock = dir_.path() + "/LOCK";
  for (mode_t mode : {01777, 0777, 0757, 0770, 0720}) {
    SCOPED_TRACE(mode);
    ASSERT_EQ(::chmod(o.dir.c_str(), mode), 0);
    auto tier = DiskTier::Open(o, SmallLayout());
    ASSERT_EQ(tier.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(tier.status().message()),
                ::testing::AllOf(::testing::HasSubstr(o.dir),
                                 ::testing::HasSubstr((mode & S_IWOTH) ? "writable by everyone"
                                                                       : "writable by its group"),
                                 ::testing::HasSubstr("chmod go-w")));
    EXPECT_FALSE(std::filesystem::exists(lock)) << "refused before anything is written";
  }
  for (mode_t mode : {0700, 0755, 0750}) {
    ASSERT_EQ(::chmod(o.dir.c_str(), mode), 0);
    EXPECT_TRUE(DiskTier::Open(o, SmallLayout()).ok()) << mode;
  }
  std::filesystem::remove(lock);
  if (::geteuid() != 0) {
    GTEST_SKIP() << "the foreign-owner case needs root (to chown the directory)";
  }
  ASSERT_EQ(::chown(o.dir.c_str(), 4242, 4242), 0);
  auto tier = DiskTier::Open(o, SmallLayout());
  ASSERT_EQ(tier.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tier.status().message()),
              ::testing::AllOf(::testing::HasSubstr("owned by uid 4242"),
                               ::testing::HasSubstr("chown")));
  EXPECT_FALSE(std::filesystem::exists(lock));
  ASSERT_EQ(::chown(o.dir.c_str(), 0, 0), 0);
  EXPECT_TRUE(DiskTier::Open(o, SmallLayout()).ok()) << "root-owned is accepted";
}

// A tmpfs of `size` mounted on a fresh directory, unmounted by the destructor. ok() is false
// where this process may not mount (not root, or a container without CAP_SYS_ADMIN).
class SmallFilesystem {
 public:
  explicit SmallFilesystem(const char* size) : dir_("tmpfs") {
    const std::string options = absl::StrCat("size=", size, ",mode=0700");
    mounted_ = ::mount("tmpfs", dir_.path().c_str(), "tmpfs", 0, options.c_str()) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~SmallFilesystem() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool ok() const { return mounted_; }
  const std::string& error() const { return error_; }
  std::string path() const { return dir_.path(); }
  bool RemountReadOnly() {
    return ::mount("tmpfs", dir_.path().c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr) == 0;
  }

 private:
  ScratchDir dir_;
  bool mounted_ = false;
  std::string error_;
};

std::vector<std::string> TempFilesIn(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".tmp") out.push_back(e.path().string());
  }
  return out;
}

TEST_F(DiskTierTest, AFullFilesystemFailsWritesCleanlyAndKeepsWhatWasWritten) {
  SmallFilesystem fs("64k");
  if (!fs.ok()) GTEST_SKIP() << "cannot mount a tmpfs here: " << fs.error();
  DiskTierOptions o;
  o.dir = fs.path();
  o.max_bytes = int64_t{1} << 30;  // past the filesystem: the disk fills before the cap
  o.clock = [this] { return ++now_; };
  auto tier = DiskTier::Open(o, SmallLayout());
  ASSERT_TRUE(tier.ok()) << tier.status();
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 3, 40);
  SpillAll(**tier, chain);
  const DiskTierStats s = (*tier)->Stats();
  EXPECT_GT(s.write_errors, 0u) << "64 KiB of 4 KiB pages cannot hold 40 files";
  EXPECT_GT(s.spills, 0u);
  EXPECT_EQ(s.spills + s.write_errors, chain.size());
  EXPECT_EQ(s.spills_dropped, s.write_errors);
  EXPECT_THAT(TempFilesIn(fs.path()), ::testing::IsEmpty()) << "a failed write leaves nothing";
  size_t held = 0;
  for (const BlockRecord& r : chain) {
    if (!(*tier)->Contains(r.key)) continue;
    ++held;
    std::vector<uint8_t> data;
    ASSERT_TRUE(LoadInto(**tier, r, &data).ok());
    EXPECT_EQ(data, r.data);
  }
  EXPECT_EQ(held, s.spills);
  EXPECT_EQ((*tier)->Stats().corrupt_blocks, 0u);

  // Full at start-up: refused with the reason, not half-opened.
  tier->reset();
  std::ofstream(fs.path() + "/filler") << std::string(1 << 20, 'x');
  auto full = DiskTier::Open(o, SmallLayout());
  ASSERT_EQ(full.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(full.status().message()),
              ::testing::HasSubstr(std::strerror(ENOSPC)));
}

TEST_F(DiskTierTest, AReadOnlyFilesystemIsRefusedAtStartNamingIt) {
  SmallFilesystem fs("1m");
  if (!fs.ok()) GTEST_SKIP() << "cannot mount a tmpfs here: " << fs.error();
  DiskTierOptions o;
  o.dir = fs.path();
  o.max_bytes = 1 << 20;
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 4, 2);
  {
    auto tier = DiskTier::Open(o, SmallLayout());
    ASSERT_TRUE(tier.ok()) << tier.status();
    SpillAll(**tier, chain);
  }
  ASSERT_TRUE(fs.RemountReadOnly()) << std::strerror(errno);
  auto tier = DiskTier::Open(o, SmallLayout());
  ASSERT_EQ(tier.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tier.status().message()),
              ::testing::AllOf(::testing::HasSubstr("not writable"),
                               ::testing::HasSubstr(std::strerror(EROFS))));
}

}  // namespace
}  // namespace prefixd
