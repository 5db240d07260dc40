// Randomized test of KvCache against a deliberately naive model.
//
// The model keeps, per root, the plain set of cached token prefixes (whole blocks) and each
// live sequence's tokens and computed count. After every operation:
//  - the cache's index holds exactly the model's prefixes: new ones appear only when a
//    sequence computes them, and one disappears only by a legal eviction (no live sequence
//    has computed it, no cached prefix extends it, and the evictions counter moved with it);
//  - every admission's hit length equals the naive longest common prefix over the model's
//    prefixes, capped at prompt length - 1;
//  - a fake KV storage, updated only through the block tables and the BlockCopy lists the
//    cache returns, holds for every sequence's computed rows and every indexed block's rows
//    exactly the value of that position's prefix;
//  - CheckInvariants() passes, and a failed call left DebugState() unchanged.
// Seeds and the step are printed on failure. PREFIXD_CACHE_RANDOM_OPS scales the total
// number of operations (default 100,000; 50,000 under ASan); PREFIXD_CACHE_SEED runs one seed.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cache/block_key.h"
#include "cache/kv_cache.h"
#include "cache/token_chain.h"
#include "gtest/gtest.h"
#include "tests/cache/fork_chains.h"
#include "tests/cache/kv_cache_test_peer.h"

namespace prefixd {
namespace {

struct Config {
  int32_t num_blocks;
  int32_t block_size;
  bool prefix_cache;
  // Cached blocks per tenant before its own go first (-1: no shares); each root is a tenant.
  int64_t tenant_share = -1;
};

using Prefix = std::pair<int, std::vector<uint32_t>>;  // (root index, tokens)

uint64_t Mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

class RandomRun {
 public:
  RandomRun(const Config& config, uint64_t seed) : cfg_(config), rng_(seed) {
    KvCacheOptions o;
    o.pool.num_blocks = cfg_.num_blocks;
    o.pool.block_size = cfg_.block_size;
    o.pool.bytes_per_token = 8;
    o.enable_prefix_cache = cfg_.prefix_cache;
    o.clock = [this] { return now_; };
    o.tenant_share_blocks = cfg_.tenant_share;
    cache_ = std::move(*KvCache::Create(o));
    roots_ = {CacheRootKey("m1", CacheNamespace("a", "")),
              CacheRootKey("m1", CacheNamespace("b", "")),
              CacheRootKey("m2", CacheNamespace("a", ""))};
    storage_.assign(static_cast<size_t>(cfg_.num_blocks) * cfg_.block_size, 0);
  }

  // Runs `ops` operations; returns false (after reporting) on the first failure.
  void Run(int ops) {
    for (step_ = 0; step_ < ops && !::testing::Test::HasFailure(); ++step_) {
      if (rng_() % 3 == 0) now_ += rng_() % 3;  // the clock sometimes stands still
      // Retentions (configurations with shares) lapse on the same clock.
      if (cfg_.tenant_share >= 0 && rng_() % 4 == 0) cache_->ExpireRetention(now_);
      const uint32_t op = rng_() % 100;
      if (op < 25 || seqs_.empty()) {
        OpAdmit();
      } else if (op < 45) {
        OpCompute();
      } else if (op < 65) {
        OpDecode();
      } else if (op < 72) {
        OpFork();
      } else if (op < 80) {
        OpTruncate();
      } else if (op < 96) {
        OpRelease();
      } else {
        OpEvict();
      }
      Verify();
    }
  }

 private:
  struct ModelSeq {
    int root = 0;
    std::vector<uint32_t> tokens;
    std::vector<uint64_t> values;  // values[p]: the KV "value" of position p's prefix
    int32_t computed = 0;
  };

  uint64_t ValueOf(int root, const std::vector<uint32_t>& tokens, size_t p) const {
    uint64_t h = Mix(0x1234, static_cast<uint64_t>(root));
    for (size_t i = 0; i <= p; ++i) h = Mix(h, tokens[i]);
    return h;
  }

  void RecomputeValues(ModelSeq& s) {
    s.values.resize(s.tokens.size());
    uint64_t h = Mix(0x1234, static_cast<uint64_t>(s.root));
    for (size_t i = 0; i < s.tokens.size(); ++i) s.values[i] = h = Mix(h, s.tokens[i]);
  }

  SequenceId PickSeq() {
    auto it = seqs_.begin();
    std::advance(it, rng_() % seqs_.size());
    return it->first;
  }

  std::vector<uint32_t> RandomTokens(size_t n) {
    std::vector<uint32_t> t(n);
    for (auto& x : t) x = rng_() % 3;  // a tiny vocabulary makes shared prefixes common
    return t;
  }

  void ExecuteCopies(const std::vector<BlockCopy>& copies) {
    const int32_t bs = cfg_.block_size;
    for (const BlockCopy& c : copies) {
      ASSERT_GT(c.num_rows, 0);
      ASSERT_LE(c.num_rows, bs);
      ASSERT_NE(c.src, c.dst);
      for (int32_t r = 0; r < c.num_rows; ++r) {
        storage_[int64_t{c.dst} * bs + r] = storage_[int64_t{c.src} * bs + r];
      }
    }
  }

  // The backend's part: write rows [from, to) of `id` through its block table.
  void WriteRows(SequenceId id, int32_t from, int32_t to) {
    const int32_t bs = cfg_.block_size;
    auto table = cache_->BlockTable(id);
    const ModelSeq& m = seqs_.at(id);
    for (int32_t p = from; p < to; ++p) {
      storage_[int64_t{table[p / bs]} * bs + p % bs] = m.values[p];
    }
  }

  int32_t NaiveHit(int root, const std::vector<uint32_t>& prompt) const {
    size_t best = 0;
    for (const Prefix& e : model_cached_) {
      if (e.first != root) continue;
      size_t n = 0;
      while (n < e.second.size() && n < prompt.size() && e.second[n] == prompt[n]) ++n;
      best = std::max(best, n);
    }
    return static_cast<int32_t>(std::min(best, prompt.size() - 1));
  }

  void AddComputedPrefixes(const ModelSeq& m) {
    if (!cfg_.prefix_cache) return;
    const int32_t bs = cfg_.block_size;
    for (int32_t len = bs; len <= m.computed; len += bs) {
      model_cached_.insert(
          {m.root, std::vector<uint32_t>(m.tokens.begin(), m.tokens.begin() + len)});
    }
  }

  void OpAdmit() {
    if (seqs_.size() >= 8) return OpRelease();
    ModelSeq m;
    // Usually extend a prefix of an earlier prompt, so that hits and partial hits happen.
    if (!history_.empty() && rng_() % 4 != 0) {
      const auto& h = history_[rng_() % history_.size()];
      m.tokens.assign(h.second.begin(), h.second.begin() + rng_() % (h.second.size() + 1));
    }
    auto extra = RandomTokens(rng_() % 8 + (m.tokens.empty() ? 1 : 0));
    m.tokens.insert(m.tokens.end(), extra.begin(), extra.end());
    if (m.tokens.size() > 24) m.tokens.resize(24);
    RecomputeValues(m);
    history_.push_back({m.root, m.tokens});
    if (history_.size() > 32) history_.erase(history_.begin());

    AdmissionRequest r;
    r.chain = std::make_shared<TokenChain>(roots_[m.root], cfg_.block_size, m.tokens);
    const int32_t p = static_cast<int32_t>(m.tokens.size());
    r.reserve_tokens = static_cast<int32_t>(rng_() % (p + 1));
    r.reserve_uncached_tokens = static_cast<int32_t>(rng_() % 6);
    r.readmission = rng_() % 5 == 0;
    r.tenant = m.root;
    if (cfg_.tenant_share >= 0 && rng_() % 3 == 0) r.retain_until = now_ + rng_() % 50 + 1;

    const int32_t expect_hit = cfg_.prefix_cache ? NaiveHit(m.root, m.tokens) : 0;
    const KvCacheStats before = cache_->Stats();
    const std::string state = KvCacheTestPeer::DebugState(*cache_);
    auto plan = cache_->PlanAdmission(r);
    ASSERT_EQ(KvCacheTestPeer::DebugState(*cache_), state) << "PlanAdmission changed the state";
    auto allocate_for = [&](int32_t hit) -> int64_t {
      const int64_t cap_blocks =
          (std::max({r.reserve_tokens, hit + r.reserve_uncached_tokens, hit + 1}) +
           cfg_.block_size - 1) /
          cfg_.block_size;
      return cap_blocks - hit / cfg_.block_size;
    };
    // A match that ends inside a block may fall back to its whole blocks when the copy
    // source would need a block the pool cannot spare (the rows are computed instead).
    const int32_t whole_blocks_hit = expect_hit - expect_hit % cfg_.block_size;
    if (!plan.ok()) {
      ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
      ASSERT_GT(allocate_for(whole_blocks_hit), before.blocks_free)
          << "refused although free blocks sufficed";
      return;
    }
    if (plan->num_cached != expect_hit) {
      ASSERT_EQ(plan->num_cached, whole_blocks_hit) << "hit length differs from the naive model";
      // Only under pressure: the copy source costs at most one block, and every free block
      // is available.
      ASSERT_GE(allocate_for(expect_hit), before.blocks_free) << "partial copy dropped needlessly";
      ++partial_copies_dropped_;
    }
    const int64_t allocate = allocate_for(plan->num_cached);
    ASSERT_LE(allocate, before.blocks_free + before.blocks_cached);
    ASSERT_EQ(plan->blocks_to_allocate, allocate);
    Admission a = cache_->Commit(*plan);
    ASSERT_EQ(a.num_cached, plan->num_cached);
    ExecuteCopies(a.copies);
    ASSERT_GE(cache_->Capacity(a.seq), std::min(r.reserve_tokens, p));
    m.computed = a.num_cached;
    const KvCacheStats after = cache_->Stats();
    ASSERT_EQ(after.queried_tokens - before.queried_tokens, r.readmission ? 0u : uint64_t(p));
    ASSERT_EQ(after.hit_tokens - before.hit_tokens, r.readmission ? 0u : uint64_t(a.num_cached));
    ASSERT_EQ(after.evictions - before.evictions, uint64_t(plan->blocks_to_evict));
    seqs_[a.seq] = std::move(m);
  }

  // Reserves rows up to `to`, writes [computed, to) and marks them computed.
  void ComputeTo(SequenceId id, int32_t to) {
    ModelSeq& m = seqs_.at(id);
    const std::string state = KvCacheTestPeer::DebugState(*cache_);
    auto copies = cache_->Reserve(id, to);
    if (!copies.ok()) {
      ASSERT_EQ(copies.status().code(), absl::StatusCode::kResourceExhausted);
      ASSERT_EQ(KvCacheTestPeer::DebugState(*cache_), state) << "failed Reserve changed the state";
      return;
    }
    ExecuteCopies(*copies);
    SyncEvictions();  // before MarkComputed may index an evicted prefix again
    ASSERT_GE(cache_->Capacity(id), to);
    WriteRows(id, m.computed, to);
    cache_->MarkComputed(id, to);
    m.computed = to;
    AddComputedPrefixes(m);
  }

  void OpCompute() {
    const SequenceId id = PickSeq();
    const ModelSeq& m = seqs_.at(id);
    const int32_t n = static_cast<int32_t>(m.tokens.size());
    if (m.computed == n) return OpDecode();
    ComputeTo(id, m.computed + 1 + static_cast<int32_t>(rng_() % (n - m.computed)));
  }

  void OpDecode() {
    const SequenceId id = PickSeq();
    ModelSeq& m = seqs_.at(id);
    if (m.tokens.size() >= 40) return OpTruncate();
    if (m.computed < static_cast<int32_t>(m.tokens.size())) {
      return ComputeTo(id, static_cast<int32_t>(m.tokens.size()));
    }
    const uint32_t t = RandomTokens(1)[0];
    cache_->AppendTokens(id, {t});
    m.tokens.push_back(t);
    RecomputeValues(m);
    ComputeTo(id, static_cast<int32_t>(m.tokens.size()));
  }

  void OpFork() {
    if (seqs_.size() >= 8) return OpRelease();
    const SequenceId id = PickSeq();
    const int32_t n = 1 + static_cast<int32_t>(rng_() % 3);
    for (SequenceId child : testing::ForkCopies(*cache_, id, n)) seqs_[child] = seqs_.at(id);
  }

  void OpTruncate() {
    const SequenceId id = PickSeq();
    ModelSeq& m = seqs_.at(id);
    const int32_t k = static_cast<int32_t>(rng_() % (m.tokens.size() + 1));
    cache_->Truncate(id, k);
    m.tokens.resize(k);
    m.values.resize(k);
    m.computed = std::min(m.computed, k);
    if (k == 0) {  // an empty sequence has nothing left to do
      cache_->Release(id);
      seqs_.erase(id);
    }
  }

  void OpRelease() {
    const SequenceId id = PickSeq();
    cache_->Release(id);
    seqs_.erase(id);
  }

  void OpEvict() {
    const int64_t cached = cache_->Stats().blocks_cached;
    const int32_t n = 1 + static_cast<int32_t>(rng_() % 3);
    ASSERT_EQ(cache_->Evict(n), std::min<int64_t>(n, cached));
  }

  // Reads the index, checking each indexed block's rows; prefixes gone from it since the
  // last call must be legal evictions, and are dropped from the model.
  std::set<Prefix> SyncEvictions() {
    const int32_t bs = cfg_.block_size;
    std::set<Prefix> actual;
    for (const IndexedBlockInfo& info : KvCacheTestPeer::IndexedBlocks(*cache_)) {
      int root = 0;
      while (roots_[root] != info.root) ++root;
      for (int32_t r = 0; r < bs; ++r) {  // an indexed block's rows hold its prefix's values
        const size_t p = info.tokens.size() - bs + r;
        EXPECT_EQ(storage_[int64_t{info.block} * bs + r], ValueOf(root, info.tokens, p))
            << "indexed block " << info.block;
      }
      actual.insert({root, info.tokens});
    }
    uint64_t removed = 0;
    for (auto it = model_cached_.begin(); it != model_cached_.end();) {
      if (actual.contains(*it)) {
        ++it;
        continue;
      }
      const Prefix& x = *it;
      for (const auto& [id, m] : seqs_) {
        const bool holds = m.root == x.first &&
                           m.computed >= static_cast<int32_t>(x.second.size()) &&
                           std::equal(x.second.begin(), x.second.end(), m.tokens.begin());
        EXPECT_FALSE(holds) << "evicted a prefix that sequence " << id << " has computed";
      }
      for (const Prefix& y : actual) {
        const bool extends = y.first == x.first && y.second.size() > x.second.size() &&
                             std::equal(x.second.begin(), x.second.end(), y.second.begin());
        EXPECT_FALSE(extends) << "evicted a parent before its cached child";
      }
      ++removed;
      it = model_cached_.erase(it);
    }
    const uint64_t evictions = cache_->Stats().evictions;
    EXPECT_EQ(evictions - last_evictions_, removed);
    last_evictions_ = evictions;
    return actual;
  }

  void Verify() {
    if (::testing::Test::HasFailure()) return;
    cache_->CheckInvariants();
    const int32_t bs = cfg_.block_size;
    // Fake storage: every computed row of every sequence holds its prefix's value.
    for (const auto& [id, m] : seqs_) {
      ASSERT_EQ(cache_->NumComputed(id), m.computed);
      ASSERT_EQ(cache_->NumTokens(id), static_cast<int32_t>(m.tokens.size()));
      auto table = cache_->BlockTable(id);
      for (int32_t p = 0; p < m.computed; ++p) {
        ASSERT_EQ(storage_[int64_t{table[p / bs]} * bs + p % bs], m.values[p])
            << "sequence " << id << " row " << p;
      }
    }
    std::set<Prefix> actual = SyncEvictions();
    ASSERT_EQ(actual, model_cached_) << "index holds prefixes no sequence computed";
  }

 public:
  // What the run exercised, so that a change that stops producing hits, copies or evictions
  // shows up in the log.
  std::string Summary() const {
    const KvCacheStats st = cache_->Stats();
    return "queried=" + std::to_string(st.queried_tokens) +
           " hit=" + std::to_string(st.hit_tokens) + " cow=" + std::to_string(st.cow_copies) +
           " evictions=" + std::to_string(st.evictions) +
           " partial_copies_dropped=" + std::to_string(partial_copies_dropped_);
  }
  int step_ = 0;
  int partial_copies_dropped_ = 0;

 private:
  Config cfg_;
  std::mt19937_64 rng_;
  int64_t now_ = 0;
  std::unique_ptr<KvCache> cache_;
  std::vector<Digest> roots_;
  std::vector<uint64_t> storage_;
  std::map<SequenceId, ModelSeq> seqs_;
  std::set<Prefix> model_cached_;
  std::vector<Prefix> history_;
  uint64_t last_evictions_ = 0;
};

#if defined(__SANITIZE_ADDRESS__)
// ASan + UBSan make each step ~6x slower; half the operations keep the CI's sanitizer pass
// near 10 s while the normal build runs all of them.
constexpr int kDefaultOps = 50000;
#else
constexpr int kDefaultOps = 100000;
#endif

int TotalOps() {
  const char* env = std::getenv("PREFIXD_CACHE_RANDOM_OPS");
  return env != nullptr ? std::atoi(env) : kDefaultOps;
}

TEST(KvCacheRandomTest, MatchesNaiveModel) {
  const Config configs[] = {{24, 4, true},  {8, 4, true},     {16, 2, true},   {12, 1, true},
                            {24, 4, false}, {24, 4, true, 3}, {16, 2, true, 0}};
  std::vector<uint64_t> seeds;
  if (const char* s = std::getenv("PREFIXD_CACHE_SEED")) {
    seeds.push_back(std::strtoull(s, nullptr, 10));
  } else {
    for (uint64_t i = 1; i <= 20; ++i) seeds.push_back(i * 7919);
  }
  const int ops_per_seed = std::max<int>(1, TotalOps() / static_cast<int>(seeds.size()));
  for (size_t i = 0; i < seeds.size(); ++i) {
    const Config& c = configs[seeds[i] % std::size(configs)];
    // Printed first, so that even a PREFIXD_CHECK abort names the seed.
    std::fprintf(stderr, "seed=%llu blocks=%d block_size=%d prefix_cache=%d share=%lld ops=%d\n",
                 static_cast<unsigned long long>(seeds[i]), c.num_blocks, c.block_size,
                 c.prefix_cache, static_cast<long long>(c.tenant_share), ops_per_seed);
    RandomRun run(c, seeds[i]);
    run.Run(ops_per_seed);
    std::fprintf(stderr, "  %s\n", run.Summary().c_str());
    ASSERT_FALSE(::testing::Test::HasFailure())
        << "seed=" << seeds[i] << " step=" << run.step_
        << " (rerun with PREFIXD_CACHE_SEED=" << seeds[i] << ")";
  }
}

}  // namespace
}  // namespace prefixd
