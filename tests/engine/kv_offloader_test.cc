// The KvOffloader under a Scheduler driven step by step, on the CPU backend, a tiny random
// GPT-2 and a real disk tier whose reads are held back through its read seam
// (DiskTierOptions::read_hook): a request whose blocks are being read is parked while the
// others decode one token per step; a load that loses a block midway computes the rest; a
// parked request that is cancelled gives back everything it held. Then a third kind of tier,
// in memory, that the offloader knows only as a KvTier in its list: its blocks load like the
// others', and a load slower than computing its tokens is not waited for. Answers equal the
// ones computed without a tier, bit for bit (==).
#include "engine/kv_offloader.h"

#include <unistd.h>

#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/check.h"
#include "cache/block_key.h"
#include "cache/block_record.h"
#include "cache/disk/disk_tier.h"
#include "cache/kv_cache.h"
#include "cache/token_chain.h"
#include "engine/engine_options.h"
#include "engine/kv_tiers.h"
#include "engine/request_stream.h"
#include "engine/scheduler.h"
#include "engine/score_store.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/cache/tier_test_util.h"
#include "tests/engine/cpu_engine_fixture.h"
#include "tests/engine/engine_test_util.h"

namespace prefixd {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int64_t kPoolBlocks = 32;
constexpr char kNamespace[] = "tenant-a";

std::vector<uint32_t> RandomTokens(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> tok(0, 50255);
  std::vector<uint32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(tok(rng));
  return out;
}

// The disk tier's read seam: while held, every read waits; `arrived` counts the reads that
// reached it, and `on_read` (set before loads start) runs before each one.
class ReadGate {
 public:
  void Hold() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void Pass() {
    absl::MutexLock lock(&mu_);
    ++arrived_;
    const int n = arrived_;
    mu_.Await(absl::Condition(&open_));
    if (on_read_) on_read_(n);
  }
  void WaitArrived(int n) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return arrived_ >= n; };
    mu_.Await(absl::Condition(&reached));
  }
  void set_on_read(std::function<void(int)> f) {
    absl::MutexLock lock(&mu_);
    on_read_ = std::move(f);
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(int)> on_read_ ABSL_GUARDED_BY(mu_);
};

// Counts the offloader's wake calls (a load's part done), so a test can wait for one.
class Wakes {
 public:
  void Wake() {
    absl::MutexLock lock(&mu_);
    ++count_;
  }
  void WaitFor(int n) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return count_ >= n; };
    mu_.Await(absl::Condition(&reached));
  }
  int count() {
    absl::MutexLock lock(&mu_);
    return count_;
  }
  // Waits up to `timeout` for the count to pass `seen`, as the engine waits on its wake.
  void WaitPast(int seen, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return count_ > seen; };
    mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

 private:
  absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

// A tier of a kind the offloader has never seen, in memory: one class deriving from KvTier,
// listed. It is offered computed blocks (stored as block records), answers matches at once
// (but for a match from a key given to HoldMatchesFrom: answered when the test calls
// AnswerHeldMatches), and ends a fetch only when the test calls Complete, verifying each
// record as every tier must. Engine thread only, but for Complete and AnswerHeldMatches (the
// test's thread, while the engine steps nothing).
class MemoryTier final : public KvTier {
 public:
  explicit MemoryTier(const BlockLayout& layout) : layout_(layout) {}

  TierMedium medium() const override { return TierMedium::kRemote; }
  TierOffers offers() const override { return TierOffers::kComputed; }
  const BlockLayout& layout() const override { return layout_; }
  absl::StatusOr<std::shared_ptr<const TierMatch>> StartMatch(
      absl::Span<const Digest> keys, const MatchOptions& match,
      std::function<void()> on_done) override {
    auto m = std::make_shared<TierMatch>();
    while (m->blocks < keys.size() && !match.scored_only && records_.count(keys[m->blocks])) {
      ++m->blocks;
    }
    if (!keys.empty() && held_from_.count(keys.front())) {
      held_matches_.push_back({m, std::move(on_done)});
    } else {
      m->done_.Notify();
    }
    return m;
  }
  absl::Duration match_reuse() const override { return absl::ZeroDuration(); }
  absl::StatusOr<std::shared_ptr<const TierFetch>> StartFetch(
      FetchRequest request, std::function<void()> on_done) override {
    auto f = std::make_shared<TierFetch>();
    f->root = request.root;
    f->keys = std::move(request.keys);
    f->tokens = std::move(request.tokens);
    fetches_.push_back({f, std::move(on_done)});
    return f;
  }
  int32_t max_fetch_blocks() const override { return 64; }
  bool wait_capped_at_compute() const override { return true; }
  bool WantsOffer(const Digest& key, const OfferIntent&) override { return !records_.count(key); }
  std::vector<uint8_t> OfferBuffer() override {
    return std::vector<uint8_t>(static_cast<size_t>(layout_.data_bytes()));
  }
  void Offer(BlockRecord record) override {
    records_[record.key] = EncodeBlockRecord(layout_, record);
  }
  bool Flush(absl::Time) override { return true; }

  // Ends every fetch started: each block verified against its request, then the wake.
  void Complete() {
    for (auto& [f, on_done] : fetches_) {
      const size_t bs = layout_.block_size;
      for (size_t i = 0; i < f->keys.size(); ++i) {
        const BlockExpectation expect{.root = f->root,
                                      .key = f->keys[i],
                                      .tokens = absl::MakeConstSpan(f->tokens).subspan(i * bs, bs)};
        const std::string& bytes = records_.at(f->keys[i]);
        std::vector<PositionScore> scores;
        absl::StatusOr<absl::Span<const uint8_t>> data =
            DecodeBlockRecord(bytes, layout_, expect, &scores);
        if (!data.ok()) break;
        f->values.emplace_back(data->begin(), data->end());
        f->data.push_back(f->values.back());
        f->scores.push_back(std::move(scores));
        f->seconds.push_back(0);
      }
      f->done_.store(true, std::memory_order_release);
      if (on_done) on_done();
    }
    fetches_.clear();
  }
  // Matches starting at `key` are answered only by AnswerHeldMatches.
  void HoldMatchesFrom(const Digest& key) { held_from_.insert(key); }
  // Answers every match held, then wakes the engine, and holds no more.
  void AnswerHeldMatches() {
    held_from_.clear();
    for (auto& [m, on_done] : held_matches_) {
      m->done_.Notify();
      if (on_done) on_done();
    }
    held_matches_.clear();
  }
  size_t blocks() const { return records_.size(); }
  size_t fetches_started() const { return fetches_.size(); }
  size_t matches_held() const { return held_matches_.size(); }

 private:
  const BlockLayout layout_;
  std::set<Digest> held_from_;
  std::vector<std::pair<std::shared_ptr<TierMatch>, std::function<void()>>> held_matches_;
  std::map<Digest, std::string> records_;
  std::vector<std::pair<std::shared_ptr<TierFetch>, std::function<void()>>> fetches_;
};

// One request's stream and what it has produced so far.
struct Client {
  std::shared_ptr<RequestStream> stream;
  RequestResult result;
  int tokens = 0;
  int events = 0;

  void Poll() {
    std::vector<RequestEvent> got;
    stream->Poll(&got);
    for (const RequestEvent& e : got) {
      ++events;
      if (e.kind == RequestEvent::Kind::kToken) ++tokens;
      ApplyEvent(e, &result);
    }
  }
};

class KvOffloaderTest : public ::testing::Test {
 protected:
  // Which tiers the offloader lists.
  enum class Tiers { kDisk, kMemory };
  KvOffloaderTest() : KvOffloaderTest(Tiers::kDisk) {}
  // `max_load_blocks`: the disk tier's fetch budget (DiskTierOptions::max_load_blocks).
  explicit KvOffloaderTest(Tiers tiers, int32_t max_load_blocks = 128) : dir_("offloader") {
    const Model& model = TinyModel::Get();
    const ModelConfig& c = model.config();
    CpuBackendOptions b;
    b.model = &model;
    b.kv_pool.budget_bytes =
        kPoolBlocks * kBlockSize * KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), 4);
    b.kv_pool.block_size = kBlockSize;
    b.threads = 1;
    backend_ = *CreateCpuBackend(b);
    EngineOptions e;
    e.backend = backend_.get();
    e.model_config = c;
    e.manifest_sha256 = model.manifest_sha256();
    DiskTierOptions d;
    d.dir = dir_.path();
    d.max_bytes = int64_t{256} << 20;
    d.max_load_blocks = max_load_blocks;
    d.read_hook = [this] { gate_.Pass(); };
    absl::StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(d, *EngineBlockLayout(e));
    PREFIXD_CHECK(tier.ok());
    tier_ = *std::move(tier);
    memory_ = std::make_unique<MemoryTier>(*EngineBlockLayout(e));
    std::vector<KvTier*> listed;
    listed.push_back(tiers == Tiers::kDisk ? static_cast<KvTier*>(tier_.get()) : memory_.get());
    offloader_ = std::make_unique<KvOffloader>(
        KvOffloader::Options{.backend = backend_.get(),
                             .tiers = std::move(listed),
                             .scores = &scores_,
                             .vocab_size = static_cast<uint32_t>(c.vocab_size),
                             .wake = [this] { wakes_.Wake(); },
                             .compute_per_token = [this] { return per_token_; },
                             .clock = [this] { return now_; }});
    KvCacheOptions k;
    k.pool = backend_->kv_pool();
    k.on_evict = [this](const EvictedBlock& evicted) {
      offloader_->OfferEvicted(evicted, scores_.Find(*evicted.key));
      scores_.Forget(*evicted.key);
    };
    cache_ = *KvCache::Create(k);
    SetPrefillBudget(256);
  }
  // A new scheduler over the same pool and tiers, with `max_batch_tokens` a step.
  void SetPrefillBudget(int32_t max_batch_tokens) {
    scheduler_ = std::make_unique<Scheduler>(SchedulerOptions{
        .backend = backend_.get(),
        .cache = cache_.get(),
        .model_config = TinyModel::Get().config(),
        .max_batch_tokens = max_batch_tokens,
        .clock = [] { return absl::Now(); },
        .offloader = offloader_.get(),
        .scores = &scores_});
  }
  // A read still held would keep the loader thread from stopping.
  ~KvOffloaderTest() override { gate_.Open(); }

  Digest Root() const { return CacheRootKey(TinyModel::Get().manifest_sha256(), kNamespace); }

  std::shared_ptr<Client> Add(std::vector<uint32_t> prompt, uint32_t max_new,
                              const std::string& tenant = "") {
    auto r = std::make_unique<RequestState>();
    r->request.prompt = std::move(prompt);
    r->request.tenant = tenant;
    r->request.max_new_tokens = max_new;
    r->request.ignore_eos = true;
    r->request.top_logprobs = 2;
    r->root = Root();
    r->usage.prompt_tokens = static_cast<uint32_t>(r->request.prompt.size());
    r->stream = std::make_shared<RequestStream>(nullptr);
    auto client = std::make_shared<Client>();
    client->stream = r->stream;
    scheduler_->Enqueue(std::move(r));
    clients_.push_back(client);
    return client;
  }

  // One engine-loop turn; false when nothing could run (no batch was formed).
  bool Step() {
    scheduler_->HandleCancellations();
    const bool ran = scheduler_->Step();
    scheduler_->FlushEvents();
    cache_->CheckInvariants();
    for (const auto& c : clients_) c->Poll();
    return ran;
  }
  // Steps until every request ended. When nothing can run (requests parked on their loads)
  // it waits for the offloader's wake as the engine does, however slow the loader thread
  // is on a loaded machine; a minute without the end fails.
  void RunToEnd() {
    const absl::Time deadline = absl::Now() + absl::Minutes(1);
    while (!scheduler_->idle() && absl::Now() < deadline) {
      const int seen = wakes_.count();
      if (!Step()) wakes_.WaitPast(seen, absl::Milliseconds(10));
    }
    ASSERT_TRUE(scheduler_->idle());
  }

  // Evicts every cached block into the tier and waits until the writer wrote them.
  void SpillEverything() {
    cache_->Evict(static_cast<int32_t>(cache_->num_blocks()));
    ASSERT_TRUE(tier_->Flush(absl::Now() + absl::Seconds(30)));
  }

  // Runs `prompt` to its end; called first in a test, with nothing in the pool or the tier,
  // its answer is computed.
  RequestResult Computed(const std::vector<uint32_t>& prompt, uint32_t max_new) {
    std::shared_ptr<Client> c = Add(prompt, max_new);
    RunToEnd();
    return c->result;
  }

  // For the fair-plan tests: `prompt`'s answer computed and its blocks spilled to the tier,
  // then a prefill budget of 64 tokens a step and the tier's reads held.
  RequestResult ComputedSpilledAndHeld(const std::vector<uint32_t>& prompt) {
    const RequestResult first = Computed(prompt, 1);
    SpillEverything();
    SetPrefillBudget(64);
    gate_.Hold();
    return first;
  }
  // Adds tenant b's 200-token prompt (into *added) and steps until its first token: the
  // steps taken, at most 10.
  int StepsToTheFirstTokenOfALongPrompt(std::shared_ptr<Client>* added) {
    *added = Add(RandomTokens(6, 200), 1, "b");
    int steps = 0;
    while ((*added)->tokens == 0 && steps < 10) {
      Step();
      ++steps;
    }
    return steps;
  }

  testing::ScratchDir dir_;
  ReadGate gate_;
  Wakes wakes_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<MemoryTier> memory_;
  // The offloader's compute estimate and clock (zero: no estimate, no cap).
  absl::Duration per_token_ = absl::ZeroDuration();
  absl::Time now_ = absl::UnixEpoch();
  std::unique_ptr<DiskTier> tier_;
  ScoreStore scores_;
  std::unique_ptr<KvOffloader> offloader_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::shared_ptr<Client>> clients_;  // polled after every step
};

TEST_F(KvOffloaderTest, AParkedRequestDoesNotStallOtherRequestsDecodeSteps) {
  const std::vector<uint32_t> prompt = RandomTokens(1, 100);
  const RequestResult first = Computed(prompt, 8);
  ASSERT_TRUE(first.status.ok()) << first.status;
  EXPECT_EQ(first.usage.cached_prompt_tokens, 0u);
  SpillEverything();
  ASSERT_EQ(tier_->Stats().blocks, 6);  // 100 prompt + 7 computed generated tokens

  gate_.Hold();
  std::shared_ptr<Client> decoding = Add(RandomTokens(2, 20), 40);
  Step();
  Step();
  ASSERT_EQ(decoding->tokens, 2);
  std::shared_ptr<Client> again = Add(prompt, 8);
  Step();  // matched in the tier: its load starts, the request is parked
  gate_.WaitArrived(1);
  for (int i = 0; i < 10; ++i) {
    const int before = decoding->tokens;
    Step();
    EXPECT_EQ(decoding->tokens, before + 1) << "step " << i;
  }
  EXPECT_EQ(again->events, 0) << "the parked request has not started";
  EXPECT_EQ(scheduler_->counters().waiting_requests, 1u);
  EXPECT_EQ(scheduler_->counters().running_requests, 1u);
  EXPECT_EQ(tier_->Stats().loads, 0u);

  gate_.Open();
  wakes_.WaitFor(1);
  RunToEnd();
  ASSERT_TRUE(again->result.status.ok()) << again->result.status;
  EXPECT_EQ(again->result.usage.cached_prompt_tokens, 96u);
  EXPECT_EQ(scheduler_->counters().disk_hit_tokens, 96u);
  EXPECT_EQ(tier_->Stats().loads, 6u);
  EXPECT_EQ(again->result.samples[0], first.samples[0]);
  ASSERT_TRUE(decoding->result.status.ok());
  EXPECT_EQ(decoding->tokens, 40);
  EXPECT_EQ(tier_->fetch_blocks_in_flight(), 0);
}

// Tenant a's prompt is in the tier and its load is held; meanwhile tenant b's prompt,
// longer than a step's prefill budget (64 tokens), prefills a full budget every step (64 +
// 64 + 64 + 8: its first token in the fourth step). A parked request takes no turn: before,
// a's turn set its prompt aside every step (a, never served, always had the least service),
// which left b's chunks nothing for as long as the load took. Then a's load arrives and both
// answers are whole.
TEST_F(KvOffloaderTest, AParkedRequestSetsNoPrefillBudgetAsideFromAnotherTenant) {
  const std::vector<uint32_t> prompt = RandomTokens(5, 100);
  const RequestResult first = ComputedSpilledAndHeld(prompt);
  ASSERT_TRUE(first.status.ok()) << first.status;
  std::shared_ptr<Client> parked = Add(prompt, 1, "a");
  Step();  // matched in the tier: its load starts, the request is parked
  gate_.WaitArrived(1);
  std::shared_ptr<Client> long_one;
  EXPECT_EQ(StepsToTheFirstTokenOfALongPrompt(&long_one), 4);
  EXPECT_EQ(parked->events, 0) << "the parked request has not started";

  gate_.Open();
  wakes_.WaitFor(1);
  RunToEnd();
  ASSERT_TRUE(parked->result.status.ok()) << parked->result.status;
  EXPECT_EQ(parked->result.usage.cached_prompt_tokens, 96u);
  EXPECT_EQ(parked->result.samples[0], first.samples[0]);
  ASSERT_TRUE(long_one->result.status.ok()) << long_one->result.status;
}

// The third block's file disappears while the load reads the blocks before it: two blocks
// come from the tier, the other four are computed.
TEST_F(KvOffloaderTest, ALoadThatFailsMidwayComputesTheRest) {
  const std::vector<uint32_t> prompt = RandomTokens(3, 100);
  const RequestResult first = Computed(prompt, 4);
  ASSERT_TRUE(first.status.ok());
  SpillEverything();
  const TokenChain chain(Root(), kBlockSize, prompt);
  const std::string third = tier_->PathOf(chain.keys()[2]);
  gate_.set_on_read([third](int n) {
    if (n == 2) ::unlink(third.c_str());  // during the second read: gone before the third
  });
  std::shared_ptr<Client> again = Add(prompt, 4);
  RunToEnd();
  ASSERT_TRUE(again->result.status.ok()) << again->result.status;
  EXPECT_EQ(again->result.usage.cached_prompt_tokens, 32u);
  EXPECT_EQ(scheduler_->counters().disk_hit_tokens, 32u);
  EXPECT_EQ(tier_->Stats().loads, 2u);
  EXPECT_EQ(again->result.samples[0], first.samples[0]);
}

// A damaged file in the middle: the blocks before it load, it is deleted and counted, and
// it and the ones after it are computed.
TEST_F(KvOffloaderTest, ACorruptBlockAndEveryOneAfterItAreComputed) {
  const std::vector<uint32_t> prompt = RandomTokens(4, 100);
  const RequestResult first = Computed(prompt, 4);
  ASSERT_TRUE(first.status.ok());
  SpillEverything();
  const TokenChain chain(Root(), kBlockSize, prompt);
  const std::string damaged = tier_->PathOf(chain.keys()[3]);
  {
    const int64_t at = kBlockRecordHeaderBytes + kBlockSize * 4 + 100;  // in the K/V data
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    const char c = static_cast<char>(f.get());
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x10));
  }
  std::shared_ptr<Client> again = Add(prompt, 4);
  RunToEnd();
  ASSERT_TRUE(again->result.status.ok());
  EXPECT_EQ(again->result.usage.cached_prompt_tokens, 48u);
  EXPECT_EQ(tier_->Stats().loads, 3u);
  EXPECT_EQ(tier_->Stats().corrupt_blocks, 1u);
  EXPECT_EQ(again->result.samples[0], first.samples[0]);
}

TEST_F(KvOffloaderTest, CancellingAParkedRequestReleasesEverything) {
  const std::vector<uint32_t> prompt = RandomTokens(5, 100);
  ASSERT_TRUE(Computed(prompt, 4).status.ok());
  SpillEverything();
  gate_.Hold();
  std::shared_ptr<Client> parked = Add(prompt, 4);
  Step();
  gate_.WaitArrived(1);
  EXPECT_EQ(tier_->fetch_blocks_in_flight(), 6);
  parked->stream->Cancel();
  Step();
  EXPECT_EQ(parked->result.status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(scheduler_->idle());
  gate_.Open();
  wakes_.WaitFor(1);
  // The loader let go of the load before waking: nothing is held any more.
  EXPECT_EQ(tier_->fetch_blocks_in_flight(), 0);
  const KvCacheStats s = cache_->Stats();
  EXPECT_EQ(s.blocks_active, 0);
  EXPECT_EQ(s.num_sequences, 0);
  cache_->CheckInvariants();
}
// A fork parked on its load, then stopped: its load (the tier's fetch budget, the bytes
// read) goes with it, not with its request. A 32-block pool: q (200 + 50 tokens) and r (32 +
// 100, six samples) run until a block for one of them preempts r's sixth sample; the cached
// blocks go to the tier, and the caller stops samples 1 to 4, which makes room. The sixth
// finds its generated blocks there: its load starts and is held. Then the caller stops it
// while the first sample decodes on. Before, the stopped sample kept its load until the
// whole request ended, so the tier's budget stayed in use (every other request needing it
// refused) that long.
TEST_F(KvOffloaderTest, AStoppedSampleLetsGoOfItsLoadWhileItsRequestGoesOn) {
  std::shared_ptr<Client> q = Add(RandomTokens(7, 200), 50);
  std::shared_ptr<Client> r;
  {
    auto request = std::make_unique<RequestState>();
    request->request.prompt = RandomTokens(8, 32);
    request->request.num_samples = 6;
    request->request.sampling.temperature = 1.0f;  // samples that differ: blocks of their own
    request->request.sampling.seed = 1;
    request->request.max_new_tokens = 100;
    request->request.ignore_eos = true;
    request->root = Root();
    request->stream = std::make_shared<RequestStream>(nullptr);
    r = std::make_shared<Client>();
    r->stream = request->stream;
    scheduler_->Enqueue(std::move(request));
    clients_.push_back(r);
  }
  for (int i = 0; i < 50 && scheduler_->counters().preemptions == 0; ++i) Step();
  ASSERT_EQ(scheduler_->counters().preemptions, 1u);
  SpillEverything();
  gate_.Hold();
  for (uint32_t sample = 1; sample <= 4; ++sample) r->stream->StopSample(sample);
  Step();  // the sixth sample is matched in the tier: its load starts, it is parked
  ASSERT_EQ(tier_->fetch_blocks_in_flight(), 2);
  gate_.WaitArrived(1);
  r->stream->StopSample(5);
  Step();
  gate_.Open();
  wakes_.WaitFor(1);
  EXPECT_EQ(tier_->fetch_blocks_in_flight(), 0);
  EXPECT_EQ(r->result.samples.size(), 6u);
  EXPECT_EQ(r->result.status.code(), absl::StatusCode::kUnknown) << "r goes on (no kDone)";
  RunToEnd();
  ASSERT_TRUE(r->result.status.ok()) << r->result.status;
  ASSERT_TRUE(q->result.status.ok()) << q->result.status;
  EXPECT_EQ(r->result.samples[0].ids.size(), 100u);
  EXPECT_EQ(r->result.samples[5].finish, FinishReason::kStop);
}

// The rate is the forward's time per token over steps that prefilled a block or more, the
// latest weighing a quarter; decode-only steps (memory-bound) do not count.
TEST(ComputeRateTest, AveragesPrefillStepsOnly) {
  ComputeRate rate;
  EXPECT_EQ(rate.PerToken(), absl::ZeroDuration());
  rate.Observe(/*prefill_tokens=*/4, /*tokens=*/8, absl::Milliseconds(80));
  EXPECT_EQ(rate.PerToken(), absl::ZeroDuration());
  rate.Observe(32, 40, absl::Milliseconds(40));
  EXPECT_EQ(rate.PerToken(), absl::Milliseconds(1));
  rate.Observe(40, 40, absl::Milliseconds(80));
  EXPECT_EQ(rate.PerToken(), absl::Microseconds(1250));
}

// A disk fetch budget of one load of a 100-token prompt (6 blocks): a second request for
// the same blocks is refused the budget while the first's load is held.
class KvOffloaderSmallBudgetTest : public KvOffloaderTest {
 protected:
  KvOffloaderSmallBudgetTest() : KvOffloaderTest(Tiers::kDisk, 6) {}
};

// As AParkedRequestSetsNoPrefillBudgetAsideFromAnotherTenant, with a second request of tenant
// a parked because the first's load holds the whole fetch budget: it takes no turn either.
TEST_F(KvOffloaderSmallBudgetTest, ARequestParkedOnTheFetchBudgetSetsNoPrefillBudgetAside) {
  const std::vector<uint32_t> prompt = RandomTokens(5, 100);
  const RequestResult first = ComputedSpilledAndHeld(prompt);
  ASSERT_TRUE(first.status.ok()) << first.status;
  std::shared_ptr<Client> loading = Add(prompt, 1, "a");
  Step();  // matched in the tier: its load starts and takes the whole fetch budget
  gate_.WaitArrived(1);
  std::shared_ptr<Client> refused = Add(prompt, 2, "a");
  Step();  // matched too; the budget is in use: parked without a load
  std::shared_ptr<Client> long_one;
  EXPECT_EQ(StepsToTheFirstTokenOfALongPrompt(&long_one), 4);
  EXPECT_EQ(loading->events, 0);
  EXPECT_EQ(refused->events, 0);

  gate_.Open();
  RunToEnd();
  for (const auto& c : {loading, refused, long_one}) {
    ASSERT_TRUE(c->result.status.ok()) << c->result.status;
  }
  EXPECT_EQ(loading->result.usage.cached_prompt_tokens, 96u);
  EXPECT_EQ(loading->result.samples[0], first.samples[0]);
}

class KvOffloaderMemoryTierTest : public KvOffloaderTest {
 protected:
  KvOffloaderMemoryTierTest() : KvOffloaderTest(Tiers::kMemory) {}
};

// A tier the offloader was not written for joins by being listed: it is offered the blocks
// the engine computes, its match continues the pool's, and the request stays parked until
// its fetch ends, then takes its blocks (counted as its medium's).
TEST_F(KvOffloaderMemoryTierTest, ANewKindOfTierWorksByBeingListed) {
  const std::vector<uint32_t> prompt = RandomTokens(7, 100);
  const RequestResult first = Computed(prompt, 4);
  ASSERT_TRUE(first.status.ok()) << first.status;
  EXPECT_EQ(memory_->blocks(), 6u);  // 100 prompt + 3 computed generated tokens: 6 full
  cache_->Evict(static_cast<int32_t>(cache_->num_blocks()));  // no tier takes evicted ones
  std::shared_ptr<Client> again = Add(prompt, 4);
  Step();
  ASSERT_EQ(memory_->fetches_started(), 1u);
  for (int i = 0; i < 3; ++i) Step();
  EXPECT_EQ(again->events, 0) << "parked on its fetch";
  memory_->Complete();
  RunToEnd();
  ASSERT_TRUE(again->result.status.ok()) << again->result.status;
  EXPECT_EQ(again->result.usage.cached_prompt_tokens, 96u);
  EXPECT_EQ(again->result.usage.cached_remote_tokens, 96u);
  EXPECT_EQ(again->result.usage.cached_disk_tokens, 0u);
  EXPECT_EQ(again->result.samples[0], first.samples[0]);
  EXPECT_EQ(offloader_->waits_cut(), 0u);
}

// As AParkedRequestSetsNoPrefillBudgetAsideFromAnotherTenant, with tenant a's request parked
// on the tier's match answer instead of a load: it takes no turn either (before, it set its
// whole prompt aside every step until the answer came, and b prefilled nothing meanwhile).
TEST_F(KvOffloaderMemoryTierTest, ARequestParkedOnAMatchAnswerSetsNoPrefillBudgetAside) {
  const std::vector<uint32_t> prompt = RandomTokens(9, 100);
  const RequestResult first = Computed(prompt, 1);
  ASSERT_TRUE(first.status.ok()) << first.status;
  cache_->Evict(static_cast<int32_t>(cache_->num_blocks()));
  SetPrefillBudget(64);
  memory_->HoldMatchesFrom(TokenChain(Root(), kBlockSize, prompt).keys()[0]);
  std::shared_ptr<Client> parked = Add(prompt, 1, "a");
  Step();  // its match is asked and not answered: parked
  ASSERT_EQ(memory_->matches_held(), 1u);
  std::shared_ptr<Client> long_one;
  EXPECT_EQ(StepsToTheFirstTokenOfALongPrompt(&long_one), 4);
  EXPECT_EQ(parked->events, 0) << "parked on its match answer";
  EXPECT_EQ(memory_->fetches_started(), 0u);

  memory_->AnswerHeldMatches();
  Step();  // the answer is used: the fetch starts
  ASSERT_EQ(memory_->fetches_started(), 1u);
  memory_->Complete();
  RunToEnd();
  ASSERT_TRUE(parked->result.status.ok()) << parked->result.status;
  EXPECT_EQ(parked->result.usage.cached_remote_tokens, 96u);
  EXPECT_EQ(parked->result.samples[0], first.samples[0]);
  ASSERT_TRUE(long_one->result.status.ok()) << long_one->result.status;
}

// A load from a tier that asks for the cap is waited for only as long as computing its tokens
// would take (and at least kMinCappedWait): past it the request computes them, and its answer
// is the same. Before it, the request stays parked.
TEST_F(KvOffloaderMemoryTierTest, ALoadSlowerThanComputingItsTokensIsNotWaitedFor) {
  const std::vector<uint32_t> prompt = RandomTokens(8, 100);
  const RequestResult first = Computed(prompt, 4);
  ASSERT_TRUE(first.status.ok()) << first.status;
  cache_->Evict(static_cast<int32_t>(cache_->num_blocks()));
  per_token_ = absl::Milliseconds(2);  // 96 tokens: 192 ms
  std::shared_ptr<Client> again = Add(prompt, 4);
  Step();  // the fetch starts, never to end
  ASSERT_EQ(memory_->fetches_started(), 1u);
  now_ += absl::Milliseconds(191);
  for (int i = 0; i < 3; ++i) Step();
  EXPECT_EQ(again->events, 0) << "parked within the compute time";
  now_ += absl::Milliseconds(1);
  RunToEnd();
  ASSERT_TRUE(again->result.status.ok()) << again->result.status;
  EXPECT_EQ(again->result.usage.cached_prompt_tokens, 0u);
  EXPECT_EQ(again->result.samples[0], first.samples[0]);
  EXPECT_EQ(offloader_->waits_cut(), 1u);
  memory_->Complete();  // ending late is harmless: nobody holds the load any more

  // A tiny estimate still waits kMinCappedWait.
  cache_->Evict(static_cast<int32_t>(cache_->num_blocks()));
  per_token_ = absl::Nanoseconds(1);
  std::shared_ptr<Client> third = Add(prompt, 4);
  Step();
  now_ += KvOffloader::kMinCappedWait - absl::Milliseconds(1);
  Step();
  EXPECT_EQ(third->events, 0) << "parked within kMinCappedWait";
  memory_->Complete();
  RunToEnd();
  EXPECT_EQ(third->result.usage.cached_prompt_tokens, 96u);
  EXPECT_EQ(third->result.samples[0], first.samples[0]);
  EXPECT_EQ(offloader_->waits_cut(), 1u);
}

}  // namespace
}  // namespace prefixd
