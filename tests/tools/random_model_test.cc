// The random-model writer: HF-format output, determinism, and an init that makes attention
// and logits depend on the tokens.
#include "tools/random_model.h"

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "base/check.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/files.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using json = nlohmann::json;

using ::prefixd::testing::ReadFile;

class RandomModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "prefixd_random_model_XXXXXX").string();
    PREFIXD_CHECK(::mkdtemp(tmpl.data()) != nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }

  RandomModelOptions Options(const std::string& name, uint64_t seed = 1) {
    RandomModelOptions o;
    o.out_dir = (root_ / name).string();
    o.tokenizer_dir = PREFIXD_TOKENIZER_DIR;
    o.seed = seed;
    return o;
  }

  std::unique_ptr<Model> WriteAndLoad(const RandomModelOptions& o) {
    absl::Status s = WriteRandomModel(o);
    EXPECT_TRUE(s.ok()) << s;
    absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(o.out_dir);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }

  fs::path root_;
};

TEST_F(RandomModelTest, WritesHuggingFaceLayout) {
  RandomModelOptions o = Options("m");
  ASSERT_TRUE(WriteRandomModel(o).ok());
  const json config = json::parse(ReadFile(root_ / "m" / "config.json"));
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(config["activation_function"], "gelu_new");
  EXPECT_EQ(config["layer_norm_epsilon"].get<double>(), 1e-5);
  EXPECT_EQ(config["bos_token_id"], 50256);
  EXPECT_EQ(config["eos_token_id"], 50256);
  EXPECT_EQ(config["n_layer"], 2);
  EXPECT_EQ(config["n_head"], 2);
  EXPECT_EQ(config["n_embd"], 64);
  EXPECT_EQ(config["n_positions"], 256);
  EXPECT_EQ(config["n_ctx"], 256);
  EXPECT_EQ(config["vocab_size"], 50257);
  for (const char* k : {"attn_pdrop", "embd_pdrop", "resid_pdrop"}) {
    EXPECT_EQ(config[k].get<double>(), 0.1) << k;
  }

  const std::string weights = ReadFile(root_ / "m" / "model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, weights.data(), 8);
  const json header = json::parse(weights.substr(8, n));
  EXPECT_EQ(header["__metadata__"], (json{{"format", "pt"}}));
  EXPECT_EQ(header["wte.weight"]["shape"], json::array({50257, 64}));
  EXPECT_EQ(header["h.0.attn.c_attn.weight"]["shape"], json::array({64, 192}));
  EXPECT_EQ(header["h.1.mlp.c_proj.weight"]["shape"], json::array({256, 64}));
  EXPECT_EQ(header["ln_f.bias"]["dtype"], "F32");
  EXPECT_FALSE(header.contains("lm_head.weight"));  // tied, as HF's gpt2 checkpoint
  for (const auto& [name, v] : header.items()) {
    EXPECT_FALSE(name.starts_with("transformer.")) << name;
  }
  EXPECT_EQ(ReadFile(root_ / "m" / "vocab.json"),
            ReadFile(fs::path(PREFIXD_TOKENIZER_DIR) / "vocab.json"));
  EXPECT_EQ(ReadFile(root_ / "m" / "merges.txt"),
            ReadFile(fs::path(PREFIXD_TOKENIZER_DIR) / "merges.txt"));
}

TEST_F(RandomModelTest, DeterministicPerSeed) {
  std::unique_ptr<Model> a = WriteAndLoad(Options("a", 5));
  std::unique_ptr<Model> b = WriteAndLoad(Options("b", 5));
  std::unique_ptr<Model> c = WriteAndLoad(Options("c", 6));
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->manifest_sha256(), b->manifest_sha256());
  EXPECT_NE(a->manifest_sha256(), c->manifest_sha256());
  // Rewriting over an existing directory gives the same bytes again.
  ASSERT_TRUE(WriteRandomModel(Options("a", 5)).ok());
  absl::StatusOr<std::unique_ptr<Model>> again = Model::Load((root_ / "a").string());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->manifest_sha256(), a->manifest_sha256());
}

TEST_F(RandomModelTest, HonoursShapeAndDtype) {
  RandomModelOptions o = Options("m");
  o.config.n_layer = 3;
  o.config.n_head = 4;
  o.config.n_embd = 32;
  o.config.n_positions = 16;
  o.config.vocab_size = 50304;  // padded vocabulary, as some checkpoints have
  o.dtype = DType::kBF16;
  std::unique_ptr<Model> m = WriteAndLoad(o);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->config().n_layer, 3);
  EXPECT_EQ(m->config().head_dim(), 8);
  EXPECT_EQ(m->dtype(), DType::kBF16);
  EXPECT_EQ(m->Get("wte.weight").shape, (std::vector<int64_t>{50304, 32}));
  EXPECT_NE(m->Find("h.2.mlp.c_fc.weight"), nullptr);
}

TEST_F(RandomModelTest, RefusesBadOptionsBeforeWriting) {
  RandomModelOptions o = Options("m");
  o.config.n_head = 3;  // 64 % 3 != 0
  EXPECT_THAT(WriteRandomModel(o).message(), HasSubstr("not divisible by n_head"));
  o = Options("m");
  o.config.vocab_size = 1000;
  o.config.bos_token_id = o.config.eos_token_id = 0;
  EXPECT_THAT(WriteRandomModel(o).message(), HasSubstr("below the tokenizer's 50257"));
  o = Options("m");
  o.tokenizer_dir = (root_ / "nowhere").string();
  EXPECT_THAT(WriteRandomModel(o).message(), HasSubstr("vocab.json: missing"));
  o = Options("");
  o.out_dir = "";
  EXPECT_FALSE(WriteRandomModel(o).ok());
  EXPECT_FALSE(fs::exists(root_ / "m"));
}

TEST(RandomModelPresetTest, Presets) {
  ASSERT_TRUE(PresetModelConfig("tiny").has_value());
  EXPECT_EQ(PresetModelConfig("tiny")->n_embd, 64);
  ASSERT_TRUE(PresetModelConfig("gpt2").has_value());
  EXPECT_EQ(PresetModelConfig("gpt2")->n_layer, 12);
  EXPECT_EQ(PresetModelConfig("gpt2")->n_positions, 1024);
  EXPECT_FALSE(PresetModelConfig("gpt3").has_value());
}

// Layer norm over rows of width e (weight w, bias b).
std::vector<float> LayerNorm(const std::vector<float>& x, int e, const std::vector<float>& w,
                             const std::vector<float>& b) {
  std::vector<float> out(x.size());
  for (size_t r = 0; r < x.size() / e; ++r) {
    double mean = 0, var = 0;
    for (int i = 0; i < e; ++i) mean += x[r * e + i];
    mean /= e;
    for (int i = 0; i < e; ++i) var += (x[r * e + i] - mean) * (x[r * e + i] - mean);
    var /= e;
    for (int i = 0; i < e; ++i) {
      out[r * e + i] =
          static_cast<float>((x[r * e + i] - mean) / std::sqrt(var + 1e-5)) * w[i] + b[i];
    }
  }
  return out;
}

TEST_F(RandomModelTest, InitIsNotDegenerate) {
  std::unique_ptr<Model> m = WriteAndLoad(Options("m"));
  ASSERT_NE(m, nullptr);
  const int e = 64, d = 32;
  // Layernorm gains near 1 but not all equal; biases small but not zero.
  const std::vector<float> ln1_w = m->ToFloat(m->Get("h.0.ln_1.weight"));
  const std::vector<float> ln1_b = m->ToFloat(m->Get("h.0.ln_1.bias"));
  EXPECT_GT(*std::min_element(ln1_w.begin(), ln1_w.end()), 0.9f);
  EXPECT_LT(*std::max_element(ln1_w.begin(), ln1_w.end()), 1.1f);
  EXPECT_NE(*std::min_element(ln1_w.begin(), ln1_w.end()),
            *std::max_element(ln1_w.begin(), ln1_w.end()));
  EXPECT_GT(std::abs(ln1_b[0]) + std::abs(ln1_b[1]) + std::abs(ln1_b[2]), 0.0f);
  for (float v : ln1_b) EXPECT_LT(std::abs(v), 0.2f);

  // Attention of layer 0, head 0 over the first tokens of a sentence: the scores
  // q.k / sqrt(d) must spread over more than a couple of units, so softmax is not uniform.
  const std::vector<uint32_t> ids = m->tokenizer().Encode("The quick brown fox jumps over");
  const int t = static_cast<int>(ids.size());
  const std::vector<float> wte = m->ToFloat(m->Get("wte.weight"));
  const std::vector<float> wpe = m->ToFloat(m->Get("wpe.weight"));
  std::vector<float> x(static_cast<size_t>(t) * e);
  for (int p = 0; p < t; ++p) {
    for (int i = 0; i < e; ++i) x[p * e + i] = wte[ids[p] * e + i] + wpe[p * e + i];
  }
  const std::vector<float> h = LayerNorm(x, e, ln1_w, ln1_b);
  const std::vector<float> w = m->ToFloat(m->Get("h.0.attn.c_attn.weight"));  // [e, 3e]
  const std::vector<float> bias = m->ToFloat(m->Get("h.0.attn.c_attn.bias"));
  auto project = [&](int p, int col) {
    double s = bias[col];
    for (int i = 0; i < e; ++i) s += h[p * e + i] * w[i * 3 * e + col];
    return s;
  };
  double spread = 0;
  for (int p = 1; p < t; ++p) {
    double lo = 1e30, hi = -1e30;
    for (int k = 0; k <= p; ++k) {
      double score = 0;
      for (int j = 0; j < d; ++j) score += project(p, j) * project(k, e + j);
      score /= std::sqrt(static_cast<double>(d));
      lo = std::min(lo, score);
      hi = std::max(hi, score);
    }
    spread = std::max(spread, hi - lo);
  }
  EXPECT_GT(spread, 2.0);

  // Logits of the tied head for a final hidden state (here the embedding after ln_f):
  // they differ by O(1) between tokens.
  const std::vector<float> hf =
      LayerNorm(std::vector<float>(x.begin(), x.begin() + e), e, m->ToFloat(m->Get("ln_f.weight")),
                m->ToFloat(m->Get("ln_f.bias")));
  double sum = 0, sum_sq = 0;
  const int vocab = 50257;
  for (int v = 0; v < vocab; ++v) {
    double logit = 0;
    for (int i = 0; i < e; ++i) logit += hf[i] * wte[static_cast<size_t>(v) * e + i];
    sum += logit;
    sum_sq += logit * logit;
  }
  const double std_dev = std::sqrt(sum_sq / vocab - (sum / vocab) * (sum / vocab));
  EXPECT_GT(std_dev, 0.5);
  EXPECT_LT(std_dev, 10.0);
}

}  // namespace
}  // namespace prefixd
