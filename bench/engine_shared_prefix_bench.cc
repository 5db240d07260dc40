// Shared-prefix serving on the CPU backend: the workload the prefix cache exists for.
//
// 32 requests share a 512-token system prompt, each adds its own 16-token suffix and asks
// for 32 new tokens (greedy, EOS ignored); 8 client threads keep 8 requests in flight. The
// same workload runs twice in one process on the full-size random GPT-2 (124M, fp32): with
// the prefix cache on, then off (--no-prefix-cache). Prints throughput (generated tokens per
// second of wall time) and time to first token (client-side: Submit to first token).
//
// Usage: engine_shared_prefix_bench [--model DIR] [--threads N] [--requests 32]
//          [--concurrency 8] [--prefix 512] [--suffix 16] [--new 32] [--only on|off]
//          [--kv-events ENDPOINT] [--dtype f32|f16|bf16|int8]
// --kv-events publishes the engine's KV events (server/kv_events.h) on ENDPOINT (e.g.
// tcp://127.0.0.1:*) as prefixd --kv-events does: run with and without it, alternating, to
// see what the events cost the engine thread.
// --dtype is the weights' storage (CpuBackendOptions::dtype; default f32); with int8 the
// header names the ISA its products ran on (PREFIXD_CPU_ISA=avx512 against amx: the AMX gain in
// time to first token).
// Without --model a random GPT-2 is written to a temporary directory first.
#include <unistd.h>

#include <algorithm>
#include <atomic>
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
#include "cache/kv_layout.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "engine/dtype.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/matmul.h"
#include "server/kv_events.h"
#include "tools/random_model.h"

namespace prefixd {
namespace {

struct Flags {
  std::string model;
  int threads = 2;
  int requests = 32;
  int concurrency = 8;
  int prefix = 512;
  int suffix = 16;
  int new_tokens = 32;
  std::string only;  // "on" or "off": run one half (for profiling); empty: both
  std::string kv_events;  // empty: no KV events
  DType dtype = DType::kF32;
};

struct RunResult {
  double wall_s = 0;
  uint64_t generated = 0;
  uint64_t prefill_tokens = 0;
  uint64_t cached_tokens = 0;
  std::vector<double> ttft_s;
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

RunResult RunWorkload(const Model& model, const Flags& f, bool prefix_cache) {
  const ModelConfig& c = model.config();
  const int64_t per_token = KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), 4);
  const int32_t block = 16;
  // Room for every request in flight plus the shared prefix, with margin.
  const int64_t tokens_per_request = f.prefix + f.suffix + f.new_tokens;
  const int64_t blocks =
      (f.concurrency + 2) * ((tokens_per_request + block - 1) / block) + f.prefix / block;
  CpuBackendOptions b;
  b.model = &model;
  b.kv_pool.budget_bytes = blocks * block * per_token;
  b.kv_pool.block_size = block;
  b.threads = f.threads;
  b.dtype = f.dtype;
  auto backend = CreateCpuBackend(b);
  if (!backend.ok()) {
    std::fprintf(stderr, "backend: %s\n", std::string(backend.status().message()).c_str());
    std::exit(1);
  }
  EngineOptions o;
  o.backend = backend->get();
  o.model_config = c;
  o.manifest_sha256 = model.manifest_sha256();
  o.max_batch_tokens = 512;
  o.enable_prefix_cache = prefix_cache;
  std::shared_ptr<KvEventPublisher> events;
  if (!f.kv_events.empty()) {
    KvEventsOptions events_options;
    events_options.endpoint = f.kv_events;
    auto p = KvEventPublisher::Start(events_options);
    if (!p.ok()) {
      std::fprintf(stderr, "%s\n", std::string(p.status().message()).c_str());
      std::exit(1);
    }
    events = *p;
    o.kv_events = events;
  }
  auto engine = Engine::Create(o);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", std::string(engine.status().message()).c_str());
    std::exit(1);
  }

  std::mt19937 rng(7);
  auto random_tokens = [&](int n) {
    std::vector<uint32_t> out;
    for (int i = 0; i < n; ++i) out.push_back(rng() % 50256);
    return out;
  };
  const std::vector<uint32_t> system = random_tokens(f.prefix);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < f.requests; ++i) {
    EngineRequest r;
    r.request_id = absl::StrCat("bench-", i);
    r.prompt = system;
    const std::vector<uint32_t> own = random_tokens(f.suffix);
    r.prompt.insert(r.prompt.end(), own.begin(), own.end());
    r.max_new_tokens = f.new_tokens;
    r.ignore_eos = true;
    requests.push_back(std::move(r));
  }

  RunResult result;
  std::mutex mu;
  std::atomic<int> next{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int t = 0; t < f.concurrency; ++t) {
    clients.emplace_back([&] {
      for (int i = next++; i < f.requests; i = next++) {
        const auto submitted = std::chrono::steady_clock::now();
        auto stream = (*engine)->Submit(requests[i]);
        if (!stream.ok()) {
          std::fprintf(stderr, "submit: %s\n", std::string(stream.status().message()).c_str());
          std::exit(1);
        }
        double ttft = -1;
        uint64_t generated = 0, cached = 0;
        RequestEvent e;
        while ((*stream)->Wait(&e)) {
          if (e.kind == RequestEvent::Kind::kToken) {
            if (ttft < 0) {
              ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - submitted)
                         .count();
            }
            ++generated;
          } else if (e.kind == RequestEvent::Kind::kDone) {
            if (!e.status.ok()) {
              std::fprintf(stderr, "request: %s\n", std::string(e.status.message()).c_str());
              std::exit(1);
            }
            cached = e.usage.cached_prompt_tokens;
            break;
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        result.ttft_s.push_back(ttft);
        result.generated += generated;
        result.cached_tokens += cached;
      }
    });
  }
  for (auto& t : clients) t.join();
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.prefill_tokens = (*engine)->Stats().scheduler.prefill_tokens;
  (*engine)->Shutdown(absl::ZeroDuration());
  if (events != nullptr) {
    std::printf("kv events: %llu batches published, %llu dropped\n",
                static_cast<unsigned long long>(events->published()),
                static_cast<unsigned long long>(events->dropped()));
  }
  return result;
}

int Main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model")
      f.model = value();
    else if (a == "--threads")
      f.threads = std::stoi(value());
    else if (a == "--requests")
      f.requests = std::stoi(value());
    else if (a == "--concurrency")
      f.concurrency = std::stoi(value());
    else if (a == "--prefix")
      f.prefix = std::stoi(value());
    else if (a == "--suffix")
      f.suffix = std::stoi(value());
    else if (a == "--new")
      f.new_tokens = std::stoi(value());
    else if (a == "--kv-events")
      f.kv_events = value();
    else if (a == "--only")
      f.only = value();
    else if (a == "--dtype") {
      const std::string v = value();
      if (!ParseDType(v)) {
        std::fprintf(stderr, "--dtype takes f32, f16, bf16 or int8, got %s\n", v.c_str());
        return 2;
      }
      f.dtype = *ParseDType(v);
    }
    else {
      std::fprintf(stderr, "unknown flag %s (see the header of engine_shared_prefix_bench.cc)\n",
                   a.c_str());
      return 2;
    }
  }
  std::string dir = f.model;
  const bool temporary = dir.empty();
  if (temporary) {
    dir = (std::filesystem::temp_directory_path() / absl::StrCat("prefixd_bench_gpt2_", ::getpid()))
              .string();
    RandomModelOptions o;
    o.out_dir = dir;
    o.config = Gpt2ModelConfig();
    o.seed = 1;
    if (absl::Status s = WriteRandomModel(o); !s.ok()) {
      std::fprintf(stderr, "writing the model: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  auto model = Model::Load(dir);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  std::printf(
      "model %s (%d layers, %d wide), %s on %s, %d threads; %d requests, %d in flight: "
      "%d-token shared prefix + %d own tokens, %d new tokens each (greedy)\n",
      (*model)->name().c_str(), (*model)->config().n_layer, (*model)->config().n_embd,
      std::string(DTypeName(f.dtype)).c_str(), MatMulIsaInUse().c_str(), f.threads, f.requests, f.concurrency, f.prefix, f.suffix, f.new_tokens);
  if (!f.only.empty() && f.only != "on" && f.only != "off") {
    std::fprintf(stderr, "--only takes on or off, got %s\n", f.only.c_str());
    return 2;
  }
  const RunResult on = f.only == "off" ? RunResult{} : RunWorkload(**model, f, true);
  const RunResult off = f.only == "on" ? RunResult{} : RunWorkload(**model, f, false);
  if (temporary) std::filesystem::remove_all(dir);

  std::printf("\n%-14s %9s %12s %10s %10s %10s %14s %14s\n", "prefix cache", "wall s", "gen tok/s",
              "TTFT mean", "TTFT p50", "TTFT p90", "prefill tokens", "cached tokens");
  for (const auto& [name, r] : {std::pair<const char*, const RunResult&>{"on", on},
                                std::pair<const char*, const RunResult&>{"off", off}}) {
    if (r.ttft_s.empty()) continue;
    double mean = 0;
    for (double t : r.ttft_s) mean += t;
    mean /= r.ttft_s.size();
    std::printf("%-14s %9.2f %12.1f %9.3fs %9.3fs %9.3fs %14llu %14llu\n", name, r.wall_s,
                r.generated / r.wall_s, mean, Percentile(r.ttft_s, 0.5), Percentile(r.ttft_s, 0.9),
                static_cast<unsigned long long>(r.prefill_tokens),
                static_cast<unsigned long long>(r.cached_tokens));
  }
  if (!f.only.empty()) return 0;
  double mean_on = 0, mean_off = 0;
  for (double t : on.ttft_s) mean_on += t;
  for (double t : off.ttft_s) mean_off += t;
  std::printf("\ncache on vs off: %.1fx throughput, %.1fx lower mean TTFT (p50 %.1fx, p90 %.1fx)\n",
              (on.generated / on.wall_s) / (off.generated / off.wall_s), mean_off / mean_on,
              Percentile(off.ttft_s, 0.5) / Percentile(on.ttft_s, 0.5),
              Percentile(off.ttft_s, 0.9) / Percentile(on.ttft_s, 0.9));
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) { return prefixd::Main(argc, argv); }
