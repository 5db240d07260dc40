// How far the CPU backend's half-precision and int8 weights move GPT-2's outputs from f32: the
// same tokens through an f32, an f16, a bf16 and an int8 backend, compared position by position.
//
//   dtype_accuracy --model DIR [--positions 300] [--generate 64] [--threads 2] [--ids 1,2,...]
//
// Teacher-forced: a fixed pseudo-random token sequence is fed one token per step, and at
// every position the log-softmax of each other backend is compared with f32's: the largest
// and the mean |Δ logprob| on the token f32 ranks first, the largest over f32's top 5 and over
// the whole vocabulary, and how often the argmax agrees. Free-running: each backend greedily
// continues a prompt on its own, and the report gives how many leading tokens agree with f32's
// continuation. --ids feeds the given tokens instead of the pseudo-random ones (and sets
// --positions to their count): e.g. a prompt and f32's greedy continuation of it, the sequence
// scripts/bench-peer's cross-check feeds llama.cpp, so that its figures and these compare position
// for position.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cache/kv_layout.h"
#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "kernels/cpu/cpu_backend.h"

namespace prefixd {
namespace {

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "dtype_accuracy: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

std::vector<uint32_t> Tokens(int n, uint32_t vocab) {
  std::vector<uint32_t> t(n);
  uint64_t x = 12345;
  for (uint32_t& v : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<uint32_t>((x >> 33) % vocab);
  }
  return t;
}

std::vector<double> LogSoftmax(const float* logits, int64_t n) {
  const double max = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(logits[i] - max);
  const double log_sum = std::log(sum) + max;
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = logits[i] - log_sum;
  return out;
}

// One sequence on its own backend, fed a token at a time.
class Runner {
 public:
  Runner(std::unique_ptr<Backend> backend, int32_t positions)
      : backend_(std::move(backend)), table_((positions + 15) / 16) {
    for (size_t i = 0; i < table_.size(); ++i) table_[i] = static_cast<int32_t>(i);
  }
  // Logits after feeding `token` at `pos` (positions 0..pos-1 fed before, in order).
  std::vector<float> Step(uint32_t token, int32_t pos) {
    std::vector<float> logits;
    const uint32_t ids[1] = {token};
    Check(backend_->Forward({SequenceStep{ids, pos, table_, true}}, &logits));
    return logits;
  }

 private:
  std::unique_ptr<Backend> backend_;
  std::vector<int32_t> table_;
};

int Main(int argc, char** argv) {
  std::string model_dir;
  int positions = 300, generate = 64, threads = 2;
  std::vector<uint32_t> ids;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") {
      model_dir = argv[i + 1];
    } else if (flag == "--positions") {
      positions = std::atoi(argv[i + 1]);
    } else if (flag == "--generate") {
      generate = std::atoi(argv[i + 1]);
    } else if (flag == "--threads") {
      threads = std::atoi(argv[i + 1]);
    } else if (flag == "--ids") {
      ids.clear();
      for (const char* p = argv[i + 1]; *p != '\0';) {
        char* end = nullptr;
        ids.push_back(static_cast<uint32_t>(std::strtoul(p, &end, 10)));
        if (end == p) break;
        p = *end == ',' ? end + 1 : end;
      }
      positions = static_cast<int>(ids.size());
    } else {
      model_dir.clear();
      break;
    }
  }
  if (model_dir.empty() || positions < 16 || generate < 1 || threads < 1) {
    std::fprintf(stderr,
                 "usage: dtype_accuracy --model DIR [--positions N>=16] [--generate N>=1] "
                 "[--threads N] [--ids 1,2,...]\n");
    return 2;
  }
  auto model = Model::Load(model_dir);
  Check(model.status());
  const ModelConfig& c = (*model)->config();
  const int32_t context = std::max(positions, 16 + generate);
  if (context > c.n_positions) {
    std::fprintf(stderr, "dtype_accuracy: the model's context is %d positions\n", c.n_positions);
    return 2;
  }
  auto make = [&](DType dtype) {
    CpuBackendOptions o;
    o.model = model->get();
    o.dtype = dtype;
    o.threads = threads;
    o.kv_pool.budget_bytes =
        int64_t{(context + 15) / 16} * 16 * KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), 4);
    auto b = CreateCpuBackend(o);
    Check(b.status());
    return Runner(std::move(*b), context);
  };
  const int64_t v = c.vocab_size;
  std::printf("model %s, %d teacher-forced positions, %d greedy tokens\n\n",
              (*model)->name().c_str(), positions, generate);
  std::printf(
      "| dtype | max \\|Δ logprob\\| of f32's top token | mean | max over f32's top 5 | max over "
      "the vocabulary | argmax agrees | greedy tokens agreeing with f32 |\n"
      "|---|---|---|---|---|---|---|\n");
  for (uint32_t id : ids) {
    if (id >= static_cast<uint32_t>(v)) {
      std::fprintf(stderr, "dtype_accuracy: --ids holds %u, past the vocabulary\n", id);
      return 2;
    }
  }
  const std::vector<uint32_t> tokens =
      ids.empty() ? Tokens(positions, static_cast<uint32_t>(v)) : ids;
  Runner f32 = make(DType::kF32);
  std::vector<std::vector<double>> reference(positions);
  for (int32_t p = 0; p < positions; ++p) {
    const std::vector<float> l = f32.Step(tokens[p], p);
    reference[p] = LogSoftmax(l.data(), v);
  }
  // f32's greedy continuation of the first 16 tokens.
  auto greedy = [&](Runner& runner) {
    std::vector<uint32_t> out;
    std::vector<float> logits;
    for (int32_t p = 0; p < 16; ++p) logits = runner.Step(tokens[p], p);
    for (int32_t g = 0; g < generate; ++g) {
      const uint32_t next =
          static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(next);
      logits = runner.Step(next, 16 + g);
    }
    return out;
  };
  Runner f32_greedy = make(DType::kF32);
  const std::vector<uint32_t> want = greedy(f32_greedy);
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kI8}) {
    Runner half = make(dtype);
    double top = 0, top_sum = 0, top5 = 0, all = 0;
    int agree = 0;
    for (int32_t p = 0; p < positions; ++p) {
      const std::vector<float> l = half.Step(tokens[p], p);
      const std::vector<double> got = LogSoftmax(l.data(), v);
      const std::vector<double>& ref = reference[p];
      std::vector<int64_t> order(v);
      for (int64_t i = 0; i < v; ++i) order[i] = i;
      std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                        [&](int64_t a, int64_t b) { return ref[a] > ref[b]; });
      top = std::max(top, std::abs(got[order[0]] - ref[order[0]]));
      top_sum += std::abs(got[order[0]] - ref[order[0]]);
      for (int i = 0; i < 5; ++i) top5 = std::max(top5, std::abs(got[order[i]] - ref[order[i]]));
      for (int64_t i = 0; i < v; ++i) all = std::max(all, std::abs(got[i] - ref[i]));
      agree += (std::max_element(got.begin(), got.end()) - got.begin()) == order[0];
    }
    Runner half_greedy = make(dtype);
    const std::vector<uint32_t> got = greedy(half_greedy);
    int same = 0;
    while (same < generate && got[same] == want[same]) ++same;
    std::printf("| %s | %.2e | %.2e | %.2e | %.2e | %d of %d | %d of %d |\n",
                std::string(DTypeName(dtype)).c_str(), top, top_sum / positions, top5, all, agree,
                positions, same, generate);
  }
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) { return prefixd::Main(argc, argv); }
