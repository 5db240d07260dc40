// KvEventRecorder (engine/kv_event_recorder.h): the pool's hooks become one batch per Flush,
// in order, with each block's identity (adapter, namespace) from the root the engine noted,
// an eviction as removal from the pool only, the disk tier's files (from its inbox) as DISK
// stores and removals after the pool's events, nothing for an empty step, and a bounded map
// of roots.
#include "engine/kv_event_recorder.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/block_key.h"
#include "cache/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class FakeSink : public KvEventSink {
 public:
  void Publish(std::vector<KvEvent> batch) override { batches.push_back(std::move(batch)); }
  std::vector<std::vector<KvEvent>> batches;
};

Digest Key(int i) { return Sha256Of(absl::StrCat("key-", i)); }

class KvEventRecorderTest : public ::testing::Test {
 protected:
  KvEventRecorderTest()
      : sink_(std::make_shared<FakeSink>()),
        recorder_(
            {.sink = sink_, .pool_medium = KvMedium::kGpu, .block_size = 2, .disk_events = disk_}) {
  }

  void Index(const Digest& key, const Digest* parent, const Digest& root) {
    recorder_.OnIndexed(IndexedBlock{.block = 0, .key = &key, .parent_key = parent,
                                     .root = &root, .tokens = tokens_});
  }
  void Evict(const Digest& key, const Digest& parent_or_root, const Digest& root) {
    recorder_.OnEvicted(EvictedBlock{
        .block = 0, .key = &key, .parent_key = &parent_or_root, .root = &root, .tokens = tokens_});
  }
  // A disk file's head: its parent key is the root for a first block.
  BlockRecordHead Head(const Digest& key, const Digest& parent_or_root, const Digest& root) {
    return BlockRecordHead{
        .root = root, .parent_key = parent_or_root, .key = key, .tokens = tokens_};
  }

  std::shared_ptr<FakeSink> sink_;
  std::shared_ptr<TierEventInbox> disk_ = std::make_shared<TierEventInbox>(nullptr);
  KvEventRecorder recorder_;
  std::vector<uint32_t> tokens_ = {7, 9};
};

TEST_F(KvEventRecorderTest, OneBatchPerFlushWithEachBlocksIdentity) {
  const Digest base = Sha256Of("root-base");
  const Digest adapter = Sha256Of("root-adapter");
  recorder_.NoteRoot(base, "", "", "ns-1");
  recorder_.NoteRoot(adapter, "sql", std::string(64, 'a'), "ns-1");
  recorder_.Flush();
  EXPECT_THAT(sink_->batches, IsEmpty());  // nothing changed: nothing published

  const Digest k0 = Key(0), k1 = Key(1), a0 = Key(2);
  Index(k0, nullptr, base);
  Index(k1, &k0, base);
  Index(a0, nullptr, adapter);
  recorder_.Flush();
  ASSERT_EQ(sink_->batches.size(), 1u);
  const std::vector<KvEvent>& b = sink_->batches[0];
  ASSERT_EQ(b.size(), 3u);
  const std::string ns = "ns:" + DigestHex(Sha256Of("ns-1"));
  EXPECT_EQ(std::get<KvBlockStored>(b[0]),
            (KvBlockStored{.block_hash = KvEventBlockHash(k0),
                           .token_ids = {7, 9},
                           .block_size = 2,
                           .medium = KvMedium::kGpu,
                           .extra_keys = {ns}}));
  EXPECT_EQ(std::get<KvBlockStored>(b[1]).parent_block_hash, KvEventBlockHash(k0));
  const KvBlockStored& a = std::get<KvBlockStored>(b[2]);
  EXPECT_EQ(a.lora_name, "sql");
  // 0xaaaaaaaaaaaaaaaa >> 1: 63 bits of the digest.
  EXPECT_EQ(a.lora_id, static_cast<int64_t>(0x5555555555555555ull));
  EXPECT_THAT(a.extra_keys, ElementsAre(ns, "adapter:" + std::string(64, 'a')));
}

// A spill is a removal from the pool when the block leaves it, and a store on DISK only when
// the tier reports the file written (through its inbox, after the pool's events of the step);
// a spill the tier drops never shows on DISK.
TEST_F(KvEventRecorderTest, ASpillIsRemovalFromThePoolThenStorageOnDiskOnceWritten) {
  const Digest root = Sha256Of("root");
  recorder_.NoteRoot(root, "sql", std::string(64, 'b'), "ns");
  const Digest k0 = Key(0), k1 = Key(1);
  Index(k0, nullptr, root);
  Index(k1, &k0, root);
  recorder_.Flush();
  Evict(k1, k0, root);
  disk_->PushStored(Head(k1, k0, root));  // written while the step ran
  Evict(k0, root, root);                  // its spill is dropped: no file, no DISK store
  recorder_.Flush();
  ASSERT_EQ(sink_->batches.size(), 2u);
  const std::vector<KvEvent>& b = sink_->batches[1];
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(std::get<KvBlockRemoved>(b[0]),
            (KvBlockRemoved{.block_hash = KvEventBlockHash(k1), .medium = KvMedium::kGpu}));
  EXPECT_EQ(std::get<KvBlockRemoved>(b[1]),
            (KvBlockRemoved{.block_hash = KvEventBlockHash(k0), .medium = KvMedium::kGpu}));
  // The block keeps its identity on DISK: its root is still known.
  EXPECT_EQ(std::get<KvBlockStored>(b[2]),
            (KvBlockStored{.block_hash = KvEventBlockHash(k1),
                           .parent_block_hash = KvEventBlockHash(k0),
                           .token_ids = {7, 9},
                           .block_size = 2,
                           .medium = KvMedium::kDisk,
                           .lora_name = "sql",
                           .lora_id = static_cast<int64_t>(0x5dddddddddddddddull),
                           .extra_keys = {"ns:" + DigestHex(Sha256Of("ns")),
                                          "adapter:" + std::string(64, 'b')}}));
  // The tier deletes the file later (its cap): a removal from DISK in the next batch.
  disk_->PushDeleted(k1);
  recorder_.Flush();
  ASSERT_EQ(sink_->batches.size(), 3u);
  EXPECT_THAT(sink_->batches[2],
              ElementsAre(KvEvent(
                  KvBlockRemoved{.block_hash = KvEventBlockHash(k1), .medium = KvMedium::kDisk})));
}

// Files found at start-up: roots no request named, so no adapter and no namespace; a first
// block has no parent hash; the events are the inbox's, in its order.
TEST_F(KvEventRecorderTest, FilesFoundAtStartUpAreStoredOnDiskWithoutIdentity) {
  const Digest root = Sha256Of("earlier-root");
  const Digest k0 = Key(0), k1 = Key(1);
  disk_->PushStored(Head(k0, root, root));
  disk_->PushStored(Head(k1, k0, root));
  recorder_.Flush();
  ASSERT_EQ(sink_->batches.size(), 1u);
  EXPECT_THAT(sink_->batches[0],
              ElementsAre(KvEvent(KvBlockStored{.block_hash = KvEventBlockHash(k0),
                                                .token_ids = {7, 9},
                                                .block_size = 2,
                                                .medium = KvMedium::kDisk}),
                          KvEvent(KvBlockStored{.block_hash = KvEventBlockHash(k1),
                                                .parent_block_hash = KvEventBlockHash(k0),
                                                .token_ids = {7, 9},
                                                .block_size = 2,
                                                .medium = KvMedium::kDisk})));
  recorder_.Flush();  // the inbox is empty again: nothing more
  EXPECT_EQ(sink_->batches.size(), 1u);
}

TEST(KvEventMediumTest, TheCudaBackendsPoolIsGpu) {
  // The backends' own strings (engine/backend.h kv_numerics()).
  EXPECT_EQ(PoolMediumOfNumerics("cuda r1 sm_90 cublas 130000"), KvMedium::kGpu);
  EXPECT_EQ(PoolMediumOfNumerics("cpu r1"), KvMedium::kCpu);
  EXPECT_EQ(PoolMediumOfNumerics("fake"), KvMedium::kCpu);
  EXPECT_STREQ(KvMediumName(KvMedium::kGpu), "GPU");
  EXPECT_STREQ(KvMediumName(KvMedium::kCpu), "CPU");
  EXPECT_STREQ(KvMediumName(KvMedium::kDisk), "DISK");
}

TEST_F(KvEventRecorderTest, RootsWithoutBlocksAreSweptPastTheBound) {
  const Digest kept = Sha256Of("kept");
  recorder_.NoteRoot(kept, "", "", "kept-ns");
  const Digest k0 = Key(0);
  Index(k0, nullptr, kept);  // the root now has a pool block
  for (size_t i = 0; i < KvEventRecorder::kMaxIdleRoots + 10; ++i) {
    recorder_.NoteRoot(Sha256Of(absl::StrCat("salt-", i)), "", "", absl::StrCat("ns-", i));
  }
  // The root with a block survived every sweep: its next block is still described.
  const Digest k1 = Key(1);
  Index(k1, &k0, kept);
  recorder_.Flush();
  const std::vector<KvEvent>& b = sink_->batches.back();
  EXPECT_THAT(std::get<KvBlockStored>(b.back()).extra_keys,
              ElementsAre("ns:" + DigestHex(Sha256Of("kept-ns"))));
}

// A request whose root was swept before its blocks were indexed adds blocks the root's count
// never saw; when the root is noted again and those blocks leave, the count must not go below
// zero, or the root would never be swept again (and the map would grow with such roots).
TEST_F(KvEventRecorderTest, ARootIsSweptOnceBlocksIndexedWhileItWasSweptLeave) {
  const Digest root = Sha256Of("orphaned");
  auto fill = [this](int round) {
    for (size_t i = 0; i < KvEventRecorder::kMaxIdleRoots; ++i) {
      recorder_.NoteRoot(Sha256Of(absl::StrCat("salt-", round, "-", i)), "", "",
                         absl::StrCat("ns-", round, "-", i));
    }
  };
  recorder_.NoteRoot(root, "", "", "orphaned-ns");
  fill(0);  // the request's root has no block yet: swept
  const Digest k0 = Key(0);
  Index(k0, nullptr, root);  // its block, without identity
  recorder_.NoteRoot(root, "", "", "orphaned-ns");  // a later request names the root again
  Evict(k0, root, root);                            // the block leaves: the root has none
  fill(1);                                          // so the next sweep takes it
  // A swept root shows as a block without identity (invariant 2).
  const Digest k1 = Key(1);
  Index(k1, nullptr, root);
  recorder_.Flush();
  EXPECT_THAT(std::get<KvBlockStored>(sink_->batches.back().back()).extra_keys, IsEmpty());
}

}  // namespace
}  // namespace prefixd
