// LoRA adapters on the CPU backend: an adapter's logits against a model whose weights were
// merged in advance (within a stated tolerance), exactly the base when B = 0, and the
// invariance the backend keeps for every row (batch mates, chunking, cached prefix, threads,
// instruction set) with adapters in the batch.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/lora_adapter.h"
#include "engine/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/matmul.h"
#include "tests/kernels/test_models.h"
#include "tools/random_adapter.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;
using testing::Blocks;
using testing::MakeBackend;
using testing::RandomTokens;

std::shared_ptr<const LoraAdapter> WriteAndLoadAdapter(const Model& base,
                                                       const RandomAdapterOptions& options,
                                                       const std::string& tag) {
  const std::string dir = testing::MakeTempDir(tag);
  const absl::Status written = WriteRandomAdapter(dir, base.config(), options);
  EXPECT_TRUE(written.ok()) << written;
  auto adapter = LoadLoraAdapter(dir, base.config());
  EXPECT_TRUE(adapter.ok()) << adapter.status();
  return adapter.ok() ? *adapter : nullptr;
}

// The base's weights with each targeted matrix replaced by W + scaling · (B·A)ᵀ (computed in
// double, rounded once), written as a model directory and loaded.
std::unique_ptr<Model> MergedModel(const Model& base, const LoraAdapter& adapter) {
  const ModelConfig& c = base.config();
  const std::string dir = testing::MakeTempDir("merged");
  for (const char* f : {"config.json", "vocab.json", "merges.txt"}) {
    fs::copy_file(fs::path(base.dir()) / f, fs::path(dir) / f);
  }
  std::vector<std::string> names = {"wte.weight", "wpe.weight"};
  for (int i = 0; i < c.n_layer; ++i) {
    for (const char* s : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                          "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
                          "mlp.c_proj.bias"}) {
      names.push_back(absl::StrCat("h.", i, ".", s));
    }
  }
  names.push_back("ln_f.weight");
  names.push_back("ln_f.bias");
  std::vector<SafetensorsEntry> entries;
  std::string data;
  for (const std::string& name : names) {
    const Tensor& t = base.Get(name);
    std::vector<float> w = base.ToFloat(t);
    for (int i = 0; i < c.n_layer; ++i) {
      for (int target = 0; target < kNumLoraTargets; ++target) {
        const LoraTarget lt = static_cast<LoraTarget>(target);
        if (name != absl::StrCat("h.", i, ".", std::string(LoraTargetPath(lt)), ".weight")) {
          continue;
        }
        const LoraModule* m = adapter.module(i, lt);
        if (m == nullptr) continue;
        const int64_t r = adapter.rank;
        for (int64_t k = 0; k < m->in; ++k) {
          for (int64_t o = 0; o < m->out; ++o) {
            double d = 0;
            for (int64_t j = 0; j < r; ++j) {
              d += double{m->a_t[k * r + j]} * double{m->b_t[j * m->out + o]};
            }
            w[k * m->out + o] = static_cast<float>(w[k * m->out + o] + adapter.scaling * d);
          }
        }
      }
    }
    SafetensorsEntry e;
    e.name = name;
    e.dtype = DType::kF32;
    e.shape = t.shape;
    e.begin = data.size();
    data.append(reinterpret_cast<const char*>(w.data()), w.size() * 4);
    e.end = data.size();
    entries.push_back(std::move(e));
  }
  const std::string file = EncodeSafetensorsHeader(entries, {{"format", "pt"}}) + data;
  {
    std::FILE* f = std::fopen((dir + "/model.safetensors").c_str(), "wb");
    EXPECT_NE(f, nullptr);
    if (f == nullptr) return nullptr;
    EXPECT_EQ(std::fwrite(file.data(), 1, file.size(), f), file.size());
    std::fclose(f);
  }
  auto model = Model::Load(dir);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// Prefills `tokens` with `adapter` in chunks of `chunk` (0: at once) from `from`; the last
// token's logits.
std::vector<float> Prefill(Backend& backend, const std::vector<uint32_t>& tokens,
                           const std::vector<int32_t>& table, int chunk,
                           const LoraAdapter* adapter, int from = 0) {
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
    s.adapter = adapter;
    logits.clear();
    const absl::Status st = backend.Forward({s}, &logits);
    EXPECT_TRUE(st.ok()) << st;
  }
  return logits;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    m = std::max(m, std::abs(double{a[i]} - double{b[i]}));
  }
  return m;
}

double MaxAbs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, std::abs(double{x}));
  return m;
}

class CpuBackendLoraTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tiny_ = testing::WriteAndLoad(TinyModelConfig(), 11, "tiny").release();
    odd_ = testing::WriteAndLoad(testing::OddModelConfig(), 12, "odd").release();
  }
  static void TearDownTestSuite() {
    delete tiny_;
    delete odd_;
  }
  static std::vector<const Model*> Models() { return {tiny_, odd_}; }

  // Three different adapters: rank 4 on every module; rank 8 with rslora; rank 2 on c_attn
  // only.
  static std::vector<std::shared_ptr<const LoraAdapter>> ThreeAdapters(const Model& m) {
    RandomAdapterOptions a;
    a.rank = 4;
    a.lora_alpha = 8;
    a.seed = 1;
    a.b_std = 0.1f;
    RandomAdapterOptions b = a;
    b.rank = 8;
    b.use_rslora = true;
    b.seed = 2;
    RandomAdapterOptions c = a;
    c.rank = 2;
    c.target_modules = {"c_attn"};
    c.seed = 3;
    return {WriteAndLoadAdapter(m, a, "a"), WriteAndLoadAdapter(m, b, "b"),
            WriteAndLoadAdapter(m, c, "c")};
  }

  static inline Model* tiny_ = nullptr;
  static inline Model* odd_ = nullptr;
};

// Tolerance: the adapter adds its update after the base product (another rounding order than
// one product with merged weights), so logits agree to fp32 rounding of the layers, the same
// rule as against the double reference: max |difference| <= 1e-4 · max |logit|. The adapter
// must also move the logits by far more than that, or the comparison would prove nothing.
TEST_F(CpuBackendLoraTest, LogitsMatchAModelWithMergedWeights) {
  for (const Model* model : Models()) {
    for (const auto& adapter : ThreeAdapters(*model)) {
      ASSERT_NE(adapter, nullptr);
      std::unique_ptr<Model> merged = MergedModel(*model, *adapter);
      ASSERT_NE(merged, nullptr);
      auto backend = MakeBackend(*model, 2);
      auto merged_backend = MakeBackend(*merged, 2);
      const std::vector<uint32_t> tokens = RandomTokens(29, 4);
      const std::vector<float> got = Prefill(*backend, tokens, Blocks(0, 2), 7, adapter.get());
      const std::vector<float> want = Prefill(*merged_backend, tokens, Blocks(0, 2), 0, nullptr);
      const std::vector<float> base = Prefill(*backend, tokens, Blocks(4, 2), 0, nullptr);
      const double scale = MaxAbs(want);
      EXPECT_GT(scale, 0.1);
      EXPECT_LE(MaxAbsDiff(got, want), 1e-4 * scale) << "rank " << adapter->rank;
      EXPECT_GT(MaxAbsDiff(base, want), 1e-2 * scale) << "the adapter hardly changes the model";
    }
  }
}

TEST_F(CpuBackendLoraTest, ZeroBIsExactlyTheBase) {
  for (const Model* model : Models()) {
    RandomAdapterOptions o;
    o.rank = 4;
    o.b_std = 0.0f;  // PEFT's initial adapter
    auto adapter = WriteAndLoadAdapter(*model, o, "zero");
    ASSERT_NE(adapter, nullptr);
    auto backend = MakeBackend(*model, 2);
    const std::vector<uint32_t> tokens = RandomTokens(40, 5);
    EXPECT_EQ(Prefill(*backend, tokens, Blocks(0, 3), 0, adapter.get()),
              Prefill(*backend, tokens, Blocks(3, 3), 0, nullptr));
    EXPECT_EQ(Prefill(*backend, tokens, Blocks(6, 3), 3, adapter.get()),
              Prefill(*backend, tokens, Blocks(3, 3), 0, nullptr));
  }
}

// The base and three adapters in one batch (prefill chunks and decodes mixed) give each row
// exactly what it gets alone.
TEST_F(CpuBackendLoraTest, BatchOfBaseAndThreeAdaptersEqualsEachAlone) {
  for (const Model* model : Models()) {
    const auto adapters = ThreeAdapters(*model);
    const std::vector<const LoraAdapter*> who = {nullptr, adapters[0].get(), adapters[1].get(),
                                                 adapters[2].get()};
    auto backend = MakeBackend(*model, 2);
    const size_t v = model->config().vocab_size;
    std::vector<std::vector<uint32_t>> prompts;
    std::vector<std::vector<float>> alone_prefill, alone_decode;
    for (int i = 0; i < 4; ++i) {
      prompts.push_back(RandomTokens(18 + 5 * i, 20 + i));
      alone_prefill.push_back(Prefill(*backend, prompts[i], Blocks(8 * i, 3), 0, who[i]));
      std::vector<uint32_t> longer = prompts[i];
      longer.push_back(100 + i);
      alone_decode.push_back(
          Prefill(*backend, longer, Blocks(8 * i, 3), 0, who[i], /*from=*/prompts[i].size()));
    }
    // Together: every prompt at once, in another pool region, then one decode each.
    std::vector<std::vector<int32_t>> tables;
    for (int i = 0; i < 4; ++i) tables.push_back(Blocks(32 + 8 * i, 3));
    std::vector<SequenceStep> steps(4);
    for (int i = 0; i < 4; ++i) {
      steps[i].token_ids = prompts[i];
      steps[i].start_pos = 0;
      steps[i].block_table = tables[i];
      steps[i].want_logits = true;
      steps[i].adapter = who[i];  // base first, then the three adapters
    }
    std::vector<float> logits;
    ASSERT_TRUE(backend->Forward(steps, &logits).ok());
    ASSERT_EQ(logits.size(), 4 * v);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(std::vector<float>(logits.begin() + i * v, logits.begin() + (i + 1) * v),
                alone_prefill[i])
          << "prefill row " << i;
    }
    std::vector<std::vector<uint32_t>> next(4);
    for (int i = 0; i < 4; ++i) {
      next[i] = {static_cast<uint32_t>(100 + i)};
      // Reverse order this time: a row's place in the batch does not matter either.
      SequenceStep& s = steps[3 - i];
      s.token_ids = next[i];
      s.start_pos = static_cast<int32_t>(prompts[i].size());
      s.block_table = tables[i];
      s.adapter = who[i];
    }
    logits.clear();
    ASSERT_TRUE(backend->Forward(steps, &logits).ok());
    for (int i = 0; i < 4; ++i) {
      const int row = 3 - i;
      EXPECT_EQ(std::vector<float>(logits.begin() + row * v, logits.begin() + (row + 1) * v),
                alone_decode[i])
          << "decode of " << i;
    }
    // The adapters do change their rows (or the equalities above would be trivial).
    for (int i = 1; i < 4; ++i) {
      EXPECT_NE(alone_prefill[i], Prefill(*backend, prompts[i], Blocks(60, 3), 0, nullptr));
    }
  }
}

TEST_F(CpuBackendLoraTest, ChunkingCachedPrefixAndThreadsDoNotChangeAnAdaptersLogits) {
  for (const Model* model : Models()) {
    const auto adapters = ThreeAdapters(*model);
    const LoraAdapter* a = adapters[1].get();
    const std::vector<uint32_t> tokens = RandomTokens(45, 6);
    auto one = MakeBackend(*model, 1);
    auto three = MakeBackend(*model, 3);
    const std::vector<float> want = Prefill(*one, tokens, Blocks(0, 3), 0, a);
    EXPECT_EQ(Prefill(*three, tokens, Blocks(0, 3), 0, a), want);
    for (int chunk : {1, 5, 16}) {
      EXPECT_EQ(Prefill(*three, tokens, Blocks(10 + chunk, 3), chunk, a), want) << chunk;
    }
    // Its own cached prefix: the first two blocks shared, the rest recomputed.
    EXPECT_EQ(Prefill(*one, tokens, {0, 1, 7}, 0, a, /*from=*/32), want);
  }
}

TEST_F(CpuBackendLoraTest, InstructionSetDoesNotChangeAnAdaptersLogits) {
  if (!MatMulIsaSupported(MatMulIsa::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  const auto adapters = ThreeAdapters(*tiny_);
  auto backend = MakeBackend(*tiny_, 2);
  const std::vector<uint32_t> tokens = RandomTokens(40, 9);
  SetMatMulIsa(MatMulIsa::kAvx2);
  const std::vector<float> want = Prefill(*backend, tokens, Blocks(0, 3), 5, adapters[0].get());
  SetMatMulIsa(MatMulIsa::kAvx512);
  const std::vector<float> got = Prefill(*backend, tokens, Blocks(3, 3), 0, adapters[0].get());
  SetMatMulIsa(MatMulIsa::kAuto);
  EXPECT_EQ(got, want);
}

TEST_F(CpuBackendLoraTest, RefusesAnAdapterForAnotherModel) {
  RandomAdapterOptions o;
  auto for_odd = WriteAndLoadAdapter(*odd_, o, "odd_adapter");
  ASSERT_NE(for_odd, nullptr);
  auto backend = MakeBackend(*tiny_, 1);
  const std::vector<uint32_t> tokens = RandomTokens(5, 1);
  const std::vector<int32_t> table = Blocks(0, 1);
  SequenceStep s;
  s.token_ids = tokens;
  s.block_table = table;
  s.want_logits = true;
  s.adapter = for_odd.get();
  std::vector<float> logits;
  const absl::Status st = backend->Forward({s}, &logits);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(logits.empty());
  EXPECT_TRUE(backend->applies_lora());
}

}  // namespace
}  // namespace prefixd
