// The soak run shared by the fake-backend and CPU-backend engine tests: thousands of random
// requests (shared prefixes, two namespaces, forks, sampling, cancellations at random
// points) on a tiny pool; every request must end exactly once, the accounting must add up,
// and the pool must end with every block free or cached and its invariants intact.
#ifndef PREFIXD_TESTS_ENGINE_SOAK_UTIL_H_
#define PREFIXD_TESTS_ENGINE_SOAK_UTIL_H_

#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "tests/engine/engine_test_peer.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace prefixd {

struct SoakOptions {
  int num_requests = 2000;
  int wave = 64;  // submitted together, then read
  uint32_t vocab = 64;
  int max_prefix = 40;
  uint32_t max_new_tokens = 6;  // each request asks for 1..max_new_tokens
  uint32_t seed = 1;
  // Called for every request that ended OK (e.g. to compare with a reference).
  std::function<void(const EngineRequest&, const RequestResult&)> check_ok;
};

inline void RunSoak(Engine& engine, const SoakOptions& o) {
  std::mt19937 rng(o.seed);
  auto tokens = [&](int n) {
    std::vector<uint32_t> out;
    for (int i = 0; i < n; ++i) out.push_back(rng() % (o.vocab - 1));
    return out;
  };
  std::vector<std::vector<uint32_t>> prefixes;
  for (int i = 0; i < 4; ++i)
    prefixes.push_back(tokens(8 + static_cast<int>(rng() % (o.max_prefix - 7))));

  enum class CancelAt { kNever, kAtOnce, kAfterFirstEvent };
  uint64_t completion_total = 0;
  int ok = 0, cancelled = 0;
  for (int begin = 0; begin < o.num_requests; begin += o.wave) {
    const int end = std::min(o.num_requests, begin + o.wave);
    std::vector<EngineRequest> requests;
    std::vector<CancelAt> cancel;
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = begin; i < end; ++i) {
      EngineRequest r;
      r.request_id = absl::StrCat("soak-", i);
      r.cache_namespace = rng() % 4 == 0 ? "b" : "a";
      if (rng() % 4 != 0) r.prompt = prefixes[rng() % prefixes.size()];
      const std::vector<uint32_t> own = tokens(1 + static_cast<int>(rng() % 12));
      r.prompt.insert(r.prompt.end(), own.begin(), own.end());
      r.max_new_tokens = 1 + rng() % o.max_new_tokens;
      r.num_samples = rng() % 4 == 0 ? 1 + rng() % 3 : 1;
      if (rng() % 2 == 0) {
        r.sampling = {
            .temperature = 0.7f, .top_k = rng() % 2 ? 0u : 8u, .top_p = 0.95f, .seed = rng()};
      }
      r.top_logprobs = rng() % 4 == 0 ? 2 : 0;
      if (rng() % 8 == 0) r.stop_token_ids = {static_cast<uint32_t>(rng() % o.vocab)};
      const uint32_t c = rng() % 100;
      cancel.push_back(c < 15   ? CancelAt::kAtOnce
                       : c < 30 ? CancelAt::kAfterFirstEvent
                                : CancelAt::kNever);
      auto s = engine.Submit(r);
      ASSERT_TRUE(s.ok()) << s.status();
      if (cancel.back() == CancelAt::kAtOnce) (*s)->Cancel();
      streams.push_back(*s);
      requests.push_back(std::move(r));
    }
    for (size_t i = 0; i < streams.size(); ++i) {
      SCOPED_TRACE(requests[i].request_id);
      RequestResult got;
      RequestEvent e;
      bool first = true;
      while (streams[i]->Wait(&e)) {
        if (first && cancel[i] == CancelAt::kAfterFirstEvent) streams[i]->Cancel();
        first = false;
        if (!ApplyEvent(e, &got)) break;
      }
      std::vector<RequestEvent> extra;
      EXPECT_FALSE(streams[i]->Poll(&extra)) << "events after kDone";
      ASSERT_EQ(got.done_events, 1);
      const EngineRequest& r = requests[i];
      uint32_t emitted = 0;
      for (const SampleResult& s : got.samples) emitted += static_cast<uint32_t>(s.ids.size());
      EXPECT_EQ(got.usage.completion_tokens, emitted);
      EXPECT_EQ(got.usage.prompt_tokens, r.prompt.size());
      EXPECT_LE(got.usage.cached_prompt_tokens, r.prompt.size() - 1);
      completion_total += emitted;
      if (got.status.ok()) {
        ++ok;
        ASSERT_EQ(got.samples.size(), r.num_samples);
        for (const SampleResult& s : got.samples) {
          EXPECT_EQ(s.finished_events, 1);
          EXPECT_LE(s.ids.size(), r.max_new_tokens);
          if (s.finish == FinishReason::kLength) {
            EXPECT_EQ(s.ids.size(), r.max_new_tokens);
          }
        }
        if (o.check_ok) o.check_ok(r, got);
      } else {
        ++cancelled;
        EXPECT_EQ(got.status.code(), absl::StatusCode::kCancelled) << got.status;
        EXPECT_NE(cancel[i], CancelAt::kNever);
      }
    }
  }
  EXPECT_GT(ok, o.num_requests / 2);
  EXPECT_GT(cancelled, o.num_requests / 20);
  // No token lost or counted twice: the engine's counter equals what the streams carried.
  const EngineStats stats = engine.Stats();
  EXPECT_EQ(stats.scheduler.generated_tokens, completion_total);
  EXPECT_EQ(stats.scheduler.waiting_requests, 0u);
  EXPECT_EQ(stats.scheduler.running_requests, 0u);
  EXPECT_GT(stats.scheduler.preemptions, 0u);
  EXPECT_GT(stats.cache.hit_tokens, 0u);
  EngineTestPeer::RunWithKvCache(engine, [](const KvCache& cache) {
    cache.CheckInvariants();
    const KvCacheStats s = cache.Stats();
    EXPECT_EQ(s.blocks_active, 0);
    EXPECT_EQ(s.num_sequences, 0);
    EXPECT_EQ(s.blocks_free + s.blocks_cached, s.blocks_total);
  });
}

}  // namespace prefixd

#endif  // PREFIXD_TESTS_ENGINE_SOAK_UTIL_H_
