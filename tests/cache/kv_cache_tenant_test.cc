// Cache shares in the pool (cache/eviction_queue.h through KvCache): exact eviction order
// and per-tenant stats in a tiny pool.
#include <memory>
#include <vector>

#include "cache/block_key.h"
#include "cache/kv_cache.h"
#include "cache/token_chain.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/kv_cache_test_peer.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;

constexpr TenantId kQuiet = 0;
constexpr TenantId kNoisy = 1;

class KvCacheTenantTest : public ::testing::Test {
 protected:
  // 8 blocks of 4 tokens; the noisy tenant may keep `noisy_share` cached blocks (-1: off).
  void Make(int64_t noisy_share) {
    KvCacheOptions o;
    o.pool = {.num_blocks = 8, .block_size = 4, .bytes_per_token = 8};
    o.clock = [this] { return ++now_; };
    auto c = KvCache::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cache_ = *std::move(c);
    if (noisy_share >= 0) cache_->SetTenantShare(kNoisy, noisy_share);
  }

  // Admits an 8-token prompt of `tenant` starting at `first`, computes it and releases it:
  // two cached blocks of that tenant. Returns them.
  std::vector<int32_t> CachePrompt(TenantId tenant, uint32_t first, int64_t retain_until = 0,
                                   int32_t* retained_tokens = nullptr) {
    std::vector<uint32_t> tokens(8);
    for (uint32_t i = 0; i < 8; ++i) tokens[i] = first + i;
    AdmissionRequest r;
    r.chain = std::make_shared<TokenChain>(Root(tenant), 4, tokens);
    r.reserve_tokens = 8;
    r.tenant = tenant;
    r.retain_until = retain_until;
    absl::StatusOr<Admission> a = cache_->Admit(r);
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return {};
    if (retained_tokens != nullptr) *retained_tokens = a->retained_tokens;
    cache_->MarkComputed(a->seq, 8);
    const absl::Span<const int32_t> t = cache_->BlockTable(a->seq);
    std::vector<int32_t> blocks(t.begin(), t.end());
    cache_->Release(a->seq);
    cache_->CheckInvariants();
    return blocks;
  }

  int32_t Hit(TenantId tenant, uint32_t first) {
    std::vector<uint32_t> tokens(8);
    for (uint32_t i = 0; i < 8; ++i) tokens[i] = first + i;
    AdmissionRequest r;
    r.chain = std::make_shared<TokenChain>(Root(tenant), 4, tokens);
    r.reserve_tokens = 8;
    r.tenant = tenant;
    absl::StatusOr<AdmissionPlan> p = cache_->PlanAdmission(r);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? p->num_cached : -1;
  }

  static Digest Root(TenantId tenant) {
    return CacheRootKey("manifest", CacheNamespace(tenant == kQuiet ? "quiet" : "noisy", ""));
  }

  int64_t now_ = 0;
  std::unique_ptr<KvCache> cache_;
};

// The flood scenario: the quiet tenant's prefix is the oldest in the pool. Without a share
// the noisy tenant's fourth prompt evicts it (plain LRU); with a share of 2 blocks the noisy
// tenant's own oldest blocks go first and the quiet prefix survives every flood prompt.
TEST_F(KvCacheTenantTest, AFloodEvictsOnlyTheFloodersBlocks) {
  Make(/*noisy_share=*/-1);
  const std::vector<int32_t> quiet = CachePrompt(kQuiet, 0);
  CachePrompt(kNoisy, 100);
  CachePrompt(kNoisy, 200);
  CachePrompt(kNoisy, 300);
  // Leaves first, then LRU: the quiet leaf, its parent, then the noisy prompts in age order.
  EXPECT_EQ(KvCacheTestPeer::EvictionOrder(*cache_).front(), quiet[1]);
  CachePrompt(kNoisy, 400);
  EXPECT_EQ(Hit(kQuiet, 0), 0);

  Make(/*noisy_share=*/2);
  const std::vector<int32_t> quiet2 = CachePrompt(kQuiet, 0);
  const std::vector<int32_t> m1 = CachePrompt(kNoisy, 100);
  const std::vector<int32_t> m2 = CachePrompt(kNoisy, 200);
  const std::vector<int32_t> m3 = CachePrompt(kNoisy, 300);
  // Noisy holds 6 cached blocks, 4 over its share: its leaves go first, oldest first, until
  // it is back within its share; then plain LRU (the quiet prefix, the oldest).
  EXPECT_THAT(KvCacheTestPeer::EvictionOrder(*cache_),
              ElementsAre(m1[1], m1[0], m2[1], m2[0], quiet2[1], quiet2[0], m3[1], m3[0]));
  for (uint32_t first : {400u, 500u, 600u, 700u}) {
    CachePrompt(kNoisy, first);
    EXPECT_EQ(Hit(kQuiet, 0), 7) << "quiet prefix evicted by the flood prompt at " << first;
  }
  // The share picks the victims; it does not cap what a tenant may cache while blocks are
  // free or its own are the victims: noisy still fills the rest of the pool.
  const auto stats = cache_->TenantStats();
  EXPECT_EQ(stats.at(kQuiet).cached_blocks, 2);
  EXPECT_EQ(stats.at(kQuiet).evictions, 0u);
  EXPECT_EQ(stats.at(kNoisy).cached_blocks, 6);
  EXPECT_EQ(stats.at(kNoisy).evictions, 8u);  // 14 noisy blocks indexed, 6 still cached
  cache_->CheckInvariants();
}

// Blocks in use are not counted against the share: a running request's blocks neither make
// its tenant over its share nor become victims.
TEST_F(KvCacheTenantTest, BlocksInUseDoNotCountAgainstTheShare) {
  Make(/*noisy_share=*/1);
  const std::vector<int32_t> quiet = CachePrompt(kQuiet, 0);
  // A running noisy request holding two indexed blocks: not cached, not over its share.
  AdmissionRequest r;
  std::vector<uint32_t> tokens = {100, 101, 102, 103, 104, 105, 106, 107};
  r.chain = std::make_shared<TokenChain>(Root(kNoisy), 4, tokens);
  r.reserve_tokens = 8;
  r.tenant = kNoisy;
  absl::StatusOr<Admission> running = cache_->Admit(r);
  ASSERT_TRUE(running.ok());
  cache_->MarkComputed(running->seq, 8);
  const std::vector<int32_t> noisy(cache_->BlockTable(running->seq).begin(),
                                   cache_->BlockTable(running->seq).end());
  EXPECT_EQ(cache_->TenantStats().at(kNoisy).cached_blocks, 0);
  EXPECT_THAT(KvCacheTestPeer::EvictionOrder(*cache_), ElementsAre(quiet[1], quiet[0]));
  cache_->Release(running->seq);
  // Released: 2 cached > share 1, so the noisy leaf goes first; then plain LRU, where the
  // quiet prefix is the older.
  EXPECT_EQ(cache_->TenantStats().at(kNoisy).cached_blocks, 2);
  EXPECT_THAT(KvCacheTestPeer::EvictionOrder(*cache_),
              ElementsAre(noisy[1], quiet[1], quiet[0], noisy[0]));
  cache_->CheckInvariants();
}

// A retained prompt survives a flood by its own tenant and by another (every normal block
// goes first), reports its retained hit tokens, and lapses at its time.
TEST_F(KvCacheTenantTest, RetentionSurvivesPressureAndLapses) {
  Make(-1);
  const std::vector<int32_t> kept = CachePrompt(kQuiet, 0, /*retain_until=*/1000);
  CachePrompt(kQuiet, 50);
  for (uint32_t first = 100; first < 1000; first += 100) {
    CachePrompt(kNoisy, first);
    EXPECT_EQ(Hit(kQuiet, 0), 7) << "retained prefix evicted at " << first;
  }
  EXPECT_EQ(cache_->TenantStats().at(kQuiet).retained_blocks, 2);
  // The retained blocks are the last victims.
  const std::vector<int32_t> order = KvCacheTestPeer::EvictionOrder(*cache_);
  ASSERT_GE(order.size(), 2u);
  EXPECT_THAT(std::vector<int32_t>(order.end() - 2, order.end()), ElementsAre(kept[1], kept[0]));
  int32_t retained = -1;
  CachePrompt(kQuiet, 0, 0, &retained);  // a hit from retained blocks
  EXPECT_EQ(retained, 7);
  EXPECT_EQ(cache_->ExpireRetention(999), 0);
  EXPECT_EQ(cache_->ExpireRetention(1000), 2);
  EXPECT_EQ(cache_->TenantStats().at(kQuiet).retained_blocks, 0);
  cache_->CheckInvariants();
  // Normal blocks now: a flood of a whole pool evicts them.
  for (uint32_t first = 1000; first < 1400; first += 100) CachePrompt(kNoisy, first);
  EXPECT_EQ(Hit(kQuiet, 0), 0);
  cache_->CheckInvariants();
}

// A tenant retains at most its share: the retention that lapses soonest gives way, and a
// retention shorter than all of them is not taken. A later retention extends a block's.
TEST_F(KvCacheTenantTest, RetentionIsCappedByTheShare) {
  Make(-1);
  cache_->SetTenantShare(kQuiet, 3);
  const std::vector<int32_t> a = CachePrompt(kQuiet, 0, 500);
  const std::vector<int32_t> b = CachePrompt(kQuiet, 100, 900);  // 4 > 3: a block of a lapses
  EXPECT_EQ(cache_->TenantStats().at(kQuiet).retained_blocks, 3);
  CachePrompt(kQuiet, 200, 100);  // shorter than every retention held: not retained
  EXPECT_EQ(cache_->ExpireRetention(100), 0);
  EXPECT_EQ(cache_->ExpireRetention(500), 1);  // what was left of a
  EXPECT_EQ(cache_->TenantStats().at(kQuiet).retained_blocks, 2);
  CachePrompt(kQuiet, 100, 2000);  // b again: extended
  EXPECT_EQ(cache_->ExpireRetention(900), 0);
  EXPECT_EQ(cache_->ExpireRetention(2000), 2);
  cache_->CheckInvariants();
}

// Retained tokens are those read from blocks retained when the admission began: the
// admission's own retention, which may displace another retention at the share, is taken
// after they are counted, and so cannot hide a retained block it reads.
TEST_F(KvCacheTenantTest, RetainedTokensCountBlocksRetainedBeforeTheAdmissionsOwnRetention) {
  Make(-1);
  cache_->SetTenantShare(kQuiet, 3);
  const std::vector<int32_t> x = CachePrompt(kQuiet, 0, /*retain_until=*/10);
  ASSERT_EQ(x.size(), 2u);
  ASSERT_LT(x[0], x[1]);  // of two retentions ending together, x[0]'s gives way first
  // Another prompt's two blocks, retained longer: x[0]'s retention gives way, x[1]'s stays.
  CachePrompt(kQuiet, 100, /*retain_until=*/20);
  EXPECT_EQ(cache_->TenantStats().at(kQuiet).retained_blocks, 3);
  // x again, retained longer still: it shares x[0] and copies 3 rows of x[1], retained now.
  int32_t retained = -1;
  CachePrompt(kQuiet, 0, /*retain_until=*/30, &retained);
  EXPECT_EQ(retained, 3) << "the rows read from x[1], retained when the admission began";
  cache_->CheckInvariants();
}

// Hits are counted per tenant at first admission.
TEST_F(KvCacheTenantTest, HitsAreCountedPerTenant) {
  Make(-1);
  CachePrompt(kQuiet, 0);
  CachePrompt(kQuiet, 0);  // 7 tokens from the cache
  CachePrompt(kNoisy, 0);  // another tenant's root: a miss
  const auto s = cache_->TenantStats();
  EXPECT_EQ(s.at(kQuiet).hit_tokens, 7u);
  EXPECT_EQ(s.at(kNoisy).hit_tokens, 0u);
}

}  // namespace
}  // namespace prefixd
