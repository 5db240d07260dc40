// Sampling one token from a full GPT-2 row of logits (50,257 entries), as the engine does
// once per sequence per step on its own thread between backend steps. Reports time per row.
//
//   Greedy:          temperature 0, the chosen token's log-probability (what the shared-
//                    prefix bench and most evaluations run).
//   Temperature:     temperature 0.8 over the whole vocabulary.
//   TopP:            temperature 0.8, top-p 0.95.
//   GreedyTop5:      greedy with 5 top log-probabilities.
#include <cstdint>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "engine/sampler.h"

namespace prefixd {
namespace {

const std::vector<float>& Row() {
  static const std::vector<float>* const row = [] {
    auto* v = new std::vector<float>(50257);
    std::mt19937 rng(3);
    std::normal_distribution<float> logit(0.0f, 3.0f);  // roughly a random model's spread
    for (float& x : *v) x = logit(rng);
    return v;
  }();
  return *row;
}

void Run(benchmark::State& state, float temperature, float top_p, uint32_t top_logprobs) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  uint32_t position = 0;
  for (auto _ : state) {
    SampledToken t = SampleToken(Row(), p, {.seed = 1, .position = position++}, top_logprobs);
    benchmark::DoNotOptimize(t);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Greedy(benchmark::State& state) { Run(state, 0.0f, 1.0f, 0); }
void BM_Temperature(benchmark::State& state) { Run(state, 0.8f, 1.0f, 0); }
void BM_TopP(benchmark::State& state) { Run(state, 0.8f, 0.95f, 0); }
void BM_GreedyTop5(benchmark::State& state) { Run(state, 0.0f, 1.0f, 5); }
BENCHMARK(BM_Greedy);
BENCHMARK(BM_Temperature);
BENCHMARK(BM_TopP);
BENCHMARK(BM_GreedyTop5);

}  // namespace
}  // namespace prefixd

BENCHMARK_MAIN();
