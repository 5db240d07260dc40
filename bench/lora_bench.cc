// The cost of LoRA adapters in a decode step on the CPU backend, full-size GPT-2 (124M):
// batch-8 decode with the 8 rows spread over 4 adapters (2 rows each; c_attn, c_proj and
// c_fc of every layer), at rank 8 and rank 64, against the same batch on the base alone.
//
//   lora_bench [--model DIR] [--threads 2] [--rounds 7] [--steps 16] [--context 128]
//
// Method: one backend; each configuration has its own 8 sequences, prefilled once with its
// adapters to `context` tokens. Each round times `steps` decode steps of every configuration
// in turn (base, rank 8, rank 64), so the three share the machine's state within a round;
// the figure of a configuration is the median over rounds of its mean step, and each ratio is
// the median of the per-round ratios (the machine is shared and noisy). Without --model,
// writes a random GPT-2 (tools/random_model.h) into a temp dir first. Goal (issue 29): rank 8
// ≤ 1.15× the base step.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/command_line.h"
#include "bench/bench_clock.h"
#include "cache/kv_layout.h"
#include "engine/backend.h"
#include "engine/lora_adapter.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/cpu_backend.h"
#include "tools/random_adapter.h"
#include "tools/random_model.h"

namespace prefixd {
namespace {

using bench::Now;

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "lora_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

std::vector<uint32_t> Tokens(int n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  uint64_t x = seed + 1;
  for (uint32_t& v : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<uint32_t>((x >> 33) % 50257);
  }
  return t;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

constexpr int kBatch = 8;
constexpr int kAdapters = 4;

// One configuration's 8 sequences: their tokens, block tables and adapters.
struct Config {
  std::string name;
  std::vector<std::shared_ptr<const LoraAdapter>> adapters;  // empty: the base
  std::vector<std::vector<uint32_t>> tokens;
  std::vector<std::vector<int32_t>> tables;
  const LoraAdapter* adapter_of(int row) const {
    return adapters.empty() ? nullptr : adapters[row % adapters.size()].get();
  }
};

int Main(int argc, char** argv) {
  static constexpr FlagSpec kFlags[] = {{"model"}, {"threads"}, {"rounds"}, {"steps"},
                                        {"context"}};
  absl::StatusOr<ParsedCommandLine> args =
      ParseArgv(absl::MakeConstSpan(argv + 1, static_cast<size_t>(argc - 1)), kFlags);
  if (!args.ok() || !args->positional.empty()) {
    std::fprintf(stderr,
                 "usage: lora_bench [--model DIR] [--threads N] [--rounds N] [--steps N] "
                 "[--context N]\n");
    return 2;
  }
  int threads = 2, rounds = 7, steps = 16, context = 128;
  for (auto [name, field, lo, hi] : {std::tuple<const char*, int*, int, int>{"threads", &threads, 1, 64},
                                     {"rounds", &rounds, 1, 1000},
                                     {"steps", &steps, 1, 1000},
                                     {"context", &context, 1, 900}}) {
    if (const std::optional<std::string> v = args->Flag(name)) {
      absl::StatusOr<int64_t> n = ParseInteger(*v, absl::StrCat("--", name), lo, hi);
      Check(n.status());
      *field = static_cast<int>(*n);
    }
  }
  const std::string temp_dir =
      (std::filesystem::temp_directory_path() / ("prefixd_lora_bench_" + std::to_string(getpid())))
          .string();
  std::string model_dir = args->Flag("model").value_or("");
  if (model_dir.empty()) {
    RandomModelOptions o;
    o.out_dir = temp_dir + "/gpt2";
    o.config = Gpt2ModelConfig();
    o.seed = 1;
    std::fprintf(stderr, "writing a random GPT-2 to %s ...\n", o.out_dir.c_str());
    Check(WriteRandomModel(o));
    model_dir = o.out_dir;
  }
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(model_dir);
  Check(model.status());
  const ModelConfig& c = (*model)->config();

  std::vector<Config> configs(3);
  configs[0].name = "base";
  const int ranks[] = {8, 64};
  for (int k = 0; k < 2; ++k) {
    Config& cfg = configs[1 + k];
    cfg.name = absl::StrCat("4 adapters, rank ", ranks[k]);
    for (int a = 0; a < kAdapters; ++a) {
      RandomAdapterOptions o;
      o.rank = ranks[k];
      o.lora_alpha = 2.0f * ranks[k];
      o.seed = 100 * k + a;
      const std::string dir = absl::StrCat(temp_dir, "/adapter_r", ranks[k], "_", a);
      Check(WriteRandomAdapter(dir, c, o));
      absl::StatusOr<std::shared_ptr<const LoraAdapter>> loaded = LoadLoraAdapter(dir, c);
      Check(loaded.status());
      cfg.adapters.push_back(*loaded);
    }
  }

  const int32_t blocks_each = (context + steps + 15) / 16;
  CpuBackendOptions bo;
  bo.model = model->get();
  bo.threads = threads;
  bo.kv_pool.budget_bytes = int64_t{3} * kBatch * blocks_each * 16 *
                             KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), 4);
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend(bo);
  Check(backend.status());
  model->reset();  // the backend holds its own copy of the weights

  int32_t next_block = 0;
  for (Config& cfg : configs) {
    for (int s = 0; s < kBatch; ++s) {
      cfg.tokens.push_back(Tokens(context + steps, 10 + s));
      std::vector<int32_t> table(blocks_each);
      for (int32_t& b : table) b = next_block++;
      cfg.tables.push_back(table);
      SequenceStep step;
      step.token_ids = absl::MakeConstSpan(cfg.tokens[s]).subspan(0, context);
      step.block_table = cfg.tables[s];
      step.adapter = cfg.adapter_of(s);
      std::vector<float> logits;
      Check((*backend)->Forward({step}, &logits));
    }
  }

  std::vector<std::vector<double>> ms(3);
  std::vector<std::vector<double>> ratio(2);
  for (int r = 0; r < rounds; ++r) {
    double round_ms[3];
    for (int k = 0; k < 3; ++k) {
      const Config& cfg = configs[k];
      const double t0 = Now();
      for (int i = 0; i < steps; ++i) {
        std::vector<SequenceStep> batch(kBatch);
        for (int s = 0; s < kBatch; ++s) {
          batch[s].token_ids = absl::MakeConstSpan(cfg.tokens[s]).subspan(context + i, 1);
          batch[s].start_pos = context + i;
          batch[s].block_table = cfg.tables[s];
          batch[s].want_logits = true;
          batch[s].adapter = cfg.adapter_of(s);
        }
        std::vector<float> logits;
        Check((*backend)->Forward(batch, &logits));
      }
      round_ms[k] = (Now() - t0) * 1e3 / steps;
      ms[k].push_back(round_ms[k]);
    }
    ratio[0].push_back(round_ms[1] / round_ms[0]);
    ratio[1].push_back(round_ms[2] / round_ms[0]);
    std::fprintf(stderr, "round %d: base %.2f ms, rank 8 %.2f ms, rank 64 %.2f ms\n", r + 1,
                 round_ms[0], round_ms[1], round_ms[2]);
  }
  std::printf("| batch-8 decode step, context %d, %d threads | median ms/step | ÷ base (median of rounds) |\n",
              context, threads);
  std::printf("|---|---|---|\n");
  std::printf("| base alone | %.2f | 1 |\n", Median(ms[0]));
  std::printf("| 8 rows over 4 adapters, rank 8 | %.2f | %.3f |\n", Median(ms[1]), Median(ratio[0]));
  std::printf("| 8 rows over 4 adapters, rank 64 | %.2f | %.3f |\n", Median(ms[2]), Median(ratio[1]));
  std::filesystem::remove_all(temp_dir);
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) { return prefixd::Main(argc, argv); }
