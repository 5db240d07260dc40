// Engine behaviour on a model-free backend (fake_backend.h): admission, batching,
// preemption, forks, cancellation, shutdown, errors, counters. The real-model exactness
// tests are in engine_cpu_test.cc.
#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "engine/sampler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_peer.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/fake_backend.h"
#include "tests/engine/soak_util.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kVocab = 64;
constexpr uint32_t kEos = 63;

ModelConfig FakeConfig() { return FakeModelConfig(kVocab); }

struct Setup {
  int64_t blocks = 64;
  int32_t block_size = 16;
  int32_t max_batch_tokens = 64;
  int32_t max_queue = 1024;
  bool prefix_cache = true;
};

struct Harness {
  explicit Harness(const Setup& s = {}) : backend(s.blocks, s.block_size, kVocab) {
    EngineOptions o;
    o.backend = &backend;
    o.model_config = FakeConfig();
    o.manifest_sha256 = "fake-manifest";
    o.max_batch_tokens = s.max_batch_tokens;
    o.max_queue = s.max_queue;
    o.enable_prefix_cache = s.prefix_cache;
    // A clock that advances 1 ms per reading: latencies are positive and deterministic.
    o.clock = [this] { return absl::UnixEpoch() + absl::Milliseconds(++ticks); };
    o.on_fatal_error = [this](const absl::Status& s) {
      fatal_status = s;
      ++fatal_calls;
      fatal_seen.Notify();
    };
    auto e = Engine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status();
    engine = *std::move(e);
  }
  ~Harness() { engine->Shutdown(absl::ZeroDuration()); }

  FakeBackend backend;
  std::atomic<int64_t> ticks{0};
  absl::Status fatal_status;  // written once on the engine thread before fatal_seen
  std::atomic<int> fatal_calls{0};
  absl::Notification fatal_seen;
  std::unique_ptr<Engine> engine;
};

// What a correct engine must produce: decoding straight from the reference logits.
RequestResult Reference(const EngineRequest& r) {
  RequestResult out;
  out.samples.resize(r.num_samples);
  for (uint32_t s = 0; s < r.num_samples; ++s) {
    std::vector<uint32_t> tokens = r.prompt;
    SampleResult& res = out.samples[s];
    res.finished_events = 1;
    res.finish = FinishReason::kLength;
    while (res.ids.size() < r.max_new_tokens) {
      const std::vector<float> logits = FakeBackend::ReferenceLogits(tokens, kVocab);
      SampledToken t = SampleToken(
          logits, r.sampling,
          {.seed = r.sampling.seed, .sample_index = s, .position = uint32_t(tokens.size())},
          r.top_logprobs);
      const uint32_t id = t.token.token_id;
      if ((!r.ignore_eos && id == kEos) ||
          std::count(r.stop_token_ids.begin(), r.stop_token_ids.end(), id) > 0) {
        res.finish = FinishReason::kStop;
        break;
      }
      res.ids.push_back(id);
      res.logprobs.push_back(t.token.logprob);
      res.top.push_back(t.top);
      tokens.push_back(id);
    }
  }
  out.status = absl::OkStatus();
  out.done_events = 1;
  return out;
}

EngineRequest MakeRequest(std::mt19937* rng, int prompt_len, uint32_t max_new) {
  EngineRequest r;
  std::uniform_int_distribution<uint32_t> tok(0, kVocab - 2);
  for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(tok(*rng));
  r.max_new_tokens = max_new;
  return r;
}

void ExpectMatchesReference(const RequestResult& got, const EngineRequest& r) {
  const RequestResult want = Reference(r);
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.done_events, 1);
  ASSERT_EQ(got.samples.size(), want.samples.size());
  uint32_t completion = 0;
  for (size_t s = 0; s < want.samples.size(); ++s) {
    EXPECT_EQ(got.samples[s], want.samples[s]) << "sample " << s;
    completion += static_cast<uint32_t>(want.samples[s].ids.size());
  }
  EXPECT_EQ(got.usage.prompt_tokens, r.prompt.size());
  EXPECT_EQ(got.usage.completion_tokens, completion);
}

void ExpectPoolQuiet(Engine& engine) {
  EngineTestPeer::RunWithKvCache(engine, [](const KvCache& cache) {
    cache.CheckInvariants();
    const KvCacheStats s = cache.Stats();
    EXPECT_EQ(s.blocks_active, 0);
    EXPECT_EQ(s.blocks_free + s.blocks_cached, s.blocks_total);
    EXPECT_EQ(s.num_sequences, 0);
  });
}

// Submit applies the one set of request rules (engine/request_validation.h, tested rule by
// rule there): each refusal carries its field.
TEST(EngineTest, SubmitRefusesRequestsThatCouldNeverRun) {
  Harness h({.blocks = 8, .block_size = 16});
  auto refused = [&](EngineRequest r, RequestField field, const char* hint) {
    auto s = h.engine->Submit(std::move(r));
    ASSERT_FALSE(s.ok()) << hint;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
    EXPECT_EQ(ErrorField(s.status()), field) << s.status();
    EXPECT_THAT(s.status().message(), HasSubstr(hint));
  };
  using F = RequestField;
  EngineRequest ok;
  ok.prompt = {1, 2, 3};
  ok.max_new_tokens = 4;
  EngineRequest r = ok;
  r.prompt.clear();
  refused(r, F::kPrompt, "empty prompt");
  r = ok;
  r.prompt[1] = kVocab;
  refused(r, F::kPrompt, "ids must be < vocab_size 64");
  r = ok;
  r.max_new_tokens = 0;
  refused(r, F::kMaxNewTokens, "is 0");
  r = ok;
  r.prompt.assign(200, 1);
  r.max_new_tokens = 57;
  refused(r, F::kMaxNewTokens, "context length 256");
  r = ok;
  r.num_samples = 0;
  refused(r, F::kNumSamples, "is 0");
  r.num_samples = 17;
  refused(r, F::kNumSamples, "exceeds this server's limit 16");
  r = ok;
  r.sampling.temperature = -1.0f;
  refused(r, F::kTemperature, "is invalid");
  r.sampling.temperature = std::numeric_limits<float>::infinity();
  refused(r, F::kTemperature, "is invalid");
  r = ok;
  r.sampling.top_p = 0.0f;
  refused(r, F::kTopP, "is invalid");
  r.sampling.top_p = 1.5f;
  refused(r, F::kTopP, "is invalid");
  r.sampling.top_p = std::numeric_limits<float>::quiet_NaN();
  refused(r, F::kTopP, "is invalid");
  r = ok;
  r.top_logprobs = 21;
  refused(r, F::kTopLogprobs, "use 0..20");
  r = ok;
  r.stop_token_ids = {5, kVocab + 3};
  refused(r, F::kStopTokenIds, "has token id 67");
  r = ok;
  r.prompt.assign(120, 1);
  r.max_new_tokens = 9;  // 129 tokens = 9 blocks of 16; the pool has 8
  refused(r, F::kMaxNewTokens, "whole pool holds 8 blocks (128 tokens)");
  r.max_new_tokens = 8;  // exactly the pool: accepted
  EXPECT_TRUE(RunOne(*h.engine, r).status.ok());
}

TEST(EngineTest, GreedyAndSampledOutputsMatchTheReference) {
  Harness h;
  std::mt19937 rng(1);
  EngineRequest greedy = MakeRequest(&rng, 37, 20);
  greedy.top_logprobs = 3;
  ExpectMatchesReference(RunOne(*h.engine, greedy), greedy);
  EngineRequest sampled = MakeRequest(&rng, 5, 30);
  sampled.sampling = {.temperature = 0.8f, .top_k = 10, .top_p = 0.9f, .seed = 77};
  ExpectMatchesReference(RunOne(*h.engine, sampled), sampled);
  EngineRequest forked = sampled;
  forked.num_samples = 4;
  forked.top_logprobs = 2;
  const RequestResult f = RunOne(*h.engine, forked);
  ExpectMatchesReference(f, forked);
  EXPECT_NE(f.samples[0].ids, f.samples[1].ids);  // each sample has its own stream
  ExpectPoolQuiet(*h.engine);
}

TEST(EngineTest, StopTokensAndEosEndASampleWithoutBeingEmitted) {
  Harness h;
  std::mt19937 rng(2);
  EngineRequest r = MakeRequest(&rng, 9, 40);
  r.ignore_eos = true;
  const RequestResult free_run = RunOne(*h.engine, r);
  ASSERT_EQ(free_run.samples[0].ids.size(), 40u);
  // Stop at the 6th generated token's id.
  EngineRequest stop = r;
  stop.stop_token_ids = {free_run.samples[0].ids[5]};
  const RequestResult stopped = RunOne(*h.engine, stop);
  ExpectMatchesReference(stopped, stop);
  EXPECT_EQ(stopped.samples[0].finish, FinishReason::kStop);
  EXPECT_LE(stopped.samples[0].ids.size(), 5u);
  EXPECT_EQ(stopped.usage.completion_tokens, stopped.samples[0].ids.size());
  // EOS stops unless ignored: find a prompt whose greedy output contains EOS.
  for (int attempt = 0; attempt < 200; ++attempt) {
    EngineRequest e = MakeRequest(&rng, 4, 60);
    if (Reference(e).samples[0].finish != FinishReason::kStop) continue;
    ExpectMatchesReference(RunOne(*h.engine, e), e);
    e.ignore_eos = true;
    const RequestResult ignored = RunOne(*h.engine, e);
    ExpectMatchesReference(ignored, e);
    EXPECT_EQ(ignored.samples[0].finish, FinishReason::kLength);
    EXPECT_EQ(std::count(ignored.samples[0].ids.begin(), ignored.samples[0].ids.end(), kEos) > 0,
              true);
    return;
  }
  FAIL() << "no prompt produced EOS";
}

TEST(EngineTest, ConcurrentRequestsUnderPreemptionMatchTheReference) {
  // 24 blocks of 8 tokens for 32 requests of up to 80 tokens each: preemption is certain.
  Harness h({.blocks = 24, .block_size = 8, .max_batch_tokens = 48});
  std::mt19937 rng(3);
  std::vector<EngineRequest> requests;
  const std::vector<uint32_t> shared = MakeRequest(&rng, 20, 1).prompt;
  for (int i = 0; i < 32; ++i) {
    EngineRequest r = MakeRequest(&rng, 1 + static_cast<int>(rng() % 50), 1 + rng() % 30);
    r.ignore_eos = i % 2 == 0;
    if (i % 3 == 0) r.prompt.insert(r.prompt.begin(), shared.begin(), shared.end());
    if (i % 4 == 1) r.sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 5u + i};
    if (i % 8 == 5) r.num_samples = 3;
    r.top_logprobs = i % 5;
    requests.push_back(r);
  }
  const std::vector<std::shared_ptr<RequestStream>> streams = SubmitTogether(*h.engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    ASSERT_NE(streams[i], nullptr);
    ExpectMatchesReference(Collect(*streams[i]), requests[i]);
  }
  EXPECT_GT(h.engine->Stats().scheduler.preemptions, 0u);
  ExpectPoolQuiet(*h.engine);
}

TEST(EngineTest, SecondRequestWaitsForTheFirstsPrefixInsteadOfRecomputingIt) {
  // Prefill in chunks of 16: while the first request computes its 64-token prompt, the
  // second (same prompt) must wait and then take 63 tokens from the cache.
  Harness h({.blocks = 64, .block_size = 16, .max_batch_tokens = 16});
  std::mt19937 rng(4);
  EngineRequest r = MakeRequest(&rng, 64, 3);
  auto a = h.engine->Submit(r);
  auto b = h.engine->Submit(r);
  ASSERT_TRUE(a.ok() && b.ok());
  const RequestResult ra = Collect(**a);
  const RequestResult rb = Collect(**b);
  ExpectMatchesReference(ra, r);
  ExpectMatchesReference(rb, r);
  EXPECT_EQ(ra.usage.cached_prompt_tokens, 0u);
  EXPECT_EQ(rb.usage.cached_prompt_tokens, 63u);
  const EngineStats s = h.engine->Stats();
  EXPECT_EQ(s.scheduler.prefill_tokens,
            64u + 1u);  // the second computed only its last prompt token
  EXPECT_EQ(s.cache.queried_tokens, 128u);
  EXPECT_EQ(s.cache.hit_tokens, 63u);
  EXPECT_EQ(s.scheduler.generated_tokens, 6u);
}

TEST(EngineTest, RequestNeedingTheWholePoolRunsEvenWhenItsMatchEndsInACachedBlock) {
  // 3 blocks of 16. A leaves X (16 tokens) and Y (16 tokens) cached. B (34 prompt + 14 new =
  // 48 tokens, the whole pool) matches X and the first 15 tokens of Y: copying those rows
  // would need Y's block as well as B's three, so B computes them instead of waiting for a
  // block that nothing will ever free.
  Harness h({.blocks = 3, .block_size = 16, .max_batch_tokens = 64});
  std::mt19937 rng(11);
  EngineRequest a = MakeRequest(&rng, 33, 1);
  a.ignore_eos = true;
  ExpectMatchesReference(RunOne(*h.engine, a), a);
  EngineRequest b = a;
  b.prompt.resize(31);
  b.prompt.push_back((a.prompt[31] + 1) % (kVocab - 1));
  b.prompt.push_back(5);
  b.prompt.push_back(6);
  b.max_new_tokens = 14;
  auto stream = h.engine->Submit(b);
  ASSERT_TRUE(stream.ok()) << stream.status();
  RequestResult got;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  bool done = false;
  while (!done && absl::Now() < deadline) {
    std::vector<RequestEvent> events;
    (*stream)->Poll(&events);
    for (const RequestEvent& e : events) done = !ApplyEvent(e, &got) || done;
    if (!done) absl::SleepFor(absl::Milliseconds(2));
  }
  if (!done) (*stream)->Cancel();
  ASSERT_TRUE(done) << "B never ran";
  ExpectMatchesReference(got, b);
  EXPECT_EQ(got.usage.cached_prompt_tokens, 16u) << "X shared, Y's rows recomputed";
  ExpectPoolQuiet(*h.engine);
}

TEST(EngineTest, PrefixCacheOffComputesEverything) {
  Harness h({.blocks = 64, .block_size = 16, .prefix_cache = false});
  std::mt19937 rng(5);
  EngineRequest r = MakeRequest(&rng, 40, 3);
  ExpectMatchesReference(RunOne(*h.engine, r), r);
  const RequestResult again = RunOne(*h.engine, r);
  ExpectMatchesReference(again, r);
  EXPECT_EQ(again.usage.cached_prompt_tokens, 0u);
  EXPECT_EQ(h.engine->Stats().scheduler.prefill_tokens, 80u);
  EXPECT_EQ(h.engine->Stats().cache.blocks_cached, 0);
}

TEST(EngineTest, CancelEndsTheStreamAndReleasesBlocks) {
  Harness h;
  std::mt19937 rng(6);
  EngineRequest r = MakeRequest(&rng, 30, 200);
  r.ignore_eos = true;
  std::shared_ptr<RequestStream> stream;
  // Cancel from inside the 6th forward step (the engine thread is busy there): the step
  // completes, and the request ends before the next one. The hook waits until this thread
  // has stored the stream (the engine may reach step 6 before Submit's caller runs again).
  absl::Notification stream_stored;
  h.backend.set_hook(5, [&] {
    stream_stored.WaitForNotification();
    stream->Cancel();
  });
  auto s = h.engine->Submit(r);
  ASSERT_TRUE(s.ok());
  stream = *s;
  stream_stored.Notify();
  const RequestResult got = Collect(*stream);
  stream->Cancel();  // idempotent, also after the end
  EXPECT_EQ(got.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(got.done_events, 1);
  ASSERT_EQ(got.samples.size(), 1u);
  EXPECT_EQ(got.samples[0].ids.size(), 6u);
  EXPECT_EQ(got.samples[0].finished_events, 0);
  EXPECT_EQ(got.usage.completion_tokens, 6u);
  ExpectPoolQuiet(*h.engine);
}

TEST(EngineTest, CancelWhileWaitingNeverRuns) {
  Harness h;
  absl::Notification gate;
  h.backend.set_gate(&gate);
  std::mt19937 rng(13);
  EngineRequest r = MakeRequest(&rng, 8, 4);
  auto a = h.engine->Submit(r);
  h.backend.entered().WaitForNotification();
  auto b = h.engine->Submit(MakeRequest(&rng, 8, 4));
  (*b)->Cancel();
  gate.Notify();
  ExpectMatchesReference(Collect(**a), r);
  const RequestResult rb = Collect(**b);
  EXPECT_EQ(rb.status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(rb.samples.empty());
  EXPECT_EQ(h.engine->Stats().cache.queried_tokens, 8u);  // b was never admitted
}

TEST(EngineTest, NotifyFiresWhenEventsArrive) {
  Harness h;
  std::mt19937 rng(7);
  EngineRequest r = MakeRequest(&rng, 3, 5);
  auto s = h.engine->Submit(r);
  ASSERT_TRUE(s.ok());
  std::atomic<int> calls{0};
  absl::Notification done;
  RequestResult got;
  (*s)->SetNotify([&] { ++calls; });
  got = Collect(**s);
  ExpectMatchesReference(got, r);
  EXPECT_GT(calls.load(), 0);
}

TEST(EngineTest, QueueLimitAndShutdownRefuseNewRequests) {
  Harness h({.max_queue = 2});
  absl::Notification gate;
  h.backend.set_gate(&gate);
  std::mt19937 rng(8);
  EngineRequest r = MakeRequest(&rng, 4, 3);
  auto first = h.engine->Submit(r);
  ASSERT_TRUE(first.ok());
  h.backend.entered().WaitForNotification();  // the engine thread is inside Forward
  auto second = h.engine->Submit(r);
  auto third = h.engine->Submit(r);
  ASSERT_TRUE(second.ok() && third.ok());
  auto fourth = h.engine->Submit(r);
  ASSERT_FALSE(fourth.ok());
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(fourth.status().message(), HasSubstr("queue is full"));
  gate.Notify();
  for (auto* s : {&first, &second, &third}) ExpectMatchesReference(Collect(***s), r);
  h.engine->Shutdown(absl::Seconds(30));  // nothing left: returns at once
  auto after = h.engine->Submit(r);
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable);
}

TEST(EngineTest, ShutdownGraceEndsTheRestWithUnavailable) {
  Harness h;
  absl::Notification gate;
  h.backend.set_gate(&gate, 3);
  std::mt19937 rng(9);
  EngineRequest r = MakeRequest(&rng, 4, 150);
  r.ignore_eos = true;
  auto s = h.engine->Submit(r);
  ASSERT_TRUE(s.ok());
  h.backend.entered().WaitForNotification();  // the request cannot finish while we hold it
  std::thread shutdown([&] { h.engine->Shutdown(absl::ZeroDuration()); });
  // Shutdown has begun once Submit refuses; no sleep needed.
  EngineRequest probe = MakeRequest(&rng, 2, 1);
  std::vector<std::shared_ptr<RequestStream>> accepted;
  while (true) {
    auto p = h.engine->Submit(probe);
    if (absl::IsResourceExhausted(p.status())) continue;  // queue full: not draining yet
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable);
      break;
    }
    accepted.push_back(*p);
  }
  gate.Notify();
  shutdown.join();
  const RequestResult got = Collect(**s);
  EXPECT_EQ(got.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(got.status.message(), HasSubstr("server is shutting down"));
  // Steps 0-3 ran (step 3 was in flight when Shutdown began); nothing after.
  EXPECT_EQ(got.samples[0].ids.size(), 4u);
  for (auto& p : accepted) EXPECT_EQ(Collect(*p).done_events, 1);
  ExpectPoolQuiet(*h.engine);
}

TEST(EngineTest, ShutdownWithGraceLetsRunningRequestsFinish) {
  Harness h;
  std::mt19937 rng(10);
  EngineRequest r = MakeRequest(&rng, 10, 60);
  r.ignore_eos = true;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(*h.engine->Submit(r));
  h.engine->Shutdown(absl::Seconds(60));
  for (auto& s : streams) ExpectMatchesReference(Collect(*s), r);
}

TEST(EngineTest, BackendFailureEndsRequestsInFlightWithInternal) {
  Harness h;
  absl::Notification gate;
  h.backend.set_gate(&gate);
  h.backend.set_fail_at_call(1);
  std::mt19937 rng(11);
  EngineRequest r = MakeRequest(&rng, 6, 10);
  r.ignore_eos = true;
  auto a = h.engine->Submit(r);
  h.backend.entered().WaitForNotification();
  auto b = h.engine->Submit(r);  // joins the batch of the failing call
  gate.Notify();
  const RequestResult ra = Collect(**a);
  const RequestResult rb = Collect(**b);
  EXPECT_EQ(ra.status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(ra.status.message(), HasSubstr("injected failure"));
  EXPECT_EQ(rb.status.code(), absl::StatusCode::kInternal);
  ExpectPoolQuiet(*h.engine);
  // The engine keeps serving.
  ExpectMatchesReference(RunOne(*h.engine, r), r);
}

TEST(EngineTest, FatalDeviceErrorEndsEveryRequestAndRefusesNewOnes) {
  Harness h;
  absl::Notification gate;
  h.backend.set_gate(&gate);
  h.backend.set_fail_at_call(1);
  h.backend.set_fail_fatally(true);
  std::mt19937 rng(13);
  EngineRequest r = MakeRequest(&rng, 6, 10);
  r.ignore_eos = true;
  auto a = h.engine->Submit(r);
  h.backend.entered().WaitForNotification();
  auto b = h.engine->Submit(r);
  auto c = h.engine->Submit(MakeRequest(&rng, 40, 5));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  gate.Notify();
  for (auto* s : {&a, &b, &c}) {
    const RequestResult res = Collect(***s);
    EXPECT_EQ(res.status.code(), absl::StatusCode::kInternal) << res.status;
    EXPECT_THAT(res.status.message(), HasSubstr("injected failure"));
  }
  h.fatal_seen.WaitForNotification();
  EXPECT_TRUE(IsFatalDeviceError(h.fatal_status));
  EXPECT_EQ(h.fatal_calls.load(), 1);
  // From now on the engine refuses work instead of sending it to a broken device.
  auto late = h.engine->Submit(r);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(late.status().message(), HasSubstr("restarting"));
  ExpectPoolQuiet(*h.engine);
  EXPECT_EQ(h.fatal_calls.load(), 1);
}

TEST(EngineTest, StatsAndLatenciesCountWhatHappened) {
  Harness h;
  std::mt19937 rng(12);
  uint64_t prompt = 0, generated = 0;
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 5; ++i) {
    EngineRequest r = MakeRequest(&rng, 10 + i, 4 + i);
    r.ignore_eos = true;
    prompt += r.prompt.size();
    generated += r.max_new_tokens;
    requests.push_back(r);
    streams.push_back(*h.engine->Submit(r));
  }
  for (size_t i = 0; i < streams.size(); ++i)
    ExpectMatchesReference(Collect(*streams[i]), requests[i]);
  const EngineStats s = h.engine->Stats();  // published before the events were
  EXPECT_EQ(s.scheduler.prefill_tokens, prompt);
  EXPECT_EQ(s.scheduler.generated_tokens, generated);
  EXPECT_EQ(s.cache.queried_tokens, prompt);
  EXPECT_EQ(s.scheduler.waiting_requests, 0u);
  EXPECT_EQ(s.scheduler.running_requests, 0u);
  EXPECT_EQ(s.cache.blocks_total, 64);
  EXPECT_EQ(s.cache.blocks_active, 0);
  EXPECT_EQ(s.cache.bytes_per_token, 8);
  const Engine::Latencies l = h.engine->DrainLatencies();
  ASSERT_EQ(l.ttft.size(), 5u);
  // One per token after each sample's first: 4 + 5 + 6 + 7 + 8 tokens, 5 first ones.
  ASSERT_EQ(l.tpot.size(), generated - 5);
  for (double t : l.ttft) EXPECT_GT(t, 0.0);
  for (double t : l.tpot) EXPECT_GT(t, 0.0);
  EXPECT_TRUE(h.engine->DrainLatencies().ttft.empty());
}

// The residency observations follow the pool: a repeated prompt reuses its two full blocks
// (two gaps), and a prompt that needs the whole pool evicts them (two lifetimes and idles).
TEST(EngineTest, ResidencyObservationsFollowThePool) {
  Harness h({.blocks = 4, .block_size = 4, .max_batch_tokens = 64});
  std::mt19937 rng(5);
  EngineRequest a = MakeRequest(&rng, 9, 1);
  a.ignore_eos = true;
  ExpectMatchesReference(Collect(**h.engine->Submit(a)), a);
  ExpectMatchesReference(Collect(**h.engine->Submit(a)), a);
  Engine::Latencies l = h.engine->DrainLatencies();
  ASSERT_EQ(l.block_reuse_gap.size(), 2u);
  for (double gap : l.block_reuse_gap) EXPECT_GT(gap, 0.0);
  EXPECT_TRUE(l.block_lifetime.empty());
  EngineRequest b = MakeRequest(&rng, 13, 1);
  b.ignore_eos = true;
  ExpectMatchesReference(Collect(**h.engine->Submit(b)), b);
  l = h.engine->DrainLatencies();
  ASSERT_EQ(l.block_lifetime.size(), 2u);
  ASSERT_EQ(l.block_idle_before_eviction.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    // Reused after indexing, so idle for less than the block lived.
    EXPECT_GT(l.block_idle_before_eviction[i], 0.0);
    EXPECT_LT(l.block_idle_before_eviction[i], l.block_lifetime[i]);
  }
  EXPECT_TRUE(l.block_reuse_gap.empty());
}

TEST(EngineTest, SoakEveryRequestEndsOnceWithReferenceOutputAndThePoolIsClean) {
  Harness h({.blocks = 10, .block_size = 8, .max_batch_tokens = 32});
  SoakOptions o;
  o.num_requests = 2000;
  o.vocab = kVocab;
  o.seed = 99;
  o.check_ok = [](const EngineRequest& r, const RequestResult& got) {
    ExpectMatchesReference(got, r);
  };
  RunSoak(*h.engine, o);
}

}  // namespace
}  // namespace prefixd
