// The disk tier's block events (DiskTierOptions on_store / on_delete, cache/disk/disk_tier.h
// invariant 5): files found at Open are stored parents first, written files when written
// (never a dropped or failed spill), and every own file that leaves the index is deleted once:
// the cap, a failed verification, a file found gone, a failed replacement. Replaying the
// events gives the index's own entries after each step; other layouts' files report nothing.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cache/block_key.h"
#include "cache/disk/disk_tier.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/tier_test_util.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using testing::ExpectationOf;
using ::testing::IsEmpty;
using testing::MakeChain;
using testing::ScoredLayout;
using testing::ScratchDir;
using testing::SmallLayout;
using ::testing::UnorderedElementsAreArray;
using testing::WithScores;

constexpr absl::Duration kWait = absl::Seconds(30);

// "+<hex>" for a store, "-<hex>" for a delete, first 8 hex digits of the key.
std::string Short(const Digest& key) { return DigestHex(key).substr(0, 8); }
std::string Stored(const BlockRecord& r) { return absl::StrCat("+", Short(r.key)); }
std::string Deleted(const BlockRecord& r) { return absl::StrCat("-", Short(r.key)); }

class DiskTierEventsTest : public ::testing::Test {
 protected:
  struct Opts {
    int64_t max_bytes = int64_t{1} << 20;
    BlockLayout layout = SmallLayout();
    bool events = true;
    // The writer's file write; unset: the real one.
    std::function<int(const std::string&, const std::string&, std::string_view)> write_file =
        nullptr;
  };
  std::unique_ptr<DiskTier> Open(const Opts& opts) {
    DiskTierOptions o;
    o.dir = dir_.path();
    o.max_bytes = opts.max_bytes;
    o.clock = [this] { return ++now_; };
    o.write_file = opts.write_file;
    if (opts.events) {
      o.on_store = [this](const BlockRecordHead& head) {
        absl::MutexLock lock(&mu_);
        log_.push_back(absl::StrCat("+", Short(head.key)));
        heads_.push_back(head);
        resident_.insert(DigestHex(head.key));
      };
      o.on_delete = [this](const Digest& key) {
        absl::MutexLock lock(&mu_);
        log_.push_back(absl::StrCat("-", Short(key)));
        resident_.erase(DigestHex(key));
      };
    }
    auto t = DiskTier::Open(o, opts.layout);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
  std::unique_ptr<DiskTier> Open() { return Open(Opts{}); }

  static void SpillAll(DiskTier& tier, const std::vector<BlockRecord>& records) {
    for (const BlockRecord& r : records) {
      ASSERT_TRUE(tier.WantsSpill(r.key, {.scored = !r.scores.empty()}));
      tier.Spill(r);
    }
    ASSERT_TRUE(tier.Flush(absl::Now() + kWait));
  }

  // The events since the last call.
  std::vector<std::string> TakeLog() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out = std::move(log_);
    log_.clear();
    return out;
  }
  // The replayed events equal the own block files in the directory (invariant 5).
  void ExpectReplayIsTheDirectory(const DiskTier& tier) {
    std::vector<std::string> files;
    const std::string prefix = tier.layout().Id() + "-";
    for (const auto& e : std::filesystem::directory_iterator(dir_.path())) {
      const std::string name = e.path().filename().string();
      if (name.starts_with(prefix) && name.ends_with(".kvb")) {
        files.push_back(name.substr(prefix.size(), 64));
      }
    }
    const int64_t blocks = tier.Stats().blocks;  // not under mu_: the tier calls us under its lock
    absl::MutexLock lock(&mu_);
    EXPECT_THAT(resident_, UnorderedElementsAreArray(files));
    EXPECT_EQ(static_cast<int64_t>(resident_.size()), blocks);
  }

  ScratchDir dir_{"tier_events"};
  int64_t now_ = 0;
  absl::Mutex mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  std::vector<BlockRecordHead> heads_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> resident_ ABSL_GUARDED_BY(mu_);
};

TEST_F(DiskTierEventsTest, FilesFoundAtOpenAreStoredParentsFirstWithTheirHeads) {
  const std::vector<BlockRecord> a = MakeChain(SmallLayout(), 1, 3);
  const std::vector<BlockRecord> b = MakeChain(SmallLayout(), 2, 2);
  {
    auto writer = Open({.events = false});
    ASSERT_NE(writer, nullptr);
    // Children first, so that neither the write order nor the LRU order is the chain order.
    SpillAll(*writer, {a[2], b[1], a[1], b[0], a[0]});
  }
  auto tier = Open();
  ASSERT_NE(tier, nullptr);
  std::vector<std::string> log = TakeLog();
  ASSERT_EQ(log.size(), 5u);
  EXPECT_THAT(log, UnorderedElementsAreArray(
                       {Stored(a[0]), Stored(a[1]), Stored(a[2]), Stored(b[0]), Stored(b[1])}));
  auto at = [&](const BlockRecord& r) { return std::find(log.begin(), log.end(), Stored(r)); };
  EXPECT_LT(at(a[0]), at(a[1]));
  EXPECT_LT(at(a[1]), at(a[2]));
  EXPECT_LT(at(b[0]), at(b[1]));
  {
    absl::MutexLock lock(&mu_);
    for (const BlockRecordHead& h : heads_) {
      for (const BlockRecord& r : {a[0], a[1], a[2], b[0], b[1]}) {
        if (r.key != h.key) continue;
        EXPECT_EQ(h, (BlockRecordHead{.root = r.root,
                                      .parent_key = r.parent_key,
                                      .key = r.key,
                                      .tokens = r.tokens,
                                      .scored = false}));
      }
    }
  }
  EXPECT_EQ(tier->Stats().corrupt_blocks, 0u);
  ExpectReplayIsTheDirectory(*tier);
}

// A file whose head fails (garbage, another block's bytes under this name, a size its header
// does not give) is deleted at Open and counted, and reported nowhere; so are the files
// Open's cap deletes: none was ever reported stored.
TEST_F(DiskTierEventsTest, FilesOpenDropsAreNeverReported) {
  const BlockLayout layout = SmallLayout();
  const std::vector<BlockRecord> chain = MakeChain(layout, 1, 6);
  std::vector<std::string> path;
  {
    auto writer = Open({.events = false});
    ASSERT_NE(writer, nullptr);
    SpillAll(*writer, chain);
    for (const BlockRecord& r : chain) path.push_back(writer->PathOf(r.key));
  }
  std::ofstream(path[3], std::ios::trunc) << "not a block";
  std::filesystem::copy_file(path[5], path[4], std::filesystem::copy_options::overwrite_existing);
  std::ofstream(path[5], std::ios::app) << "x";  // one byte more than its header says
  // Blocks 0 and 1 are the oldest: the cap's victims.
  const auto now = std::filesystem::file_time_type::clock::now();
  std::filesystem::last_write_time(path[0], now - std::chrono::seconds(20));
  std::filesystem::last_write_time(path[1], now - std::chrono::seconds(10));
  // 5 files of record_bytes, one of 11 bytes and one of record_bytes + 1: room for 4 takes 2.
  auto tier = Open({.max_bytes = 4 * layout.record_bytes()});
  ASSERT_NE(tier, nullptr);
  const DiskTierStats s = tier->Stats();
  EXPECT_EQ(s.evicted_files, 2u);
  EXPECT_EQ(s.corrupt_blocks, 3u);
  EXPECT_EQ(s.blocks, 1);
  EXPECT_THAT(TakeLog(), ElementsAre(Stored(chain[2])));
  for (int i : {0, 1, 3, 4, 5}) EXPECT_FALSE(std::filesystem::exists(path[i])) << i;
  ExpectReplayIsTheDirectory(*tier);
}

TEST_F(DiskTierEventsTest, AFileIsStoredWhenWrittenNeverWhenOnlyQueuedOrWhenItsWriteFails) {
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 1, 2);
  absl::Notification release;
  auto tier = Open({.write_file = [&](const std::string& tmp, const std::string& path,
                                      std::string_view bytes) -> int {
    release.WaitForNotification();
    if (path.find(DigestHex(chain[1].key)) != std::string::npos) return EIO;
    std::ofstream(tmp, std::ios::binary) << bytes;
    std::filesystem::rename(tmp, path);
    return 0;
  }});
  ASSERT_NE(tier, nullptr);
  for (const BlockRecord& r : chain) {
    ASSERT_TRUE(tier->WantsSpill(r.key));
    tier->Spill(r);
  }
  // Queued, the first one perhaps being written: nothing is on disk, nothing is reported;
  // both count as queued either way.
  EXPECT_THAT(TakeLog(), IsEmpty());
  EXPECT_EQ(tier->Stats().queued_blocks, 2);
  release.Notify();
  ASSERT_TRUE(tier->Flush(absl::Now() + kWait));
  EXPECT_EQ(tier->Stats().queued_blocks, 0);
  EXPECT_THAT(TakeLog(), ElementsAre(Stored(chain[0])));  // chain[1]'s write failed
  EXPECT_EQ(tier->Stats().write_errors, 1u);
  ExpectReplayIsTheDirectory(*tier);
}

// The cap deletes exactly the least recently used own files, each reported once, after its
// store and in the order they went; another layout's file goes first and reports nothing.
TEST_F(DiskTierEventsTest, TheCapsDeletionsAreReportedExactly) {
  const BlockLayout layout = SmallLayout();
  const int64_t file = layout.record_bytes();
  {
    auto other = Open({.layout = SmallLayout("manifest-2"), .events = false});
    ASSERT_NE(other, nullptr);
    SpillAll(*other, MakeChain(SmallLayout("manifest-2"), 5, 1));
  }
  const std::vector<BlockRecord> chain = MakeChain(layout, 1, 5);
  auto tier = Open({.max_bytes = 3 * file});
  ASSERT_NE(tier, nullptr);
  SpillAll(*tier, {chain[0], chain[1]});
  EXPECT_THAT(TakeLog(), ElementsAre(Stored(chain[0]), Stored(chain[1])));
  SpillAll(*tier, {chain[2]});  // the foreign file makes room: nothing to report
  EXPECT_THAT(TakeLog(), ElementsAre(Stored(chain[2])));
  EXPECT_EQ(tier->Stats().foreign_files, 0);
  std::vector<uint8_t> data(static_cast<size_t>(layout.data_bytes()));
  ASSERT_TRUE(tier->Load(ExpectationOf(chain[0]), absl::MakeSpan(data)).ok());  // most recent
  SpillAll(*tier, {chain[3], chain[4]});
  EXPECT_THAT(TakeLog(), ElementsAre(Deleted(chain[1]), Stored(chain[3]), Deleted(chain[2]),
                                     Stored(chain[4])));
  EXPECT_EQ(tier->Stats().evicted_files, 3u);
  ExpectReplayIsTheDirectory(*tier);
}

TEST_F(DiskTierEventsTest, ACorruptOrVanishedFileIsDeletedOnceAtItsLoad) {
  const std::vector<BlockRecord> chain = MakeChain(SmallLayout(), 1, 2);
  auto tier = Open();
  ASSERT_NE(tier, nullptr);
  SpillAll(*tier, chain);
  TakeLog();
  std::filesystem::resize_file(tier->PathOf(chain[0].key), 100);
  std::filesystem::remove(tier->PathOf(chain[1].key));  // behind the tier's back
  std::vector<uint8_t> data(static_cast<size_t>(SmallLayout().data_bytes()));
  for (int pass = 0; pass < 2; ++pass) {  // the second pass finds nothing: no second event
    EXPECT_FALSE(tier->Load(ExpectationOf(chain[0]), absl::MakeSpan(data)).ok());
    EXPECT_FALSE(tier->Load(ExpectationOf(chain[1]), absl::MakeSpan(data)).ok());
  }
  EXPECT_THAT(TakeLog(), ElementsAre(Deleted(chain[0]), Deleted(chain[1])));
  EXPECT_EQ(tier->Stats().corrupt_blocks, 1u);
  ExpectReplayIsTheDirectory(*tier);
}

// A file with a score section replacing one without keeps the block indexed: no event; a
// replacement whose write fails leaves neither file: the block is deleted.
TEST_F(DiskTierEventsTest, AReplacementIsNoNewStoreAndAFailedOneIsADeletion) {
  const BlockLayout layout = ScoredLayout();
  const std::vector<BlockRecord> chain = MakeChain(layout, 1, 2);
  std::atomic<bool> fail = false;
  auto tier = Open({.layout = layout,
                    .write_file = [&](const std::string& tmp, const std::string& path,
                                      std::string_view bytes) -> int {
                      if (fail) return ENOSPC;
                      std::ofstream(tmp, std::ios::binary) << bytes;
                      std::filesystem::rename(tmp, path);
                      return 0;
                    }});
  ASSERT_NE(tier, nullptr);
  SpillAll(*tier, chain);
  EXPECT_THAT(TakeLog(), ElementsAre(Stored(chain[0]), Stored(chain[1])));
  SpillAll(*tier, {WithScores(chain[0], layout)});
  EXPECT_THAT(TakeLog(), IsEmpty());
  EXPECT_EQ(tier->MatchScoredFrom({chain[0].key}), 1u);
  fail = true;
  SpillAll(*tier, {WithScores(chain[1], layout)});
  EXPECT_THAT(TakeLog(), ElementsAre(Deleted(chain[1])));
  EXPECT_FALSE(tier->Contains(chain[1].key));
  ExpectReplayIsTheDirectory(*tier);
}

}  // namespace
}  // namespace prefixd
