// CPU backend throughput on full-size GPT-2 (124M): prefill, decode at several context
// lengths, batched decode, and a cached decode step against recomputing the prefix.
//
//   cpu_backend_bench [--model DIR] [--threads 2] [--reps 5] [--isa auto|avx2|avxvnni|avx512|amx]
//                     [--dtype f32|f16|bf16|int8] [--quick 0-6]
//
// --isa picks the matrix-product register blocks (all give identical bits); --dtype the
// weights' storage (the checkpoint is rounded to it at load; arithmetic stays fp32, except
// int8's integer products, kernels/cpu/matmul.h); --quick 1 runs
// only prefill 512, decode batch 1 at context 256 and decode batch 8 (for before/after checks);
// 2, 3 and 4 run just one of those three; 5 runs what scripts/bench-peer compares with llama.cpp
// (prefill 17 and 512 tokens, decode batch 1 at context 16 and 256, decode batch 8); 6 the
// int8-on-AMX set (prefill 17 and 512, decode batch 1, 8 and 32 at context 128), run with
// --isa amx against --isa avx512.
// Without --model, writes a random GPT-2 (tools/random_model.h) into a temp dir first. Each
// figure is the best of --reps runs (the machine is shared; the minimum is the least noisy
// estimate of what the code costs). Prints a Markdown table for docs/BENCHMARKS.md.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/command_line.h"
#include "bench/bench_clock.h"
#include "cache/kv_layout.h"
#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/matmul.h"
#include "tools/random_model.h"

namespace prefixd {
namespace {

using bench::CpuNow;
using bench::Now;

// Best wall time and best CPU time over the repetitions (each its own minimum).
struct Timing {
  double wall = 1e30;
  double cpu = 1e30;
  void Add(double w, double c) {
    wall = std::min(wall, w);
    cpu = std::min(cpu, c);
  }
};

std::vector<uint32_t> Tokens(int n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  uint64_t x = seed + 1;
  for (uint32_t& v : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<uint32_t>((x >> 33) % 50257);
  }
  return t;
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "cpu_backend_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

class Bench {
 public:
  Bench(Backend& b, int reps) : b_(b), reps_(reps) {}

  // Seconds to prefill `n` tokens from position 0 into blocks starting at `first_block`.
  Timing Prefill(int n, int32_t first_block, uint32_t seed) {
    const std::vector<uint32_t> tokens = Tokens(n, seed);
    const std::vector<int32_t> table = Table(first_block, n);
    Timing best;
    for (int r = 0; r < reps_; ++r) {
      std::vector<float> logits;
      const double t0 = Now(), c0 = CpuNow();
      Check(b_.Forward({SequenceStep{tokens, 0, table, true}}, &logits));
      best.Add(Now() - t0, CpuNow() - c0);
    }
    return best;
  }

  // Seconds per decode step for `batch` sequences, each with `context` cached tokens.
  Timing Decode(int batch, int context, int steps) {
    std::vector<std::vector<uint32_t>> tokens(batch);
    std::vector<std::vector<int32_t>> tables(batch);
    const int32_t blocks_each = (context + steps + 15) / 16;
    for (int s = 0; s < batch; ++s) {
      tokens[s] = Tokens(context + steps, 100 + s);
      tables[s] = Table(s * blocks_each, context + steps);
      std::vector<float> logits;
      Check(b_.Forward(
          {SequenceStep{absl::MakeConstSpan(tokens[s]).subspan(0, context), 0, tables[s], false}},
          &logits));
    }
    Timing best;
    for (int r = 0; r < reps_; ++r) {
      const double t0 = Now(), c0 = CpuNow();
      for (int i = 0; i < steps; ++i) {
        std::vector<SequenceStep> batch_steps;
        for (int s = 0; s < batch; ++s) {
          batch_steps.push_back({absl::MakeConstSpan(tokens[s]).subspan(context + i, 1),
                                 context + i, tables[s], true});
        }
        std::vector<float> logits;
        Check(b_.Forward(batch_steps, &logits));
      }
      best.Add((Now() - t0) / steps, (CpuNow() - c0) / steps);
    }
    return best;
  }

 private:
  static std::vector<int32_t> Table(int32_t first, int tokens) {
    std::vector<int32_t> t((tokens + 15) / 16);
    for (size_t i = 0; i < t.size(); ++i) t[i] = first + static_cast<int32_t>(i);
    return t;
  }
  Backend& b_;
  int reps_;
};

int Main(int argc, char** argv) {
  std::string model_dir;
  int threads = 2;
  int reps = 5;
  int quick = 0;
  MatMulIsa isa = MatMulIsa::kAuto;
  DType dtype = DType::kF32;
  constexpr const char* kUsage =
      "usage: cpu_backend_bench [--model DIR] [--threads N] [--reps N] "
      "[--isa auto|avx2|avxvnni|avx512|amx] [--dtype f32|f16|bf16|int8] [--quick 0-6]\n";
  static constexpr FlagSpec kFlags[] = {
      {"model"}, {"threads"}, {"reps"}, {"quick"}, {"isa"}, {"dtype"}, {"help", FlagKind::kSwitch}};
  absl::StatusOr<ParsedCommandLine> args =
      ParseArgv(absl::MakeConstSpan(argv + 1, static_cast<size_t>(argc - 1)), kFlags);
  if (args.ok() && args->Has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args.ok() || !args->positional.empty()) {
    std::fprintf(
        stderr, "cpu_backend_bench: %s\n%s",
        args.ok() ? "unexpected positional argument" : std::string(args.status().message()).c_str(),
        kUsage);
    return 2;
  }
  model_dir = args->Flag("model").value_or("");
  for (auto [name, field, lo, hi] :
       {std::tuple<const char*, int*, int, int>{"threads", &threads, 1, 1024},
        {"reps", &reps, 1, 1 << 20},
        {"quick", &quick, 0, 6}}) {
    const std::optional<std::string> v = args->Flag(name);
    if (!v.has_value()) continue;
    absl::StatusOr<int64_t> n = ParseInteger(*v, absl::StrCat("--", name), lo, hi);
    if (!n.ok()) {
      std::fprintf(stderr, "cpu_backend_bench: %s\n", std::string(n.status().message()).c_str());
      return 2;
    }
    *field = static_cast<int>(*n);
  }
  if (const std::optional<std::string> v = args->Flag("isa"); v.has_value()) {
    if (!ParseMatMulIsa(*v)) {
      std::fprintf(stderr,
                   "cpu_backend_bench: --isa takes auto, avx2, avxvnni, avx512 or amx, got %s\n",
                   v->c_str());
      return 2;
    }
    isa = *ParseMatMulIsa(*v);
  }
  if (const std::optional<std::string> v = args->Flag("dtype"); v.has_value()) {
    if (!ParseDType(*v)) {
      std::fprintf(stderr, "cpu_backend_bench: --dtype takes f32, f16, bf16 or int8, got %s\n",
                   v->c_str());
      return 2;
    }
    dtype = *ParseDType(*v);
  }
  if (!MatMulIsaSupported(isa)) {
    std::fprintf(stderr, "cpu_backend_bench: this CPU lacks that instruction set\n");
    return 2;
  }
  SetMatMulIsa(isa);
  std::string temp_dir;
  if (model_dir.empty()) {
    temp_dir =
        (std::filesystem::temp_directory_path() / ("prefixd_cpu_bench_" + std::to_string(getpid())))
            .string();
    RandomModelOptions o;
    o.out_dir = temp_dir;
    o.config = Gpt2ModelConfig();
    o.seed = 1;
    std::fprintf(stderr, "writing a random GPT-2 to %s ...\n", temp_dir.c_str());
    Check(WriteRandomModel(o));
    model_dir = temp_dir;
  }
  auto model = Model::Load(model_dir);
  Check(model.status());
  CpuBackendOptions o;
  o.model = model->get();
  o.threads = threads;
  o.dtype = dtype;
  const ModelConfig& c = (*model)->config();
  // 256 blocks of 16: room for 8 sequences of 144 tokens, or one of 1,008, and a 513-token
  // prefill from block 128.
  o.kv_pool.budget_bytes = int64_t{320} * 16 * KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), 4);
  auto backend_or = CreateCpuBackend(o);
  Check(backend_or.status());
  Backend& backend = **backend_or;
  Bench bench(backend, reps);
  const MemoryUsage mem = backend.memory_usage();
  std::printf(
      "model %s (%lld parameters, weights %.0f MB, matrices packed %s), isa %s, %d threads, "
      "best of %d\n\n",
      (*model)->name().c_str(), static_cast<long long>((*model)->num_parameters()),
      mem.weights_bytes / 1e6, std::string(DTypeName(dtype)).c_str(), MatMulIsaInUse().c_str(),
      threads, reps);

  std::printf(
      "| measurement | wall time | CPU time (all threads) | tokens/s (wall) "
      "|\n|---|---|---|---|\n");
  if (quick == 5) {  // the llama.cpp peer's set (scripts/bench-peer)
    for (int n : {17, 512}) {
      const Timing t = bench.Prefill(n, 0, n);
      std::printf("| prefill %d tokens | %.1f ms | %.1f ms | %.0f |\n", n, t.wall * 1e3,
                  t.cpu * 1e3, n / t.wall);
    }
    for (int ctx : {16, 256}) {
      const Timing t = bench.Decode(1, ctx, 8);
      std::printf("| decode batch 1, context %d | %.1f ms/step | %.1f ms/step | %.1f |\n", ctx,
                  t.wall * 1e3, t.cpu * 1e3, 1 / t.wall);
    }
    const Timing d8 = bench.Decode(8, 128, 8);
    std::printf("| decode batch 8, context 128 | %.1f ms/step | %.1f ms/step | %.1f |\n",
                d8.wall * 1e3, d8.cpu * 1e3, 8 / d8.wall);
    if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
    return 0;
  }
  if (quick == 6) {  // int8 on AMX tiles against VNNI: prefill and batched decode
    for (int n : {17, 512}) {
      const Timing t = bench.Prefill(n, 0, n);
      std::printf("| prefill %d tokens | %.1f ms | %.1f ms | %.0f |\n", n, t.wall * 1e3,
                  t.cpu * 1e3, n / t.wall);
    }
    for (int batch : {1, 8, 32}) {
      const Timing t = bench.Decode(batch, 128, 8);
      std::printf("| decode batch %d, context 128 | %.1f ms/step | %.1f ms/step | %.1f |\n",
                  batch, t.wall * 1e3, t.cpu * 1e3, batch / t.wall);
    }
    if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
    return 0;
  }
  if (quick != 0) {
    if (quick == 1 || quick == 2) {
      const Timing p = bench.Prefill(512, 0, 512);
      std::printf("| prefill 512 tokens | %.1f ms | %.1f ms | %.0f |\n", p.wall * 1e3, p.cpu * 1e3,
                  512 / p.wall);
    }
    if (quick == 1 || quick == 3) {
      const Timing d1 = bench.Decode(1, 256, 8);
      std::printf("| decode batch 1, context 256 | %.1f ms/step | %.1f ms/step | %.1f |\n",
                  d1.wall * 1e3, d1.cpu * 1e3, 1 / d1.wall);
    }
    if (quick == 1 || quick == 4) {
      const Timing d8 = bench.Decode(8, 128, 8);
      std::printf("| decode batch 8, context 128 | %.1f ms/step | %.1f ms/step | %.1f |\n",
                  d8.wall * 1e3, d8.cpu * 1e3, 8 / d8.wall);
    }
    if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
    return 0;
  }
  for (int n : {17, 512}) {
    const Timing t = bench.Prefill(n, 0, n);
    std::printf("| prefill %d tokens | %.1f ms | %.1f ms | %.0f |\n", n, t.wall * 1e3, t.cpu * 1e3,
                n / t.wall);
  }
  for (int ctx : {16, 256, 1000}) {
    const Timing t = bench.Decode(1, ctx, 8);
    std::printf("| decode batch 1, context %d | %.1f ms/step | %.1f ms/step | %.1f |\n", ctx,
                t.wall * 1e3, t.cpu * 1e3, 1 / t.wall);
  }
  for (int batch : {8, 32}) {
    const Timing t = bench.Decode(batch, 128, 8);
    std::printf("| decode batch %d, context 128 | %.1f ms/step | %.1f ms/step | %.1f |\n", batch,
                t.wall * 1e3, t.cpu * 1e3, batch / t.wall);
  }
  std::printf(
      "\n| context | cached decode step (wall / CPU) | recompute prefix + token "
      "(wall / CPU) | ratio (wall) |\n|---|---|---|---|\n");
  for (int ctx : {16, 64, 128, 256, 512}) {
    const Timing cached = bench.Decode(1, ctx, 4);
    const Timing recomputed = bench.Prefill(ctx + 1, 128, 7);
    std::printf("| %d | %.1f / %.1f ms | %.1f / %.1f ms | %.1fx |\n", ctx, cached.wall * 1e3,
                cached.cpu * 1e3, recomputed.wall * 1e3, recomputed.cpu * 1e3,
                recomputed.wall / cached.wall);
  }
  if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) { return prefixd::Main(argc, argv); }
