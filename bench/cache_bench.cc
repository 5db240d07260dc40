// Cache bookkeeping cost per operation: admission of a 1,024-token prompt with 90%
// cached, one decode step (append + reserve + mark computed), fork of 8, release, and the
// chain-key hash per token. Goal: well under 1% of a CPU decode step of GPT-2 small (~20 ms)
// and under 5 us per sequence per step. Pool: 4,096 blocks of 16 tokens, GPT-2 small fp16.
#include <memory>
#include <numeric>
#include <vector>

#include "benchmark/benchmark.h"
#include "cache/block_key.h"
#include "base/check.h"
#include "cache/kv_cache.h"
#include "cache/token_chain.h"
#include "cache/kv_layout.h"

namespace prefixd {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kPrompt = 1024;
constexpr int32_t kCachedPrefix = 928;  // 58 blocks = 90.6% of the prompt

std::unique_ptr<KvCache> MakeCache() {
  KvCacheOptions o;
  o.pool.num_blocks = 4096;
  o.pool.block_size = kBlockSize;
  o.pool.bytes_per_token = KvBytesPerToken(12, 12, 64, 2);
  return std::move(*KvCache::Create(o));
}

const Digest& Root() {
  static const Digest root = CacheRootKey("bench-manifest", CacheNamespace("tenant", ""));
  return root;
}

// Copies of seq's chain for Fork, as the engine makes them (not timed apart: part of a fork).
std::vector<std::shared_ptr<TokenChain>> ChainCopies(const KvCache& cache, SequenceId seq, int n) {
  std::vector<std::shared_ptr<TokenChain>> chains;
  for (int i = 0; i < n; ++i) chains.push_back(std::make_shared<TokenChain>(cache.Chain(seq)));
  return chains;
}

std::vector<uint32_t> Tokens(int32_t n, uint32_t start) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

SequenceId AdmitComputed(KvCache& cache, const std::vector<uint32_t>& prompt) {
  AdmissionRequest r;
  r.chain = std::make_shared<TokenChain>(Root(), kBlockSize, prompt);
  r.reserve_tokens = static_cast<int32_t>(prompt.size());
  auto a = cache.Admit(r);
  PREFIXD_CHECK(a.ok());
  cache.MarkComputed(a->seq, static_cast<int32_t>(prompt.size()));
  return a->seq;
}

// A 1,024-token prompt whose first 928 tokens are cached: match, share 58 blocks, allocate 6
// (the uncached part is not computed, so the state is the same after every iteration).
void BM_Admit1024Cached90(benchmark::State& state) {
  auto cache = MakeCache();
  std::vector<uint32_t> cached = Tokens(kCachedPrefix, 0);
  cache->Release(AdmitComputed(*cache, cached));
  std::vector<uint32_t> prompt = cached;
  for (uint32_t t : Tokens(kPrompt - kCachedPrefix, 100000)) prompt.push_back(t);
  AdmissionRequest r;
  r.chain = std::make_shared<TokenChain>(Root(), kBlockSize, prompt);
  r.reserve_tokens = kPrompt;
  for (auto _ : state) {
    auto a = cache->Admit(r);
    benchmark::DoNotOptimize(a);
    state.PauseTiming();
    PREFIXD_CHECK(a.ok() && a->num_cached == kCachedPrefix);
    cache->Release(a->seq);
    state.ResumeTiming();
  }
}
BENCHMARK(BM_Admit1024Cached90);

// Release of a sequence of 1,024 computed tokens, all of its 64 blocks indexed (they become
// cached and evictable).
void BM_Release1024(benchmark::State& state) {
  auto cache = MakeCache();
  std::vector<uint32_t> prompt = Tokens(kPrompt, 0);
  cache->Release(AdmitComputed(*cache, prompt));
  AdmissionRequest r;
  r.chain = std::make_shared<TokenChain>(Root(), kBlockSize, prompt);
  r.reserve_tokens = kPrompt;
  for (auto _ : state) {
    state.PauseTiming();
    auto a = cache->Admit(r);
    PREFIXD_CHECK(a.ok());
    cache->MarkComputed(a->seq, kPrompt);
    state.ResumeTiming();
    cache->Release(a->seq);
  }
}
BENCHMARK(BM_Release1024);

// One decode step of a running sequence: AppendTokens + Reserve + MarkComputed (a block is
// allocated, and later hashed and indexed, every 16 steps).
void BM_DecodeStep(benchmark::State& state) {
  auto cache = MakeCache();
  SequenceId seq = AdmitComputed(*cache, Tokens(kPrompt, 0));
  uint32_t next = 1u << 20;
  int64_t steps = 0;
  for (auto _ : state) {
    const uint32_t t = next++;
    cache->AppendTokens(seq, {&t, 1});
    const int32_t n = cache->NumTokens(seq);
    auto copies = cache->Reserve(seq, n);
    benchmark::DoNotOptimize(copies);
    cache->MarkComputed(seq, n);
    if (++steps % 1024 == 0) {  // keep the sequence at 1-2k tokens
      state.PauseTiming();
      cache->Truncate(seq, kPrompt);
      cache->Evict(1 << 20);
      state.ResumeTiming();
    }
  }
}
BENCHMARK(BM_DecodeStep);

// Fork of 8 children from a 1,024-token sequence (shared blocks only), then their release.
void BM_Fork8AndRelease(benchmark::State& state) {
  auto cache = MakeCache();
  SequenceId seq = AdmitComputed(*cache, Tokens(kPrompt - 3, 0));
  for (auto _ : state) {
    std::vector<SequenceId> kids = cache->Fork(seq, ChainCopies(*cache, seq, 8));
    for (SequenceId k : kids) cache->Release(k);
  }
}
BENCHMARK(BM_Fork8AndRelease);

// The first decode step of 8 forked children: each copies the shared partial block.
void BM_Fork8FirstWrite(benchmark::State& state) {
  auto cache = MakeCache();
  SequenceId seq = AdmitComputed(*cache, Tokens(kPrompt - 3, 0));
  for (auto _ : state) {
    std::vector<SequenceId> kids = cache->Fork(seq, ChainCopies(*cache, seq, 8));
    for (SequenceId k : kids) {
      const uint32_t t = static_cast<uint32_t>(k);
      cache->AppendTokens(k, {&t, 1});
      auto copies = cache->Reserve(k, kPrompt - 2);
      benchmark::DoNotOptimize(copies);
      cache->MarkComputed(k, kPrompt - 2);
    }
    for (SequenceId k : kids) cache->Release(k);
  }
}
BENCHMARK(BM_Fork8FirstWrite);

// Cold admission of a new 1,024-token prompt, its prefill (64 blocks hashed at admission,
// indexed as computed) and release, in a full pool: includes evicting 64 blocks.
void BM_ColdPrefill1024(benchmark::State& state) {
  auto cache = MakeCache();
  uint32_t base = 0;
  for (auto _ : state) {
    SequenceId s = AdmitComputed(*cache, Tokens(kPrompt, base));
    base += kPrompt;
    cache->Release(s);
  }
  state.counters["evictions"] = static_cast<double>(cache->Stats().evictions);
}
BENCHMARK(BM_ColdPrefill1024);

// One scheduler step's admission pass over 1,000 waiting requests that all wait for the
// same prefix: a running sequence is computing its 960 tokens (60 blocks, registered as
// pending), and each waiting 1,024-token prompt is that prefix plus 64 tokens of its own, so
// every plan reports pending_match_tokens > 0 and the request is skipped. The scheduler plans
// each of them again on every step until the prefix is indexed; what a plan reads of a
// prompt is its chain, hashed once when the request was queued.
void BM_Plan1000Waiting(benchmark::State& state) {
  constexpr int kWaiting = 1000;
  constexpr int32_t kShared = 960;
  auto cache = MakeCache();
  const std::vector<uint32_t> prefix = Tokens(kShared, 0);
  AdmissionRequest running;
  running.chain = std::make_shared<TokenChain>(Root(), kBlockSize, prefix);
  running.reserve_tokens = kShared;
  PREFIXD_CHECK(cache->Admit(running).ok());  // reserved, not computed: pending
  // Each waiting request keeps its chain (hashed once, when it was queued).
  std::vector<std::shared_ptr<TokenChain>> waiting;
  for (int i = 0; i < kWaiting; ++i) {
    std::vector<uint32_t> prompt = prefix;
    for (uint32_t t : Tokens(kPrompt - kShared, 100000 + 64 * i)) prompt.push_back(t);
    waiting.push_back(std::make_shared<TokenChain>(Root(), kBlockSize, prompt));
  }
  for (auto _ : state) {
    for (const std::shared_ptr<TokenChain>& chain : waiting) {
      AdmissionRequest r;
      r.chain = chain;
      r.reserve_tokens = kPrompt;
      auto plan = cache->PlanAdmission(r);
      PREFIXD_CHECK(plan.ok() && plan->pending_match_tokens == kShared);
      benchmark::DoNotOptimize(plan);
    }
  }
  state.SetItemsProcessed(state.iterations() * kWaiting);
}
BENCHMARK(BM_Plan1000Waiting)->Unit(benchmark::kMillisecond);

// The chain-key hash: one SHA-256 over 32 + 64 bytes per block of 16 tokens.
void BM_ChainKeyPerToken(benchmark::State& state) {
  Digest key = Root();
  std::vector<uint32_t> block = Tokens(kBlockSize, 7);
  for (auto _ : state) {
    key = ChainKey(key, block);
    benchmark::DoNotOptimize(key);
  }
  state.SetItemsProcessed(state.iterations() * kBlockSize);
}
BENCHMARK(BM_ChainKeyPerToken);

}  // namespace
}  // namespace prefixd

BENCHMARK_MAIN();
