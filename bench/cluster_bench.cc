// cluster_bench: a many-system-prompts workload through a prefixd front door (scripts/cluster),
// measuring what prefix-affinity routing is for: cached prompt tokens, requests per replica,
// and, with --kill-replica, what clients see when a replica is SIGKILLed mid-run.
//
// --prompts system prompts of --prefix-tokens random ids (or words, --text), each sent
// --requests-per-prompt times with a suffix of its own (or, with --zipf S, as many requests
// whose prompts follow a Zipf law: a few hot prompts), all in one random order (--seed),
// --concurrency at a time. The replica that served a call is read from the
// x-prefixd-replica header HAProxy adds (deploy/haproxy/haproxy.cfg). Prints one JSON object.
//
// --http sends the same workload as OpenAI completions (text prompts, not streamed) to the
// HTTP front door (cluster.json's "http", or --server HOST:PORT), which HAProxy routes by the
// start of the JSON "prompt"; the replica comes from the same header.
//
// Failover (--cluster DIR/cluster.json --kill-replica I, gRPC only): once --kill-after requests have
// finished and a request is streaming from replica I, SIGKILL it; then, --restart-after-s
// later, run --restart-command (e.g. scripts/cluster restart ...) and keep sending.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
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
  std::string server;
  std::string cluster;  // cluster.json: the server address and replica pids
  uint32_t prompts = 24;
  uint32_t prefix_tokens = 512;
  uint32_t requests_per_prompt = 4;
  uint32_t suffix_tokens = 16;
  uint32_t max_tokens = 4;
  uint32_t concurrency = 4;
  uint64_t seed = 1;
  bool text = false;
  bool http = false;  // the HTTP front door (implies text prompts)
  double zipf = 0;  // > 0: each request's prompt drawn with P(rank k) ∝ 1 / k^zipf
  double deadline_s = 120;
  uint32_t kill_replica = 0;  // 1-based; 0 = no failover test
  uint32_t kill_after = 0;
  double restart_after_s = 5;
  std::string restart_command;
  std::string requests_out;  // JSON lines, one per request
};

struct Record {
  uint32_t prompt = 0;
  double start_s = 0, end_s = -1;
  double first_s = -1;  // the first response message (gRPC): time to first token
  std::string replica;  // from the response headers; empty if none came
  bool started = false;
  bool streaming = false;
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string message;
  uint32_t prompt_tokens = 0, cached_tokens = 0;
};

std::string CodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    default: return absl::StrCat("code ", static_cast<int>(c));
  }
}

const char* kUsage =
    "usage: cluster_bench (--server ADDR | --cluster FILE) [--prompts N] [--prefix-tokens N]\n"
    "  [--requests-per-prompt N] [--suffix-tokens N] [--max-tokens N] [--concurrency N]\n"
    "  [--seed S] [--text] [--http] [--zipf S] [--deadline-s S] [--requests-out FILE]\n"
    "  [--kill-replica I --kill-after N [--restart-after-s S] [--restart-command CMD]]\n";

std::optional<Options> Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    auto num = [&](auto* out) {
      auto v = value();
      return v.has_value() && absl::SimpleAtoi(*v, out);
    };
    bool ok = true;
    if (a == "--server") {
      auto v = value();
      ok = v.has_value();
      if (ok) o.server = *v;
    } else if (a == "--cluster") {
      auto v = value();
      ok = v.has_value();
      if (ok) o.cluster = *v;
    } else if (a == "--restart-command") {
      auto v = value();
      ok = v.has_value();
      if (ok) o.restart_command = *v;
    } else if (a == "--requests-out") {
      auto v = value();
      ok = v.has_value();
      if (ok) o.requests_out = *v;
    } else if (a == "--prompts") {
      ok = num(&o.prompts) && o.prompts > 0;
    } else if (a == "--prefix-tokens") {
      ok = num(&o.prefix_tokens) && o.prefix_tokens > 0;
    } else if (a == "--requests-per-prompt") {
      ok = num(&o.requests_per_prompt) && o.requests_per_prompt > 0;
    } else if (a == "--suffix-tokens") {
      ok = num(&o.suffix_tokens) && o.suffix_tokens > 0;
    } else if (a == "--max-tokens") {
      ok = num(&o.max_tokens) && o.max_tokens > 0;
    } else if (a == "--concurrency") {
      ok = num(&o.concurrency) && o.concurrency > 0;
    } else if (a == "--seed") {
      ok = num(&o.seed);
    } else if (a == "--deadline-s") {
      auto v = value();
      ok = v.has_value() && absl::SimpleAtod(*v, &o.deadline_s) && o.deadline_s > 0;
    } else if (a == "--zipf") {
      auto v = value();
      ok = v.has_value() && absl::SimpleAtod(*v, &o.zipf) && o.zipf >= 0;
    } else if (a == "--restart-after-s") {
      auto v = value();
      ok = v.has_value() && absl::SimpleAtod(*v, &o.restart_after_s) && o.restart_after_s >= 0;
    } else if (a == "--kill-replica") {
      ok = num(&o.kill_replica) && o.kill_replica > 0;
    } else if (a == "--kill-after") {
      ok = num(&o.kill_after);
    } else if (a == "--text") {
      o.text = true;
    } else if (a == "--http") {
      o.http = true;
      o.text = true;  // json_query finds a key only in a string prompt
    } else {
      std::cerr << "cluster_bench: unknown argument '" << a << "'\n" << kUsage;
      return std::nullopt;
    }
    if (!ok) {
      std::cerr << "cluster_bench: " << a << " needs a valid value\n" << kUsage;
      return std::nullopt;
    }
  }
  if (o.server.empty() == o.cluster.empty()) {
    std::cerr << "cluster_bench: give one of --server or --cluster\n" << kUsage;
    return std::nullopt;
  }
  if (o.kill_replica > 0 && o.http) {
    std::cerr << "cluster_bench: --kill-replica measures the gRPC front door (leave out --http)\n";
    return std::nullopt;
  }
  if (o.kill_replica > 0 && o.cluster.empty()) {
    std::cerr << "cluster_bench: --kill-replica needs --cluster (for the replica's pid)\n";
    return std::nullopt;
  }
  return o;
}

// Words that are one GPT-2 token each with their leading space.
constexpr const char* kWords[] = {
    "the",   "cache", "server", "prompt", "model", "token", "block", "system", "user",  "answer",
    "query", "data",  "time",   "value",  "state", "rule",  "table", "order",  "price", "code",
    "file",  "page",  "line",   "name",   "list",  "word",  "case",  "point",  "level", "group"};

struct Workload {
  std::vector<v1::GenerateRequest> requests;
  std::vector<uint32_t> prompt_of;
};

Workload MakeWorkload(const Options& o, uint32_t vocab) {
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<uint32_t> id(0, vocab - 1);
  std::uniform_int_distribution<size_t> word(0, std::size(kWords) - 1);
  auto ids = [&](uint32_t n) {
    std::vector<uint32_t> v(n);
    for (uint32_t& x : v) x = id(rng);
    return v;
  };
  auto words = [&](uint32_t n) {
    std::string s;
    for (uint32_t k = 0; k < n; ++k) absl::StrAppend(&s, " ", kWords[word(rng)]);
    return s;
  };
  std::vector<std::vector<uint32_t>> prefix_ids;
  std::vector<std::string> prefix_text;
  for (uint32_t p = 0; p < o.prompts; ++p) {
    if (o.text) {
      prefix_text.push_back(absl::StrCat("System prompt ", p, ":", words(o.prefix_tokens - 4)));
    } else {
      prefix_ids.push_back(ids(o.prefix_tokens));
    }
  }
  // Which prompt each request uses: every prompt --requests-per-prompt times, or as many
  // requests drawn from a Zipf distribution over the prompts (prompt 0 the most popular).
  std::vector<uint32_t> prompt_of;
  if (o.zipf > 0) {
    std::vector<double> weights;
    for (uint32_t p = 0; p < o.prompts; ++p) weights.push_back(1.0 / std::pow(p + 1.0, o.zipf));
    std::discrete_distribution<uint32_t> pick(weights.begin(), weights.end());
    for (uint32_t k = 0; k < o.prompts * o.requests_per_prompt; ++k) prompt_of.push_back(pick(rng));
  } else {
    for (uint32_t p = 0; p < o.prompts; ++p) {
      for (uint32_t r = 0; r < o.requests_per_prompt; ++r) prompt_of.push_back(p);
    }
  }
  Workload w;
  for (uint32_t k = 0; k < prompt_of.size(); ++k) {
    const uint32_t p = prompt_of[k];
    {
      v1::GenerateRequest req;
      if (o.text) {
        req.set_text(absl::StrCat(prefix_text[p], "\nUser:", words(o.suffix_tokens)));
      } else {
        for (uint32_t x : prefix_ids[p]) req.mutable_token_ids()->add_ids(x);
        for (uint32_t x : ids(o.suffix_tokens)) req.mutable_token_ids()->add_ids(x);
      }
      req.set_max_new_tokens(o.max_tokens);
      req.set_ignore_eos(true);
      req.set_seed(k);
      w.requests.push_back(std::move(req));
      w.prompt_of.push_back(p);
    }
  }
  std::vector<size_t> order(w.requests.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  Workload shuffled;
  for (size_t i : order) {
    shuffled.requests.push_back(w.requests[i]);
    shuffled.prompt_of.push_back(w.prompt_of[i]);
  }
  return shuffled;
}

int Run(const Options& o) {
  std::string server = o.server;
  std::vector<int> pids;
  if (!o.cluster.empty()) {
    std::ifstream in(o.cluster);
    if (!in) {
      std::cerr << "cluster_bench: cannot read " << o.cluster << "\n";
      return 1;
    }
    const nlohmann::json c = nlohmann::json::parse(in);
    server = c.at("grpc").get<std::string>();
    if (o.http) {
      if (!c.contains("http")) {
        std::cerr << "cluster_bench: " << o.cluster << " has no HTTP front door\n";
        return 1;
      }
      server = c.at("http").get<std::string>();
    }
    for (const auto& r : c.at("replicas")) pids.push_back(r.at("pid").get<int>());
    if (o.kill_replica > pids.size()) {
      std::cerr << "cluster_bench: --kill-replica " << o.kill_replica << " but the cluster has "
                << pids.size() << " replicas\n";
      return 1;
    }
  }
  auto channel = grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  auto stub = v1::Inference::NewStub(channel);
  v1::ModelInfo info;
  info.set_vocab_size(50257);  // text prompts (all that --http sends) need no vocabulary size
  if (!o.http) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status s = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    if (!s.ok()) {
      std::cerr << "cluster_bench: GetModelInfo at " << server << " failed: " << s.error_message()
                << "\n";
      return 1;
    }
  }
  const Workload w = MakeWorkload(o, info.vocab_size());
  const std::string kill_name = absl::StrCat("r", o.kill_replica);

  std::mutex mu;
  std::condition_variable cv;
  std::vector<Record> records(w.requests.size());
  uint32_t finished = 0;
  double kill_s = -1, restarted_s = -1;
  std::vector<size_t> in_flight_at_kill, streaming_on_killed;
  const Clock::time_point t0 = Clock::now();
  auto now_s = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };

  std::atomic<size_t> next{0};
  // One completion through the HTTP front door, recorded like a gRPC call (200 = OK).
  auto http_request = [&](bench::HttpConnection& conn, size_t i) {
    const v1::GenerateRequest& g = w.requests[i];
    const nlohmann::json body{{"prompt", g.text()}, {"max_tokens", g.max_new_tokens()},
                              {"temperature", 0}, {"ignore_eos", true}, {"seed", g.seed()}};
    {
      std::lock_guard<std::mutex> l(mu);
      records[i].prompt = w.prompt_of[i];
      records[i].start_s = now_s();
      records[i].started = true;
    }
    absl::StatusOr<bench::HttpResponse> res = conn.Post("/v1/completions", body.dump());
    std::lock_guard<std::mutex> l(mu);
    Record& r = records[i];
    r.end_s = now_s();
    if (!res.ok()) {
      r.code = grpc::StatusCode::UNAVAILABLE;
      r.message = std::string(res.status().message());
    } else {
      r.replica = res->headers["x-prefixd-replica"];
      const nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
      if (res->status != 200 || j.is_discarded() || !j.contains("usage")) {
        r.code = grpc::StatusCode::UNKNOWN;
        r.message = absl::StrCat("HTTP ", res->status, ": ", res->body);
      } else {
        r.prompt_tokens = j["usage"]["prompt_tokens"].get<uint32_t>();
        r.cached_tokens = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<uint32_t>();
      }
    }
    ++finished;
    cv.notify_all();
  };
  auto worker = [&] {
    if (o.http) {
      bench::HttpConnection conn(server);
      for (size_t i = next.fetch_add(1); i < w.requests.size(); i = next.fetch_add(1)) {
        http_request(conn, i);
      }
      return;
    }
    for (size_t i = next.fetch_add(1); i < w.requests.size(); i = next.fetch_add(1)) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(o.deadline_s * 1000)));
      {
        std::lock_guard<std::mutex> l(mu);
        records[i].prompt = w.prompt_of[i];
        records[i].start_s = now_s();
        records[i].started = true;
      }
      auto reader = stub->Generate(&ctx, w.requests[i]);
      v1::GenerateResponse msg;
      v1::Usage usage;
      bool first = true;
      while (reader->Read(&msg)) {
        if (first) {
          first = false;
          const auto& md = ctx.GetServerInitialMetadata();
          auto it = md.find("x-prefixd-replica");
          std::lock_guard<std::mutex> l(mu);
          if (it != md.end()) records[i].replica.assign(it->second.data(), it->second.size());
          records[i].streaming = true;
          records[i].first_s = now_s();
          cv.notify_all();
        }
        if (msg.has_usage()) usage = msg.usage();
      }
      grpc::Status s = reader->Finish();
      std::lock_guard<std::mutex> l(mu);
      Record& r = records[i];
      r.end_s = now_s();
      r.streaming = false;
      r.code = s.error_code();
      r.message = s.error_message();
      if (r.replica.empty()) {
        const auto& md = ctx.GetServerInitialMetadata();
        auto it = md.find("x-prefixd-replica");
        if (it != md.end()) r.replica.assign(it->second.data(), it->second.size());
      }
      if (s.ok()) {
        r.prompt_tokens = usage.prompt_tokens();
        r.cached_tokens = usage.cached_prompt_tokens();
      }
      ++finished;
      cv.notify_all();
    }
  };

  std::thread killer;
  if (o.kill_replica > 0) {
    killer = std::thread([&] {
      std::unique_lock<std::mutex> l(mu);
      auto ready = [&] {
        if (finished == records.size()) return true;
        if (finished < o.kill_after) return false;
        for (const Record& r : records) {
          if (r.streaming && r.replica == kill_name) return true;
        }
        return false;
      };
      cv.wait(l, ready);
      if (finished == records.size()) return;
      kill(pids[o.kill_replica - 1], SIGKILL);
      kill_s = now_s();
      for (size_t i = 0; i < records.size(); ++i) {
        const Record& r = records[i];
        if (r.started && r.end_s < 0) {
          in_flight_at_kill.push_back(i);
          if (r.streaming && r.replica == kill_name) streaming_on_killed.push_back(i);
        }
      }
      l.unlock();
      std::this_thread::sleep_for(std::chrono::duration<double>(o.restart_after_s));
      if (!o.restart_command.empty()) {
        const int rc = std::system((o.restart_command + " >/dev/null").c_str());
        l.lock();
        if (rc == 0) {
          restarted_s = now_s();
        } else {
          std::cerr << "cluster_bench: the restart command failed (" << rc << ")\n";
        }
      }
    });
  }

  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < std::min<size_t>(o.concurrency, w.requests.size()); ++t) {
    threads.emplace_back(worker);
  }
  for (std::thread& t : threads) t.join();
  {
    std::lock_guard<std::mutex> l(mu);
    cv.notify_all();
  }
  if (killer.joinable()) killer.join();
  const double wall_s = now_s();

  // Summary.
  uint64_t prompt_tokens = 0, cached = 0;
  uint32_t ok = 0, with_ttft = 0;
  double ttft_sum = 0;
  std::map<std::string, uint32_t> per_replica;
  std::map<std::string, uint32_t> codes;
  for (const Record& r : records) {
    codes[CodeName(r.code)]++;
    if (r.code != grpc::StatusCode::OK) continue;
    ++ok;
    if (r.first_s >= 0) {
      ttft_sum += r.first_s - r.start_s;
      ++with_ttft;
    }
    prompt_tokens += r.prompt_tokens;
    cached += r.cached_tokens;
    per_replica[r.replica.empty() ? "?" : r.replica]++;
  }
  uint32_t busiest = 0;
  for (const auto& [name, n] : per_replica) busiest = std::max(busiest, n);
  const double mean = per_replica.empty() ? 0 : static_cast<double>(ok) / per_replica.size();
  nlohmann::json out = {
      {"server", server},
      {"api", o.http ? "http" : "grpc"},
      {"seed", o.seed},
      {"requests", records.size()},
      {"requests_ok", ok},
      {"wall_s", wall_s},
      {"prompt_tokens", prompt_tokens},
      {"cached_prompt_tokens", cached},
      {"hit_ratio", prompt_tokens ? static_cast<double>(cached) / prompt_tokens : 0.0},
      {"requests_per_s", wall_s > 0 ? ok / wall_s : 0.0},
      {"mean_ttft_s", with_ttft ? ttft_sum / with_ttft : 0.0},
      {"requests_per_replica", per_replica},
      {"busiest_over_mean", mean > 0 ? busiest / mean : 0.0},
      {"codes", codes}};

  if (o.kill_replica > 0 && kill_s >= 0) {
    // Each prompt's home: the replica that served it before the kill.
    std::map<uint32_t, std::string> home;
    for (const Record& r : records) {
      if (r.code == grpc::StatusCode::OK && r.end_s < kill_s) home[r.prompt] = r.replica;
    }
    uint32_t failed = 0, failed_not_in_flight = 0, failed_streaming_on_killed = 0;
    double max_fail_after_kill = 0;
    std::map<std::string, uint32_t> failed_codes;
    for (size_t i = 0; i < records.size(); ++i) {
      const Record& r = records[i];
      if (r.code == grpc::StatusCode::OK) continue;
      ++failed;
      failed_codes[absl::StrCat(CodeName(r.code), ": ", r.message)]++;
      if (std::find(in_flight_at_kill.begin(), in_flight_at_kill.end(), i) ==
          in_flight_at_kill.end()) {
        ++failed_not_in_flight;
      }
      if (std::find(streaming_on_killed.begin(), streaming_on_killed.end(), i) !=
          streaming_on_killed.end()) {
        ++failed_streaming_on_killed;
      }
      max_fail_after_kill = std::max(max_fail_after_kill, r.end_s - kill_s);
    }
    // Requests for the killed replica's prompts, started after the kill: who served them,
    // how long their first token took and how much of their prompts came from a cache (the
    // pool of the replica that took them over, or the shared tier).
    struct Moved {
      uint32_t ok = 0;
      double ttft_sum = 0;
      uint64_t prompt_tokens = 0, cached = 0;
      void Add(const Record& r) {
        if (r.code != grpc::StatusCode::OK || r.first_s < 0) return;
        ++ok;
        ttft_sum += r.first_s - r.start_s;
        prompt_tokens += r.prompt_tokens;
        cached += r.cached_tokens;
      }
      nlohmann::json Json() const {
        return {{"requests_ok", ok},
                {"mean_ttft_s", ok ? ttft_sum / ok : 0.0},
                {"hit_ratio", prompt_tokens ? static_cast<double>(cached) / prompt_tokens : 0.0}};
      }
    };
    std::map<std::string, uint32_t> moved, after_restart;
    Moved moved_figures, after_restart_figures;
    for (const Record& r : records) {
      auto h = home.find(r.prompt);
      const bool killed_home = h != home.end() && h->second == kill_name;
      if (killed_home && r.start_s > kill_s && (restarted_s < 0 || r.start_s < restarted_s)) {
        moved[r.code == grpc::StatusCode::OK ? r.replica : "failed"]++;
        moved_figures.Add(r);
      }
      if (killed_home && restarted_s >= 0 && r.start_s > restarted_s) {
        after_restart[r.code == grpc::StatusCode::OK ? r.replica : "failed"]++;
        after_restart_figures.Add(r);
      }
    }
    out["failover"] = {
        {"killed", kill_name},
        {"kill_at_s", kill_s},
        {"in_flight_at_kill", in_flight_at_kill.size()},
        {"streaming_on_killed_at_kill", streaming_on_killed.size()},
        {"failed", failed},
        {"failed_streaming_on_killed", failed_streaming_on_killed},
        {"failed_not_in_flight_at_kill", failed_not_in_flight},
        {"failed_codes", failed_codes},
        {"max_s_from_kill_to_failure", max_fail_after_kill},
        {"killed_home_prompts_after_kill_served_by", moved},
        {"killed_home_prompts_after_kill", moved_figures.Json()},
        {"restarted_at_s", restarted_s},
        {"killed_home_prompts_after_restart_served_by", after_restart},
        {"killed_home_prompts_after_restart", after_restart_figures.Json()}};
  }
  std::cout << out.dump() << "\n";

  if (!o.requests_out.empty()) {
    std::ofstream f(o.requests_out);
    for (const Record& r : records) {
      f << nlohmann::json{{"prompt", r.prompt}, {"start_s", r.start_s}, {"end_s", r.end_s},
                          {"replica", r.replica}, {"code", static_cast<int>(r.code)},
                          {"message", r.message}, {"prompt_tokens", r.prompt_tokens},
                          {"cached_prompt_tokens", r.cached_tokens}}
               .dump()
        << "\n";
    }
  }
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) {
  auto o = prefixd::Parse(argc, argv);
  if (!o.has_value()) return 2;
  return prefixd::Run(*o);
}
