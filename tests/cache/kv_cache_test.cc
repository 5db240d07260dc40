// Tiny-pool scenario tests: exact block ids, reference counts, free-list and
// eviction order after each step. Block size 4 throughout, so block i of a prompt holds
// tokens [4i, 4i + 4).
#include "cache/kv_cache.h"
#include "cache/token_chain.h"
#include "tests/cache/fork_chains.h"

#include <numeric>
#include <vector>

#include "cache/block_copy.h"
#include "cache/block_key.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/kv_cache_test_peer.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<uint32_t> Iota(uint32_t n, uint32_t start = 0) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::vector<uint32_t> Concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const Digest kRoot = CacheRootKey("manifest-1", CacheNamespace("tenant", ""));

class KvCacheTest : public ::testing::Test {
 protected:
  void Make(int32_t num_blocks, bool prefix_cache = true) {
    KvCacheOptions o;
    o.pool.num_blocks = num_blocks;
    o.pool.block_size = 4;
    o.pool.bytes_per_token = 100;
    o.enable_prefix_cache = prefix_cache;
    o.clock = [this] { return now_; };
    auto c = KvCache::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cache_ = std::move(*c);
  }

  // Admits `prompt` reserving all of it; CHECKs invariants.
  Admission Admit(const std::vector<uint32_t>& prompt, const Digest& root = kRoot) {
    AdmissionRequest r;
    r.chain = std::make_shared<TokenChain>(root, cache_->block_size(), prompt);
    r.reserve_tokens = static_cast<int32_t>(prompt.size());
    auto a = cache_->Admit(r);
    EXPECT_TRUE(a.ok()) << a.status();
    cache_->CheckInvariants();
    return a.ok() ? *a : Admission{};
  }

  // Admits and computes the whole prompt.
  SequenceId Prefill(const std::vector<uint32_t>& prompt, const Digest& root = kRoot) {
    Admission a = Admit(prompt, root);
    cache_->MarkComputed(a.seq, static_cast<int32_t>(prompt.size()));
    cache_->CheckInvariants();
    return a.seq;
  }

  // One decode step: append the token, reserve its row, compute it.
  std::vector<BlockCopy> Decode(SequenceId seq, uint32_t token) {
    cache_->AppendTokens(seq, {token});
    auto copies = cache_->Reserve(seq, cache_->NumTokens(seq));
    EXPECT_TRUE(copies.ok()) << copies.status();
    cache_->MarkComputed(seq, cache_->NumTokens(seq));
    cache_->CheckInvariants();
    return copies.ok() ? *copies : std::vector<BlockCopy>{};
  }

  std::vector<int32_t> Table(SequenceId seq) {
    auto t = cache_->BlockTable(seq);
    return {t.begin(), t.end()};
  }

  int64_t now_ = 0;
  std::unique_ptr<KvCache> cache_;
};

TEST_F(KvCacheTest, CreateRejectsBadOptions) {
  KvCacheOptions o;
  // The pool is the backend's; the operator's block size was checked where it was read
  // (ValidateKvPoolOptions), so the cache asks only for a pool it can index.
  o.pool.num_blocks = 4;
  o.pool.block_size = 0;
  EXPECT_EQ(KvCache::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.pool.block_size = 16;
  o.pool.num_blocks = 0;
  EXPECT_EQ(KvCache::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.pool.num_blocks = int64_t{1} << 31;
  EXPECT_EQ(KvCache::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(KvCacheTest, SharedPrefixIsSharedByReference) {
  Make(8);
  SequenceId a = Prefill(Iota(10));
  EXPECT_THAT(Table(a), ElementsAre(0, 1, 2));
  EXPECT_TRUE(KvCacheTestPeer::IsIndexed(*cache_, 0));
  EXPECT_TRUE(KvCacheTestPeer::IsIndexed(*cache_, 1));
  EXPECT_FALSE(KvCacheTestPeer::IsIndexed(*cache_, 2));  // partly filled: never indexed

  Admission b = Admit(Concat(Iota(8), {100, 101}));
  EXPECT_EQ(b.num_cached, 8);
  EXPECT_THAT(b.copies, IsEmpty());
  EXPECT_THAT(Table(b.seq), ElementsAre(0, 1, 3));
  EXPECT_EQ(KvCacheTestPeer::RefCount(*cache_, 0), 2);
  EXPECT_EQ(KvCacheTestPeer::RefCount(*cache_, 1), 2);
  EXPECT_EQ(KvCacheTestPeer::RefCount(*cache_, 2), 1);
  EXPECT_EQ(KvCacheTestPeer::RefCount(*cache_, 3), 1);
  EXPECT_EQ(cache_->NumComputed(b.seq), 8);
  EXPECT_THAT(KvCacheTestPeer::FreeList(*cache_), ElementsAre(4, 5, 6, 7));

  cache_->Release(a);
  cache_->CheckInvariants();
  EXPECT_EQ(KvCacheTestPeer::StateOf(*cache_, 2), BlockState::kFree);
  EXPECT_THAT(KvCacheTestPeer::FreeList(*cache_), ElementsAre(4, 5, 6, 7, 2));
  cache_->Release(b.seq);
  cache_->CheckInvariants();
  EXPECT_EQ(KvCacheTestPeer::StateOf(*cache_, 0), BlockState::kCached);
  EXPECT_EQ(KvCacheTestPeer::StateOf(*cache_, 1), BlockState::kCached);
  EXPECT_THAT(KvCacheTestPeer::FreeList(*cache_), ElementsAre(4, 5, 6, 7, 2, 3));
  EXPECT_THAT(KvCacheTestPeer::EvictionOrder(*cache_), ElementsAre(1, 0));  // leaf before parent

  KvCacheStats s = cache_->Stats();
  EXPECT_EQ(s.queried_tokens, 20u);
  EXPECT_EQ(s.hit_tokens, 8u);
  EXPECT_EQ(s.blocks_total, 8);
  EXPECT_EQ(s.blocks_free, 6);
  EXPECT_EQ(s.blocks_cached, 2);
  EXPECT_EQ(s.blocks_active, 0);
  EXPECT_EQ(s.pool_bytes, 8 * 4 * 100);
}

TEST_F(KvCacheTest, PartialMatchCopiesMatchingRows) {
  Make(8);
  cache_->Release(Prefill(Iota(8)));  // blocks 0 [0..3], 1 [4..7] cached
  EXPECT_THAT(KvCacheTestPeer::FreeList(*cache_), ElementsAre(2, 3, 4, 5, 6, 7));

  // Block 1 matches only its first two tokens: share block 0, copy two rows of block 1.
  Admission b = Admit({0, 1, 2, 3, 4, 5, 50, 51, 52});
  EXPECT_EQ(b.num_cached, 6);
  EXPECT_THAT(Table(b.seq), ElementsAre(0, 2, 3));
  EXPECT_THAT(b.copies, ElementsAre(BlockCopy{1, 2, 2}));
  EXPECT_EQ(KvCacheTestPeer::RefCount(*cache_, 0), 1);
  EXPECT_EQ(KvCacheTestPeer::StateOf(*cache_, 1), BlockState::kCached);  // the source stays cached
  EXPECT_EQ(cache_->NumComputed(b.seq), 6);
  EXPECT_EQ(cache_->Stats().cow_copies, 1u);
  EXPECT_EQ(cache_->Stats().cow_rows, 2u);

  // Completing the copied block with other tokens indexes it as block 1's sibling.
  cache_->MarkComputed(b.seq, 9);
  cache_->CheckInvariants();
  EXPECT_TRUE(KvCacheTestPeer::IsIndexed(*cache_, 2));
  EXPECT_FALSE(KvCacheTestPeer::IsIndexed(*cache_, 3));
}

// A request that needs the whole pool, whose best match ends inside a cached block: the
// copy source would need a block of its own, so the rows are computed instead (waiting
// would never end: nothing else runs to free a block).
TEST_F(KvCacheTest, PartialCopyIsDroppedWhenOnlyItsSourceKeepsTheRequestOut) {
  Make(3);
  cache_->Release(Prefill(Iota(9)));  // blocks 0 [0..3] and 1 [4..7] indexed and cached
  // 0..3 shared, 4..6 would be copied from block 1; 12 tokens = the whole pool.
  const std::vector<uint32_t> prompt = {0, 1, 2, 3, 4, 5, 6, 60, 61, 62, 63, 64};
  AdmissionRequest r;
  r.chain = std::make_shared<TokenChain>(kRoot, cache_->block_size(), prompt);
  r.reserve_tokens = 12;
  absl::StatusOr<AdmissionPlan> plan = cache_->PlanAdmission(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_cached, 4) << "block 0 shared, block 1's rows recomputed";
  Admission b = Admit(prompt);
  EXPECT_EQ(b.num_cached, 4);
  EXPECT_THAT(b.copies, IsEmpty());
  ASSERT_EQ(Table(b.seq).size(), 3u);
  EXPECT_EQ(Table(b.seq)[0], 0);
  EXPECT_EQ(cache_->NumComputed(b.seq), 4);

  // With a block to spare the copy is kept.
  Make(4);
  cache_->Release(Prefill(Iota(9)));
  Admission c = Admit(prompt);
  EXPECT_EQ(c.num_cached, 7);
  ASSERT_EQ(c.copies.size(), 1u);
  EXPECT_EQ(c.copies[0].src, 1);
  EXPECT_EQ(c.copies[0].num_rows, 3);
}

TEST(IndependentCopyBatchEndsTest, ABatchNeverHoldsACopyThatDependsOnAnEarlierOne) {
  using B = BlockCopy;
  EXPECT_THAT(IndependentCopyBatchEnds({}, 8), IsEmpty());
  // Reading the same source twice is independent.
  EXPECT_THAT(IndependentCopyBatchEnds({B{1, 2, 4}, B{1, 3, 4}}, 8), ElementsAre(2));
  // Writing what an earlier copy reads, reading what it writes, or writing it twice: split.
  EXPECT_THAT(IndependentCopyBatchEnds({B{1, 2, 4}, B{3, 1, 4}}, 8), ElementsAre(1, 2));
  EXPECT_THAT(IndependentCopyBatchEnds({B{1, 2, 4}, B{2, 3, 4}}, 8), ElementsAre(1, 2));
  EXPECT_THAT(IndependentCopyBatchEnds({B{1, 2, 4}, B{3, 2, 4}}, 8), ElementsAre(1, 2));
  // A conflict starts a new batch that only holds what comes after it.
  EXPECT_THAT(IndependentCopyBatchEnds({B{1, 2, 4}, B{5, 6, 4}, B{2, 7, 4}, B{1, 8, 4}}, 8),
              ElementsAre(2, 4));
  // And batches hold at most max_batch copies.
  EXPECT_THAT(IndependentCopyBatchEnds(
                  {B{1, 2, 4}, B{3, 4, 4}, B{5, 6, 4}, B{7, 8, 4}, B{9, 10, 4}}, 2),
              ElementsAre(2, 4, 5));
}

TEST_F(KvCacheTest, LastPromptTokenIsAlwaysComputed) {
  Make(8);
  cache_->Release(Prefill(Iota(8)));
  // The whole prompt is cached, but its last token's logits are needed: 7 tokens are served,
  // and the 3 cached rows of block 1 are copied so that row 3 can be written.
  Admission b = Admit(Iota(8));
  EXPECT_EQ(b.num_cached, 7);
  EXPECT_THAT(Table(b.seq), ElementsAre(0, 2));
  EXPECT_THAT(b.copies, ElementsAre(BlockCopy{1, 2, 3}));
  // Once computed, block 2 duplicates block 1: the sequence switches to block 1 and
  // block 2 goes back to the free list.
  cache_->MarkComputed(b.seq, 8);
  cache_->CheckInvariants();
  EXPECT_THAT(Table(b.seq), ElementsAre(0, 1));
  EXPECT_EQ(KvCacheTestPeer::StateOf(*cache_, 2), BlockState::kFree);
  EXPECT_EQ(KvCacheTestPeer::RefCount(*cache_, 1), 1);
  EXPECT_EQ(cache_->Stats().hit_tokens, 7u);

  // A one-token prompt is never served from the cache.
  Admission c = Admit({0});
  EXPECT_EQ(c.num_cached, 0);
  EXPECT_THAT(c.copies, IsEmpty());
}

TEST_F(KvCacheTest, ForkSharesEveryBlockAndCopiesOnFirstWrite) {
  Make(8);
  SequenceId p = Prefill(Iota(6));  // block 0 full + indexed, block 1 holds 2 rows
  EXPECT_THAT(Table(p), ElementsAre(0, 1));
  std::vector<SequenceId> kids = testing::ForkCopies(*cache_, p, 3);
  cache_->CheckInvariants();
  ASSERT_EQ(kids.size(), 3u);
  EXPECT_EQ(KvCacheTestPeer::RefCount(*cache_, 0), 4);
  EXPECT_EQ(KvCacheTestPeer::RefCount(*cache_, 1), 4);
  for (SequenceId k : kids) {
    EXPECT_THAT(Table(k), ElementsAre(0, 1));
    EXPECT_EQ(cache_->NumComputed(k), 6);
  }
  // Each child's first write into the shared partial block copies its two rows.
  EXPECT_THAT(Decode(kids[0], 100), ElementsAre(BlockCopy{1, 2, 2}));
  EXPECT_EQ(KvCacheTestPeer::RefCount(*cache_, 1), 3);
  EXPECT_THAT(Decode(kids[1], 101), ElementsAre(BlockCopy{1, 3, 2}));
  EXPECT_THAT(Decode(kids[2], 102), ElementsAre(BlockCopy{1, 4, 2}));
  EXPECT_EQ(KvCacheTestPeer::RefCount(*cache_, 1), 1);
  // The parent is the last owner: it writes in place.
  EXPECT_THAT(Decode(p, 103), IsEmpty());
  EXPECT_THAT(Table(p), ElementsAre(0, 1));
  EXPECT_THAT(Table(kids[0]), ElementsAre(0, 2));
  EXPECT_THAT(Table(kids[2]), ElementsAre(0, 4));
  EXPECT_EQ(KvCacheTestPeer::RefCount(*cache_, 0), 4);
  // A second write into the now private block needs no copy.
  EXPECT_THAT(Decode(kids[0], 104), IsEmpty());
  EXPECT_EQ(cache_->Stats().cow_copies, 3u);
  // Filling block 2 indexes it under its own tokens [4, 5, 100, 104].
  EXPECT_TRUE(KvCacheTestPeer::IsIndexed(*cache_, 2));
  for (SequenceId k : kids) cache_->Release(k);
  cache_->Release(p);
  cache_->CheckInvariants();
  EXPECT_EQ(cache_->Stats().blocks_active, 0);
}

TEST_F(KvCacheTest, MarkComputedIntoSharedBlockWithoutReserveDies) {
  Make(8);
  SequenceId p = Prefill(Iota(6));
  SequenceId k = testing::ForkCopies(*cache_, p, 1)[0];
  cache_->AppendTokens(k, {9});
  EXPECT_DEATH(cache_->MarkComputed(k, 7), "shared block");
}

TEST_F(KvCacheTest, EvictionUnderPressureTakesLeastRecentlyUsedLeavesFirst) {
  Make(4);
  now_ = 10;
  cache_->Release(Prefill(Iota(8)));  // blocks 0 <- 1, released at t=10
  now_ = 20;
  cache_->Release(Prefill(Iota(8, 100)));  // blocks 2 <- 3, released at t=20
  EXPECT_THAT(KvCacheTestPeer::FreeList(*cache_), IsEmpty());
  EXPECT_THAT(KvCacheTestPeer::EvictionOrder(*cache_), ElementsAre(1, 0, 3, 2));

  // A new 8-token prompt needs two blocks: the oldest chain goes, leaf first.
  Admission c = Admit(Iota(8, 200));
  EXPECT_EQ(c.num_cached, 0);
  EXPECT_THAT(Table(c.seq), ElementsAre(1, 0));
  EXPECT_EQ(cache_->Stats().evictions, 2u);
  EXPECT_THAT(KvCacheTestPeer::EvictionOrder(*cache_), ElementsAre(3, 2));

  // The evicted prefix misses now; the surviving one still hits (once C's blocks can make
  // room for the one block it needs: the two it reuses cannot).
  cache_->Release(c.seq);
  AdmissionRequest r;
  std::vector<uint32_t> old = Concat(Iota(8), {9});
  r.chain = std::make_shared<TokenChain>(kRoot, cache_->block_size(), old);
  auto plan = cache_->PlanAdmission(r);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->matched_tokens, 0);
  std::vector<uint32_t> kept = Concat(Iota(8, 100), {9});
  r.chain = std::make_shared<TokenChain>(kRoot, cache_->block_size(), kept);
  plan = cache_->PlanAdmission(r);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->matched_tokens, 8);
}

TEST_F(KvCacheTest, InjectedClockOrdersEviction) {
  Make(6);
  now_ = 50;
  cache_->Release(Prefill(Iota(4)));       // block 0 at t=50
  now_ = 5;                                // the clock is the caller's: not necessarily monotone
  cache_->Release(Prefill(Iota(4, 100)));  // block 1 at t=5
  EXPECT_THAT(KvCacheTestPeer::EvictionOrder(*cache_), ElementsAre(1, 0));
  // Using block 1 again refreshes it.
  now_ = 60;
  cache_->Release(Prefill(Concat(Iota(4, 100), {7})));
  EXPECT_THAT(KvCacheTestPeer::EvictionOrder(*cache_), ElementsAre(0, 1));
  EXPECT_EQ(cache_->Evict(1), 1);
  cache_->CheckInvariants();
  EXPECT_EQ(KvCacheTestPeer::StateOf(*cache_, 0), BlockState::kFree);
}

TEST_F(KvCacheTest, ParentIsNeverEvictedBeforeItsCachedChildren) {
  Make(8);
  now_ = 1;
  cache_->Release(Prefill(Iota(8)));  // 0 <- 1
  now_ = 2;
  // A sibling continuation of block 0, released later: block 0 now has two children.
  cache_->Release(Prefill(Concat(Iota(4), {40, 41, 42, 43})));
  EXPECT_THAT(KvCacheTestPeer::EvictionOrder(*cache_), ElementsAre(1, 2, 0));
  EXPECT_EQ(cache_->Evict(2), 2);
  cache_->CheckInvariants();
  EXPECT_EQ(KvCacheTestPeer::StateOf(*cache_, 0), BlockState::kCached);
  EXPECT_EQ(cache_->Evict(5), 1);
  EXPECT_EQ(cache_->Stats().blocks_cached, 0);
}

TEST_F(KvCacheTest, NamespacesNeverShare) {
  Make(16);
  cache_->Release(Prefill(Iota(8)));
  const Digest other_tenant = CacheRootKey("manifest-1", CacheNamespace("other", ""));
  EXPECT_EQ(Admit(Concat(Iota(8), {1}), other_tenant).num_cached, 0);
  // Length prefixes keep tenant/salt splits apart.
  const Digest ab_c = CacheRootKey("manifest-1", CacheNamespace("ab", "c"));
  const Digest a_bc = CacheRootKey("manifest-1", CacheNamespace("a", "bc"));
  EXPECT_NE(ab_c, a_bc);
  cache_->Release(Prefill(Iota(8, 500), ab_c));
  EXPECT_EQ(Admit(Concat(Iota(8, 500), {1}), a_bc).num_cached, 0);
  EXPECT_EQ(Admit(Concat(Iota(8, 500), {1}), ab_c).num_cached, 8);
  // The same namespace still hits.
  EXPECT_EQ(Admit(Concat(Iota(8), {1})).num_cached, 8);
}

TEST_F(KvCacheTest, ManifestChangeInvalidates) {
  Make(16);
  cache_->Release(Prefill(Iota(8)));
  const Digest new_model = CacheRootKey("manifest-2", CacheNamespace("tenant", ""));
  Admission a = Admit(Concat(Iota(8), {1}), new_model);
  EXPECT_EQ(a.num_cached, 0);
  EXPECT_THAT(a.copies, IsEmpty());
}

TEST_F(KvCacheTest, TruncateInsideSharedBlock) {
  Make(8);
  SequenceId p = Prefill(Iota(8));  // 0, 1 indexed
  SequenceId k = testing::ForkCopies(*cache_, p, 1)[0];
  cache_->Truncate(k, 6);
  cache_->CheckInvariants();
  EXPECT_THAT(Table(k), ElementsAre(0, 1));
  EXPECT_EQ(cache_->NumComputed(k), 6);
  EXPECT_EQ(KvCacheTestPeer::RefCount(*cache_, 1), 2);
  // Writing row 6 must not touch block 1: the parent and the index still need it.
  cache_->AppendTokens(k, {60, 61});
  auto copies = cache_->Reserve(k, 8);
  ASSERT_TRUE(copies.ok());
  EXPECT_THAT(*copies, ElementsAre(BlockCopy{1, 2, 2}));
  cache_->MarkComputed(k, 8);
  cache_->CheckInvariants();
  EXPECT_THAT(Table(k), ElementsAre(0, 2));
  EXPECT_EQ(KvCacheTestPeer::RefCount(*cache_, 1), 1);
  EXPECT_TRUE(KvCacheTestPeer::IsIndexed(*cache_, 1));
  EXPECT_TRUE(KvCacheTestPeer::IsIndexed(*cache_, 2));

  // Alone in an indexed block: still copied, because the index makes it visible.
  cache_->Truncate(p, 5);
  EXPECT_EQ(KvCacheTestPeer::RefCount(*cache_, 1), 1);
  cache_->AppendTokens(p, {70});
  copies = cache_->Reserve(p, 6);
  ASSERT_TRUE(copies.ok());
  EXPECT_THAT(*copies, ElementsAre(BlockCopy{1, 3, 1}));
  EXPECT_EQ(KvCacheTestPeer::StateOf(*cache_, 1), BlockState::kCached);
  cache_->CheckInvariants();

  // Truncating to a block boundary releases the blocks past it.
  cache_->Truncate(k, 4);
  cache_->CheckInvariants();
  EXPECT_THAT(Table(k), ElementsAre(0));
  EXPECT_EQ(KvCacheTestPeer::StateOf(*cache_, 2), BlockState::kCached);
}

TEST_F(KvCacheTest, ResourceExhaustedLeavesStateIdentical) {
  Make(4);
  cache_->Release(Prefill(Iota(8)));     // 0, 1 cached
  SequenceId b = Prefill(Iota(4, 100));  // block 2, owned
  Prefill({300});                        // block 3, owned
  const std::string before = KvCacheTestPeer::DebugState(*cache_);

  AdmissionRequest r;
  std::vector<uint32_t> huge = Iota(17);  // 5 blocks: can never fit
  r.chain = std::make_shared<TokenChain>(kRoot, cache_->block_size(), huge);
  r.reserve_tokens = 17;
  auto a = cache_->Admit(r);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(a.status().message()), ::testing::HasSubstr("never fit"));
  EXPECT_EQ(KvCacheTestPeer::DebugState(*cache_), before);

  // Hits blocks 0 and 1 and needs two more; the only candidates are the cached blocks it
  // reuses, which cannot be evicted for it.
  std::vector<uint32_t> longer = Concat(Iota(8), Iota(5, 8));
  r.chain = std::make_shared<TokenChain>(kRoot, cache_->block_size(), longer);
  r.reserve_tokens = 13;
  a = cache_->Admit(r);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(KvCacheTestPeer::DebugState(*cache_), before);

  // Growing a sequence past what can be freed fails the same way.
  cache_->AppendTokens(b, Iota(12, 200));
  const std::string grown = KvCacheTestPeer::DebugState(*cache_);
  auto copies = cache_->Reserve(b, 16);
  EXPECT_EQ(copies.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(KvCacheTestPeer::DebugState(*cache_), grown);
  // ...while what fits succeeds, evicting the cached blocks (leaf first).
  copies = cache_->Reserve(b, 12);
  ASSERT_TRUE(copies.ok());
  EXPECT_THAT(*copies, IsEmpty());
  EXPECT_THAT(Table(b), ElementsAre(2, 1, 0));
  EXPECT_EQ(cache_->Stats().evictions, 2u);
  cache_->CheckInvariants();
}

TEST_F(KvCacheTest, PlanIsPureAndStalePlansAreRejected) {
  Make(8);
  cache_->Release(Prefill(Iota(8)));
  const std::string before = KvCacheTestPeer::DebugState(*cache_);
  AdmissionRequest r;
  std::vector<uint32_t> prompt = Concat(Iota(8), {8, 9});
  r.chain = std::make_shared<TokenChain>(kRoot, cache_->block_size(), prompt);
  r.reserve_uncached_tokens = 1;  // the first prefill chunk: one token past the cache
  auto plan = cache_->PlanAdmission(r);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(KvCacheTestPeer::DebugState(*cache_), before);
  EXPECT_EQ(plan->num_cached, 8);
  EXPECT_EQ(plan->capacity_tokens, 12);
  EXPECT_EQ(plan->blocks_to_allocate, 1);
  Admission a = cache_->Commit(*plan);
  EXPECT_THAT(Table(a.seq), ElementsAre(0, 1, 2));
  EXPECT_DEATH(cache_->Commit(*plan), "stale");
}

TEST_F(KvCacheTest, ReadmissionIsNotCountedAsAQuery) {
  Make(8);
  SequenceId a = Prefill(Iota(8));
  cache_->Release(a);  // preempted
  AdmissionRequest r;
  std::vector<uint32_t> prompt = Concat(Iota(8), {8});
  r.chain = std::make_shared<TokenChain>(kRoot, cache_->block_size(), prompt);
  r.readmission = true;
  auto adm = cache_->Admit(r);
  ASSERT_TRUE(adm.ok());
  EXPECT_EQ(adm->num_cached, 8);
  EXPECT_EQ(cache_->Stats().queried_tokens, 8u);
  EXPECT_EQ(cache_->Stats().hit_tokens, 0u);
}

TEST_F(KvCacheTest, BlocksAreIndexedAsSoonAsTheyAreComputed) {
  Make(16);
  // A admits a 12-token prompt with a 4-token first chunk.
  AdmissionRequest r;
  std::vector<uint32_t> prompt = Iota(12);
  r.chain = std::make_shared<TokenChain>(kRoot, cache_->block_size(), prompt);
  r.reserve_uncached_tokens = 4;
  auto a = cache_->Admit(r);
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(Table(a->seq), ElementsAre(0));
  r.reserve_uncached_tokens = 0;

  // Nothing is computed yet: B sees no match but 11 tokens in flight.
  auto plan = cache_->PlanAdmission(r);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->matched_tokens, 0);
  EXPECT_EQ(plan->pending_match_tokens, 11);

  cache_->MarkComputed(a->seq, 4);
  cache_->CheckInvariants();
  plan = cache_->PlanAdmission(r);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_cached, 4);
  EXPECT_EQ(plan->pending_match_tokens, 7);

  ASSERT_TRUE(cache_->Reserve(a->seq, 12).ok());
  cache_->MarkComputed(a->seq, 12);
  cache_->CheckInvariants();
  plan = cache_->PlanAdmission(r);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_cached, 11);
  EXPECT_EQ(plan->pending_match_tokens, 0);

  // Decode fills block 3 with generated tokens: indexed as well.
  for (uint32_t t = 0; t < 4; ++t) Decode(a->seq, 900 + t);
  EXPECT_THAT(Table(a->seq), ElementsAre(0, 1, 2, 3));
  EXPECT_TRUE(KvCacheTestPeer::IsIndexed(*cache_, 3));
}

TEST_F(KvCacheTest, NoPrefixCacheModeNeverMatchesOrIndexes) {
  Make(8, /*prefix_cache=*/false);
  SequenceId a = Prefill(Iota(8));
  EXPECT_FALSE(KvCacheTestPeer::IsIndexed(*cache_, 0));
  cache_->Release(a);
  cache_->CheckInvariants();
  EXPECT_THAT(KvCacheTestPeer::FreeList(*cache_), ElementsAre(2, 3, 4, 5, 6, 7, 1, 0));
  SequenceId b = Prefill(Concat(Iota(8), {1}));
  EXPECT_EQ(cache_->NumComputed(b), 9);
  EXPECT_THAT(Table(b), ElementsAre(2, 3, 4));
  EXPECT_EQ(cache_->Stats().blocks_cached, 0);
  EXPECT_EQ(cache_->Stats().hit_tokens, 0u);
  // Fork and copy-on-write work the same without the index.
  SequenceId k = testing::ForkCopies(*cache_, b, 1)[0];
  EXPECT_THAT(Decode(k, 5), ElementsAre(BlockCopy{4, 5, 1}));
  EXPECT_THAT(Table(k), ElementsAre(2, 3, 5));
}


// Invariant 6: a live sequence's chain changes only through the cache, and backs one sequence.
TEST_F(KvCacheTest, ASequenceChainChangedOutsideTheCacheOrSharedIsCaught) {
  Make(8);
  auto chain = std::make_shared<TokenChain>(kRoot, cache_->block_size(), Iota(5));
  AdmissionRequest r;
  r.chain = chain;
  r.reserve_tokens = 5;
  absl::StatusOr<Admission> a = cache_->Admit(r);
  ASSERT_TRUE(a.ok());
  // The caller reads the one list the cache grows: the sampled token, and the key of the
  // block it fills, are there without being appended twice.
  cache_->AppendTokens(a->seq, {5, 6});
  EXPECT_EQ(chain->size(), 7u);
  cache_->AppendTokens(a->seq, {7});
  ASSERT_EQ(chain->keys().size(), 2u);
  EXPECT_EQ(chain->keys()[1], ChainKey(chain->keys()[0], {4, 5, 6, 7}));
  EXPECT_EQ(&cache_->Chain(a->seq), chain.get());
  cache_->CheckInvariants();
  // A second live sequence on the same chain would grow it behind the first one's back.
  EXPECT_DEATH(cache_->Admit(r).IgnoreError(), "already backs a live sequence");
  chain->Append({8});  // outside the cache
  EXPECT_DEATH(cache_->NumComputed(a->seq), "changed outside the cache");
  EXPECT_DEATH(cache_->CheckInvariants(), "");
}

}  // namespace
}  // namespace prefixd

namespace prefixd {
namespace {

// on_index and on_evict together describe the index exactly: every block that enters it is
// reported once (with its parent's key, none for a first block, and its tokens), a block
// that joins an identical indexed one is not, and each leaves through on_evict.
TEST(KvCacheHooksTest, IndexAndEvictHooksDescribeTheIndex) {
  std::vector<std::string> log;
  const TokenChain chain(kRoot, 4, Iota(8));
  auto name = [&](const Digest& key) -> std::string {
    if (key == chain.keys()[0]) return "k0";
    if (key == chain.keys()[1]) return "k1";
    if (key == kRoot) return "root";
    return "other";
  };
  KvCacheOptions o;
  o.pool = {.num_blocks = 4, .block_size = 4, .bytes_per_token = 100};
  o.on_index = [&](const IndexedBlock& b) {
    log.push_back("index " + name(*b.key) + " parent " +
                  (b.parent_key == nullptr ? "none" : name(*b.parent_key)) + " tokens " +
                  std::to_string(b.tokens.front()) + ".." + std::to_string(b.tokens.back()));
  };
  o.on_evict = [&](const EvictedBlock& e) { log.push_back("evict " + name(*e.key)); };
  auto c = KvCache::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  KvCache& cache = **c;
  auto admit = [&](std::vector<uint32_t> prompt) {
    AdmissionRequest r;
    r.chain = std::make_shared<TokenChain>(kRoot, 4, prompt);
    r.reserve_tokens = static_cast<int32_t>(prompt.size());
    absl::StatusOr<Admission> a = cache.Admit(r);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? a->seq : SequenceId{-1};
  };
  // Two identical prompts computed at once: the second's blocks join the first's.
  const SequenceId a = admit(Iota(8));
  const SequenceId b = admit(Iota(8));
  cache.MarkComputed(a, 8);
  cache.MarkComputed(b, 8);
  EXPECT_THAT(log, ElementsAre("index k0 parent none tokens 0..3",
                               "index k1 parent k0 tokens 4..7"));
  cache.Release(a);
  cache.Release(b);
  log.clear();
  // A prompt of four other blocks needs the whole pool: leaves leave first.
  const SequenceId other = admit(Iota(16, 100));
  EXPECT_THAT(log, ElementsAre("evict k1", "evict k0"));
  cache.CheckInvariants();
  cache.Release(other);
}

// on_reuse names the indexed blocks a first admission reads: those it shares, then a partial
// match's copy source; a readmission and a miss report nothing.
TEST(KvCacheHooksTest, ReuseHookNamesTheBlocksAnAdmissionReads) {
  std::vector<std::vector<int32_t>> reads;
  KvCacheOptions o;
  o.pool = {.num_blocks = 8, .block_size = 4, .bytes_per_token = 100};
  o.on_reuse = [&](absl::Span<const int32_t> blocks) {
    reads.emplace_back(blocks.begin(), blocks.end());
  };
  auto c = KvCache::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  KvCache& cache = **c;
  auto admit = [&](std::vector<uint32_t> prompt, bool readmission) {
    AdmissionRequest r;
    r.chain = std::make_shared<TokenChain>(kRoot, 4, prompt);
    r.reserve_tokens = static_cast<int32_t>(prompt.size());
    r.readmission = readmission;
    absl::StatusOr<Admission> a = cache.Admit(r);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? a->seq : SequenceId{-1};
  };
  const SequenceId first = admit(Iota(12), false);  // a miss: nothing read
  EXPECT_TRUE(reads.empty());
  cache.MarkComputed(first, 12);
  const std::vector<int32_t> table(cache.BlockTable(first).begin(),
                                   cache.BlockTable(first).end());
  cache.Release(first);
  // Blocks 0 and 1 shared whole, then 2 rows of block 2 copied (the prompt diverges there).
  std::vector<uint32_t> diverging = Iota(10);
  diverging.push_back(999);
  const SequenceId second = admit(diverging, false);
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_THAT(reads[0], ElementsAre(table[0], table[1], table[2]));
  cache.Release(second);
  const SequenceId again = admit(Iota(12), true);  // a readmission is not a reuse
  EXPECT_EQ(reads.size(), 1u);
  cache.Release(again);
  cache.CheckInvariants();
}

}  // namespace
}  // namespace prefixd
