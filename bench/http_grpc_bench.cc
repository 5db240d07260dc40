// http_grpc_bench: generated tokens per second through the OpenAI-compatible HTTP API versus
// the gRPC API of one running prefixd, with the same streamed workload, in one run.
//
// A phase runs --streams concurrent clients, each sending --requests streamed completions in
// turn (random prompts of --prompt-tokens ids, --max-tokens new tokens, ignore_eos so every
// request generates them all). gRPC clients use Generate, one channel (and connection) each;
// HTTP clients POST /v1/completions with "stream": true on a keep-alive connection each and
// read the Server-Sent Events (bench/http_client.h). Both APIs get the same prompts and seeds;
// each phase has its own cache_salt, so neither reuses the other's prompt blocks. Phases
// alternate (gRPC, HTTP, HTTP, gRPC, ...) for --rounds rounds, so drift on a shared machine
// falls on both. Prints one line per phase and a JSON summary with the ratio
// http_tokens_per_s / grpc_tokens_per_s over all phases.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/http_client.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "prefixd/v1/inference.grpc.pb.h"

namespace prefixd {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string grpc_address;
  std::string http_address;
  uint32_t streams = 64;
  uint32_t requests = 4;  // per stream per phase
  uint32_t prompt_tokens = 32;
  uint32_t max_tokens = 64;
  uint32_t rounds = 3;
  uint32_t vocab = 50257;
  uint64_t seed = 1;
};

const char* kUsage =
    "usage: http_grpc_bench --grpc HOST:PORT --http HOST:PORT [--streams N] [--requests N]\n"
    "  [--prompt-tokens N] [--max-tokens N] [--rounds N] [--vocab N] [--seed S]\n";

std::optional<Options> Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    bool ok = v != nullptr;
    if (ok) ++i;
    if (a == "--grpc" && ok) {
      o.grpc_address = v;
    } else if (a == "--http" && ok) {
      o.http_address = v;
    } else if (a == "--streams" && ok) {
      ok = absl::SimpleAtoi(v, &o.streams) && o.streams > 0;
    } else if (a == "--requests" && ok) {
      ok = absl::SimpleAtoi(v, &o.requests) && o.requests > 0;
    } else if (a == "--prompt-tokens" && ok) {
      ok = absl::SimpleAtoi(v, &o.prompt_tokens) && o.prompt_tokens > 0;
    } else if (a == "--max-tokens" && ok) {
      ok = absl::SimpleAtoi(v, &o.max_tokens) && o.max_tokens > 0;
    } else if (a == "--rounds" && ok) {
      ok = absl::SimpleAtoi(v, &o.rounds) && o.rounds > 0;
    } else if (a == "--vocab" && ok) {
      ok = absl::SimpleAtoi(v, &o.vocab) && o.vocab > 0;
    } else if (a == "--seed" && ok) {
      ok = absl::SimpleAtoi(v, &o.seed);
    } else {
      std::cerr << "http_grpc_bench: unknown or incomplete argument '" << a << "'\n" << kUsage;
      return std::nullopt;
    }
    if (!ok) {
      std::cerr << "http_grpc_bench: " << a << " needs a valid value\n" << kUsage;
      return std::nullopt;
    }
  }
  if (o.grpc_address.empty() || o.http_address.empty()) {
    std::cerr << "http_grpc_bench: --grpc and --http are required\n" << kUsage;
    return std::nullopt;
  }
  return o;
}

struct Job {
  std::vector<uint32_t> prompt;
  uint64_t seed = 0;
};

// jobs[stream][k]: the same for both APIs within a round.
std::vector<std::vector<Job>> MakeJobs(const Options& o, uint32_t round) {
  std::mt19937_64 rng(o.seed * 1000003 + round);
  std::uniform_int_distribution<uint32_t> id(0, o.vocab - 1);
  std::vector<std::vector<Job>> jobs(o.streams, std::vector<Job>(o.requests));
  for (auto& per_stream : jobs) {
    for (Job& j : per_stream) {
      j.prompt.resize(o.prompt_tokens);
      for (uint32_t& x : j.prompt) x = id(rng);
      j.seed = rng() >> 1;  // the HTTP API takes seeds as int64
    }
  }
  return jobs;
}

struct PhaseResult {
  uint64_t tokens = 0;
  uint64_t messages = 0;  // gRPC messages or SSE events carrying tokens
  uint32_t failed = 0;
  std::string first_error;
  double wall_s = 0;
  double tokens_per_s() const { return wall_s > 0 ? tokens / wall_s : 0; }
};

class Tally {
 public:
  void Ok(uint64_t tokens, uint64_t messages) {
    std::lock_guard<std::mutex> l(mu_);
    r_.tokens += tokens;
    r_.messages += messages;
  }
  void Fail(const std::string& error) {
    std::lock_guard<std::mutex> l(mu_);
    if (r_.failed++ == 0) r_.first_error = error;
  }
  PhaseResult result() const { return r_; }

 private:
  std::mutex mu_;
  PhaseResult r_;
};

template <typename Client>
PhaseResult RunPhase(const Options& o, const std::vector<std::vector<Job>>& jobs,
                     const Client& one_request) {
  Tally tally;
  std::atomic<uint32_t> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (uint32_t s = 0; s < o.streams; ++s) {
    threads.emplace_back([&, s] {
      auto client = one_request(s);  // a connection per stream, made before the clock starts
      ++ready;
      while (!go.load()) std::this_thread::yield();
      for (const Job& j : jobs[s]) client(j, &tally);
    });
  }
  while (ready.load() < o.streams) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const Clock::time_point t0 = Clock::now();
  go = true;
  for (std::thread& t : threads) t.join();
  PhaseResult r = tally.result();
  r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

PhaseResult GrpcPhase(const Options& o, const std::vector<std::vector<Job>>& jobs,
                      const std::string& salt) {
  return RunPhase(o, jobs, [&](uint32_t) {
    grpc::ChannelArguments args;
    // A connection per stream, as the HTTP clients have (channels would share one otherwise).
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel =
        grpc::CreateCustomChannel(o.grpc_address, grpc::InsecureChannelCredentials(), args);
    channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stub = std::shared_ptr<v1::Inference::Stub>(v1::Inference::NewStub(channel));
    return [&o, &salt, stub](const Job& j, Tally* tally) {
      v1::GenerateRequest req;
      for (uint32_t id : j.prompt) req.mutable_token_ids()->add_ids(id);
      req.set_max_new_tokens(o.max_tokens);
      req.set_temperature(1.0f);
      req.set_seed(j.seed);
      req.set_ignore_eos(true);
      req.set_cache_salt(salt);
      grpc::ClientContext ctx;
      auto reader = stub->Generate(&ctx, req);
      v1::GenerateResponse res;
      uint64_t tokens = 0, messages = 0;
      while (reader->Read(&res)) {
        if (res.token_ids_size() > 0) ++messages;
        tokens += res.token_ids_size();
      }
      grpc::Status s = reader->Finish();
      if (!s.ok()) return tally->Fail(s.error_message());
      tally->Ok(tokens, messages);
    };
  });
}

PhaseResult HttpPhase(const Options& o, const std::vector<std::vector<Job>>& jobs,
                      const std::string& salt) {
  return RunPhase(o, jobs, [&](uint32_t) {
    auto conn = std::make_shared<bench::HttpConnection>(o.http_address);
    return [&o, &salt, conn](const Job& j, Tally* tally) {
      nlohmann::json body{{"prompt", j.prompt},
                          {"max_tokens", o.max_tokens},
                          {"temperature", 1.0},
                          {"seed", j.seed},
                          {"ignore_eos", true},
                          {"cache_salt", salt},
                          {"stream", true},
                          {"stream_options", {{"include_usage", true}}}};
      uint64_t tokens = 0, events = 0;
      bool done = false;
      std::string error;
      auto on_event = [&](std::string_view data) {
        if (data == "[DONE]") {
          done = true;
          return;
        }
        nlohmann::json chunk = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
        if (chunk.is_discarded()) {
          error = "an event is not JSON";
        } else if (chunk.contains("error")) {
          error = chunk["error"].value("message", "error event");
        } else if (chunk.contains("usage") && chunk["usage"].is_object()) {
          tokens = chunk["usage"].value("completion_tokens", 0);
        } else {
          ++events;
        }
      };
      absl::StatusOr<bench::HttpResponse> res = conn->Post("/v1/completions", body.dump(), on_event);
      if (!res.ok()) return tally->Fail(std::string(res.status().message()));
      if (res->status != 200) return tally->Fail(absl::StrCat("HTTP ", res->status, " ", res->body));
      if (!error.empty() || !done) return tally->Fail(error.empty() ? "no [DONE]" : error);
      tally->Ok(tokens, events);
    };
  });
}

int Main(int argc, char** argv) {
  std::optional<Options> o = Parse(argc, argv);
  if (!o) return 2;
  double grpc_tokens = 0, grpc_s = 0, http_tokens = 0, http_s = 0;
  nlohmann::json phases = nlohmann::json::array();
  std::vector<double> round_ratios;
  bool failed = false;
  for (uint32_t round = 0; round < o->rounds; ++round) {
    const auto jobs = MakeJobs(*o, round);
    double tps[2] = {0, 0};  // grpc, http
    // Even rounds gRPC first, odd rounds HTTP first.
    for (int k = 0; k < 2; ++k) {
      const bool http = (k == 1) == (round % 2 == 0);
      const std::string salt = absl::StrCat(http ? "http-" : "grpc-", o->seed, "-", round);
      PhaseResult r = http ? HttpPhase(*o, jobs, salt) : GrpcPhase(*o, jobs, salt);
      const char* api = http ? "http" : "grpc";
      std::cerr << "round " << round + 1 << " " << api << ": " << r.tokens << " tokens in "
                << r.wall_s << " s = " << r.tokens_per_s() << " tokens/s, " << r.messages
                << " messages, " << r.failed << " failed"
                << (r.failed > 0 ? absl::StrCat(" (", r.first_error, ")") : "") << "\n";
      failed = failed || r.failed > 0;
      phases.push_back({{"round", round + 1}, {"api", api}, {"tokens", r.tokens},
                        {"messages", r.messages}, {"wall_s", r.wall_s},
                        {"tokens_per_s", r.tokens_per_s()}, {"failed", r.failed}});
      (http ? http_tokens : grpc_tokens) += r.tokens;
      (http ? http_s : grpc_s) += r.wall_s;
      tps[http ? 1 : 0] = r.tokens_per_s();
    }
    round_ratios.push_back(tps[0] > 0 ? tps[1] / tps[0] : 0);
  }
  const double grpc_tps = grpc_s > 0 ? grpc_tokens / grpc_s : 0;
  const double http_tps = http_s > 0 ? http_tokens / http_s : 0;
  std::vector<double> sorted = round_ratios;
  std::sort(sorted.begin(), sorted.end());
  nlohmann::json summary{
      {"streams", o->streams}, {"requests_per_stream", o->requests},
      {"prompt_tokens", o->prompt_tokens}, {"max_tokens", o->max_tokens},
      {"rounds", o->rounds}, {"grpc_tokens_per_s", grpc_tps}, {"http_tokens_per_s", http_tps},
      {"ratio_http_over_grpc", grpc_tps > 0 ? http_tps / grpc_tps : 0},
      {"round_ratios", round_ratios}, {"median_round_ratio", sorted[sorted.size() / 2]},
      {"phases", phases}};
  std::cout << summary.dump(2) << "\n";
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) { return prefixd::Main(argc, argv); }
