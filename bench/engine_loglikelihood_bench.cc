// A loglikelihood workload shaped like an evaluation run, through the engine and the CPU
// backend on the full-size random GPT-2 (124M, fp32).
//
// --questions questions x --choices choices: every prompt is one --preamble-token few-shot
// preamble shared by all, then the question's own --question tokens, then a continuation of
// 5..30 tokens (uniform, its own per choice). Each request asks what lm-evaluation-harness's
// `local-completions` asks: prompt logprobs with 1 top entry, 1 new token, greedy. Clients
// keep --concurrency requests in flight, choices of a question submitted next to each other
// (as a harness batches them). Runs three ways, each in a fresh engine:
//   scoring, prefix cache on     (score records of cached blocks serve shared positions)
//   scoring, prefix cache off    (what a server that bypasses the cache for scoring does)
//   plain,   prefix cache off    (the same prompts without prompt logprobs: plain prefill)
// and prints requests/s, prefill tokens and the per-prompt-token cost of scoring over plain
// prefill (wall time per prefill token, scoring off vs plain off).
//
// Usage: engine_loglikelihood_bench [--model DIR] [--threads N] [--questions 200]
//          [--choices 4] [--preamble 400] [--question 24] [--concurrency 8]
//          [--only on|off|plain[,...]]   (a comma list: those runs, in the order on, off, plain)
// Without --model a random GPT-2 is written to a temporary directory first.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cache/kv_layout.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/cpu_backend.h"
#include "tools/random_model.h"

namespace prefixd {
namespace {

struct Flags {
  std::string model;
  int threads = 2;
  int questions = 200;
  int choices = 4;
  int preamble = 400;
  int question = 24;
  int concurrency = 8;
  std::string only;  // "on", "off" or "plain": one run; empty: all three
};

struct RunResult {
  bool ran = false;
  double wall_s = 0;
  int requests = 0;
  uint64_t prompt_tokens = 0;
  EngineStats stats;
  double logprob_checksum = 0;  // sum of every returned prompt logprob (runs must agree)
};

std::vector<EngineRequest> Workload(const Flags& f, bool scoring) {
  std::mt19937 rng(11);
  auto random_tokens = [&](int n) {
    std::vector<uint32_t> out;
    for (int i = 0; i < n; ++i) out.push_back(rng() % 50256);
    return out;
  };
  const std::vector<uint32_t> preamble = random_tokens(f.preamble);
  std::vector<EngineRequest> out;
  for (int q = 0; q < f.questions; ++q) {
    const std::vector<uint32_t> question = random_tokens(f.question);
    for (int c = 0; c < f.choices; ++c) {
      EngineRequest r;
      r.request_id = absl::StrCat("q", q, "c", c);
      r.prompt = preamble;
      r.prompt.insert(r.prompt.end(), question.begin(), question.end());
      const std::vector<uint32_t> cont = random_tokens(5 + static_cast<int>(rng() % 26));
      r.prompt.insert(r.prompt.end(), cont.begin(), cont.end());
      r.max_new_tokens = 1;
      r.ignore_eos = true;
      r.sampling.seed = 1234;
      if (scoring) r.prompt_logprobs = 1;
      out.push_back(std::move(r));
    }
  }
  return out;
}

RunResult Run(const Model& model, const Flags& f, bool prefix_cache, bool scoring) {
  const ModelConfig& c = model.config();
  const int32_t block = 16;
  const int64_t per_token = KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), 4);
  const int64_t longest = f.preamble + f.question + 30 + 1;
  const int64_t blocks = (f.concurrency + 2) * ((longest + block - 1) / block) + 8;
  CpuBackendOptions b;
  b.model = &model;
  b.kv_pool.budget_bytes = blocks * block * per_token;
  b.kv_pool.block_size = block;
  b.threads = f.threads;
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
  auto engine = Engine::Create(o);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", std::string(engine.status().message()).c_str());
    std::exit(1);
  }
  const std::vector<EngineRequest> requests = Workload(f, scoring);
  RunResult result;
  result.ran = true;
  result.requests = static_cast<int>(requests.size());
  for (const EngineRequest& r : requests) result.prompt_tokens += r.prompt.size();
  std::atomic<int> next{0};
  // Per request, summed in request order afterwards: the same bits whichever client ran it.
  std::vector<double> checksums(requests.size(), 0.0);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < f.concurrency; ++c) {
    clients.emplace_back([&] {
      for (int i = next++; i < result.requests; i = next++) {
        auto stream = (*engine)->Submit(requests[i]);
        if (!stream.ok()) {
          std::fprintf(stderr, "submit: %s\n", std::string(stream.status().message()).c_str());
          std::exit(1);
        }
        RequestEvent e;
        while ((*stream)->Wait(&e)) {
          if (e.kind == RequestEvent::Kind::kPrompt) {
            for (const PromptToken& p : e.prompt) checksums[i] += p.has_logprob ? p.logprob : 0;
          } else if (e.kind == RequestEvent::Kind::kDone) {
            if (!e.status.ok()) {
              std::fprintf(stderr, "request: %s\n", std::string(e.status.message()).c_str());
              std::exit(1);
            }
            break;
          }
        }
      }
    });
  }
  for (auto& th : clients) th.join();
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (double s : checksums) result.logprob_checksum += s;
  result.stats = (*engine)->Stats();
  (*engine)->Shutdown(absl::ZeroDuration());
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
    auto number = [&]() {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 1 || n > 100000) {
        std::fprintf(stderr, "%s takes a number from 1 to 100000, got %s\n", a.c_str(), v.c_str());
        std::exit(2);
      }
      return static_cast<int>(n);
    };
    if (a == "--model") {
      f.model = value();
    } else if (a == "--threads") {
      f.threads = number();
    } else if (a == "--questions") {
      f.questions = number();
    } else if (a == "--choices") {
      f.choices = number();
    } else if (a == "--preamble") {
      f.preamble = number();
    } else if (a == "--question") {
      f.question = number();
    } else if (a == "--concurrency") {
      f.concurrency = number();
    } else if (a == "--only") {
      f.only = value();
      for (absl::string_view run : absl::StrSplit(f.only, ',')) {
        if (run != "on" && run != "off" && run != "plain") {
          std::fprintf(stderr, "--only takes on, off or plain (or a comma list), got %s\n",
                       f.only.c_str());
          return 2;
        }
      }
    } else {
      std::fprintf(stderr, "unknown flag %s (see the header of engine_loglikelihood_bench.cc)\n",
                   a.c_str());
      return 2;
    }
  }
  if (f.preamble + f.question + 31 > 1024) {
    std::fprintf(stderr, "--preamble + --question + 31 must fit GPT-2's 1024 positions\n");
    return 2;
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
      "model %s (%d layers, %d wide), %d threads; %d questions x %d choices, %d in flight: "
      "%d-token shared preamble + %d question tokens + 5..30 continuation tokens; prompt "
      "logprobs (top 1), 1 new token, greedy\n",
      (*model)->name().c_str(), (*model)->config().n_layer, (*model)->config().n_embd, f.threads,
      f.questions, f.choices, f.concurrency, f.preamble, f.question);
  std::fflush(stdout);
  auto wanted = [&f](absl::string_view run) {
    if (f.only.empty()) return true;
    for (absl::string_view w : absl::StrSplit(f.only, ',')) {
      if (w == run) return true;
    }
    return false;
  };
  const RunResult on = wanted("on") ? Run(**model, f, true, true) : RunResult{};
  const RunResult off = wanted("off") ? Run(**model, f, false, true) : RunResult{};
  const RunResult plain = wanted("plain") ? Run(**model, f, false, false) : RunResult{};
  if (temporary) std::filesystem::remove_all(dir);

  std::printf("\n%-22s %9s %10s %14s %16s %16s %16s\n", "run", "wall s", "requests/s",
              "prefill tokens", "scored positions", "from records", "logprob checksum");
  for (const auto& [name, r] : {std::pair<const char*, const RunResult&>{"scoring, cache on", on},
                                {"scoring, cache off", off},
                                {"plain, cache off", plain}}) {
    if (!r.ran) continue;
    std::printf("%-22s %9.2f %10.2f %14llu %16llu %16llu %16.6f\n", name, r.wall_s,
                r.requests / r.wall_s,
                static_cast<unsigned long long>(r.stats.scheduler.prefill_tokens),
                static_cast<unsigned long long>(r.stats.scheduler.prompt_logprob_tokens),
                static_cast<unsigned long long>(r.stats.scheduler.prompt_logprob_tokens_cached),
                r.logprob_checksum);
  }
  if (on.ran && off.ran) {
    std::printf("\ncache on vs off (scoring): %.2fx requests/s, %.2fx fewer prefill tokens; "
                "checksums %s\n",
                (on.requests / on.wall_s) / (off.requests / off.wall_s),
                static_cast<double>(off.stats.scheduler.prefill_tokens) /
                    static_cast<double>(on.stats.scheduler.prefill_tokens),
                on.logprob_checksum == off.logprob_checksum ? "equal" : "DIFFER");
  }
  if (off.ran && plain.ran) {
    const double scoring_us = 1e6 * off.wall_s / off.stats.scheduler.prefill_tokens;
    const double plain_us = 1e6 * plain.wall_s / plain.stats.scheduler.prefill_tokens;
    std::printf("per prompt token (cache off): scoring %.1f us, plain prefill %.1f us: "
                "+%.0f%%\n",
                scoring_us, plain_us, 100.0 * (scoring_us / plain_us - 1.0));
  }
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) { return prefixd::Main(argc, argv); }
