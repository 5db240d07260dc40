// The Scheduler driven step by step (no engine thread): exact batch composition, chunked
// prefill next to running decodes, preemption of the newest and its exact resumption.
#include "engine/scheduler.h"

#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "cache/block_key.h"
#include "cache/kv_cache.h"
#include "engine/request_stream.h"
#include "engine/score_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/fake_backend.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using Rec = FakeBackend::StepRecord;

constexpr int32_t kVocab = 64;

class SchedulerTest : public ::testing::Test {
 protected:
  void Init(int32_t blocks, int32_t block_size, int32_t max_batch_tokens) {
    backend_ = std::make_unique<FakeBackend>(blocks, block_size, kVocab);
    KvCacheOptions c;
    c.pool.num_blocks = blocks;
    c.pool.block_size = block_size;
    c.pool.bytes_per_token = 8;
    cache_ = *KvCache::Create(c);
    ModelConfig config;
    config.n_positions = 1024;
    config.vocab_size = kVocab;
    config.eos_token_id = kVocab - 1;
    scheduler_ = std::make_unique<Scheduler>(
        SchedulerOptions{.backend = backend_.get(),
                         .cache = cache_.get(),
                         .model_config = config,
                         .max_batch_tokens = max_batch_tokens,
                         .clock = [this] { return absl::UnixEpoch() + absl::Seconds(++ticks_); }});
  }

  std::shared_ptr<RequestStream> Add(int prompt_len, uint32_t max_new, uint32_t first = 1) {
    std::vector<uint32_t> prompt;
    for (int i = 0; i < prompt_len; ++i) prompt.push_back((first + i) % (kVocab - 1));
    return Add(std::move(prompt), max_new);
  }
  std::shared_ptr<RequestStream> Add(std::vector<uint32_t> prompt, uint32_t max_new) {
    auto r = std::make_unique<RequestState>();
    r->request.prompt = std::move(prompt);
    r->request.max_new_tokens = max_new;
    r->request.ignore_eos = true;
    r->root = CacheRootKey("manifest", "ns");
    r->stream = std::make_shared<RequestStream>(nullptr);
    auto stream = r->stream;
    scheduler_->Enqueue(std::move(r));
    return stream;
  }

  void Step() {
    scheduler_->Step();
    scheduler_->FlushEvents();
    cache_->CheckInvariants();
  }

  const std::vector<Rec>& LastBatch() const { return backend_->recorded().back(); }

  std::unique_ptr<FakeBackend> backend_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Scheduler> scheduler_;
  int64_t ticks_ = 0;
};

RequestResult Drain(RequestStream& s) {
  RequestResult out;
  std::vector<RequestEvent> events;
  s.Poll(&events);
  for (const RequestEvent& e : events) ApplyEvent(e, &out);
  return out;
}

TEST_F(SchedulerTest, LongPromptIsChunkedAndNeverStallsRunningDecodes) {
  Init(/*blocks=*/64, /*block_size=*/16, /*max_batch_tokens=*/32);
  auto a = Add(4, 20);
  Step();
  EXPECT_THAT(LastBatch(), ElementsAre(Rec{0, 4, true}));
  Step();
  EXPECT_THAT(LastBatch(), ElementsAre(Rec{4, 1, true}));
  auto b = Add(100, 2, 7);
  // Every step: A's decode first, then B's chunk from what is left of 32 tokens.
  Step();
  EXPECT_THAT(LastBatch(), ElementsAre(Rec{5, 1, true}, Rec{0, 31, false}));
  Step();
  EXPECT_THAT(LastBatch(), ElementsAre(Rec{6, 1, true}, Rec{31, 31, false}));
  Step();
  EXPECT_THAT(LastBatch(), ElementsAre(Rec{7, 1, true}, Rec{62, 31, false}));
  Step();
  EXPECT_THAT(LastBatch(), ElementsAre(Rec{8, 1, true}, Rec{93, 7, true}));
  Step();
  EXPECT_THAT(LastBatch(), ElementsAre(Rec{9, 1, true}, Rec{100, 1, true}));
  const RequestResult rb = Drain(*b);
  EXPECT_TRUE(rb.status.ok());
  EXPECT_EQ(rb.samples[0].ids.size(), 2u);
  EXPECT_EQ(scheduler_->counters().prefill_tokens, 104u);
}

TEST_F(SchedulerTest, PoolPressurePreemptsTheNewestWhichResumesExactly) {
  // 6 blocks of 4 tokens. A and B start with 8-token prompts (2 blocks each); as both grow,
  // the pool runs out and B (admitted last) is preempted, then resumes from its cached
  // prefix once A is done.
  Init(/*blocks=*/6, /*block_size=*/4, /*max_batch_tokens=*/64);
  auto a = Add(8, 12, 1);
  auto b = Add(8, 12, 20);
  uint64_t steps = 0;
  while (!scheduler_->idle() && steps < 100) {
    Step();
    ++steps;
  }
  ASSERT_TRUE(scheduler_->idle());
  EXPECT_GE(scheduler_->counters().preemptions, 1u);
  const auto& rec = backend_->recorded();
  EXPECT_THAT(rec[0], ElementsAre(Rec{0, 8, true}, Rec{0, 8, true}));
  const RequestResult ra = Drain(*a), rb = Drain(*b);
  ASSERT_TRUE(ra.status.ok() && rb.status.ok());
  // Outputs equal decoding alone from the reference logits.
  for (const auto& [result, first] : {std::pair{ra, 1u}, std::pair{rb, 20u}}) {
    std::vector<uint32_t> tokens;
    for (uint32_t i = 0; i < 8; ++i) tokens.push_back((first + i) % (kVocab - 1));
    for (uint32_t id : result.samples[0].ids) {
      const std::vector<float> logits = FakeBackend::ReferenceLogits(tokens, kVocab);
      EXPECT_EQ(id, std::max_element(logits.begin(), logits.end()) - logits.begin());
      tokens.push_back(id);
    }
    EXPECT_EQ(result.samples[0].ids.size(), 12u);
  }
  const KvCacheStats s = cache_->Stats();
  // B's re-admission hit its own cached blocks but is not a new query.
  EXPECT_EQ(s.queried_tokens, 16u);
  EXPECT_EQ(s.hit_tokens, 0u);
  EXPECT_EQ(s.blocks_active, 0);
  EXPECT_EQ(s.num_sequences, 0);
}

TEST_F(SchedulerTest, ForkComputesThePromptOnceAndCopiesTheSharedLastBlockOnWrite) {
  Init(/*blocks=*/32, /*block_size=*/4, /*max_batch_tokens=*/64);
  auto r = std::make_unique<RequestState>();
  r->request.prompt = {1, 2, 3, 4, 5, 6};  // the last block (rows 4..5) is partly filled
  r->request.max_new_tokens = 3;
  r->request.num_samples = 3;
  r->request.ignore_eos = true;
  r->request.sampling = {.temperature = 1.0f, .seed = 9};
  r->root = CacheRootKey("manifest", "ns");
  r->stream = std::make_shared<RequestStream>(nullptr);
  auto stream = r->stream;
  scheduler_->Enqueue(std::move(r));
  Step();
  EXPECT_THAT(LastBatch(), ElementsAre(Rec{0, 6, true}));  // one prefill
  const uint64_t copies_before = cache_->Stats().cow_copies;
  Step();
  // Three decodes at position 6; two of the three owners of the shared block copy it.
  EXPECT_THAT(LastBatch(), ElementsAre(Rec{6, 1, true}, Rec{6, 1, true}, Rec{6, 1, true}));
  EXPECT_EQ(cache_->Stats().cow_copies - copies_before, 2u);
  Step();
  ASSERT_TRUE(scheduler_->idle());
  const RequestResult got = Drain(*stream);
  ASSERT_TRUE(got.status.ok());
  ASSERT_EQ(got.samples.size(), 3u);
  for (const SampleResult& s : got.samples) EXPECT_EQ(s.ids.size(), 3u);
  EXPECT_EQ(got.usage.completion_tokens, 9u);
  EXPECT_EQ(scheduler_->counters().prefill_tokens, 6u);
}

TEST_F(SchedulerTest, WaitsOnlyForPrefixBlocksItCanUse) {
  Init(/*blocks=*/64, /*block_size=*/16, /*max_batch_tokens=*/256);
  Add(32, 1, 1);  // caches blocks 0 and 1 (tokens 1..32)
  Step();
  ASSERT_TRUE(scheduler_->idle());
  // Same 32 tokens + different 16-token suffixes: neither can use the other's third block,
  // so both are admitted in the same step from the cached 32 tokens.
  std::vector<uint32_t> other;
  for (uint32_t i = 0; i < 48; ++i) other.push_back(i < 32 ? 1 + i : 50);
  auto a = Add(48, 1, 1);
  auto b = Add(other, 1);
  Step();
  EXPECT_THAT(LastBatch(), ElementsAre(Rec{32, 16, true}, Rec{32, 16, true}));
  EXPECT_EQ(Drain(*a).usage.cached_prompt_tokens, 32u);
  EXPECT_EQ(Drain(*b).usage.cached_prompt_tokens, 32u);
  // Two identical 64-token prompts arriving together: the second waits while the first
  // computes the blocks it can reuse, then takes 63 tokens from the cache.
  auto c = Add(64, 1, 5);
  auto d = Add(64, 1, 5);
  Step();
  EXPECT_THAT(LastBatch(), ElementsAre(Rec{0, 64, true}));
  Step();
  EXPECT_THAT(LastBatch(), ElementsAre(Rec{63, 1, true}));
  EXPECT_EQ(Drain(*d).usage.cached_prompt_tokens, 63u);
  EXPECT_EQ(Drain(*c).usage.cached_prompt_tokens, 0u);
}

// A 4-block pool of 4 tokens and a 13-token prompt with prompt logprobs, asked twice: the
// first records its three full blocks' scores. The second may take 11 tokens from the pool
// (its last row is recomputed), 3 of them copied from the third block; with that cached
// source held the copy does not fit the pool, so it takes the first two blocks (8 tokens)
// and computes the rest: position 8's score is the third block's record. Its admission
// evicts that block (the pool is all it needs) and the record with it, so the records are
// taken before the Commit. Before, they were taken after it, and a PREFIXD_CHECK ended the
// process (the third block's record was gone).
TEST_F(SchedulerTest, ARecordScoringTheFirstComputedPositionIsTakenBeforeItsBlockIsEvicted) {
  constexpr int32_t kBlocks = 4, kBlockSize = 4;
  FakeBackend backend(kBlocks, kBlockSize, kVocab);
  ScoreStore scores;
  KvCacheOptions c;
  c.pool.num_blocks = kBlocks;
  c.pool.block_size = kBlockSize;
  c.pool.bytes_per_token = 8;
  c.on_evict = [&scores](const EvictedBlock& e) { scores.Forget(*e.key); };
  std::unique_ptr<KvCache> cache = *KvCache::Create(c);
  ModelConfig config;
  config.vocab_size = kVocab;
  config.eos_token_id = kVocab - 1;
  Scheduler scheduler(
      SchedulerOptions{.backend = &backend,
                       .cache = cache.get(),
                       .model_config = config,
                       .max_batch_tokens = 64,
                       .clock = [this] { return absl::UnixEpoch() + absl::Seconds(++ticks_); },
                       .scores = &scores});
  auto run = [&] {
    auto r = std::make_unique<RequestState>();
    for (uint32_t i = 0; i < 13; ++i) r->request.prompt.push_back(1 + i);
    r->request.max_new_tokens = 1;
    r->request.ignore_eos = true;
    r->request.prompt_logprobs = 2;
    r->root = CacheRootKey("manifest", "ns");
    r->stream = std::make_shared<RequestStream>(nullptr);
    auto stream = r->stream;
    scheduler.Enqueue(std::move(r));
    for (int steps = 0; !scheduler.idle() && steps < 10; ++steps) {
      scheduler.Step();
      scheduler.FlushEvents();
      cache->CheckInvariants();
    }
    EXPECT_TRUE(scheduler.idle());
    return Drain(*stream);
  };
  const RequestResult first = run();
  ASSERT_TRUE(first.status.ok()) << first.status;
  ASSERT_EQ(scores.size(), 3u);
  const RequestResult second = run();
  ASSERT_TRUE(second.status.ok()) << second.status;
  EXPECT_EQ(second.usage.cached_prompt_tokens, 8u);
  EXPECT_EQ(scheduler.counters().prompt_logprob_tokens_cached, 8u);
  ASSERT_EQ(second.prompt.size(), 13u);
  for (size_t p = 0; p < 13; ++p) {
    EXPECT_EQ(second.prompt[p].token_id, first.prompt[p].token_id) << p;
    EXPECT_EQ(second.prompt[p].logprob, first.prompt[p].logprob) << p;
  }
  EXPECT_EQ(second.samples, first.samples);
}

}  // namespace
}  // namespace prefixd
