// cuda_backend_bench: decode step time and prefill throughput of the CUDA backend.
//
//   cuda_backend_bench --model DIR [--dtype bf16] [--batches 1,8,64,256]
//                      [--contexts 128,1000] [--steps 20] [--prefill-seqs 16]
//                      [--prefill-len 1000] [--graphs 1]
//
// Decode: for each (context C, batch B), B sequences are prefilled with C random tokens in
// distinct blocks (no sharing, so KV reads are real DRAM traffic), then `steps` decode steps
// (one token per sequence) are timed after 3 warm-up steps (which also capture the CUDA
// graph), once with every sequence's logits copied to the host as the engine asks, once
// without. Prints the median step time of each. Prefill: `prefill-seqs` prompts of `prefill-len`
// tokens in one Forward() each batch of passes, timed end to end (tokens / s). Wall-clock timing
// around Forward(), which returns after the logits are on the host. Lines starting "RESULT" are
// parsed by scripts/gpu-check.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/model.h"
#include "engine/tokenizer.h"  // Model's destructor needs the complete type
#include "kernels/cuda/cuda_backend.h"

namespace prefixd {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int v = 0;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Sequences {
  std::vector<std::vector<uint32_t>> tokens;
  std::vector<std::vector<int32_t>> tables;
};

// B sequences of `context` random tokens, each in its own blocks, sized for `extra` more.
Sequences MakeSequences(int batch, int context, int extra, int block_size, int vocab,
                        std::mt19937* rng) {
  Sequences s;
  const int blocks = (context + extra + block_size - 1) / block_size;
  int next = 0;
  for (int b = 0; b < batch; ++b) {
    std::vector<uint32_t> t(context);
    for (uint32_t& x : t) x = (*rng)() % vocab;
    s.tokens.push_back(std::move(t));
    std::vector<int32_t> table(blocks);
    for (int& id : table) id = next++;
    s.tables.push_back(std::move(table));
  }
  return s;
}

absl::Status Prefill(Backend* backend, const Sequences& s, int group) {
  std::vector<float> logits;
  for (size_t begin = 0; begin < s.tokens.size(); begin += group) {
    std::vector<SequenceStep> steps;
    for (size_t i = begin; i < std::min(s.tokens.size(), begin + group); ++i) {
      SequenceStep st;
      st.token_ids = s.tokens[i];
      st.block_table = s.tables[i];
      st.want_logits = true;
      steps.push_back(st);
    }
    logits.clear();
    if (absl::Status st = backend->Forward(steps, &logits); !st.ok()) return st;
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {
      {"model", ""},   {"dtype", "bf16"},      {"batches", "1,8,64,256"}, {"contexts", "128,1000"},
      {"steps", "20"}, {"prefill-seqs", "16"}, {"prefill-len", "1000"},   {"graphs", "1"}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos || !flags.count(a.substr(2, eq - 2))) {
      std::fprintf(stderr,
                   "usage: cuda_backend_bench --model=DIR [--dtype=bf16] "
                   "[--batches=1,8,64,256] [--contexts=128,1000] [--steps=20] "
                   "[--prefill-seqs=16] [--prefill-len=1000] [--graphs=1]\n");
      return 2;
    }
    flags[a.substr(2, eq - 2)] = a.substr(eq + 1);
  }
  auto model = Model::Load(flags["model"]);
  if (!model.ok()) {
    std::fprintf(stderr, "cuda_backend_bench: %s\n", model.status().ToString().c_str());
    return 1;
  }
  const ModelConfig& c = (*model)->config();
  CudaBackendOptions o;
  o.model = model->get();
  const std::optional<DType> dtype = ParseDType(flags["dtype"]);
  if (!dtype) return 2;
  o.dtype = *dtype;
  o.use_cuda_graphs = flags["graphs"] != "0";
  const int steps = std::atoi(flags["steps"].c_str());
  const std::vector<int> batches = ParseList(flags["batches"]);
  const std::vector<int> contexts = ParseList(flags["contexts"]);
  // Pool sized for the largest (batch x context) plus the prefill run, not for all memory:
  // the rest stays free for anything else on the machine.
  int64_t max_tokens = 0;
  for (int b : batches) {
    for (int ctx : contexts)
      max_tokens = std::max<int64_t>(max_tokens, int64_t{b} * (ctx + steps + 3 + 16));
  }
  max_tokens = std::max<int64_t>(max_tokens, std::atoll(flags["prefill-seqs"].c_str()) *
                                                 (std::atoll(flags["prefill-len"].c_str()) + 16));
  // One block more: the backend's scratch block comes out of the budget.
  max_tokens += o.kv_pool.block_size;
  o.kv_pool.budget_bytes = max_tokens * 2 * c.n_layer * c.n_embd * DTypeSize(o.dtype);
  auto backend = CreateCudaBackend(o);
  if (!backend.ok()) {
    std::fprintf(stderr, "cuda_backend_bench: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  Backend* be = backend->get();
  std::printf("model %s: %d layers, %d wide, dtype %s, graphs %d, %lld KV blocks\n",
              (*model)->name().c_str(), c.n_layer, c.n_embd, flags["dtype"].c_str(),
              o.use_cuda_graphs ? 1 : 0, static_cast<long long>(be->num_blocks()));
  std::mt19937 rng(1);

  for (int ctx : contexts) {
    for (int batch : batches) {
      if (ctx + steps + 3 > c.n_positions) continue;
      Sequences s = MakeSequences(batch, ctx, steps + 3, be->block_size(), c.vocab_size, &rng);
      if (absl::Status st = Prefill(be, s, 16); !st.ok()) {
        std::fprintf(stderr, "prefill: %s\n", st.ToString().c_str());
        return 1;
      }
      // With logits (what the engine asks for: batch x vocab fp32 rows to the host), then
      // without (the device's share of the step); the second pass rewrites the same rows.
      for (const bool want_logits : {true, false}) {
        std::vector<double> times;
        std::vector<float> logits;
        std::vector<uint32_t> next(batch);
        for (int step = 0; step < steps + 3; ++step) {
          std::vector<SequenceStep> decode(batch);
          for (int b = 0; b < batch; ++b) {
            next[b] = rng() % c.vocab_size;
            decode[b].token_ids = absl::MakeConstSpan(&next[b], 1);
            decode[b].start_pos = ctx + step;
            decode[b].block_table = s.tables[b];
            decode[b].want_logits = want_logits;
          }
          logits.clear();
          const auto t0 = Clock::now();
          if (absl::Status st = be->Forward(decode, &logits); !st.ok()) {
            std::fprintf(stderr, "decode: %s\n", st.ToString().c_str());
            return 1;
          }
          const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
          if (step >= 3) times.push_back(us);
        }
        std::printf("RESULT %s batch=%d context=%d %.1f\n",
                    want_logits ? "decode_step_us" : "decode_step_nologits_us", batch, ctx,
                    Median(times));
      }
      std::fflush(stdout);
    }
  }

  const int seqs = std::atoi(flags["prefill-seqs"].c_str());
  const int len = std::min(std::atoi(flags["prefill-len"].c_str()), c.n_positions);
  if (seqs > 0 && len > 0) {
    Sequences warm = MakeSequences(1, len, 0, be->block_size(), c.vocab_size, &rng);
    if (absl::Status st = Prefill(be, warm, 1); !st.ok()) return 1;
    Sequences s = MakeSequences(seqs, len, 0, be->block_size(), c.vocab_size, &rng);
    const auto t0 = Clock::now();
    if (absl::Status st = Prefill(be, s, 4); !st.ok()) {
      std::fprintf(stderr, "prefill: %s\n", st.ToString().c_str());
      return 1;
    }
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("RESULT prefill_tokens_per_s seqs=%d len=%d %.0f\n", seqs, len, seqs * len / sec);
  }
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) { return prefixd::Main(argc, argv); }
