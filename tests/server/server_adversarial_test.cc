// The built prefixd under what a hostile client or a rough host does to it (docs/SERVER.md,
// "Security"): SIGKILL while the disk tier spills, then a restart on the same directory
// that must answer as a cold server does; a second server on a directory in use; SIGHUP
// storms under load; SIGTERM while HTTP streams run; many SSE clients vanishing mid-stream.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/server/grpc_helpers.h"
#include "tests/server/http_client.h"
#include "tests/server/process.h"

namespace prefixd::testing {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

constexpr absl::Duration kWait = absl::Seconds(30);

class AdversarialTest : public TinyModelSuite {
 protected:
  static absl::StatusOr<std::unique_ptr<ServerProcess>> StartServer(
      const std::vector<std::string>& flags) {
    return ServerProcess::Start(model_, flags);
  }
  static double Metric(int port, const std::string& series) {
    absl::StatusOr<std::string> text = HttpGet(port, "/metrics");
    return text.ok() ? MetricValue(*text, series) : -1;
  }
  static std::string StreamBody(const std::vector<uint32_t>& prompt, int max_tokens) {
    return json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"ignore_eos", true},
                {"stream", true}}
        .dump();
  }
};

// Greedy answers with logprobs for `prompts`, one Generate each.
std::vector<GenerateResult> Answers(const std::string& address,
                                    const std::vector<std::vector<uint32_t>>& prompts) {
  auto stub = v1::Inference::NewStub(InsecureChannel(address));
  std::vector<GenerateResult> out;
  for (const std::vector<uint32_t>& p : prompts) {
    v1::GenerateRequest r = IdsRequest(p, 6);
    r.set_top_logprobs(2);
    out.push_back(Generate(*stub, r));
    EXPECT_TRUE(out.back().status.ok()) << out.back().status.error_message();
  }
  return out;
}

// The pool holds 16 blocks of 16 tokens; each prompt is 4 blocks and differs from the
// others from its first token, so every few requests evict blocks, which the tier spills.
TEST_F(AdversarialTest, SigkillWhileSpillingThenARestartAnswersAsAColdServer) {
  const std::string cache_dir = dir_->path() + "/kv-killed";
  const std::vector<std::string> small_pool = {"--kv-cache-bytes", "262144"};
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t i = 0; i < 24; ++i) prompts.push_back(RandomIds(100 + i, 64));

  std::vector<GenerateResult> cold;
  {
    absl::StatusOr<std::unique_ptr<ServerProcess>> s = StartServer(small_pool);
    ASSERT_TRUE(s.ok()) << s.status();
    cold = Answers((*s)->address(), prompts);
  }

  std::vector<std::string> tier_flags = small_pool;
  tier_flags.insert(tier_flags.end(), {"--cache-dir", cache_dir});
  {
    absl::StatusOr<std::unique_ptr<ServerProcess>> s = StartServer(tier_flags);
    ASSERT_TRUE(s.ok()) << s.status();
    // Load from two clients until spills are under way, then SIGKILL while they go on.
    std::atomic<bool> stop{false};
    std::vector<std::thread> clients;
    for (int c = 0; c < 2; ++c) {
      clients.emplace_back([&, c] {
        auto stub = v1::Inference::NewStub(InsecureChannel((*s)->address()));
        for (size_t i = c; !stop.load(); i += 2) {
          Generate(*stub, IdsRequest(prompts[i % prompts.size()], 4));
        }
      });
    }
    absl::Cleanup join_clients = [&] {
      stop.store(true);
      for (std::thread& t : clients) t.join();
    };
    EXPECT_TRUE(PollUntil(
        [&] { return Metric((*s)->metrics_port(), "prefixd_disk_cache_spills_total") >= 12; },
        kWait));
    (*s)->process().Signal(SIGKILL);
    EXPECT_EQ((*s)->process().Wait(kWait), 128 + SIGKILL);
  }

  // The lock died with the process; leftovers of a write cut short are removed at start.
  absl::StatusOr<std::unique_ptr<ServerProcess>> restarted = StartServer(tier_flags);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  for (const auto& e : std::filesystem::directory_iterator(cache_dir)) {
    EXPECT_NE(e.path().extension(), ".tmp") << e.path();
  }
  const std::vector<GenerateResult> warm = Answers((*restarted)->address(), prompts);
  ASSERT_EQ(warm.size(), cold.size());
  uint32_t from_disk = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(warm[i].samples.size(), 1u);
    EXPECT_EQ(warm[i].samples.at(0).token_ids, cold[i].samples.at(0).token_ids) << i;
    EXPECT_EQ(warm[i].samples.at(0).logprobs, cold[i].samples.at(0).logprobs) << i;
    from_disk += warm[i].usage.cached_prompt_tokens();
  }
  const int metrics = (*restarted)->metrics_port();
  EXPECT_GT(Metric(metrics, "prefixd_disk_cache_loads_total"), 0) << "the tier was used";
  EXPECT_GT(from_disk, 0u);
  EXPECT_EQ(Metric(metrics, "prefixd_disk_cache_corrupt_blocks_total"), 0)
      << "a kill never leaves a torn block file";

  // A second server on the directory in use refuses to start, saying why.
  std::vector<std::string> argv = {BuiltBinary("server/prefixd"), "--model", model_,
                                   "--listen", "127.0.0.1:0", "--metrics-listen", "off",
                                   "--http-listen", "off", "--device", "cpu", "--threads", "1",
                                   "--cache-dir", cache_dir};
  const CommandResult second = RunCommand(argv);
  EXPECT_NE(second.exit_code, 0);
  EXPECT_THAT(second.output, HasSubstr("in use by another prefixd process"));
}

TEST_F(AdversarialTest, ASighupStormUnderLoadDropsNoRequestAndReloadsTheTokens) {
  const std::string tokens = dir_->path() + "/storm-tokens";
  std::ofstream(tokens) << "token-a alice\n";
  absl::StatusOr<std::unique_ptr<ServerProcess>> s = StartServer({"--auth-tokens", tokens});
  ASSERT_TRUE(s.ok()) << s.status();
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 3; ++c) {
    clients.emplace_back([&, c] {
      auto stub = v1::Inference::NewStub(InsecureChannel((*s)->address()));
      for (uint32_t i = 0; !stop.load(); ++i) {
        GenerateResult r = Generate(*stub, IdsRequest(RandomIds(c * 1000 + i % 7, 20), 8),
                                    "token-a");
        (r.status.ok() ? ok : failed).fetch_add(1);
      }
    });
  }
  absl::Cleanup join_clients = [&] {
    stop.store(true);
    for (std::thread& t : clients) t.join();
  };
  // "SIGHUP: reloading", or "SIGHUP during start-up: reloading" for one that arrived before
  // main began serving (it is applied then).
  auto reloads = [&] {
    const std::string log = (*s)->process().Output();
    int n = 0;
    for (size_t at = log.find(": reloading"); at != std::string::npos;
         at = log.find(": reloading", at + 1)) {
      ++n;
    }
    return n;
  };
  // 300 SIGHUPs as fast as they can be sent (pending ones coalesce into a few reloads), then
  // 20 more, each after the previous reload, the tokens file rewritten halfway.
  for (int i = 0; i < 300; ++i) (*s)->process().Signal(SIGHUP);
  ASSERT_TRUE(PollUntil([&] { return reloads() >= 1; }, kWait));
  for (int i = 0; i < 20; ++i) {
    if (i == 10) std::ofstream(tokens) << "token-a alice\ntoken-b bob\n";
    const int before = reloads();
    (*s)->process().Signal(SIGHUP);
    ASSERT_TRUE(PollUntil([&] { return reloads() > before; }, kWait));
  }
  EXPECT_TRUE(PollUntil([&] { return ok.load() >= 30; }, kWait));
  std::move(join_clients).Invoke();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_FALSE((*s)->process().Wait(absl::ZeroDuration()).has_value()) << "still serving";
  // The reloads after the rewrite took the new token; the old one still works.
  auto stub = v1::Inference::NewStub(InsecureChannel((*s)->address()));
  EXPECT_TRUE(Generate(*stub, IdsRequest({1, 2, 3}, 1), "token-b").status.ok());
  EXPECT_TRUE(Generate(*stub, IdsRequest({1, 2, 3}, 1), "token-a").status.ok());
  std::printf("320 SIGHUPs sent, %d reloads, %d generations meanwhile\n", reloads(), ok.load());
  EXPECT_GE(reloads(), 21);
}

// Every stream open when SIGTERM arrives ends with [DONE]: its tokens to the end within the
// grace, or an error event when the grace cuts it short; none is cut off mid-body.
TEST_F(AdversarialTest, SigtermWhileHttpStreamsRunEndsEveryStreamWithAnEvent) {
  for (const char* grace : {"30s", "0s"}) {
    SCOPED_TRACE(grace);
    absl::StatusOr<std::unique_ptr<ServerProcess>> s =
        StartServer({"--shutdown-grace", grace, "--kv-cache-bytes", "4194304"});
    ASSERT_TRUE(s.ok()) << s.status();
    std::vector<std::unique_ptr<HttpEventStream>> streams;
    for (uint32_t i = 0; i < 6; ++i) {
      absl::StatusOr<std::unique_ptr<HttpEventStream>> st = HttpEventStream::Open(
          (*s)->http_port(), "/v1/completions", StreamBody(RandomIds(300 + i, 8), 240));
      ASSERT_TRUE(st.ok()) << st.status();
      ASSERT_EQ((*st)->status(), 200);
      std::optional<std::string> first = (*st)->Next();  // running: a token arrived
      ASSERT_TRUE(first.has_value());
      streams.push_back(*std::move(st));
    }
    (*s)->process().Signal(SIGTERM);
    int finished = 0;
    int cut_by_grace = 0;
    for (auto& st : streams) {
      std::vector<std::string> events;
      while (std::optional<std::string> e = st->Next()) events.push_back(*e);
      ASSERT_FALSE(events.empty());
      EXPECT_EQ(events.back(), "[DONE]") << "the stream was cut off";
      if (events.size() < 2) continue;
      const json last = json::parse(events[events.size() - 2], nullptr, false);
      if (last.contains("error")) {
        ++cut_by_grace;
        EXPECT_EQ(last["error"]["code"], "UNAVAILABLE") << last.dump();
      } else if (last.contains("choices") && !last["choices"].empty() &&
                 last["choices"][0]["finish_reason"] == "length") {
        ++finished;
      }
    }
    std::printf("grace %s: %d streams finished, %d cut by the grace\n", grace, finished,
                cut_by_grace);
    EXPECT_EQ(finished + cut_by_grace, static_cast<int>(streams.size()));
    if (std::string(grace) == "30s") {
      EXPECT_EQ(finished, 6);
    } else {
      EXPECT_GT(cut_by_grace, 0) << "no grace: the streams still running are ended";
    }
    EXPECT_EQ((*s)->process().Wait(kWait), 0);
  }
}

TEST_F(AdversarialTest, ManySseClientsVanishingMidStreamReleaseEveryBlock) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> s =
      StartServer({"--kv-cache-bytes", "4194304", "--max-samples", "4"});
  ASSERT_TRUE(s.ok()) << s.status();
  auto stub = v1::Inference::NewStub(InsecureChannel((*s)->address()));
  constexpr int kClients = 32;
  std::vector<std::unique_ptr<HttpEventStream>> streams;
  for (uint32_t i = 0; i < kClients; ++i) {
    json body = json::parse(StreamBody(RandomIds(500 + i % 5, 24), 200));
    if (i % 4 == 0) body["n"] = 3;  // forked samples share blocks
    absl::StatusOr<std::unique_ptr<HttpEventStream>> st =
        HttpEventStream::Open((*s)->http_port(), "/v1/completions", body.dump());
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_EQ((*st)->status(), 200);
    streams.push_back(*std::move(st));
  }
  for (auto& st : streams) ASSERT_TRUE(st->Next().has_value());
  EXPECT_GT(GetStats(*stub).blocks_active(), 0u);
  // Half go with a reset, half with a FIN, all at once, none read to the end.
  for (size_t i = 0; i < streams.size(); ++i) {
    if (i % 2 == 0) {
      streams[i]->Abort();
    } else {
      streams[i].reset();
    }
  }
  streams.clear();
  EXPECT_TRUE(PollUntil([&] { return GetStats(*stub).blocks_active() == 0; }, kWait));
  const int metrics = (*s)->metrics_port();
  EXPECT_TRUE(PollUntil(
      [&] {
        return Metric(metrics, "prefixd_kv_blocks{state=\"active\"}") == 0 &&
               Metric(metrics, "prefixd_running_requests") == 0 &&
               Metric(metrics, "prefixd_waiting_requests") == 0;
      },
      kWait));
  EXPECT_EQ(Metric(metrics, "prefixd_requests_total{api=\"http\",code=\"CANCELLED\"}"), kClients);
  // And the server still serves.
  EXPECT_TRUE(Generate(*stub, IdsRequest({1, 2, 3}, 2)).status.ok());
}

}  // namespace
}  // namespace prefixd::testing
