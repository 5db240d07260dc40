// Random GPT-2 directories for kernel tests, written once per process into a temp dir.
#ifndef PREFIXD_TESTS_KERNELS_TEST_MODELS_H_
#define PREFIXD_TESTS_KERNELS_TEST_MODELS_H_

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/model.h"
#include "engine/tokenizer.h"  // Model's destructor needs it complete
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tools/random_model.h"

namespace prefixd::testing {

// Directories made by MakeTempDir, removed when the test process exits (models are ~15 MB
// each and every test case runs in its own process).
struct TempDirs {
  std::vector<std::string> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (const std::string& d : dirs) std::filesystem::remove_all(d, ec);
  }
};

// A fresh directory under the test temp dir, unique per process and call.
inline std::string MakeTempDir(const std::string& tag) {
  static TempDirs made;
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    ("prefixd_kernels_" + tag + "_" + std::to_string(getpid()) +
                                     "_" + std::to_string(made.dirs.size()));
  std::filesystem::create_directories(dir);
  made.dirs.push_back(dir.string());
  return dir.string();
}

// Writes a random model with `config` and `seed` and loads it; fails the test on error.
// `dtype`: the checkpoint's; a seed gives the same weights in every dtype up to rounding.
inline std::unique_ptr<Model> WriteAndLoad(const ModelConfig& config, uint64_t seed,
                                           const std::string& tag, DType dtype = DType::kF32) {
  RandomModelOptions o;
  o.dtype = dtype;
  o.out_dir = MakeTempDir(tag);
  o.tokenizer_dir = PREFIXD_TOKENIZER_DIR;
  o.config = config;
  o.seed = seed;
  const absl::Status written = WriteRandomModel(o);
  EXPECT_TRUE(written.ok()) << written;
  if (!written.ok()) return nullptr;
  auto model = Model::Load(o.out_dir);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// 3 layers, 3 heads of 12 (head_dim not a multiple of 8: the scalar tails), 64 positions.
inline ModelConfig OddModelConfig() {
  ModelConfig c = TinyModelConfig();
  c.n_layer = 3;
  c.n_head = 3;
  c.n_embd = 36;
  c.n_positions = 64;
  return c;
}

inline std::unique_ptr<Backend> MakeBackend(const Model& model, int threads,
                                            int64_t num_blocks = 64, int32_t block_size = 16,
                                            DType dtype = DType::kF32) {
  const ModelConfig& c = model.config();
  CpuBackendOptions o;
  o.model = &model;
  o.dtype = dtype;
  o.kv_pool.block_size = block_size;
  o.threads = threads;
  o.kv_pool.budget_bytes = num_blocks * block_size * 2 * c.n_layer * c.n_embd * 4;
  auto b = CreateCpuBackend(o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

// Blocks [first, first + n) as a block table.
inline std::vector<int32_t> Blocks(int32_t first, int32_t n) {
  std::vector<int32_t> t(n);
  for (int32_t i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

// Prefills tokens[from, end) in chunks of `chunk` (0 = all at once) through `table`, then
// returns the logits of the last token.
inline std::vector<float> Prefill(Backend& backend, const std::vector<uint32_t>& tokens,
                                  const std::vector<int32_t>& table, int chunk, int from = 0) {
  std::vector<float> logits;
  const int n = static_cast<int>(tokens.size());
  if (chunk <= 0) chunk = n;
  for (int start = from; start < n; start += chunk) {
    const int len = std::min(chunk, n - start);
    SequenceStep s;
    s.token_ids = absl::MakeConstSpan(tokens).subspan(start, len);
    s.start_pos = start;
    s.block_table = table;
    s.want_logits = start + len == n;
    logits.clear();
    const absl::Status st = backend.Forward({s}, &logits);
    EXPECT_TRUE(st.ok()) << st;
  }
  return logits;
}

inline std::vector<uint32_t> RandomTokens(int n, uint32_t seed, uint32_t vocab = 50257) {
  std::vector<uint32_t> t(n);
  uint64_t x = seed * 2654435761u + 1;
  for (uint32_t& v : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<uint32_t>((x >> 33) % vocab);
  }
  return t;
}

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_KERNELS_TEST_MODELS_H_
