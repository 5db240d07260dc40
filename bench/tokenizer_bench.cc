// Tokenizer throughput on ~4 MB of mixed text: the golden corpus (English, code, numbers,
// whitespace runs, accented letters, CJK, emoji) shuffled and repeated. Reports bytes/s of
// input text for encoding and of output bytes for decoding.
//
//   EncodeBulk:    one Encode call over the whole text (best case: its per-call cache of
//                  pieces sees every repeat).
//   EncodeLines:   one Encode call per corpus line, as short prompts arrive.
//   Decode:        Decode of the bulk ids back to the text.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "engine/tokenizer.h"
#include "nlohmann/json.hpp"

namespace prefixd {
namespace {

struct Corpus {
  std::unique_ptr<Tokenizer> tok;
  std::vector<std::string> lines;  // ~4 MB in all
  std::string text;                // the lines joined with '\n'
};

const Corpus& GetCorpus() {
  static const Corpus* const corpus = [] {
    auto* c = new Corpus;
    const std::string dir = PREFIXD_TOKENIZER_DIR;
    auto tok = Tokenizer::Load(dir + "/vocab.json", dir + "/merges.txt");
    if (!tok.ok()) {
      std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
      std::exit(1);
    }
    c->tok = std::move(*tok);
    std::ifstream in(std::string(PREFIXD_SOURCE_DIR) +
                     "/tests/engine/testdata/tokenizer_golden.jsonl");
    std::vector<std::string> base;
    for (std::string line; std::getline(in, line);) {
      base.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
    }
    if (base.empty()) {
      std::fprintf(stderr, "golden corpus not found\n");
      std::exit(1);
    }
    std::mt19937 rng(1);
    while (c->text.size() < (4u << 20)) {
      std::shuffle(base.begin(), base.end(), rng);
      for (const std::string& l : base) {
        c->lines.push_back(l);
        c->text += l;
        c->text += '\n';
      }
    }
    return c;
  }();
  return *corpus;
}

void BM_EncodeBulk(benchmark::State& state) {
  const Corpus& c = GetCorpus();
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = c.tok->Encode(c.text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * c.text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
}
BENCHMARK(BM_EncodeBulk)->Unit(benchmark::kMillisecond);

void BM_EncodeLines(benchmark::State& state) {
  const Corpus& c = GetCorpus();
  size_t bytes = 0;
  for (const auto& l : c.lines) bytes += l.size();
  for (auto _ : state) {
    for (const auto& l : c.lines) {
      auto ids = c.tok->Encode(l);
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_EncodeLines)->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state) {
  const Corpus& c = GetCorpus();
  const std::vector<uint32_t> ids = c.tok->Encode(c.text);
  for (auto _ : state) {
    auto text = c.tok->Decode(ids);
    benchmark::DoNotOptimize(text->data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * c.text.size()));
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace prefixd

BENCHMARK_MAIN();
