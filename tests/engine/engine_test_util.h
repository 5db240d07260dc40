// Helpers shared by the engine tests: run a request to completion and collect its events.
#ifndef PREFIXD_TESTS_ENGINE_ENGINE_TEST_UTIL_H_
#define PREFIXD_TESTS_ENGINE_ENGINE_TEST_UTIL_H_

#include <memory>
#include <ostream>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "engine/engine.h"
#include "tests/engine/engine_test_peer.h"
#include "gtest/gtest.h"

namespace prefixd {

struct SampleResult {
  std::vector<uint32_t> ids;
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> top;
  FinishReason finish = FinishReason::kNone;
  int finished_events = 0;

  bool operator==(const SampleResult& o) const {
    if (ids != o.ids || logprobs != o.logprobs || finish != o.finish ||
        finished_events != o.finished_events || top.size() != o.top.size()) {
      return false;
    }
    for (size_t i = 0; i < top.size(); ++i) {
      if (top[i].size() != o.top[i].size()) return false;
      for (size_t j = 0; j < top[i].size(); ++j) {
        if (top[i][j].token_id != o.top[i][j].token_id ||
            top[i][j].logprob != o.top[i][j].logprob) {
          return false;
        }
      }
    }
    return true;
  }
};

inline std::ostream& operator<<(std::ostream& os, const SampleResult& r) {
  os << "{ids:";
  for (uint32_t id : r.ids) os << " " << id;
  os << " finish " << static_cast<int>(r.finish) << " x" << r.finished_events << "}";
  return os;
}

struct RequestResult {
  std::vector<SampleResult> samples;
  std::vector<PromptToken> prompt;  // the kPrompt event's entries
  int prompt_events = 0;
  Usage usage;
  absl::Status status = absl::UnknownError("no kDone");
  int done_events = 0;
};

// Applies one event; false after kDone.
inline bool ApplyEvent(const RequestEvent& e, RequestResult* out) {
  if (e.kind == RequestEvent::Kind::kPrompt) {
    EXPECT_EQ(out->prompt_events, 0) << "a second kPrompt";
    EXPECT_TRUE(out->samples.empty()) << "kPrompt after a sample's event";
    out->prompt = e.prompt;
    ++out->prompt_events;
    return true;
  }
  if (e.kind != RequestEvent::Kind::kDone && e.sample_index >= out->samples.size()) {
    out->samples.resize(e.sample_index + 1);
  }
  switch (e.kind) {
    case RequestEvent::Kind::kToken: {
      SampleResult& s = out->samples[e.sample_index];
      EXPECT_EQ(s.finished_events, 0) << "token after kSampleFinished";
      s.ids.push_back(e.token.token_id);
      s.logprobs.push_back(e.token.logprob);
      s.top.push_back(e.top);
      return true;
    }
    case RequestEvent::Kind::kSampleFinished:
      out->samples[e.sample_index].finish = e.finish_reason;
      ++out->samples[e.sample_index].finished_events;
      return true;
    case RequestEvent::Kind::kPrompt:
      return true;
    case RequestEvent::Kind::kDone:
      out->usage = e.usage;
      out->status = e.status;
      ++out->done_events;
      return false;
  }
  return false;
}

// Reads the stream until kDone.
inline RequestResult Collect(RequestStream& stream) {
  RequestResult out;
  RequestEvent e;
  while (stream.Wait(&e)) {
    if (!ApplyEvent(e, &out)) break;
  }
  std::vector<RequestEvent> extra;
  EXPECT_FALSE(stream.Poll(&extra)) << "events after kDone";
  return out;
}

inline RequestResult RunOne(Engine& engine, const EngineRequest& request) {
  auto stream = engine.Submit(request);
  EXPECT_TRUE(stream.ok()) << stream.status();
  if (!stream.ok()) return {};
  return Collect(**stream);
}

// Submits every request while the engine thread is held between two steps, so that all of
// them are enqueued at once. Without this the schedule, and so whether the pool is ever short
// enough to preempt, depends on how this thread and the engine thread interleave (under load
// the engine can finish early requests before the later ones arrive). Returns one stream per
// request, in order; a refused Submit fails the calling test.
inline std::vector<std::shared_ptr<RequestStream>> SubmitTogether(
    Engine& engine, const std::vector<EngineRequest>& requests) {
  absl::Notification held, release;
  std::thread holder([&] {
    EngineTestPeer::RunWithKvCache(engine, [&](const KvCache&) {
      held.Notify();
      release.WaitForNotification();
    });
  });
  held.WaitForNotification();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : requests) {
    auto s = engine.Submit(r);
    EXPECT_TRUE(s.ok()) << s.status();
    streams.push_back(s.ok() ? *s : nullptr);
  }
  release.Notify();
  holder.join();
  return streams;
}

}  // namespace prefixd

#endif  // PREFIXD_TESTS_ENGINE_ENGINE_TEST_UTIL_H_
