// Fair admission (engine/scheduler.h step 2, engine/fair_share.h) driven step by step: the
// prefill budget goes to tenants by weight, a quiet tenant's request goes before a flood's
// earlier ones, and outputs equal solo runs. Prompts of one step's budget with one token to
// generate make each request finish in the step that computes its prompt's last chunk, so
// the order of kDone is the order of service.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "cache/block_key.h"
#include "cache/kv_cache.h"
#include "engine/request_stream.h"
#include "engine/scheduler.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/fake_backend.h"

namespace prefixd {
namespace {

constexpr int32_t kVocab = 64;
constexpr int32_t kBlockSize = 4;

TenantPolicy Weighted(const std::string& name, uint32_t weight) {
  TenantPolicy p;
  p.name = name;
  p.weight = weight;
  return p;
}

class SchedulerFairTest : public ::testing::Test {
 protected:
  void Init(int32_t max_batch_tokens, std::vector<TenantPolicy> tenants = {},
            int32_t num_blocks = kBlocks) {
    pending_.clear();
    backend_ = std::make_unique<FakeBackend>(num_blocks, kBlockSize, kVocab);
    cache_ = MakeCache(num_blocks);
    scheduler_ = MakeScheduler(backend_.get(), cache_.get(), max_batch_tokens, std::move(tenants));
  }

  std::unique_ptr<KvCache> MakeCache(int32_t num_blocks = kBlocks) {
    KvCacheOptions c;
    c.pool.num_blocks = num_blocks;
    c.pool.block_size = kBlockSize;
    c.pool.bytes_per_token = 8;
    return *KvCache::Create(c);
  }

  std::unique_ptr<Scheduler> MakeScheduler(FakeBackend* backend, KvCache* cache,
                                           int32_t max_batch_tokens,
                                           std::vector<TenantPolicy> tenants) {
    ModelConfig config;
    config.n_positions = 1024;
    config.vocab_size = kVocab;
    config.eos_token_id = kVocab - 1;
    return std::make_unique<Scheduler>(
        SchedulerOptions{.backend = backend,
                         .cache = cache,
                         .model_config = config,
                         .max_batch_tokens = max_batch_tokens,
                         .clock = [this] { return absl::UnixEpoch() + absl::Seconds(++ticks_); },
                         .tenants = std::move(tenants)});
  }

  static std::unique_ptr<RequestState> Request(const std::string& tenant, int prompt_len,
                                               uint32_t first) {
    auto r = std::make_unique<RequestState>();
    for (int i = 0; i < prompt_len; ++i) {
      r->request.prompt.push_back((first + static_cast<uint32_t>(i)) % (kVocab - 1));
    }
    r->request.max_new_tokens = 1;
    r->request.ignore_eos = true;
    r->request.tenant = tenant;
    r->root = CacheRootKey("manifest", CacheNamespace(tenant, ""));
    r->stream = std::make_shared<RequestStream>(nullptr);
    return r;
  }

  // Queues a request; `label` names it in Order().
  void Add(const std::string& tenant, int prompt_len, uint32_t first, char label) {
    auto r = Request(tenant, prompt_len, first);
    Pending p;
    p.label = label;
    p.stream = r->stream;
    p.tenant = tenant;
    p.prompt_len = prompt_len;
    p.first = first;
    pending_.push_back(std::move(p));
    scheduler_->Enqueue(std::move(r));
  }

  // Steps until idle; the labels in the order the requests ended (ties: order added).
  std::string RunToEnd() {
    std::string order;
    for (int steps = 0; !scheduler_->idle() && steps < 1000; ++steps) StepOnce(&order);
    EXPECT_TRUE(scheduler_->idle());
    return order;
  }

  // One step; the labels of the requests it ended are appended to *order.
  void StepOnce(std::string* order) {
    scheduler_->Step();
    scheduler_->FlushEvents();
    cache_->CheckInvariants();
    for (Pending& p : pending_) {
      if (p.done) continue;
      std::vector<RequestEvent> events;
      p.stream->Poll(&events);
      for (const RequestEvent& e : events) p.done |= !ApplyEvent(e, &p.result);
      if (p.done) order->push_back(p.label);
    }
  }

  // Each request's output equals the same request run alone in a fresh scheduler.
  void ExpectSoloOutputs() {
    for (const Pending& p : pending_) {
      SCOPED_TRACE(p.label);
      ASSERT_TRUE(p.done && p.result.status.ok()) << p.result.status;
      FakeBackend backend(kBlocks, kBlockSize, kVocab);
      std::unique_ptr<KvCache> cache = MakeCache();
      std::unique_ptr<Scheduler> solo = MakeScheduler(&backend, cache.get(), 64, {});
      auto r = Request(p.tenant, p.prompt_len, p.first);
      std::shared_ptr<RequestStream> stream = r->stream;
      solo->Enqueue(std::move(r));
      for (int steps = 0; !solo->idle() && steps < 100; ++steps) {
        solo->Step();
        solo->FlushEvents();
      }
      RequestResult alone;
      std::vector<RequestEvent> events;
      stream->Poll(&events);
      for (const RequestEvent& e : events) ApplyEvent(e, &alone);
      ASSERT_TRUE(alone.status.ok());
      EXPECT_EQ(p.result.samples, alone.samples);
    }
  }

  static constexpr int32_t kBlocks = 64;
  struct Pending {
    char label = 0;
    std::shared_ptr<RequestStream> stream;
    std::string tenant;
    int prompt_len = 0;
    uint32_t first = 0;
    bool done = false;
    RequestResult result;
  };
  std::unique_ptr<FakeBackend> backend_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<Pending> pending_;
  int64_t ticks_ = 0;
};

// One 4-token prompt per step. Tenant `a` (weight 3, all queued first) and `b` (weight 1):
// services a = 4/3 per request, b = 4. The first tie goes to a (earlier arrival), then b is
// behind, then a three times to b's once, ties to a; b's rest once a has none left.
TEST_F(SchedulerFairTest, WeightsShareThePrefillBudget) {
  Init(/*max_batch_tokens=*/4, {Weighted("a", 3)});
  for (uint32_t i = 0; i < 8; ++i) Add("a", 4, 1 + 4 * i, 'a');
  for (uint32_t i = 0; i < 8; ++i) Add("b", 4, 33 + 4 * i, 'b');
  const std::string order = RunToEnd();
  EXPECT_EQ(order, "abaaabaaababbbbb");
  // While both had work (the first 11 steps), a got 8 x 4 tokens, b 3 x 4.
  EXPECT_EQ(order.substr(0, 11), "abaaabaaaba");
  ExpectSoloOutputs();
}

// Equal weights alternate (ties by arrival); the same queue after SetTenantPolicies gives a
// weight 3 at once.
TEST_F(SchedulerFairTest, EqualWeightsAlternateAndAPolicyReloadReweighs) {
  Init(/*max_batch_tokens=*/4);
  for (uint32_t i = 0; i < 4; ++i) Add("a", 4, 1 + 4 * i, 'a');
  for (uint32_t i = 0; i < 4; ++i) Add("b", 4, 33 + 4 * i, 'b');
  EXPECT_EQ(RunToEnd(), "abababab");

  Init(/*max_batch_tokens=*/4);
  for (uint32_t i = 0; i < 8; ++i) Add("a", 4, 1 + 4 * i, 'a');
  for (uint32_t i = 0; i < 8; ++i) Add("b", 4, 33 + 4 * i, 'b');
  scheduler_->SetTenantPolicies({Weighted("a", 3)});
  EXPECT_EQ(RunToEnd().substr(0, 11), "abaaabaaaba");
}

// A flood of six 8-token prompts, then one quiet request; 4 tokens a step, so each prompt
// takes two chunks. Step 1: the flood's first chunk (tie, earlier arrival). Step 2: the quiet
// tenant is behind: admitted before the flood's five queued requests, and before the flood's
// running prefill gets its second chunk. Step 3: tie again, the flood's older request ends.
// Step 4: the quiet request ends. Then the flood in order.
TEST_F(SchedulerFairTest, AQuietRequestIsAdmittedBeforeAFloodsEarlierOnes) {
  Init(/*max_batch_tokens=*/4);
  for (uint32_t i = 0; i < 6; ++i) Add("noisy", 8, 1 + 8 * i, static_cast<char>('1' + i));
  Add("quiet", 8, 50, 'q');
  EXPECT_EQ(RunToEnd(), "1q23456");
  const auto& rec = backend_->recorded();
  ASSERT_GE(rec.size(), 4u);
  using Rec = FakeBackend::StepRecord;
  EXPECT_EQ(rec[0], (std::vector<Rec>{{0, 4, false}}));
  EXPECT_EQ(rec[1], (std::vector<Rec>{{0, 4, false}}));  // the quiet request's first chunk
  EXPECT_EQ(rec[2], (std::vector<Rec>{{4, 4, true}}));
  EXPECT_EQ(rec[3], (std::vector<Rec>{{4, 4, true}}));
  ExpectSoloOutputs();
}

// Tenant a's prompt is cached (all but its last token: one token to compute) and a sends it
// again every step; tenant b's 32-token prompt prefills meanwhile, 8 tokens a step. A cached
// request sets aside only what it computes, so b's chunks take the rest of every step (8 + 6
// + 7 + 7 + 4: its answer in the fifth step). Before, a cached request set aside its whole
// prompt (16 tokens: the step's budget) whenever a was behind, which left b nothing in
// those steps (b had 24 of its 32 tokens after 20 steps).
TEST_F(SchedulerFairTest, ACachedRequestSetsAsideOnlyWhatItComputes) {
  Init(/*max_batch_tokens=*/8);
  Add("a", 16, 1, 'p');
  ASSERT_EQ(RunToEnd(), "p");
  Add("b", 32, 33, 'b');
  const size_t b = pending_.size() - 1;
  int steps = 0;
  std::string order;
  while (!pending_[b].done && steps < 20) {
    Add("a", 16, 1, 'a');
    StepOnce(&order);
    ++steps;
  }
  EXPECT_EQ(steps, 5) << order;
  // From b's first step on: b's chunks and a's one-token admissions (two in the second step:
  // the one that waited behind b's first chunk, and that step's).
  using Rec = FakeBackend::StepRecord;
  const auto& rec = backend_->recorded();
  ASSERT_GE(rec.size(), 7u);
  EXPECT_EQ(rec[2], (std::vector<Rec>{{0, 8, false}}));
  EXPECT_EQ(rec[3], (std::vector<Rec>{{8, 6, false}, {15, 1, true}, {15, 1, true}}));
  EXPECT_EQ(rec[4], (std::vector<Rec>{{14, 7, false}, {15, 1, true}}));
  EXPECT_EQ(rec[5], (std::vector<Rec>{{21, 7, false}, {15, 1, true}}));
  EXPECT_EQ(rec[6], (std::vector<Rec>{{28, 4, true}, {15, 1, true}}));
  RunToEnd();
  ExpectSoloOutputs();
}

// An 8-block pool: a's 24-token prompt holds 6 blocks while it prefills, 8 tokens a step,
// so b's 12-token prompt (3 blocks) finds no room until a's request ends. From the second
// step b is behind. A request out of room sets nothing aside: its admission computes
// nothing this step. Before, b's turn set aside its whole prompt (the step's budget) every
// step, so a's prefill never got a chunk, never ended and never freed the room b waited
// for: no batch ever formed again.
TEST_F(SchedulerFairTest, ARequestOutOfRoomDoesNotKeepTheBudgetFromAPrefillThatFreesIt) {
  Init(/*max_batch_tokens=*/8, {}, /*num_blocks=*/8);
  Add("a", 24, 1, 'a');
  Add("b", 12, 33, 'b');
  EXPECT_EQ(RunToEnd(), "ab");
  using Rec = FakeBackend::StepRecord;
  const auto& rec = backend_->recorded();
  ASSERT_EQ(rec.size(), 5u);
  EXPECT_EQ(rec[1], (std::vector<Rec>{{8, 8, false}}));
  EXPECT_EQ(rec[2], (std::vector<Rec>{{16, 8, true}}));
  EXPECT_EQ(rec[3], (std::vector<Rec>{{0, 8, false}}));
  ExpectSoloOutputs();
}

// One tenant: arrival order, the budget filled in order (running chunk first, then
// admissions) as without tenants.
TEST_F(SchedulerFairTest, ALoneTenantIsServedInArrivalOrder) {
  Init(/*max_batch_tokens=*/6);
  for (uint32_t i = 0; i < 4; ++i) Add("solo", 4, 1 + 4 * i, static_cast<char>('1' + i));
  EXPECT_EQ(RunToEnd(), "1234");
  using Rec = FakeBackend::StepRecord;
  const auto& rec = backend_->recorded();
  ASSERT_EQ(rec.size(), 3u);
  EXPECT_EQ(rec[0], (std::vector<Rec>{{0, 4, true}, {0, 2, false}}));
  EXPECT_EQ(rec[1], (std::vector<Rec>{{2, 2, true}, {0, 4, true}}));
  EXPECT_EQ(rec[2], (std::vector<Rec>{{0, 4, true}}));
  ExpectSoloOutputs();
}

}  // namespace
}  // namespace prefixd
