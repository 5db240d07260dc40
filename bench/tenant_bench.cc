// Two tenants on one engine (issue 49, "Measure"): does a quiet tenant keep its prefix cache
// and its time to first token while a noisy one floods the engine?
//
// CPU backend, full-size random GPT-2 (124M, fp32), a KV pool that holds --pool-prompts
// prompts (default 32) of --prefix + --suffix + --new tokens. The quiet tenant ("quiet")
// sends --quiet-requests requests (default 40), one every --quiet-interval-ms (default 200,
// open loop: a slow answer does not delay the next request), each its own shared --prefix
// tokens (default 512) + --suffix unique tokens (default 16), --new tokens (default 8, greedy,
// EOS ignored). The noisy tenant ("noisy") keeps --noisy-concurrency requests in flight
// (default 8, closed loop) of unique --prefix-token prompts, --new tokens each, for the whole
// time quiet runs; quiet starts once the flood is up (the first noisy request finished).
// Requests carry their tenant's name and its cache namespace (CacheNamespace(tenant, ""), as
// the server derives it), so the tenants never share a block. Three scenarios, one engine
// each, in one run:
//   solo      quiet alone;
//   flood     quiet under the flood, no tenant features (cache share 1, weights 1, no
//             retention);
//   features  quiet under the flood with them: tenant_cache_share --share (default 0.5) for
//             both tenants, quiet's weight --quiet-weight (default 1) as a TenantPolicy, and
//             quiet's requests with cache_retention 24 h.
// For quiet per scenario: hit rate (Σ cached_prompt_tokens / Σ prompt tokens, from each
// request's final Usage), mean and p90 TTFT (client side: Submit to the first token), and
// their ratios against solo; the noisy tenant's finished requests and throughput (prompt and
// generated tokens per second of quiet's run), and the pool's evictions. Then the goal lines:
// under the flood with the features quiet keeps >= 90 % of its solo hit rate and its p90 TTFT
// within 1.5x of solo.
//
// Usage: tenant_bench [--model DIR] [--threads 2] [--pool-prompts 32] [--prefix 512]
//          [--suffix 16] [--new 8] [--quiet-requests 40] [--quiet-interval-ms 200]
//          [--noisy-concurrency 8] [--share 0.5] [--quiet-weight 1]
//          [--max-batch-tokens 512] [--only solo|flood|features]
// --max-batch-tokens is the engine's step budget in every scenario: a step that computes a
// noisy prompt's chunk of that many tokens is what a quiet request waits for at least.
// With --only one scenario runs (the ratios need solo). Without --model a random GPT-2 is
// written to a temporary directory first.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "base/command_line.h"
#include "bench/bench_clock.h"
#include "cache/block_key.h"
#include "cache/kv_layout.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tenant_policy.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/cpu_backend.h"
#include "tools/random_model.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;

constexpr char kQuiet[] = "quiet";
constexpr char kNoisy[] = "noisy";

struct Flags {
  std::string model;
  int threads = 2;
  int pool_prompts = 32;
  int prefix = 512;
  int suffix = 16;
  int new_tokens = 8;
  int quiet_requests = 40;
  int quiet_interval_ms = 200;
  int noisy_concurrency = 8;
  double share = 0.5;
  int quiet_weight = 1;
  int max_batch_tokens = 512;  // the engine's step budget, every scenario
  std::string only;
};

enum class Scenario { kSolo, kFlood, kFeatures };

const char* Name(Scenario s) {
  switch (s) {
    case Scenario::kSolo:
      return "solo";
    case Scenario::kFlood:
      return "flood";
    case Scenario::kFeatures:
      return "features";
  }
  return "?";
}

struct Result {
  // Quiet's.
  uint64_t quiet_prompt = 0;
  uint64_t quiet_cached = 0;
  uint64_t quiet_retained = 0;
  std::vector<double> ttft_s;
  double quiet_wall_s = 0;  // first Submit to the last kDone
  // Noisy's, over quiet's run: requests that finished in it.
  uint64_t noisy_done = 0;
  uint64_t noisy_prompt = 0;
  uint64_t noisy_generated = 0;
  uint64_t evictions = 0;        // the pool's, over quiet's run
  uint64_t quiet_evictions = 0;  // of those, quiet's blocks (EngineStats::tenants)
  int64_t pool_blocks = 0;

  double HitRate() const {
    return quiet_prompt == 0 ? 0 : static_cast<double>(quiet_cached) / quiet_prompt;
  }
};

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "tenant_bench: %s: %s\n", what.c_str(), std::string(s.message()).c_str());
  std::exit(1);
}

std::vector<uint32_t> RandomTokens(std::mt19937* rng, int n, uint32_t vocab) {
  std::vector<uint32_t> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) out.push_back((*rng)() % vocab);
  return out;
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

Result RunScenario(const Model& model, const Flags& f, Scenario scenario) {
  const ModelConfig& c = model.config();
  // The tokens are drawn below the EOS id (GPT-2's is the last); a tiny model's vocabulary
  // may be smaller.
  const uint32_t vocab = static_cast<uint32_t>(std::max(2, std::min(c.vocab_size - 1, 50256)));
  const int32_t block = 16;
  const int64_t blocks_per_prompt = (f.prefix + f.suffix + f.new_tokens + block - 1) / block;
  const int64_t blocks = f.pool_prompts * blocks_per_prompt;
  CpuBackendOptions b;
  b.model = &model;
  b.kv_pool.budget_bytes = blocks * block * KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), 4);
  b.kv_pool.block_size = block;
  b.threads = f.threads;
  auto backend = CreateCpuBackend(b);
  if (!backend.ok()) Die("backend", backend.status());
  EngineOptions o;
  o.backend = backend->get();
  o.model_config = c;
  o.manifest_sha256 = model.manifest_sha256();
  o.max_batch_tokens = f.max_batch_tokens;
  const bool features = scenario == Scenario::kFeatures;
  if (features) {
    o.tenant_cache_share = f.share;
    TenantPolicy quiet;
    quiet.name = kQuiet;
    quiet.weight = static_cast<uint32_t>(f.quiet_weight);
    o.tenants.push_back(quiet);
  } else {
    o.tenant_cache_share = 1.0;
  }
  auto engine = Engine::Create(o);
  if (!engine.ok()) Die("engine", engine.status());

  Result result;
  result.pool_blocks = (*engine)->Stats().cache.blocks_total;
  std::mutex mu;

  // The noisy tenant: closed loop until `stop`; what finishes before it counts.
  std::atomic<bool> stop{false};
  std::atomic<int> noisy_finished{0};
  std::atomic<bool> counting{false};
  std::vector<std::thread> noisy;
  if (scenario != Scenario::kSolo) {
    for (int t = 0; t < f.noisy_concurrency; ++t) {
      noisy.emplace_back([&, t] {
        std::mt19937 rng(1000 + t);
        for (int i = 0; !stop.load(); ++i) {
          EngineRequest r;
          r.request_id = absl::StrCat("noisy-", t, "-", i);
          r.tenant = kNoisy;
          r.cache_namespace = CacheNamespace(kNoisy, "");
          r.prompt = RandomTokens(&rng, f.prefix, vocab);
          r.max_new_tokens = f.new_tokens;
          r.ignore_eos = true;
          auto stream = (*engine)->Submit(std::move(r));
          if (!stream.ok()) Die("noisy submit", stream.status());
          RequestEvent e;
          uint64_t generated = 0;
          bool cancelled = false;
          for (;;) {
            if (!(*stream)->Wait(&e, absl::Now() + absl::Milliseconds(20))) {
              if (stop.load() && !cancelled) {
                (*stream)->Cancel();
                cancelled = true;
              }
              continue;
            }
            if (e.kind == RequestEvent::Kind::kToken) {
              ++generated;
            } else if (e.kind == RequestEvent::Kind::kDone) {
              if (cancelled) break;
              if (!e.status.ok()) Die("noisy request", e.status);
              ++noisy_finished;
              if (counting.load()) {
                std::lock_guard<std::mutex> lock(mu);
                ++result.noisy_done;
                result.noisy_prompt += e.usage.prompt_tokens;
                result.noisy_generated += generated;
              }
              break;
            }
          }
        }
      });
    }
    // The flood is up once the first of its requests has finished.
    while (noisy_finished.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  // The quiet tenant: open loop, one request every interval.
  std::mt19937 rng(7);
  const std::vector<uint32_t> shared = RandomTokens(&rng, f.prefix, vocab);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < f.quiet_requests; ++i) {
    EngineRequest r;
    r.request_id = absl::StrCat("quiet-", i);
    r.tenant = kQuiet;
    r.cache_namespace = CacheNamespace(kQuiet, "");
    if (features) r.cache_retention = absl::Hours(24);
    r.prompt = shared;
    const std::vector<uint32_t> own = RandomTokens(&rng, f.suffix, vocab);
    r.prompt.insert(r.prompt.end(), own.begin(), own.end());
    r.max_new_tokens = f.new_tokens;
    r.ignore_eos = true;
    requests.push_back(std::move(r));
  }
  const uint64_t evictions_before = (*engine)->Stats().cache.evictions;
  counting = true;
  const double start = bench::Now();
  double last_done = start;
  std::vector<std::thread> quiet;
  for (int i = 0; i < f.quiet_requests; ++i) {
    const double at = start + i * f.quiet_interval_ms * 1e-3;
    const double wait = at - bench::Now();
    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    quiet.emplace_back([&, i] {
      const double submitted = bench::Now();
      auto stream = (*engine)->Submit(requests[i]);
      if (!stream.ok()) Die("quiet submit", stream.status());
      double ttft = -1;
      RequestEvent e;
      while ((*stream)->Wait(&e)) {
        if (e.kind == RequestEvent::Kind::kToken) {
          if (ttft < 0) ttft = bench::Now() - submitted;
        } else if (e.kind == RequestEvent::Kind::kDone) {
          if (!e.status.ok()) Die("quiet request", e.status);
          std::lock_guard<std::mutex> lock(mu);
          result.ttft_s.push_back(ttft);
          result.quiet_prompt += e.usage.prompt_tokens;
          result.quiet_cached += e.usage.cached_prompt_tokens;
          result.quiet_retained += e.usage.cached_retained_tokens;
          last_done = std::max(last_done, bench::Now());
          break;
        }
      }
    });
  }
  for (std::thread& t : quiet) t.join();
  counting = false;
  result.quiet_wall_s = last_done - start;
  const EngineStats after = (*engine)->Stats();
  result.evictions = after.cache.evictions - evictions_before;
  for (const auto& [name, t] : after.tenants) {
    if (name == kQuiet) result.quiet_evictions = t.evictions;
  }
  stop = true;
  for (std::thread& t : noisy) t.join();
  (*engine)->Shutdown(absl::ZeroDuration());
  return result;
}

int Main(int argc, char** argv) {
  static const FlagSpec kFlags[] = {{"model"},
                                    {"threads"},
                                    {"pool-prompts"},
                                    {"prefix"},
                                    {"suffix"},
                                    {"new"},
                                    {"quiet-requests"},
                                    {"quiet-interval-ms"},
                                    {"noisy-concurrency"},
                                    {"share"},
                                    {"quiet-weight"},
                                    {"max-batch-tokens"},
                                    {"only"}};
  absl::StatusOr<ParsedCommandLine> args =
      ParseArgv(absl::MakeConstSpan(argv + 1, static_cast<size_t>(argc - 1)), kFlags);
  if (!args.ok() || !args->positional.empty()) {
    std::fprintf(stderr, "tenant_bench: %s (see the header of tenant_bench.cc)\n",
                 args.ok() ? "unexpected positional argument"
                           : std::string(args.status().message()).c_str());
    return 2;
  }
  Flags f;
  f.model = args->Flag("model").value_or(f.model);
  f.only = args->Flag("only").value_or(f.only);
  if (!f.only.empty() && f.only != "solo" && f.only != "flood" && f.only != "features") {
    std::fprintf(stderr, "tenant_bench: --only must be solo, flood or features\n");
    return 2;
  }
  for (auto [name, field] : {std::pair<const char*, int*>{"threads", &f.threads},
                             {"pool-prompts", &f.pool_prompts},
                             {"prefix", &f.prefix},
                             {"suffix", &f.suffix},
                             {"new", &f.new_tokens},
                             {"quiet-requests", &f.quiet_requests},
                             {"quiet-interval-ms", &f.quiet_interval_ms},
                             {"noisy-concurrency", &f.noisy_concurrency},
                             {"quiet-weight", &f.quiet_weight},
                             {"max-batch-tokens", &f.max_batch_tokens}}) {
    const std::optional<std::string> v = args->Flag(name);
    if (!v.has_value()) continue;
    absl::StatusOr<int64_t> n = ParseInteger(*v, absl::StrCat("--", name), 1, 1 << 20);
    if (!n.ok()) {
      std::fprintf(stderr, "tenant_bench: %s\n", std::string(n.status().message()).c_str());
      return 2;
    }
    *field = static_cast<int>(*n);
  }
  if (const std::optional<std::string> v = args->Flag("share"); v.has_value()) {
    absl::StatusOr<float> x = ParseFiniteFloat(*v, "--share");
    if (!x.ok() || *x <= 0 || *x > 1) {
      std::fprintf(stderr, "tenant_bench: --share must be a number in (0, 1]\n");
      return 2;
    }
    f.share = *x;
  }
  if (f.pool_prompts < f.noisy_concurrency + 2) {
    std::fprintf(stderr,
                 "tenant_bench: --pool-prompts must hold the noisy requests in flight + 2 (%d)\n",
                 f.noisy_concurrency + 2);
    return 2;
  }

  const fs::path root =
      fs::temp_directory_path() / absl::StrCat("prefixd_tenant_bench_", ::getpid());
  std::string model_dir = f.model;
  if (model_dir.empty()) {
    model_dir = (root / "model").string();
    RandomModelOptions o;
    o.out_dir = model_dir;
    o.config = Gpt2ModelConfig();
    o.seed = 1;
    if (absl::Status st = WriteRandomModel(o); !st.ok()) Die("writing the model", st);
  }
  auto model = Model::Load(model_dir);
  if (!model.ok()) Die("model", model.status());
  if (f.prefix + f.suffix + f.new_tokens > (*model)->config().n_positions) {
    std::fprintf(stderr, "tenant_bench: --prefix + --suffix + --new must fit the context (%d)\n",
                 (*model)->config().n_positions);
    return 2;
  }
  std::printf(
      "model %s (%d layers, %d wide, fp32), %d threads; pool of %d prompts of %d tokens; "
      "quiet: %d requests, one every %d ms, %d-token shared prefix + %d own, %d new; noisy: "
      "%d in flight, unique %d-token prompts, %d new; features: share %.2f, quiet weight %d, "
      "quiet retention 24h\n",
      (*model)->name().c_str(), (*model)->config().n_layer, (*model)->config().n_embd, f.threads,
      f.pool_prompts, f.prefix + f.suffix + f.new_tokens, f.quiet_requests, f.quiet_interval_ms,
      f.prefix, f.suffix, f.new_tokens, f.noisy_concurrency, f.prefix, f.new_tokens, f.share,
      f.quiet_weight);
  std::fflush(stdout);

  std::vector<std::pair<Scenario, Result>> results;
  for (Scenario s : {Scenario::kSolo, Scenario::kFlood, Scenario::kFeatures}) {
    if (!f.only.empty() && f.only != Name(s)) continue;
    results.emplace_back(s, RunScenario(**model, f, s));
    const Result& r = results.back().second;
    std::printf("%s: done in %.2f s\n", Name(s), r.quiet_wall_s);
    std::fflush(stdout);
  }
  std::error_code ec;
  fs::remove_all(root, ec);

  const Result* solo = nullptr;
  for (const auto& [s, r] : results) {
    if (s == Scenario::kSolo) solo = &r;
  }
  std::printf("\n%-9s %8s %9s %10s %10s %9s %9s | %7s %11s %11s %9s\n", "scenario", "hit rate",
              "retained", "TTFT mean", "TTFT p90", "hit/solo", "p90/solo", "noisy", "prompt tok/s",
              "gen tok/s", "evictions (quiet's)");
  for (const auto& [s, r] : results) {
    const double mean = Mean(r.ttft_s), p90 = Percentile(r.ttft_s, 0.9);
    std::string hit_ratio = "-", p90_ratio = "-";
    if (solo != nullptr && solo->HitRate() > 0) {
      hit_ratio = absl::StrFormat("%.2f", r.HitRate() / solo->HitRate());
    }
    if (solo != nullptr && Percentile(solo->ttft_s, 0.9) > 0) {
      p90_ratio = absl::StrFormat("%.2fx", p90 / Percentile(solo->ttft_s, 0.9));
    }
    const double wall = std::max(r.quiet_wall_s, 1e-9);
    std::printf(
        "%-9s %7.1f%% %9llu %9.1fms %9.1fms %9.9s %9.9s | %7llu %12.1f %11.1f %9llu (%llu)\n",
        Name(s), r.HitRate() * 100, static_cast<unsigned long long>(r.quiet_retained), mean * 1e3,
        p90 * 1e3, hit_ratio.c_str(), p90_ratio.c_str(),
        static_cast<unsigned long long>(r.noisy_done), r.noisy_prompt / wall,
        r.noisy_generated / wall, static_cast<unsigned long long>(r.evictions),
        static_cast<unsigned long long>(r.quiet_evictions));
  }
  std::printf(
      "(hit rate: quiet's Σ cached / Σ prompt tokens; retained: of its cached tokens, those "
      "from retained blocks; TTFT: quiet's, Submit to first token; noisy: its requests "
      "finished during quiet's run, tokens per second of that run; evictions: the pool's "
      "cached blocks evicted then, of %lld blocks)\n",
      static_cast<long long>(results.empty() ? 0 : results.front().second.pool_blocks));

  const Result* with = nullptr;
  for (const auto& [s, r] : results) {
    if (s == Scenario::kFeatures) with = &r;
  }
  if (solo == nullptr || with == nullptr) return 0;
  const double hit_ratio = solo->HitRate() > 0 ? with->HitRate() / solo->HitRate() : 0;
  const double p90_ratio =
      Percentile(with->ttft_s, 0.9) / std::max(Percentile(solo->ttft_s, 0.9), 1e-9);
  std::printf(
      "\ngoal: under the flood with the features quiet keeps >= 90%% of its solo hit rate: "
      "%.1f%% -> %s\n",
      hit_ratio * 100, hit_ratio >= 0.9 ? "met" : "NOT met");
  std::printf(
      "goal: under the flood with the features quiet's p90 TTFT within 1.5x of solo: "
      "%.2fx -> %s\n",
      p90_ratio, p90_ratio <= 1.5 ? "met" : "NOT met");
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) { return prefixd::Main(argc, argv); }
