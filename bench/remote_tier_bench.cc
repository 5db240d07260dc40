// The remote (Redis) cache tier on the CPU backend, full-size GPT-2 (random weights, fp32), in
// one run:
//
//  block  The cost of one 16-token block from the remote tier versus computing it. An engine
//         computes a --prefix-token prompt (default 512) + 16 own tokens and publishes its
//         blocks; a second engine (another replica: its own empty pool), after fetching
//         another prefix first (a running replica), runs the same prefix with new own tokens.
//         Per block: the remote fetch (GET + verify, off the engine thread) + the copy into
//         the pool, versus a cold engine's prefill time per 16 tokens; the two
//         time-to-first-tokens; and the first fetch's cost per block on the fresh replica.
//  steps  Whether other requests keep decoding while blocks are fetched. One request decodes
//         a long answer; meanwhile --requests requests whose --prefix tokens are in Redis (each
//         + 1 own token) arrive, then as many whose prefixes are not (computed). The decoding
//         request's time per token (medians) alone, during the remote loads and during the
//         cold prefills.
//  slow   Time to first token with a slow Redis (issue 53, item 2). A redis-server started
//         here, and a proxy in front of it that passes every reply on --delay-ms late
//         (tests/testing/delay_proxy.h). Engines with the default --kv-remote-timeout
//         (250 ms, which also bounds each whole fetch). TTFT of a request whose --slow-blocks
//         blocks (default 16) are in Redis (+ 16 own tokens) on a fresh replica: straight to
//         Redis, through the proxy, and --requests such requests at once through it; a miss
//         (nothing in Redis) straight and through the proxy; and the same prompt cold.
//  oversized  This process's RSS over --rounds rounds (default 6) of junk planted in Redis
//         (issue 53, item 3). One replica engine serves all rounds; each round a fresh
//         publisher engine publishes a new one-block prefix and shuts down, the value under
//         its key is grown to 64 .. 200 MB (SETRANGE: the junk never passes through this
//         process), and the
//         replica runs the prefix + 1 token: a remote match, a fetch that meets the oversized
//         value (refused by its length now, read whole before), the block computed. RSS
//         after each round, and after FLUSHALL.
//
// Usage: remote_tier_bench [--model DIR] [--kv-remote URL] [--threads 2] [--prefix 512]
//          [--reps 3] [--requests 4] [--only block|steps|slow|oversized] [--delay-ms 200]
//          [--slow-blocks 16] [--rounds 6]
// Without --only, block and steps. Without --kv-remote a redis-server (Debian package) is
// started on a unix socket in a temporary directory and stopped at the end; slow always
// starts its own. Without --model a random GPT-2 is written to a
// temporary directory first.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/command_line.h"
#include "cache/kv_layout.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/testing/delay_proxy.h"
#include "tests/testing/redis_server.h"
#include "tools/random_model.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Flags {
  std::string model;
  std::string remote;
  int threads = 2;
  int prefix = 512;
  int reps = 3;
  int requests = 4;
  std::string only;
  int delay_ms = 200;
  int slow_blocks = 16;
  int rounds = 6;
};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "remote_tier_bench: %s: %s\n", what.c_str(),
               std::string(s.message()).c_str());
  std::exit(1);
}

std::vector<uint32_t> RandomTokens(std::mt19937* rng, int n) {
  std::vector<uint32_t> out;
  for (int i = 0; i < n; ++i) out.push_back((*rng)() % 50256);
  return out;
}

std::vector<uint32_t> Concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A backend and an engine over it; no remote tier when `url` is empty.
struct Served {
  Served(const Model& model, const Flags& f, int64_t pool_tokens, const std::string& url,
         absl::Duration timeout = absl::Seconds(1)) {
    const ModelConfig& c = model.config();
    CpuBackendOptions b;
    b.model = &model;
    b.kv_pool.budget_bytes = pool_tokens * KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), 4);
    b.kv_pool.block_size = 16;
    b.threads = f.threads;
    auto made = CreateCpuBackend(b);
    if (!made.ok()) Die("backend", made.status());
    backend = *std::move(made);
    EngineOptions o;
    o.backend = backend.get();
    o.model_config = c;
    o.manifest_sha256 = model.manifest_sha256();
    o.max_batch_tokens = 512;
    o.remote_tier.url = url;
    // 1 s by default: a loaded machine; faults are not measured (slow passes the default).
    o.remote_tier.timeout = timeout;
    auto e = Engine::Create(o);
    if (!e.ok()) Die("engine", e.status());
    engine = *std::move(e);
  }
  // The grace lets the engine publish what it queued.
  ~Served() { engine->Shutdown(absl::Seconds(10)); }

  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
};

struct Outcome {
  double ttft_s = 0;
  uint64_t cached = 0;
};

Outcome Run(Engine& engine, const std::vector<uint32_t>& prompt, uint32_t new_tokens) {
  EngineRequest r;
  r.prompt = prompt;
  r.max_new_tokens = new_tokens;
  r.ignore_eos = true;
  const auto t0 = Clock::now();
  auto stream = engine.Submit(r);
  if (!stream.ok()) Die("submit", stream.status());
  Outcome out;
  RequestEvent e;
  bool first = true;
  while ((*stream)->Wait(&e)) {
    if (e.kind == RequestEvent::Kind::kToken && first) {
      out.ttft_s = Seconds(t0, Clock::now());
      first = false;
    } else if (e.kind == RequestEvent::Kind::kDone) {
      if (!e.status.ok()) Die("request", e.status);
      out.cached = e.usage.cached_prompt_tokens;
      break;
    }
  }
  return out;
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Block(const Model& model, const Flags& f, const std::string& url) {
  const int64_t pool_tokens = f.prefix + 16 + 64;
  std::mt19937 rng(21);
  std::vector<double> cold, warm, fetches, first_fetches;
  uint64_t cached = 0;
  for (int rep = 0; rep < f.reps; ++rep) {
    const std::vector<uint32_t> prefix = RandomTokens(&rng, f.prefix);
    const std::vector<uint32_t> earlier = RandomTokens(&rng, f.prefix);
    {
      Served publisher(model, f, pool_tokens, url);
      Run(*publisher.engine, Concat(prefix, RandomTokens(&rng, 16)), 1);
      Run(*publisher.engine, Concat(earlier, RandomTokens(&rng, 16)), 1);
    }  // shut down with a grace: its blocks are published
    const std::vector<uint32_t> prompt = Concat(prefix, RandomTokens(&rng, 16));
    {
      Served cold_engine(model, f, pool_tokens, "");
      cold.push_back(Run(*cold_engine.engine, prompt, 1).ttft_s);
    }
    Served replica(model, f, pool_tokens, url);
    // A running replica: it has fetched another prefix before (its tier's buffers are warm).
    Run(*replica.engine, Concat(earlier, RandomTokens(&rng, 16)), 1);
    for (double x : replica.engine->DrainLatencies().remote_load) first_fetches.push_back(x);
    const Outcome o = Run(*replica.engine, prompt, 1);
    warm.push_back(o.ttft_s);
    cached = o.cached;
    for (double x : replica.engine->DrainLatencies().remote_load) fetches.push_back(x);
  }
  const double per_block_compute = Mean(cold) / (static_cast<double>(f.prefix + 16) / 16.0);
  std::printf(
      "block: prompt %d tokens, %llu from the remote tier; TTFT cold %.1f ms, from Redis "
      "%.1f ms (%.2fx); per 16-token block: fetched + verified + copied %.2f ms (%zu blocks), "
      "computed %.2f ms (%.1fx); a fresh replica's first fetch %.2f ms per block\n",
      f.prefix + 16, static_cast<unsigned long long>(cached), Mean(cold) * 1e3, Mean(warm) * 1e3,
      Mean(cold) / std::max(Mean(warm), 1e-9), Mean(fetches) * 1e3, fetches.size(),
      per_block_compute * 1e3, per_block_compute / std::max(Mean(fetches), 1e-9),
      Mean(first_fetches) * 1e3);
}

void Steps(const Model& model, const Flags& f, const std::string& url) {
  std::mt19937 rng(31);
  std::vector<std::vector<uint32_t>> warm_prefixes;
  for (int i = 0; i < f.requests; ++i) warm_prefixes.push_back(RandomTokens(&rng, f.prefix));
  {
    Served publisher(model, f, int64_t{f.prefix + 64} * 2, url);
    for (const auto& p : warm_prefixes) Run(*publisher.engine, Concat(p, RandomTokens(&rng, 1)), 1);
  }
  Served s(model, f, int64_t{f.prefix + 64} * (f.requests + 2) + 1024, url);
  EngineRequest d;
  d.prompt = RandomTokens(&rng, 32);
  d.max_new_tokens = static_cast<uint32_t>(model.config().n_positions - 40);
  d.ignore_eos = true;
  auto stream = s.engine->Submit(d);
  if (!stream.ok()) Die("submit", stream.status());
  std::mutex mu;
  std::vector<Clock::time_point> token_times;
  std::thread reader([&] {
    RequestEvent e;
    while ((*stream)->Wait(&e)) {
      if (e.kind == RequestEvent::Kind::kToken) {
        std::lock_guard<std::mutex> l(mu);
        token_times.push_back(Clock::now());
      } else if (e.kind == RequestEvent::Kind::kDone) {
        break;
      }
    }
  });
  auto tokens = [&] {
    std::lock_guard<std::mutex> l(mu);
    return token_times.size();
  };
  while (tokens() < 20) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const Clock::time_point alone_from = Clock::now();
  while (tokens() < 60) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto burst = [&](bool warm) {
    std::vector<std::thread> ts;
    uint64_t cached = 0;
    std::mutex cmu;
    for (int i = 0; i < f.requests; ++i) {
      std::vector<uint32_t> p = warm ? warm_prefixes[i] : RandomTokens(&rng, f.prefix);
      p.push_back(7 + static_cast<uint32_t>(i));
      ts.emplace_back([&, p] {
        const Outcome o = Run(*s.engine, p, 1);
        std::lock_guard<std::mutex> l(cmu);
        cached += o.cached;
      });
    }
    for (std::thread& t : ts) t.join();
    return cached;
  };
  const Clock::time_point remote_from = Clock::now();
  const uint64_t remote_cached = burst(true);
  const Clock::time_point cold_from = Clock::now();
  const uint64_t cold_cached = burst(false);
  const Clock::time_point cold_to = Clock::now();
  (*stream)->Cancel();
  reader.join();
  auto intervals = [&](Clock::time_point from, Clock::time_point to) {
    std::vector<double> out;
    for (size_t i = 1; i < token_times.size(); ++i) {
      if (token_times[i] > from && token_times[i] <= to) {
        out.push_back(Seconds(token_times[i - 1], token_times[i]));
      }
    }
    return out;
  };
  const std::vector<double> alone = intervals(alone_from, remote_from);
  const std::vector<double> loading = intervals(remote_from, cold_from);
  const std::vector<double> computing = intervals(cold_from, cold_to);
  std::printf(
      "steps: the decoding request's time per token (median): alone %.1f ms (%zu tokens); "
      "while %d requests load %d-token prefixes from Redis (%llu tokens cached) %.1f ms (%zu "
      "tokens, %.2fx); while %d requests compute theirs (%llu cached) %.1f ms (%zu tokens, "
      "%.2fx)\n",
      Median(alone) * 1e3, alone.size(), f.requests, f.prefix,
      static_cast<unsigned long long>(remote_cached), Median(loading) * 1e3, loading.size(),
      Median(loading) / std::max(Median(alone), 1e-9), f.requests,
      static_cast<unsigned long long>(cold_cached), Median(computing) * 1e3, computing.size(),
      Median(computing) / std::max(Median(alone), 1e-9));
}

// TTFT with a slow Redis: see the header.
void Slow(const Model& model, const Flags& f) {
  auto started = testing::RedisServer::Start();
  if (!started.ok()) Die("redis-server", started.status());
  const std::unique_ptr<testing::RedisServer> redis = *std::move(started);
  testing::DelayProxy proxy(redis->port(), {.delay = absl::Milliseconds(f.delay_ms)});
  const int prefix = 16 * f.slow_blocks;
  const int64_t pool_tokens = int64_t{prefix + 32} * (f.requests + 1);
  std::mt19937 rng(41);
  std::vector<double> cold, healthy, slow, miss_healthy, miss_slow;
  std::vector<std::vector<double>> together(f.requests);
  uint64_t cached_healthy = 0, cached_slow = 0, cached_together = 0;
  for (int rep = 0; rep < f.reps; ++rep) {
    std::vector<std::vector<uint32_t>> prefixes;
    for (int i = 0; i < f.requests + 2; ++i) prefixes.push_back(RandomTokens(&rng, prefix));
    {
      Served publisher(model, f, pool_tokens, redis->url());
      for (const auto& p : prefixes) Run(*publisher.engine, Concat(p, RandomTokens(&rng, 16)), 1);
    }  // shut down with a grace: its blocks are published
    auto prompt = [&](int i) { return Concat(prefixes[i], RandomTokens(&rng, 16)); };
    {
      Served cold_engine(model, f, pool_tokens, "");
      cold.push_back(Run(*cold_engine.engine, prompt(0), 1).ttft_s);
    }
    {
      Served replica(model, f, pool_tokens, redis->url(), kDefaultRemoteTierTimeout);
      const Outcome o = Run(*replica.engine, prompt(0), 1);
      healthy.push_back(o.ttft_s);
      cached_healthy = o.cached;
      miss_healthy.push_back(Run(*replica.engine, RandomTokens(&rng, prefix + 16), 1).ttft_s);
    }
    {
      Served replica(model, f, pool_tokens, proxy.url(), kDefaultRemoteTierTimeout);
      const Outcome o = Run(*replica.engine, prompt(1), 1);
      slow.push_back(o.ttft_s);
      cached_slow = o.cached;
      miss_slow.push_back(Run(*replica.engine, RandomTokens(&rng, prefix + 16), 1).ttft_s);
    }
    {
      Served replica(model, f, pool_tokens, proxy.url(), kDefaultRemoteTierTimeout);
      std::vector<std::thread> ts;
      std::vector<Outcome> outs(f.requests);
      std::vector<std::vector<uint32_t>> prompts;
      for (int i = 0; i < f.requests; ++i) prompts.push_back(prompt(2 + i));
      for (int i = 0; i < f.requests; ++i) {
        ts.emplace_back([&, i] { outs[i] = Run(*replica.engine, prompts[i], 1); });
      }
      for (std::thread& t : ts) t.join();
      std::sort(outs.begin(), outs.end(),
                [](const Outcome& a, const Outcome& b) { return a.ttft_s < b.ttft_s; });
      cached_together = 0;
      for (int i = 0; i < f.requests; ++i) {
        together[i].push_back(outs[i].ttft_s);
        cached_together += outs[i].cached;
      }
    }
  }
  std::printf(
      "slow: %d-block prefix + 16 own tokens, replies %d ms late, timeout %s; TTFT (median of "
      "%d): cold %.1f ms; healthy Redis %.1f ms (%llu cached), miss %.1f ms; slow Redis "
      "%.1f ms (%llu cached), miss %.1f ms; %d at once through the slow Redis:",
      f.slow_blocks, f.delay_ms, absl::FormatDuration(kDefaultRemoteTierTimeout).c_str(), f.reps,
      Median(cold) * 1e3, Median(healthy) * 1e3, static_cast<unsigned long long>(cached_healthy),
      Median(miss_healthy) * 1e3, Median(slow) * 1e3,
      static_cast<unsigned long long>(cached_slow), Median(miss_slow) * 1e3, f.requests);
  for (int i = 0; i < f.requests; ++i) std::printf(" %.1f", Median(together[i]) * 1e3);
  std::printf(" ms (%llu cached in all, last rep)\n",
              static_cast<unsigned long long>(cached_together));
}

// This process's resident set, in MB (VmRSS).
double RssMb() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  double kb = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "VmRSS: %lf kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb / 1024;
}

std::vector<std::string> RedisKeys(const testing::RedisServer& redis) {
  const std::string all = redis.Command({"KEYS", "*"});
  std::vector<std::string> keys;
  for (size_t at = 0; at < all.size();) {
    const size_t end = std::min(all.find('\n', at), all.size());
    if (end > at) keys.push_back(all.substr(at, end - at));
    at = end + 1;
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

// RSS with oversized values planted: see the header.
void Oversized(const Model& model, const Flags& f) {
  auto started = testing::RedisServer::Start();
  if (!started.ok()) Die("redis-server", started.status());
  const std::unique_ptr<testing::RedisServer> redis = *std::move(started);
  std::mt19937 rng(51);
  Served replica(model, f, 256, redis->url());
  // One warm-up round without junk: the pools' and buffers' first touch.
  Run(*replica.engine, RandomTokens(&rng, 17), 1);
  std::printf("oversized: RSS %.0f MB at the start", RssMb());
  std::fflush(stdout);
  for (int round = 0; round < f.rounds; ++round) {
    const std::vector<uint32_t> prefix = RandomTokens(&rng, 16);
    const std::vector<std::string> before = RedisKeys(*redis);
    {
      Served publisher(model, f, 256, redis->url());
      Run(*publisher.engine, Concat(prefix, RandomTokens(&rng, 1)), 1);
    }  // shut down with a grace: its block is published
    std::vector<std::string> added;
    for (const std::string& k : RedisKeys(*redis)) {
      if (!std::binary_search(before.begin(), before.end(), k)) added.push_back(k);
    }
    if (added.empty()) Die("planting", absl::InternalError("nothing was published"));
    const int64_t mb = 64 + (f.rounds > 1 ? (200 - 64) * round / (f.rounds - 1) : 0);
    // The prefix's key (and, when the replica's last block was published meanwhile, that one).
    for (const std::string& k : added) {
      redis->Command({"SETRANGE", k, std::to_string((mb << 20) - 1), "j"});
    }
    const auto t0 = Clock::now();
    const Outcome o = Run(*replica.engine, Concat(prefix, RandomTokens(&rng, 1)), 1);
    std::printf("; %lld MB planted: TTFT %.1f ms (%llu cached), RSS %.0f MB",
                static_cast<long long>(mb), Seconds(t0, Clock::now()) * 1e3,
                static_cast<unsigned long long>(o.cached), RssMb());
    std::fflush(stdout);
  }
  redis->Command({"FLUSHALL"});
  Run(*replica.engine, RandomTokens(&rng, 17), 1);
  const EngineStats s = replica.engine->Stats();
  std::printf("; after FLUSHALL %.0f MB; corrupt %llu, loads %llu\n", RssMb(),
              static_cast<unsigned long long>(s.remote.corrupt_blocks),
              static_cast<unsigned long long>(s.remote.loads));
}

int Main(int argc, char** argv) {
  static const FlagSpec kFlags[] = {{"model"},  {"kv-remote"}, {"threads"},  {"prefix"},
                                     {"reps"},   {"requests"},  {"only"},     {"delay-ms"},
                                     {"slow-blocks"}, {"rounds"}};
  absl::StatusOr<ParsedCommandLine> args =
      ParseArgv(absl::MakeConstSpan(argv + 1, static_cast<size_t>(argc - 1)), kFlags);
  if (!args.ok() || !args->positional.empty()) {
    std::fprintf(stderr, "remote_tier_bench: %s (see the header of remote_tier_bench.cc)\n",
                 args.ok() ? "unexpected positional argument"
                           : std::string(args.status().message()).c_str());
    return 2;
  }
  Flags f;
  f.model = args->Flag("model").value_or(f.model);
  f.remote = args->Flag("kv-remote").value_or(f.remote);
  f.only = args->Flag("only").value_or(f.only);
  if (!f.only.empty() && f.only != "block" && f.only != "steps" && f.only != "slow" &&
      f.only != "oversized") {
    std::fprintf(stderr, "remote_tier_bench: --only must be block, steps, slow or oversized\n");
    return 2;
  }
  for (auto [name, field] : {std::pair<const char*, int*>{"threads", &f.threads},
                             {"prefix", &f.prefix},
                             {"reps", &f.reps},
                             {"requests", &f.requests},
                             {"delay-ms", &f.delay_ms},
                             {"slow-blocks", &f.slow_blocks},
                             {"rounds", &f.rounds}}) {
    const std::optional<std::string> v = args->Flag(name);
    if (!v.has_value()) continue;
    absl::StatusOr<int64_t> n = ParseInteger(*v, absl::StrCat("--", name), 1, 1 << 20);
    if (!n.ok()) {
      std::fprintf(stderr, "remote_tier_bench: %s\n", std::string(n.status().message()).c_str());
      return 2;
    }
    *field = static_cast<int>(*n);
  }
  std::unique_ptr<testing::RedisServer> redis;
  std::string url = f.remote;
  if (url.empty()) {
    auto started = testing::RedisServer::Start();
    if (!started.ok()) Die("redis-server", started.status());
    redis = *std::move(started);
    url = redis->unix_url();
  }
  const fs::path root = fs::temp_directory_path() / absl::StrCat("prefixd_remote_bench_", ::getpid());
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
  std::printf("model %s (%d layers, %d wide, fp32), %d threads, remote tier %s\n",
              (*model)->name().c_str(), (*model)->config().n_layer, (*model)->config().n_embd,
              f.threads, url.c_str());
  if (f.only.empty() || f.only == "block") Block(**model, f, url);
  if (f.only.empty() || f.only == "steps") Steps(**model, f, url);
  if (f.only == "slow") Slow(**model, f);
  if (f.only == "oversized") Oversized(**model, f);
  std::error_code ec;
  fs::remove_all(root, ec);
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) { return prefixd::Main(argc, argv); }
