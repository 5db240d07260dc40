// The disk cache tier on the CPU backend, full-size GPT-2 (random weights, fp32), in one run:
//
//  restart   A request with a --prefix-token prompt (default 960) + 16 own tokens runs on an
//            engine with a disk tier, which then shuts down with a grace (writing its cached
//            blocks). A new engine on the same directory (a restart) runs the same prefix with
//            new own tokens: its time to first token is compared with a cold engine's. With
//            --drop-caches (root only) the restart runs again after `sync; echo 3 >
//            /proc/sys/vm/drop_caches`, so its reads come from the device, not the page cache.
//  block     The cost of one 16-token block: read from the tier (read + verify + copy into the
//            pool, the engine's disk-load latency per block) versus computed (cold prefill
//            time per 16 prompt tokens).
//  capacity  --prompts distinct prompts of --prompt-tokens (default 40 x 512) cycle through a
//            pool that holds --pool-prompts of them (default 4), --concurrency in flight, 16
//            new tokens each. Without the tier every request computes its prompt; with it the
//            second pass (measured, after an unmeasured first pass that fills the tier) reads
//            them back. Throughput = generated tokens / wall s; hit rate = cached prompt tokens
//            / prompt tokens.
//  steps     Whether other requests keep decoding while blocks load from disk. --rounds x
//            --requests prefixes of --step-prefix tokens (default 6 x 4 x 256) are written to
//            the tier; a new engine on the directory runs one long decoding request, and each
//            round first lets it decode 16 tokens alone, then submits --requests requests
//            whose prefixes are on disk (+ 1 own token each) at once. The decoding request's
//            time per token in the rounds' two halves (median, mean, max) and their ratio;
//            and the time the rounds' block reads add up to, which reads on the engine thread
//            would have added to its steps.
//  open      (only with --only open: it needs no model) The start-up cost of the KV events'
//            report of the files found: DiskTier::Open over --open-files block files of GPT-2
//            small's layout (fp32, chains of 8), indexing by file name only (events off)
//            against reading and checking every file's head too (on_store set), with the
//            files' pages in the page cache (warm) and dropped (posix_fadvise DONTNEED on
//            this bench's files only, after a sync). Median over --reps, alternating.
//
// Usage: disk_tier_bench [--model DIR] [--dir DIR] [--threads 2] [--prefix 960] [--reps 3]
//          [--prompts 40] [--prompt-tokens 512] [--pool-prompts 4] [--concurrency 4]
//          [--drop-caches] [--rounds 6] [--requests 4] [--step-prefix 256]
//          [--open-files 300] [--only restart|capacity|steps|open]
// Without --model a random GPT-2 is written to a temporary directory first (not for open).
// --dir is where the tier's directories go (default: the temp dir); it decides which disk is
// measured.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/command_line.h"
#include "cache/block_key.h"
#include "cache/disk/disk_tier.h"
#include "cache/kv_layout.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/cpu_backend.h"
#include "tools/random_model.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Flags {
  std::string model;
  std::string dir;
  int threads = 2;
  int prefix = 960;
  int reps = 3;
  int prompts = 40;
  int prompt_tokens = 512;
  int pool_prompts = 4;
  int concurrency = 4;
  bool drop_caches = false;
  std::string only;
  int rounds = 6;
  int requests = 4;
  int step_prefix = 256;
  int open_files = 300;
};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), std::string(s.message()).c_str());
  std::exit(1);
}

std::vector<uint32_t> RandomTokens(std::mt19937* rng, int n) {
  std::vector<uint32_t> out;
  for (int i = 0; i < n; ++i) out.push_back((*rng)() % 50256);
  return out;
}

// A backend and an engine over it; tier off when `tier_dir` is empty.
struct Served {
  Served(const Model& model, const Flags& f, int64_t pool_tokens, const std::string& tier_dir) {
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
    o.disk_tier.dir = tier_dir;
    o.disk_tier.max_bytes = int64_t{16} << 30;
    const auto t0 = Clock::now();
    auto e = Engine::Create(o);
    create_s = Seconds(t0, Clock::now());
    if (!e.ok()) Die("engine", e.status());
    engine = *std::move(e);
  }
  ~Served() { engine->Shutdown(absl::ZeroDuration()); }

  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
  double create_s = 0;
};

struct Outcome {
  double ttft_s = 0;
  uint64_t generated = 0;
  uint64_t prompt = 0;
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
  out.prompt = prompt.size();
  RequestEvent e;
  while ((*stream)->Wait(&e)) {
    if (e.kind == RequestEvent::Kind::kToken) {
      if (out.generated++ == 0) out.ttft_s = Seconds(t0, Clock::now());
    } else if (e.kind == RequestEvent::Kind::kDone) {
      if (!e.status.ok()) Die("request", e.status);
      out.cached = e.usage.cached_prompt_tokens;
      break;
    }
  }
  return out;
}

bool DropPageCache() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  f << "3\n";
  f.flush();
  return static_cast<bool>(f);
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

void RestartAndBlock(const Model& model, const Flags& f, const std::string& root) {
  const int64_t pool_tokens = f.prefix + 16 + 64;
  std::mt19937 rng(11);
  std::vector<double> cold, warm, warm_dropped, open_s, loads, loads_dropped;
  uint64_t warm_cached = 0, prompt_len = 0;
  for (int rep = 0; rep < f.reps; ++rep) {
    const std::string dir = absl::StrCat(root, "/restart-", rep);
    fs::remove_all(dir);
    const std::vector<uint32_t> prefix = RandomTokens(&rng, f.prefix);
    auto with_suffix = [&] {
      std::vector<uint32_t> p = prefix;
      const std::vector<uint32_t> own = RandomTokens(&rng, 16);
      p.insert(p.end(), own.begin(), own.end());
      return p;
    };
    {
      Served first(model, f, pool_tokens, dir);
      Run(*first.engine, with_suffix(), 1);
      first.engine->Shutdown(absl::Seconds(10));
    }
    const std::vector<uint32_t> prompt = with_suffix();
    prompt_len = prompt.size();
    {
      Served cold_engine(model, f, pool_tokens, "");
      cold.push_back(Run(*cold_engine.engine, prompt, 1).ttft_s);
    }
    {
      Served second(model, f, pool_tokens, dir);
      open_s.push_back(second.create_s);
      const Outcome o = Run(*second.engine, prompt, 1);
      warm.push_back(o.ttft_s);
      warm_cached = o.cached;
      for (double x : second.engine->DrainLatencies().disk_load) loads.push_back(x);
    }
    if (f.drop_caches) {
      if (!DropPageCache()) {
        std::fprintf(stderr, "cannot write /proc/sys/vm/drop_caches (needs root)\n");
        std::exit(1);
      }
      Served third(model, f, pool_tokens, dir);
      warm_dropped.push_back(Run(*third.engine, prompt, 1).ttft_s);
      for (double x : third.engine->DrainLatencies().disk_load) loads_dropped.push_back(x);
    }
    fs::remove_all(dir);
  }
  std::printf(
      "\n== restart: %d-token prompt (%d-token prefix cached before the restart), %d reps\n",
      static_cast<int>(prompt_len), f.prefix, f.reps);
  std::printf("cold TTFT mean %.3f s  (each: ", Mean(cold));
  for (double x : cold) std::printf("%.3f ", x);
  std::printf(")\nrestart TTFT, page cache warm: mean %.3f s (each: ", Mean(warm));
  for (double x : warm) std::printf("%.3f ", x);
  std::printf("), %llu prompt tokens from disk; %.1fx faster than cold\n",
              static_cast<unsigned long long>(warm_cached), Mean(cold) / Mean(warm));
  if (f.drop_caches) {
    std::printf("restart TTFT, page cache dropped: mean %.3f s (each: ", Mean(warm_dropped));
    for (double x : warm_dropped) std::printf("%.3f ", x);
    std::printf("); %.1fx faster than cold\n", Mean(cold) / Mean(warm_dropped));
  }
  std::printf("engine start with the tier (open, lock, index %d files): mean %.4f s\n",
              f.prefix / 16 + 1, Mean(open_s));
  std::printf(
      "\n== block: one 16-token block (%lld bytes of K/V)\n",
      static_cast<long long>(16 * KvBytesPerToken(model.config().n_layer, model.config().n_head,
                                                  model.config().head_dim(), 4)));
  std::sort(loads.begin(), loads.end());
  std::printf(
      "read from the tier, page cache warm: mean %.2f ms, p50 %.2f ms, max %.2f ms (%zu "
      "blocks)\n",
      1e3 * Mean(loads), loads.empty() ? 0 : 1e3 * loads[loads.size() / 2],
      loads.empty() ? 0 : 1e3 * loads.back(), loads.size());
  if (f.drop_caches) {
    std::sort(loads_dropped.begin(), loads_dropped.end());
    std::printf("read from the tier, page cache dropped: mean %.2f ms, p50 %.2f ms, max %.2f ms\n",
                1e3 * Mean(loads_dropped),
                loads_dropped.empty() ? 0 : 1e3 * loads_dropped[loads_dropped.size() / 2],
                loads_dropped.empty() ? 0 : 1e3 * loads_dropped.back());
  }
  const double computed = Mean(cold) * 16.0 / static_cast<double>(prompt_len);
  std::printf("computed (cold prefill time per 16 prompt tokens): %.2f ms; read is %.1fx cheaper\n",
              1e3 * computed, computed / Mean(loads));
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Max(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// One long decoding request and the times its tokens arrived.
class Decoder {
 public:
  Decoder(Engine& engine, std::vector<uint32_t> prompt, uint32_t max_new) {
    EngineRequest d;
    d.prompt = std::move(prompt);
    d.max_new_tokens = max_new;
    d.ignore_eos = true;
    auto stream = engine.Submit(d);
    if (!stream.ok()) Die("submit", stream.status());
    stream_ = *std::move(stream);
    reader_ = std::thread([this] {
      RequestEvent e;
      while (stream_->Wait(&e)) {
        if (e.kind == RequestEvent::Kind::kToken) {
          std::lock_guard<std::mutex> l(mu_);
          times_.push_back(Clock::now());
        } else if (e.kind == RequestEvent::Kind::kDone) {
          break;
        }
      }
    });
  }
  ~Decoder() {
    stream_->Cancel();
    reader_.join();
  }
  size_t tokens() {
    std::lock_guard<std::mutex> l(mu_);
    return times_.size();
  }
  void WaitFor(size_t n) {
    while (tokens() < n) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  // The intervals between consecutive tokens whose second token arrived in (from, to].
  std::vector<double> Intervals(Clock::time_point from, Clock::time_point to) {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<double> out;
    for (size_t i = 1; i < times_.size(); ++i) {
      if (times_[i] > from && times_[i] <= to) out.push_back(Seconds(times_[i - 1], times_[i]));
    }
    return out;
  }

 private:
  std::shared_ptr<RequestStream> stream_;
  std::mutex mu_;
  std::vector<Clock::time_point> times_;
  std::thread reader_;
};

void Steps(const Model& model, const Flags& f, const std::string& root) {
  const std::string dir = root + "/steps";
  fs::remove_all(dir);
  std::mt19937 rng(41);
  const int n = f.rounds * f.requests;
  std::vector<std::vector<uint32_t>> prefixes;
  for (int i = 0; i < n; ++i) prefixes.push_back(RandomTokens(&rng, f.step_prefix));
  uint64_t spilled = 0;
  {
    // A pool of two prompts: each prefix is evicted (spilled) as later ones come; shutdown
    // writes the rest.
    Served writer(model, f, int64_t{f.step_prefix + 32} * 2, dir);
    for (const auto& p : prefixes) {
      std::vector<uint32_t> prompt = p;
      prompt.push_back(1);
      Run(*writer.engine, prompt, 1);
    }
    writer.engine->Shutdown(absl::Seconds(60));
    spilled = writer.engine->Stats().disk.spills;
  }
  // Room for every prompt and the decoder: loads never evict.
  Served s(model, f, int64_t{n} * (f.step_prefix + 32) + 1024 + 64, dir);
  const int64_t files = s.engine->Stats().disk.blocks;
  Decoder decoder(*s.engine, RandomTokens(&rng, 32),
                  static_cast<uint32_t>(model.config().n_positions - 40));
  decoder.WaitFor(8);
  std::vector<double> alone, loading, round_s, read_s;
  uint64_t cached = 0;
  size_t loading_tokens = 0;
  for (int round = 0; round < f.rounds; ++round) {
    // Without loads: the decoder alone for 16 tokens.
    const Clock::time_point alone_from = Clock::now();
    decoder.WaitFor(decoder.tokens() + 16);
    const Clock::time_point alone_to = Clock::now();
    for (double x : decoder.Intervals(alone_from, alone_to)) alone.push_back(x);
    // With loads: `requests` requests whose prefixes are on disk (each + 1 own token), at
    // once; the round ends when the last one has its token.
    std::vector<std::thread> clients;
    std::mutex cmu;
    const Clock::time_point load_from = Clock::now();
    for (int i = 0; i < f.requests; ++i) {
      std::vector<uint32_t> p = prefixes[round * f.requests + i];
      p.push_back(7 + static_cast<uint32_t>(i));
      clients.emplace_back([&, p] {
        const Outcome o = Run(*s.engine, p, 1);
        std::lock_guard<std::mutex> l(cmu);
        cached += o.cached;
      });
    }
    for (std::thread& t : clients) t.join();
    const Clock::time_point load_to = Clock::now();
    round_s.push_back(Seconds(load_from, load_to));
    const std::vector<double> during = decoder.Intervals(load_from, load_to);
    loading_tokens += during.size();
    for (double x : during) loading.push_back(x);
    double read = 0;
    for (double x : s.engine->DrainLatencies().disk_load) read += x;
    read_s.push_back(read);
  }
  const EngineStats stats = s.engine->Stats();
  std::printf(
      "\n== steps: %d rounds; each: the decoder alone for 16 tokens, then %d requests whose "
      "%d-token prefixes are on disk (%lld files, %llu spilled), page cache warm\n",
      f.rounds, f.requests, f.step_prefix, static_cast<long long>(files),
      static_cast<unsigned long long>(spilled));
  std::printf("loaded: %llu prompt tokens from disk (%llu blocks read, %llu corrupt)\n",
              static_cast<unsigned long long>(cached),
              static_cast<unsigned long long>(stats.disk.loads),
              static_cast<unsigned long long>(stats.disk.corrupt_blocks));
  std::printf("decoder time per token without loads: median %.1f ms, mean %.1f ms, max %.1f ms "
              "(%zu tokens)\n",
              1e3 * Median(alone), 1e3 * Mean(alone), 1e3 * Max(alone), alone.size());
  std::printf("decoder time per token while blocks load: median %.1f ms, mean %.1f ms, max %.1f "
              "ms (%zu tokens)\n",
              1e3 * Median(loading), 1e3 * Mean(loading), 1e3 * Max(loading), loading_tokens);
  std::printf("ratio loading / without: median %.2fx, mean %.2fx\n",
              Median(loading) / std::max(Median(alone), 1e-9),
              Mean(loading) / std::max(Mean(alone), 1e-9));
  std::printf("per round: %.3f s from submit to the last token; the blocks' reads (read + verify "
              "+ write into the pool) add up to %.3f s, which a read on the engine thread would "
              "have put into the decoder's steps\n",
              Mean(round_s), Mean(read_s));
  fs::remove_all(dir);
}

struct PassResult {
  double wall_s = 0;
  uint64_t generated = 0, prompt = 0, cached = 0;
};

PassResult Pass(Engine& engine, const std::vector<std::vector<uint32_t>>& prompts,
                int concurrency) {
  PassResult r;
  std::mutex mu;
  std::atomic<size_t> next{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < concurrency; ++c) {
    clients.emplace_back([&] {
      for (size_t i = next++; i < prompts.size(); i = next++) {
        const Outcome o = Run(engine, prompts[i], 16);
        std::lock_guard<std::mutex> lock(mu);
        r.generated += o.generated;
        r.prompt += o.prompt;
        r.cached += o.cached;
      }
    });
  }
  for (auto& t : clients) t.join();
  r.wall_s = Seconds(t0, Clock::now());
  return r;
}

void Capacity(const Model& model, const Flags& f, const std::string& root) {
  std::mt19937 rng(23);
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < f.prompts; ++i) prompts.push_back(RandomTokens(&rng, f.prompt_tokens));
  // Room for pool_prompts prompts with their 16 new tokens (whole blocks), plus slack.
  const int64_t per_prompt = (f.prompt_tokens + 16 + 15) / 16 * 16;
  const int64_t pool_tokens = f.pool_prompts * per_prompt + 8 * 16;
  std::printf(
      "\n== capacity: %d distinct %d-token prompts, a pool of %lld tokens (%d of them), "
      "%d in flight, 16 new tokens each\n",
      f.prompts, f.prompt_tokens, static_cast<long long>(pool_tokens), f.pool_prompts,
      f.concurrency);
  PassResult off;
  {
    Served engine(model, f, pool_tokens, "");
    off = Pass(*engine.engine, prompts, f.concurrency);
  }
  const std::string dir = root + "/capacity";
  fs::remove_all(dir);
  PassResult fill, on;
  EngineStats stats;
  {
    Served engine(model, f, pool_tokens, dir);
    fill = Pass(*engine.engine, prompts, f.concurrency);
    on = Pass(*engine.engine, prompts, f.concurrency);
    stats = engine.engine->Stats();
  }
  fs::remove_all(dir);
  auto line = [](const char* name, const PassResult& r) {
    std::printf("%-28s %8.2f s %10.1f gen tok/s   hit rate %5.1f%%\n", name, r.wall_s,
                r.generated / r.wall_s, 100.0 * r.cached / r.prompt);
  };
  line("without tier", off);
  line("with tier, first pass", fill);
  line("with tier, second pass", on);
  std::printf("with tier: %llu spills, %llu dropped, %llu loads, %llu corrupt, %.0f MB on disk\n",
              static_cast<unsigned long long>(stats.disk.spills),
              static_cast<unsigned long long>(stats.disk.spills_dropped),
              static_cast<unsigned long long>(stats.disk.loads),
              static_cast<unsigned long long>(stats.disk.corrupt_blocks), stats.disk.bytes / 1e6);
  std::printf("second pass vs without: %.1fx throughput\n",
              (on.generated / on.wall_s) / (off.generated / off.wall_s));
}

void OpenCost(const Flags& f, const std::string& root) {
  BlockLayout layout;
  layout.manifest_key = Sha256Of("disk_tier_bench open");
  layout.numerics_key = Sha256Of("cpu r1");
  layout.element_bytes = 4;
  layout.block_size = 16;
  layout.n_layer = 12;
  layout.n_head = 12;
  layout.head_dim = 64;
  layout.score_top_k = 20;
  const std::string dir = root + "/open";
  const Digest chain_root = Sha256Of("disk_tier_bench open root");
  {
    DiskTierOptions o;
    o.dir = dir;
    o.max_bytes = int64_t{64} << 30;
    auto tier = DiskTier::Open(o, layout);
    if (!tier.ok()) Die("disk tier", tier.status());
    BlockRecord r;
    r.root = chain_root;
    r.data.assign(static_cast<size_t>(layout.data_bytes()), 0x5a);
    Digest previous = chain_root;
    for (int i = 0; i < f.open_files; ++i) {
      r.parent_key = i % 8 == 0 ? chain_root : previous;
      r.tokens.clear();
      for (uint32_t t = 0; t < layout.block_size; ++t) r.tokens.push_back(i * 16 + t);
      r.key = ChainKey(r.parent_key, r.tokens);
      if (!(*tier)->WantsSpill(r.key, {.deadline = absl::InfiniteFuture()})) {
        Die("spill", absl::InternalError("the tier refused a block"));
      }
      (*tier)->Spill(r);
      previous = r.key;
    }
    (*tier)->Flush(absl::InfiniteFuture());
  }
  ::sync();
  auto drop_pages = [&] {
    for (const auto& e : fs::directory_iterator(dir)) {
      const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  };
  // [cold][events]: seconds per Open.
  std::vector<double> took[2][2];
  for (int rep = 0; rep < f.reps; ++rep) {
    for (int cold = 0; cold < 2; ++cold) {
      for (int events = 0; events < 2; ++events) {
        if (cold) drop_pages();
        DiskTierOptions o;
        o.dir = dir;
        o.max_bytes = int64_t{64} << 30;
        int64_t reported = 0;
        if (events) o.on_store = [&](const BlockRecordHead&) { ++reported; };
        const auto t0 = Clock::now();
        auto tier = DiskTier::Open(o, layout);
        const double s = Seconds(t0, Clock::now());
        if (!tier.ok()) Die("disk tier", tier.status());
        if (events && reported != f.open_files) {
          Die("open", absl::InternalError(absl::StrCat(reported, " files reported")));
        }
        took[cold][events].push_back(s);
      }
    }
  }
  std::printf("open: %d files of %lld bytes, median of %d\n", f.open_files,
              static_cast<long long>(layout.record_bytes()), f.reps);
  for (int cold = 0; cold < 2; ++cold) {
    const double off = Median(took[cold][0]), on = Median(took[cold][1]);
    std::printf("  %s: events off %.2f ms, on %.2f ms (+%.1f us a file)\n",
                cold ? "pages dropped" : "warm", off * 1e3, on * 1e3,
                (on - off) * 1e6 / f.open_files);
  }
}

int Main(int argc, char** argv) {
  static constexpr FlagSpec kFlags[] = {{"model"},         {"dir"},
                                        {"threads"},       {"prefix"},
                                        {"reps"},          {"prompts"},
                                        {"prompt-tokens"}, {"pool-prompts"},
                                        {"concurrency"},   {"drop-caches", FlagKind::kSwitch},
                                        {"only"},          {"rounds"},
                                        {"requests"},      {"step-prefix"},
                                        {"open-files"}};
  absl::StatusOr<ParsedCommandLine> args =
      ParseArgv(absl::MakeConstSpan(argv + 1, static_cast<size_t>(argc - 1)), kFlags);
  if (!args.ok() || !args->positional.empty()) {
    std::fprintf(stderr, "disk_tier_bench: %s (see the header of disk_tier_bench.cc)\n",
                 args.ok() ? "unexpected positional argument"
                           : std::string(args.status().message()).c_str());
    return 2;
  }
  Flags f;
  f.model = args->Flag("model").value_or(f.model);
  f.dir = args->Flag("dir").value_or(f.dir);
  f.only = args->Flag("only").value_or(f.only);
  f.drop_caches = args->Has("drop-caches");
  for (auto [name, field] : {std::pair<const char*, int*>{"threads", &f.threads},
                             {"prefix", &f.prefix},
                             {"reps", &f.reps},
                             {"prompts", &f.prompts},
                             {"prompt-tokens", &f.prompt_tokens},
                             {"pool-prompts", &f.pool_prompts},
                             {"concurrency", &f.concurrency},
                             {"rounds", &f.rounds},
                             {"requests", &f.requests},
                             {"step-prefix", &f.step_prefix},
                             {"open-files", &f.open_files}}) {
    const std::optional<std::string> v = args->Flag(name);
    if (!v.has_value()) continue;
    absl::StatusOr<int64_t> n = ParseInteger(*v, absl::StrCat("--", name), 0, 1 << 20);
    if (!n.ok()) {
      std::fprintf(stderr, "disk_tier_bench: %s\n", std::string(n.status().message()).c_str());
      return 2;
    }
    *field = static_cast<int>(*n);
  }
  if (!f.only.empty() && f.only != "restart" && f.only != "capacity" && f.only != "steps" &&
      f.only != "open") {
    std::fprintf(stderr, "--only takes restart, capacity, steps or open, got %s\n", f.only.c_str());
    return 2;
  }
  const std::string root = (fs::path(f.dir.empty() ? fs::temp_directory_path().string() : f.dir) /
                            absl::StrCat("prefixd_disk_tier_bench_", ::getpid()))
                               .string();
  if (f.only == "open") {
    OpenCost(f, root);
    fs::remove_all(root);
    return 0;
  }
  std::string model_dir = f.model;
  const bool temporary = model_dir.empty();
  if (temporary) {
    model_dir = root + "/model";
    RandomModelOptions o;
    o.out_dir = model_dir;
    o.config = Gpt2ModelConfig();
    o.seed = 1;
    if (absl::Status s = WriteRandomModel(o); !s.ok()) Die("writing the model", s);
  }
  auto model = Model::Load(model_dir);
  if (!model.ok()) Die("model", model.status());
  std::printf("model %s (%d layers, %d wide, fp32), %d threads; tier directories under %s\n",
              (*model)->name().c_str(), (*model)->config().n_layer, (*model)->config().n_embd,
              f.threads, root.c_str());
  if (f.only.empty() || f.only == "restart") RestartAndBlock(**model, f, root);
  if (f.only.empty() || f.only == "capacity") Capacity(**model, f, root);
  if (f.only.empty() || f.only == "steps") Steps(**model, f, root);
  fs::remove_all(root);
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) { return prefixd::Main(argc, argv); }
