// Model::Load on a tiny random model (tools/random_model.h) and on every malformed variant
// the loader must refuse, each crafted from the valid one in a fresh temporary directory.
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "base/check.h"
#include "engine/manifest.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "engine/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/files.h"
#include "tools/random_model.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using json = nlohmann::json;

using ::prefixd::testing::ReadFile;

void WriteFile(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

fs::path MakeTempDir() {
  std::string tmpl = (fs::temp_directory_path() / "prefixd_model_test_XXXXXX").string();
  PREFIXD_CHECK(::mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

// One tensor of a safetensors file, bytes included.
struct RawTensor {
  std::string name;
  std::string dtype;  // as in the file: "F16", "F32", ...
  std::vector<int64_t> shape;
  std::string bytes;
};

std::vector<RawTensor> ReadTensors(const fs::path& p) {
  const std::string f = ReadFile(p);
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  json h = json::parse(f.substr(8, n));
  std::vector<std::pair<uint64_t, RawTensor>> by_offset;
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") continue;
    const uint64_t b = v["data_offsets"][0], e = v["data_offsets"][1];
    by_offset.push_back(
        {b, RawTensor{name, v["dtype"].get<std::string>(), v["shape"].get<std::vector<int64_t>>(),
                      f.substr(8 + n + b, e - b)}});
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<RawTensor> out;
  for (auto& [offset, t] : by_offset) out.push_back(std::move(t));
  return out;
}

// Writes `tensors` contiguously in order; `edit` may then change the header JSON.
void WriteTensors(const fs::path& p, const std::vector<RawTensor>& tensors,
                  const std::function<void(json&)>& edit = nullptr) {
  json h = {{"__metadata__", {{"format", "pt"}}}};
  std::string data;
  for (const RawTensor& t : tensors) {
    h[t.name] = {{"dtype", t.dtype},
                 {"shape", t.shape},
                 {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  if (edit) edit(h);
  const std::string text = h.dump();
  std::string out(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  WriteFile(p, out + text + data);
}

ModelConfig SmallConfig() {
  ModelConfig c = TinyModelConfig();
  c.n_positions = 64;  // keeps the files small; the vocabulary stays GPT-2's
  return c;
}

int64_t ExpectedParameters(const ModelConfig& c) {
  const int64_t e = c.n_embd;
  return int64_t{c.vocab_size} * e + int64_t{c.n_positions} * e +
         c.n_layer * (12 * e * e + 13 * e) + 2 * e;
}

class ModelLoaderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    base_ = new fs::path(MakeTempDir());
    RandomModelOptions o;
    o.out_dir = (*base_ / "f16").string();
    o.tokenizer_dir = PREFIXD_TOKENIZER_DIR;
    o.config = SmallConfig();
    o.seed = 7;
    o.dtype = DType::kF16;
    ASSERT_TRUE(WriteRandomModel(o).ok());
  }
  static void TearDownTestSuite() {
    fs::remove_all(*base_);
    delete base_;
  }

  // A fresh copy of the valid f16 model, to break.
  void SetUp() override {
    dir_ = MakeTempDir() / "model";
    fs::copy(*base_ / "f16", dir_, fs::copy_options::recursive);
  }
  void TearDown() override { fs::remove_all(dir_.parent_path()); }

  fs::path Weights() const { return dir_ / "model.safetensors"; }

  void EditConfig(const std::function<void(json&)>& edit) {
    json j = json::parse(ReadFile(dir_ / "config.json"));
    edit(j);
    WriteFile(dir_ / "config.json", j.dump());
  }

  // Loads dir_ expecting a refusal that names `file` and contains `problem`.
  void ExpectRefused(const std::string& file, const std::string& problem) {
    absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir_.string());
    ASSERT_FALSE(m.ok()) << "loaded, expected: " << problem;
    EXPECT_THAT(m.status().message(), HasSubstr((dir_ / file).string()));
    EXPECT_THAT(m.status().message(), HasSubstr(problem)) << std::string(m.status().message());
  }

  static fs::path* base_;
  fs::path dir_;
};

fs::path* ModelLoaderTest::base_ = nullptr;

TEST_F(ModelLoaderTest, LoadsValidModel) {
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir_.string());
  ASSERT_TRUE(m.ok()) << m.status();
  const Model& model = **m;
  EXPECT_EQ(model.config().n_layer, 2);
  EXPECT_EQ(model.config().n_positions, 64);
  EXPECT_EQ(model.dtype(), DType::kF16);
  EXPECT_EQ(model.num_parameters(), ExpectedParameters(SmallConfig()));
  EXPECT_EQ(model.name(), "model");
  EXPECT_EQ(model.tokenizer().vocab_size(), 50257u);
  EXPECT_EQ(model.tokenizer().Encode("Hello world"), (std::vector<uint32_t>{15496, 995}));

  const Tensor& attn = model.Get("h.1.attn.c_attn.weight");
  EXPECT_EQ(attn.shape, (std::vector<int64_t>{64, 192}));
  EXPECT_EQ(attn.dtype, DType::kF16);
  EXPECT_EQ(attn.size_bytes, 64u * 192 * 2);
  EXPECT_EQ(model.Find("lm_head.weight"), nullptr);  // tied to wte
  EXPECT_EQ(model.Find("h.2.ln_1.weight"), nullptr);
  EXPECT_NE(model.Find("ln_f.bias"), nullptr);

  absl::StatusOr<std::string> manifest = ComputeManifestSha256(dir_.string());
  ASSERT_TRUE(manifest.ok());
  EXPECT_EQ(model.manifest_sha256(), *manifest);
}

TEST_F(ModelLoaderTest, ToFloatAgreesAcrossDtypes) {
  // The same seed in f32, f16 and bf16: equal up to each dtype's rounding (half an ulp:
  // 2^-11 relative for f16, 2^-8 for bf16; plus f16's subnormal spacing).
  std::map<DType, std::unique_ptr<Model>> models;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    RandomModelOptions o;
    o.out_dir = (dir_.parent_path() / std::string(DTypeName(dtype))).string();
    o.tokenizer_dir = PREFIXD_TOKENIZER_DIR;
    o.config = SmallConfig();
    o.seed = 7;
    o.dtype = dtype;
    ASSERT_TRUE(WriteRandomModel(o).ok());
    absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(o.out_dir);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->dtype(), dtype);
    models[dtype] = *std::move(m);
  }
  for (const char* name : {"wte.weight", "h.0.ln_1.weight", "h.1.mlp.c_proj.bias"}) {
    const std::vector<float> f32 = models[DType::kF32]->ToFloat(models[DType::kF32]->Get(name));
    const std::vector<float> f16 = models[DType::kF16]->ToFloat(models[DType::kF16]->Get(name));
    const std::vector<float> bf16 = models[DType::kBF16]->ToFloat(models[DType::kBF16]->Get(name));
    ASSERT_EQ(f32.size(), f16.size());
    ASSERT_EQ(f32.size(), bf16.size());
    for (size_t i = 0; i < f32.size(); ++i) {
      ASSERT_LE(std::fabs(f16[i] - f32[i]), std::fabs(f32[i]) * 0x1p-11f + 0x1p-25f) << name;
      ASSERT_LE(std::fabs(bf16[i] - f32[i]), std::fabs(f32[i]) * 0x1p-8f) << name;
    }
  }
  // Identity is per byte: three dtypes, three manifests.
  EXPECT_NE(models[DType::kF32]->manifest_sha256(), models[DType::kF16]->manifest_sha256());
  EXPECT_NE(models[DType::kF16]->manifest_sha256(), models[DType::kBF16]->manifest_sha256());
}

TEST_F(ModelLoaderTest, AcceptsTransformerPrefixBuffersAndLmHead) {
  std::vector<RawTensor> t = ReadTensors(Weights());
  std::string wte_bytes;
  for (RawTensor& x : t) {
    if (x.name == "wte.weight") wte_bytes = x.bytes;
    x.name = "transformer." + x.name;
  }
  // Causal-mask buffers as older exports carry them, and an untied lm_head.
  t.push_back({"transformer.h.0.attn.bias", "F32", {1, 1, 4, 4}, std::string(64, '\0')});
  t.push_back({"h.1.attn.masked_bias", "F32", {}, std::string(4, '\0')});
  // Some versions saved the mask as uint8 or bool: skipped whatever its dtype.
  t.push_back({"h.1.attn.bias", "U8", {1, 1, 4, 4}, std::string(16, '\1')});
  t.push_back({"h.0.attn.masked_bias", "BOOL", {}, std::string(1, '\0')});
  t.push_back({"lm_head.weight", "F16", {50257, 64}, wte_bytes});
  WriteTensors(Weights(), t);

  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir_.string());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->num_parameters(), ExpectedParameters(SmallConfig()) + 50257 * 64);
  EXPECT_EQ((*m)->Find("h.0.attn.bias"), nullptr);
  EXPECT_EQ((*m)->Find("transformer.wte.weight"), nullptr);
  const Tensor* lm_head = (*m)->Find("lm_head.weight");
  ASSERT_NE(lm_head, nullptr);
  EXPECT_EQ((*m)->ToFloat(*lm_head), (*m)->ToFloat((*m)->Get("wte.weight")));
}

TEST_F(ModelLoaderTest, MixedDtypesReportTheMostCommon) {
  std::vector<RawTensor> t = ReadTensors(Weights());
  for (RawTensor& x : t) {
    if (x.name != "ln_f.weight") continue;
    std::string f32;
    for (size_t i = 0; i < x.bytes.size(); i += 2) {
      uint16_t h;
      std::memcpy(&h, x.bytes.data() + i, 2);
      const float v = HalfToFloat(h);
      f32.append(reinterpret_cast<const char*>(&v), 4);
    }
    x.dtype = "F32";
    x.bytes = f32;
  }
  WriteTensors(Weights(), t);
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir_.string());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->dtype(), DType::kF16);
  EXPECT_EQ((*m)->Get("ln_f.weight").dtype, DType::kF32);
  for (float v : (*m)->ToFloat((*m)->Get("ln_f.weight"))) {
    EXPECT_GT(v, 0.89f);
    EXPECT_LT(v, 1.11f);
  }
}

TEST_F(ModelLoaderTest, RenamedDirectoryKeepsManifest) {
  absl::StatusOr<std::unique_ptr<Model>> a = Model::Load(dir_.string());
  ASSERT_TRUE(a.ok());
  const fs::path renamed = dir_.parent_path() / "renamed";
  fs::rename(dir_, renamed);
  absl::StatusOr<std::unique_ptr<Model>> b = Model::Load(renamed.string() + "/");
  fs::rename(renamed, dir_);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->manifest_sha256(), (*a)->manifest_sha256());
  EXPECT_EQ((*b)->name(), "renamed");
}

TEST_F(ModelLoaderTest, RefusesMissingFiles) {
  for (const char* file : {"config.json", "model.safetensors", "vocab.json", "merges.txt"}) {
    const fs::path p = dir_ / file;
    const std::string saved = ReadFile(p);
    fs::remove(p);
    absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir_.string());
    EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound) << file;
    EXPECT_THAT(m.status().message(), HasSubstr(p.string() + ": missing"));
    WriteFile(p, saved);
  }
  EXPECT_FALSE(Model::Load((dir_ / "nonexistent").string()).ok());
}

// A sharded checkpoint (transformers' save_pretrained splits one above max_shard_size, 5 GB by
// default, e.g. a gpt2-xl in fp32) or a PyTorch-only one has no model.safetensors: the refusal
// says which it is and how to make the one file prefixd loads.
TEST_F(ModelLoaderTest, RefusesShardedOrPickleCheckpointsSayingHowToConvert) {
  fs::remove(Weights());
  WriteFile(dir_ / "model.safetensors.index.json",
            R"({"metadata": {"total_size": 1}, "weight_map": {"wte.weight": )"
            R"("model-00001-of-00002.safetensors"}})");
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir_.string());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr(Weights().string() + ": missing"));
  EXPECT_THAT(m.status().message(), HasSubstr("sharded"));
  EXPECT_THAT(m.status().message(), HasSubstr("max_shard_size"));
  fs::remove(dir_ / "model.safetensors.index.json");
  WriteFile(dir_ / "pytorch_model.bin", "PK");
  m = Model::Load(dir_.string());
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("pytorch_model.bin"));
  EXPECT_THAT(m.status().message(), HasSubstr("safe_serialization"));
}

TEST_F(ModelLoaderTest, RefusesConfigThatIsNotJson) {
  WriteFile(dir_ / "config.json", "{\"n_layer\": 2,");
  ExpectRefused("config.json", "not valid JSON");
}

TEST_F(ModelLoaderTest, RefusesAbsentZeroOrInconsistentConfigValues) {
  EditConfig([](json& j) { j.erase("n_embd"); });
  ExpectRefused("config.json", "\"n_embd\" is missing");
  EditConfig([](json& j) {
    j["n_embd"] = 64;
    j["n_layer"] = 0;
  });
  ExpectRefused("config.json", "n_layer is 0");
  EditConfig([](json& j) {
    j["n_layer"] = 2;
    j["n_head"] = 3;
  });
  ExpectRefused("config.json", "not divisible by n_head");
}

TEST_F(ModelLoaderTest, RefusesShapeThatDisagreesWithConfig) {
  EditConfig([](json& j) { j["n_positions"] = 32; });
  ExpectRefused("model.safetensors",
                "\"wpe.weight\" has shape [64, 64] but config.json "
                "implies [32, 64]");
}

TEST_F(ModelLoaderTest, RefusesTransposedWeight) {
  // Same bytes, [out, in] instead of Conv1D's [in, out].
  std::vector<RawTensor> t = ReadTensors(Weights());
  for (RawTensor& x : t) {
    if (x.name == "h.0.attn.c_attn.weight") x.shape = {192, 64};
  }
  WriteTensors(Weights(), t);
  ExpectRefused("model.safetensors", "\"h.0.attn.c_attn.weight\" has shape [192, 64]");
}

TEST_F(ModelLoaderTest, RefusesMissingTensor) {
  std::vector<RawTensor> t = ReadTensors(Weights());
  std::erase_if(t, [](const RawTensor& x) { return x.name == "h.1.mlp.c_fc.bias"; });
  WriteTensors(Weights(), t);
  ExpectRefused("model.safetensors", "missing tensor \"h.1.mlp.c_fc.bias\"");
}

TEST_F(ModelLoaderTest, RefusesUnexpectedAndDuplicateTensors) {
  std::vector<RawTensor> t = ReadTensors(Weights());
  t.push_back({"h.2.ln_1.weight", "F16", {64}, std::string(128, '\0')});
  WriteTensors(Weights(), t);
  ExpectRefused("model.safetensors", "unexpected tensor \"h.2.ln_1.weight\"");
  t.back() = {"transformer.ln_f.bias", "F16", {64}, std::string(128, '\0')};
  WriteTensors(Weights(), t);
  ExpectRefused("model.safetensors", "\"ln_f.bias\" appears twice");
}

TEST_F(ModelLoaderTest, RefusesHeaderLengthBeyondFile) {
  std::string f = ReadFile(Weights());
  const uint64_t too_long = f.size();
  std::memcpy(f.data(), &too_long, 8);
  WriteFile(Weights(), f);
  ExpectRefused("model.safetensors", "beyond the end of the file");
  WriteFile(Weights(), "");
  ExpectRefused("model.safetensors", "too short");
}

TEST_F(ModelLoaderTest, RefusesHeaderThatIsNotJson) {
  std::string f = ReadFile(Weights());
  f[8] = '[';  // the header's opening brace
  f[9] = '}';
  WriteFile(Weights(), f);
  ExpectRefused("model.safetensors", "header is not valid JSON");
}

TEST_F(ModelLoaderTest, UntiedConfigNeedsItsOwnLmHead) {
  std::string config = ReadFile(dir_ / "config.json");
  const size_t brace = config.rfind('}');
  ASSERT_NE(brace, std::string::npos);
  config.insert(brace, ", \"tie_word_embeddings\": false");
  WriteFile(dir_ / "config.json", config);
  ExpectRefused("model.safetensors", "missing tensor \"lm_head.weight\" (config.json sets "
                                     "tie_word_embeddings to false");
  // With its own lm_head it loads.
  std::vector<RawTensor> t = ReadTensors(Weights());
  std::string wte;
  for (const RawTensor& x : t) {
    if (x.name == "wte.weight") wte = x.bytes;
  }
  t.push_back({"lm_head.weight", "F16", {50257, 64}, wte});
  WriteTensors(Weights(), t);
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir_.string());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_NE((*m)->Find("lm_head.weight"), nullptr);
}

TEST_F(ModelLoaderTest, RefusesUnknownDtype) {
  WriteTensors(Weights(), ReadTensors(Weights()),
               [](json& h) { h["wpe.weight"]["dtype"] = "Q4_0"; });
  ExpectRefused("model.safetensors", "unknown dtype \"Q4_0\"");
}

TEST_F(ModelLoaderTest, RefusesWeightsInADtypeItDoesNotComputeWith) {
  // I16 has the test model's F16 element size, so the file itself is well formed.
  WriteTensors(Weights(), ReadTensors(Weights()),
               [](json& h) { h["h.0.ln_1.weight"]["dtype"] = "I16"; });
  ExpectRefused("model.safetensors",
                "tensor \"h.0.ln_1.weight\" has dtype I16; weights must be F32, F16 or BF16");
}

TEST_F(ModelLoaderTest, RefusesOffsetsOutOfRange) {
  WriteTensors(Weights(), ReadTensors(Weights()), [](json& h) {
    h["ln_f.bias"]["data_offsets"][1] = h["ln_f.bias"]["data_offsets"][1].get<uint64_t>() + 2;
  });
  ExpectRefused("model.safetensors", "out of range");
  WriteTensors(Weights(), ReadTensors(Weights()), [](json& h) {
    h["wpe.weight"]["data_offsets"] = {uint64_t{1} << 62, (uint64_t{1} << 62) + 8192};
  });
  ExpectRefused("model.safetensors", "out of range");
}

TEST_F(ModelLoaderTest, RefusesOverlappingTensors) {
  WriteTensors(Weights(), ReadTensors(Weights()), [](json& h) {
    for (const char* k : {"ln_f.weight", "ln_f.bias"}) {  // both shift 2 bytes down
      h[k]["data_offsets"][0] = h[k]["data_offsets"][0].get<uint64_t>() - 2;
      h[k]["data_offsets"][1] = h[k]["data_offsets"][1].get<uint64_t>() - 2;
    }
  });
  ExpectRefused("model.safetensors", "overlaps");
}

TEST_F(ModelLoaderTest, RefusesGappedTensors) {
  std::vector<RawTensor> t = ReadTensors(Weights());
  ASSERT_EQ(t.back().name, "ln_f.bias");
  std::string last = t.back().bytes;
  t.back().bytes = std::string(2, '\0') + last;  // 2 pad bytes before ln_f.bias
  WriteTensors(Weights(), t, [&](json& h) {
    h["ln_f.bias"]["data_offsets"][0] = h["ln_f.bias"]["data_offsets"][0].get<uint64_t>() + 2;
  });
  ExpectRefused("model.safetensors",
                "gap of 2 bytes in the data region before tensor "
                "\"ln_f.bias\"");
}

TEST_F(ModelLoaderTest, RefusesTrailingGarbage) {
  std::ofstream(Weights(), std::ios::binary | std::ios::app) << "garbage";
  ExpectRefused("model.safetensors", "trailing garbage: 7 bytes");
}

TEST_F(ModelLoaderTest, RefusesTokenizerLargerThanVocabulary) {
  // Embeddings for 50,000 ids, but the tokenizer can produce 50,257.
  std::vector<RawTensor> t = ReadTensors(Weights());
  t[0].shape = {50000, 64};
  ASSERT_EQ(t[0].name, "wte.weight");
  t[0].bytes.resize(50000 * 64 * 2);
  WriteTensors(Weights(), t);
  EditConfig([](json& j) {
    j["vocab_size"] = 50000;
    j["bos_token_id"] = 0;
    j["eos_token_id"] = 0;
  });
  ExpectRefused("vocab.json", "holds 50257 tokens but config.json's vocab_size is 50000");
}

// What sits where a file should is named: a directory, a FIFO (without blocking on it), a
// symbolic link loop, a dangling link.
TEST_F(ModelLoaderTest, RefusesWhatIsNotARegularFileAsWhatItIs) {
  for (const char* file : {"config.json", "model.safetensors", "vocab.json", "merges.txt"}) {
    const fs::path p = dir_ / file;
    const std::string saved = ReadFile(p);
    fs::remove(p);
    fs::create_directory(p);
    ExpectRefused(file, "is a directory, not a regular file");
    fs::remove(p);
    ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
    ExpectRefused(file, "is a FIFO (named pipe), not a regular file");
    fs::remove(p);
    fs::create_symlink(dir_ / "loop", p);
    fs::create_symlink(p, dir_ / "loop");
    ExpectRefused(file, "a symbolic link loop");
    fs::remove(dir_ / "loop");
    ExpectRefused(file, "missing (a symbolic link whose target does not exist)");
    fs::remove(p);
    WriteFile(p, saved);
  }
  ASSERT_TRUE(Model::Load(dir_.string()).ok());
}

TEST_F(ModelLoaderTest, RefusesEmptyOrHeaderOnlyMerges) {
  // GPT-2's vocabulary without merges would encode "Hello world" as 11 byte tokens.
  for (const char* merges : {"", "#version: 0.2\n", "\n\n"}) {
    WriteFile(dir_ / "merges.txt", merges);
    ExpectRefused("merges.txt", "holds no merges, but " + (dir_ / "vocab.json").string() +
                                    " has 50001 tokens longer than one byte");
  }
}

// Each float dtype, NaN and both infinities, at the first element and deep inside a tensor.
TEST_F(ModelLoaderTest, RefusesNonFiniteWeightsNamingTheTensor) {
  struct Case {
    const char* tensor;
    size_t element;
    uint16_t f16_bits;
    const char* shown;
  };
  for (const Case& c :
       {Case{"h.1.mlp.c_fc.weight", 12345, 0x7e00, "NaN"}, Case{"wte.weight", 0, 0x7c00, "+Inf"},
        Case{"ln_f.bias", 63, 0xfc00, "-Inf"}}) {
    std::vector<RawTensor> t = ReadTensors(Weights());
    for (RawTensor& x : t) {
      if (x.name == c.tensor) std::memcpy(x.bytes.data() + 2 * c.element, &c.f16_bits, 2);
    }
    WriteTensors(Weights(), t);
    ExpectRefused("model.safetensors", std::string("tensor \"") + c.tensor + "\" holds " + c.shown +
                                           " at element " + std::to_string(c.element));
    fs::copy_file(*base_ / "f16" / "model.safetensors", Weights(),
                  fs::copy_options::overwrite_existing);
  }
  ASSERT_TRUE(Model::Load(dir_.string()).ok());

  for (DType dtype : {DType::kF32, DType::kBF16}) {
    RandomModelOptions o;
    o.out_dir = (dir_.parent_path() / std::string(DTypeName(dtype))).string();
    o.tokenizer_dir = PREFIXD_TOKENIZER_DIR;
    o.config = SmallConfig();
    o.seed = 7;
    o.dtype = dtype;
    ASSERT_TRUE(WriteRandomModel(o).ok());
    const fs::path weights = fs::path(o.out_dir) / "model.safetensors";
    std::vector<RawTensor> t = ReadTensors(weights);
    for (RawTensor& x : t) {
      if (x.name != "h.0.attn.c_proj.bias") continue;
      if (dtype == DType::kF32) {
        const float nan = std::nanf("");
        std::memcpy(x.bytes.data() + 4 * 5, &nan, 4);
      } else {
        const uint16_t inf = 0x7f80;
        std::memcpy(x.bytes.data() + 2 * 5, &inf, 2);
      }
    }
    WriteTensors(weights, t);
    absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(o.out_dir);
    ASSERT_FALSE(m.ok()) << DTypeName(dtype);
    EXPECT_THAT(m.status().message(),
                HasSubstr(weights.string() + ": tensor \"h.0.attn.c_proj.bias\" holds " +
                          (dtype == DType::kF32 ? "NaN" : "+Inf") + " at element 5 of 64"));
  }
}

TEST_F(ModelLoaderTest, BytesFromFilesAreEscapedInMessages) {
  WriteTensors(Weights(), ReadTensors(Weights()), [](json& h) {
    json v = h["ln_f.bias"];
    h.erase("ln_f.bias");
    h["ln_f.bias\x1b[2J\u00ff"] = v;  // ESC and U+00FF; json.dump writes the ESC as \u001b
  });
  ExpectRefused("model.safetensors", "unexpected tensor \"ln_f.bias\\x1b[2J\xc3\xbf\"");
  fs::copy_file(*base_ / "f16" / "model.safetensors", Weights(),
                fs::copy_options::overwrite_existing);
  WriteFile(dir_ / "merges.txt", "#version: 0.2\n\xff\xfe\x07\n");
  ExpectRefused("merges.txt", "got \"\\xff\\xfe\\x07\"");
}

TEST_F(ModelLoaderTest, RefusesBrokenTokenizerFiles) {
  WriteFile(dir_ / "vocab.json", "not json");
  EXPECT_FALSE(Model::Load(dir_.string()).ok());
}

}  // namespace
}  // namespace prefixd
