#include "client/bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace prefixd {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::vector<uint32_t> RandomIds(uint64_t seed, uint32_t n, uint32_t vocab) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint32_t> dist(0, vocab - 1);
  std::vector<uint32_t> ids(n);
  for (uint32_t& id : ids) id = dist(rng);
  return ids;
}

void DrawProgress(std::ostream& err, uint32_t done, uint32_t total) {
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * static_cast<double>(done) / total);
  err << "\r[" << std::string(filled, '#') << std::string(kWidth - filled, ' ') << "] " << done
      << "/" << total << std::flush;
}

}  // namespace

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(values.size()));
  const size_t index = static_cast<size_t>(std::max(1.0, rank)) - 1;
  return values[std::min(index, values.size() - 1)];
}

void PrintBenchReport(const BenchReport& r, bool json, std::ostream& out) {
  const double rps = r.wall_s > 0 ? r.requests_ok / r.wall_s : 0;
  const double tps = r.wall_s > 0 ? r.completion_tokens / r.wall_s : 0;
  const double hit = r.prompt_tokens == 0 ? 0
                                          : static_cast<double>(r.cached_prompt_tokens) /
                                                static_cast<double>(r.prompt_tokens);
  if (json) {
    auto pct = [](const std::vector<double>& v) {
      return nlohmann::json{
          {"p50", Percentile(v, 50)}, {"p90", Percentile(v, 90)}, {"p99", Percentile(v, 99)}};
    };
    out << nlohmann::json{{"requests_ok", r.requests_ok},
                          {"requests_failed", r.requests_failed},
                          {"wall_s", r.wall_s},
                          {"requests_per_s", rps},
                          {"tokens_per_s", tps},
                          {"completion_tokens", r.completion_tokens},
                          {"prompt_tokens", r.prompt_tokens},
                          {"cached_prompt_tokens", r.cached_prompt_tokens},
                          {"cache_hit_ratio", hit},
                          {"ttft_s", pct(r.ttft_s)},
                          {"itl_s", pct(r.itl_s)}}
               .dump()
        << "\n";
    return;
  }
  auto ms = [](double s) { return s * 1000.0; };
  out << absl::StrFormat("requests          %u ok, %u failed in %.2f s\n", r.requests_ok,
                         r.requests_failed, r.wall_s);
  out << absl::StrFormat("requests/s        %.2f\n", rps);
  out << absl::StrFormat("tokens/s          %.1f (generated)\n", tps);
  out << absl::StrFormat("%-17s %10s %10s %10s\n", "latency (ms)", "p50", "p90", "p99");
  out << absl::StrFormat("%-17s %10.2f %10.2f %10.2f\n", "TTFT", ms(Percentile(r.ttft_s, 50)),
                         ms(Percentile(r.ttft_s, 90)), ms(Percentile(r.ttft_s, 99)));
  out << absl::StrFormat("%-17s %10.2f %10.2f %10.2f\n", "inter-token", ms(Percentile(r.itl_s, 50)),
                         ms(Percentile(r.itl_s, 90)), ms(Percentile(r.itl_s, 99)));
  out << absl::StrFormat("cache hit ratio   %.3f (%u of %u prompt tokens)\n", hit,
                         r.cached_prompt_tokens, r.prompt_tokens);
}

int RunBench(Connection& conn, const CliArgs& args, std::ostream& out, std::ostream& err) {
  const BenchArgs& b = args.bench;
  v1::ModelInfo info;
  {
    auto ctx = conn.NewContext();
    grpc::Status s = conn.stub().GetModelInfo(ctx.get(), v1::GetModelInfoRequest(), &info);
    if (!s.ok()) {
      err << DescribeRpcError("bench (GetModelInfo)", s) << "\n";
      return 1;
    }
  }
  const uint64_t needed = uint64_t{b.prefix_tokens} + b.suffix_tokens + b.max_tokens;
  if (needed > info.context_length()) {
    err << absl::StrFormat(
        "prefixctl: bench: prefix + suffix + max-tokens = %u exceeds the model's context %u\n",
        needed, info.context_length());
    return 2;
  }
  const std::vector<uint32_t> prefix = RandomIds(b.seed, b.prefix_tokens, info.vocab_size());

  BenchReport report;
  std::mutex mu;
  std::atomic<uint32_t> next{0};
  std::atomic<uint32_t> finished{0};
  std::string first_error;
  const Clock::time_point start = Clock::now();
  auto worker = [&] {
    for (uint32_t i = next.fetch_add(1); i < b.requests; i = next.fetch_add(1)) {
      v1::GenerateRequest req;
      auto* ids = req.mutable_token_ids();
      for (uint32_t id : prefix) ids->add_ids(id);
      for (uint32_t id : RandomIds(b.seed * 1000003 + i + 1, b.suffix_tokens, info.vocab_size()))
        ids->add_ids(id);
      req.set_max_new_tokens(b.max_tokens);
      req.set_ignore_eos(true);
      req.set_seed(i);
      auto ctx = conn.NewContext();
      const Clock::time_point t0 = Clock::now();
      auto reader = conn.stub().Generate(ctx.get(), req);
      v1::GenerateResponse msg;
      std::vector<double> itl;
      double ttft = -1;
      Clock::time_point last = t0;
      v1::Usage usage;
      while (reader->Read(&msg)) {
        const Clock::time_point now = Clock::now();
        const int n = msg.token_ids_size();
        if (n > 0) {
          if (ttft < 0) {
            ttft = Seconds(now - t0);
            for (int k = 1; k < n; ++k) itl.push_back(0);  // arrived with the first token
          } else {
            for (int k = 0; k < n; ++k) itl.push_back(Seconds(now - last) / n);
          }
          last = now;
        }
        if (msg.has_usage()) usage = msg.usage();
      }
      grpc::Status s = reader->Finish();
      std::lock_guard<std::mutex> l(mu);
      if (s.ok()) {
        ++report.requests_ok;
        report.completion_tokens += usage.completion_tokens();
        report.prompt_tokens += usage.prompt_tokens();
        report.cached_prompt_tokens += usage.cached_prompt_tokens();
        if (ttft >= 0) report.ttft_s.push_back(ttft);
        report.itl_s.insert(report.itl_s.end(), itl.begin(), itl.end());
      } else {
        ++report.requests_failed;
        if (first_error.empty()) first_error = DescribeRpcError("bench request", s);
      }
      DrawProgress(err, finished.fetch_add(1) + 1, b.requests);
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < std::min(b.concurrency, b.requests); ++t) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  report.wall_s = Seconds(Clock::now() - start);
  err << "\n";
  if (!first_error.empty()) err << first_error << "\n";
  PrintBenchReport(report, args.json, out);
  return report.requests_failed == 0 ? 0 : 1;
}

}  // namespace prefixd
