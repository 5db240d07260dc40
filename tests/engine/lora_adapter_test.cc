// The LoRA adapter loader (engine/lora_adapter.h): what it accepts, its identity, and one
// test per refusal, each checking that the message names the file and the tensor or field.
#include "engine/lora_adapter.h"

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "base/check.h"
#include "cache/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/random_adapter.h"
#include "tools/random_model.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

constexpr char kA0[] = "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight";
constexpr char kB0[] = "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight";

class LoraAdapterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "prefixd_lora_XXXXXX").string();
    PREFIXD_CHECK(::mkdtemp(tmpl.data()) != nullptr);
    root_ = tmpl;
    dir_ = (root_ / "adapter").string();
    options_.rank = 4;
    options_.lora_alpha = 8.0f;
    options_.seed = 7;
    config_ = AdapterConfigJson(options_);
    tensors_ = RandomAdapterTensors(base_, options_);
  }
  void TearDown() override { fs::remove_all(root_); }

  AdapterTensor& Find(const std::string& name) {
    for (AdapterTensor& t : tensors_) {
      if (t.name == name) return t;
    }
    PREFIXD_CHECK_MSG(false, name.c_str());
    return tensors_[0];
  }
  void Write(DType dtype = DType::kF32) {
    ASSERT_TRUE(WriteAdapterFiles(dir_, config_, tensors_, dtype).ok());
  }
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> Load() {
    return LoadLoraAdapter(dir_, base_);
  }
  // Loading fails with `code`, naming `file` and each of `parts`.
  void ExpectRefused(const std::string& file, const std::vector<std::string>& parts,
                     absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    Write();
    absl::StatusOr<std::shared_ptr<const LoraAdapter>> a = Load();
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), code) << a.status();
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(dir_ + "/" + file));
    for (const std::string& p : parts) {
      EXPECT_THAT(std::string(a.status().message()), HasSubstr(p));
    }
  }

  // The files as they are now (not rewritten) are refused, naming `file` and each of `parts`.
  void ExpectRefusedAsWritten(const std::string& file, const std::vector<std::string>& parts) {
    absl::StatusOr<std::shared_ptr<const LoraAdapter>> a = Load();
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(dir_ + "/" + file));
    for (const std::string& p : parts) {
      EXPECT_THAT(std::string(a.status().message()), HasSubstr(p));
    }
  }

  fs::path root_;
  std::string dir_;
  ModelConfig base_ = TinyModelConfig();  // 2 layers, n_embd 64
  RandomAdapterOptions options_;
  json config_;
  std::vector<AdapterTensor> tensors_;
};

TEST_F(LoraAdapterTest, LoadsWhatTheWriterWrites) {
  Write();
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> a = Load();
  ASSERT_TRUE(a.ok()) << a.status();
  const LoraAdapter& ad = **a;
  EXPECT_EQ(ad.rank, 4);
  EXPECT_EQ(ad.lora_alpha, 8.0f);
  EXPECT_EQ(ad.scaling, 2.0f);
  EXPECT_EQ(ad.layers.size(), 2u);
  EXPECT_EQ(ad.digest.size(), 64u);
  // c_attn, c_proj (attn and mlp) and c_fc of both layers: (64+192 + 64+64 + 64+256 +
  // 256+64) * 4 per layer.
  EXPECT_EQ(ad.num_parameters, 2 * 1024 * 4);
  const LoraModule* m = ad.module(1, LoraTarget::kMlpCFc);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->in, 64);
  EXPECT_EQ(m->out, 256);
  // Transposed layouts: a_t[k * r + j] = A[j][k], b_t[j * out + o] = B[o][j].
  const AdapterTensor& a_src = Find("base_model.model.transformer.h.1.mlp.c_fc.lora_A.weight");
  const AdapterTensor& b_src = Find("base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight");
  EXPECT_EQ(m->a_t[5 * 4 + 3], a_src.values[3 * 64 + 5]);
  EXPECT_EQ(m->b_t[2 * 256 + 200], b_src.values[200 * 4 + 2]);
  EXPECT_NE(ad.module(0, LoraTarget::kAttnCProj), nullptr);
  EXPECT_EQ(ad.module(2, LoraTarget::kAttnCAttn), nullptr);
}

TEST_F(LoraAdapterTest, RsloraScalesBySquareRootOfRank) {
  config_["use_rslora"] = true;
  Write();
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> a = Load();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->scaling, 8.0f / 2.0f);
}

TEST_F(LoraAdapterTest, UntargetedModulesAreLeftAlone) {
  options_.target_modules = {"c_attn"};
  config_ = AdapterConfigJson(options_);
  tensors_ = RandomAdapterTensors(base_, options_);
  Write();
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> a = Load();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_NE((*a)->module(0, LoraTarget::kAttnCAttn), nullptr);
  EXPECT_EQ((*a)->module(0, LoraTarget::kAttnCProj), nullptr);
  EXPECT_EQ((*a)->module(0, LoraTarget::kMlpCFc), nullptr);
  EXPECT_EQ((*a)->module(0, LoraTarget::kMlpCProj), nullptr);
}

// PEFT targets a module when its name ("transformer.h.1.mlp.c_fc") equals an entry of
// target_modules or ends with "." + the entry: "attn.c_proj" is the attention's c_proj alone,
// "h.1.mlp.c_fc" one layer's c_fc. Such adapters were refused as naming an unknown module.
TEST_F(LoraAdapterTest, TargetModulesMatchModulesAsPeftDoes) {
  options_.target_modules = {"c_attn", "c_proj", "c_fc"};
  tensors_ = RandomAdapterTensors(base_, options_);
  std::erase_if(tensors_, [](const AdapterTensor& t) {
    return t.name.find(".attn.c_proj.") == std::string::npos &&
           t.name.find(".h.1.mlp.c_fc.") == std::string::npos &&
           t.name.find(".h.0.attn.c_attn.") == std::string::npos;
  });
  config_["target_modules"] = {"attn.c_proj", "h.1.mlp.c_fc", "transformer.h.0.attn.c_attn"};
  Write();
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> a = Load();
  ASSERT_TRUE(a.ok()) << a.status();
  for (int32_t i : {0, 1}) {
    EXPECT_NE((*a)->module(i, LoraTarget::kAttnCProj), nullptr);
    EXPECT_EQ((*a)->module(i, LoraTarget::kMlpCProj), nullptr);
  }
  EXPECT_NE((*a)->module(0, LoraTarget::kAttnCAttn), nullptr);
  EXPECT_EQ((*a)->module(1, LoraTarget::kAttnCAttn), nullptr);
  EXPECT_EQ((*a)->module(0, LoraTarget::kMlpCFc), nullptr);
  EXPECT_NE((*a)->module(1, LoraTarget::kMlpCFc), nullptr);
  EXPECT_EQ((*a)->num_parameters, 2 * (64 + 64) * 4 + (64 + 192) * 4 + (64 + 256) * 4);

  // A module an entry names must have its tensors, and one no entry names must not.
  const std::vector<AdapterTensor> saved = tensors_;
  std::erase_if(tensors_, [](const AdapterTensor& t) {
    return t.name.find(".h.1.attn.c_proj.") != std::string::npos;
  });
  ExpectRefused("adapter_model.safetensors",
                {"missing tensor \"base_model.model.transformer.h.1.attn.c_proj.lora_A.weight\"",
                 "transformer.h.1.attn.c_proj"});
  tensors_ = saved;
  config_["target_modules"] = {"attn.c_proj", "h.1.mlp.c_fc"};
  ExpectRefused("adapter_model.safetensors", {kA0, "target_modules"});
  // An entry that names no module of GPT-2's blocks is refused by the config.
  config_["target_modules"] = {"attn.c_proj", "h.1.attn"};
  ExpectRefused("adapter_config.json", {"target_modules", "h.1.attn"});
  config_["target_modules"] = {"attn.c_proj", "h.01.mlp.c_fc"};
  ExpectRefused("adapter_config.json", {"target_modules", "h.01.mlp.c_fc"});
}

// exclude_modules (PEFT 0.14) takes modules out by the same rule; an adapter saved with it
// lacks those modules' tensors and was refused as incomplete.
TEST_F(LoraAdapterTest, ExcludeModulesLeaveModulesAlone) {
  options_.target_modules = {"c_attn"};
  config_ = AdapterConfigJson(options_);
  tensors_ = RandomAdapterTensors(base_, options_);
  std::erase_if(tensors_, [](const AdapterTensor& t) {
    return t.name.find(".h.0.attn.c_attn.") != std::string::npos;
  });
  config_["exclude_modules"] = {"h.0.attn.c_attn"};
  Write();
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> a = Load();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->module(0, LoraTarget::kAttnCAttn), nullptr);
  EXPECT_NE((*a)->module(1, LoraTarget::kAttnCAttn), nullptr);
  // A tensor of an excluded module is not one PEFT writes.
  tensors_ = RandomAdapterTensors(base_, options_);
  ExpectRefused("adapter_model.safetensors", {kA0, "exclude_modules"});
  // As a string it is a regular expression, which is not supported.
  config_["exclude_modules"] = ".*h\\.0\\..*";
  ExpectRefused("adapter_config.json", {"exclude_modules", "regular expression"});
}

TEST_F(LoraAdapterTest, HalfPrecisionTensorsAreWidened) {
  Write(DType::kBF16);
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> a = Load();
  ASSERT_TRUE(a.ok()) << a.status();
  const float v = Find(kA0).values[0];
  EXPECT_EQ((*a)->module(0, LoraTarget::kAttnCAttn)->a_t[0], BF16ToFloat(FloatToBF16(v)));
}

TEST_F(LoraAdapterTest, DigestIsOverBothFilesAndNotTheDirectoryName) {
  Write();
  const std::string d1 = (*Load())->digest;
  // The manifest's construction: LP(name) + SHA-256(content) for each file, in order.
  std::ifstream c(dir_ + "/adapter_config.json", std::ios::binary);
  std::ifstream w(dir_ + "/adapter_model.safetensors", std::ios::binary);
  const std::string ct((std::istreambuf_iterator<char>(c)), {});
  const std::string wt((std::istreambuf_iterator<char>(w)), {});
  EXPECT_EQ(d1, AdapterDigest(Sha256Of(ct), Sha256Of(wt)));
  fs::rename(dir_, root_ / "renamed");
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> moved =
      LoadLoraAdapter((root_ / "renamed").string(), base_);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ((*moved)->digest, d1);
  // One element of one B changed by 2%: another identity.
  Find(kB0).values[0] *= 1.02f;
  Write();
  EXPECT_NE((*Load())->digest, d1);
  // Only the config changed (alpha): another identity.
  Find(kB0).values[0] /= 1.02f;
  config_["lora_alpha"] = 9.0;
  Write();
  EXPECT_NE((*Load())->digest, d1);
}

TEST_F(LoraAdapterTest, RefusesMissingFiles) {
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> a = Load();
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("adapter_config.json"));
  Write();
  fs::remove(dir_ + "/adapter_model.safetensors");
  a = Load();
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("adapter_model.safetensors"));
}

TEST_F(LoraAdapterTest, RefusesMalformedConfig) {
  Write();
  std::ofstream(dir_ + "/adapter_config.json", std::ios::trunc) << "{not json";
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> a = Load();
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("adapter_config.json: not a JSON"));
}

TEST_F(LoraAdapterTest, RefusesOtherPeftTypes) {
  config_["peft_type"] = "IA3";
  ExpectRefused("adapter_config.json", {"peft_type", "IA3", "LORA"});
  config_.erase("peft_type");
  ExpectRefused("adapter_config.json", {"missing \"peft_type\""});
}

TEST_F(LoraAdapterTest, RefusesBadRankAndAlpha) {
  config_["r"] = 0;
  ExpectRefused("adapter_config.json", {"\"r\""});
  config_["r"] = 2.5;
  ExpectRefused("adapter_config.json", {"\"r\""});
  config_["r"] = 4;
  config_["lora_alpha"] = "big";
  ExpectRefused("adapter_config.json", {"lora_alpha"});
  config_["lora_alpha"] = 8;
  config_["use_rslora"] = "yes";
  ExpectRefused("adapter_config.json", {"use_rslora"});
}

TEST_F(LoraAdapterTest, RefusesUnknownOrRegexTargetModules) {
  config_["target_modules"] = {"c_attn", "q_proj"};
  ExpectRefused("adapter_config.json", {"target_modules", "q_proj"});
  config_["target_modules"] = ".*c_attn";
  ExpectRefused("adapter_config.json", {"target_modules", "regular expression"});
}

TEST_F(LoraAdapterTest, RefusesFanInFanOutFalseAndBiases) {
  config_["fan_in_fan_out"] = false;
  ExpectRefused("adapter_config.json", {"fan_in_fan_out", "Conv1D"});
  config_["fan_in_fan_out"] = true;
  config_["bias"] = "lora_only";
  ExpectRefused("adapter_config.json", {"\"bias\"", "lora_only"});
}

TEST_F(LoraAdapterTest, RefusesModulesToSaveAndOtherVariants) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"modules_to_save", json::array({"lm_head"})},
           {"use_dora", true},
           {"rank_pattern", {{"c_attn", 8}}},
           {"alpha_pattern", {{"c_fc", 2}}},
           {"layers_to_transform", json::array({0})},
           // Same tensors, other computations: aLoRA
           // acts only after its invocation tokens,
           // layer_replication reorders the layers.
           {"alora_invocation_tokens", json::array({198})},
           {"layer_replication", {{0, 2}}},
           {"use_qalora", true},
           {"use_bdlora", {{"target_modules_bd_a", {"c_fc"}}}},
           {"arrow_config", {{"top_k", 2}}}}) {
    SCOPED_TRACE(key);
    json saved = config_;
    config_[key] = value;
    ExpectRefused("adapter_config.json", {key});
    config_ = saved;
  }
}

// PiSSA, OLoRA and CorDA initialise by moving part of each targeted weight into A and B, and
// LoftQ by quantizing it: the adapter is trained against that changed base. PEFT writes such an
// adapter as a plain LoRA of the original base (init_lora_weights true) only when asked to
// convert it; saved unconverted, added to the original weights it serves another model.
TEST_F(LoraAdapterTest, RefusesAnAdapterTrainedAgainstABaseItsInitChanged) {
  for (const char* init : {"pissa", "pissa_niter_4", "olora", "corda", "loftq"}) {
    SCOPED_TRACE(init);
    config_["init_lora_weights"] = init;
    ExpectRefused("adapter_config.json",
                  {"init_lora_weights", init, "path_initial_model_for_weight_conversion"});
  }
  // Initialisations that leave the base alone load.
  for (const json& init : {json(true), json(false), json("gaussian"), json("eva"),
                           json("orthogonal"), json(nullptr)}) {
    SCOPED_TRACE(init.dump());
    config_["init_lora_weights"] = init;
    Write();
    EXPECT_TRUE(Load().ok()) << Load().status();
  }
}

TEST_F(LoraAdapterTest, RefusesTensorsNotOfAnAdapter) {
  tensors_.push_back({"base_model.model.lm_head.weight", {50257, 64}, {}});
  tensors_.back().values.assign(50257 * 64, 0.0f);
  ExpectRefused("adapter_model.safetensors", {"base_model.model.lm_head.weight", "modules_to_save"});
}

TEST_F(LoraAdapterTest, RefusesTensorOfAnUntargetedModule) {
  options_.target_modules = {"c_attn"};
  config_ = AdapterConfigJson(options_);  // tensors_ still hold c_proj and c_fc
  ExpectRefused("adapter_model.safetensors",
                {"base_model.model.transformer.h.0.attn.c_proj.lora_A.weight", "target_modules"});
}

TEST_F(LoraAdapterTest, RefusesShapesThatDoNotFitTheRank) {
  Find(kA0).shape = {8, 32};  // 256 elements, as before: only the shape is wrong
  ExpectRefused("adapter_model.safetensors", {kA0, "[8, 32]", "r = 4"});
}

TEST_F(LoraAdapterTest, RefusesShapesThatDoNotFitTheBase) {
  base_.n_embd = 128;  // the adapter was made for n_embd 64
  base_.n_head = 2;
  ExpectRefused("adapter_model.safetensors", {kA0, "n_embd 128", "another model"});
}

TEST_F(LoraAdapterTest, RefusesMoreLayersThanTheBase) {
  base_.n_layer = 1;
  ExpectRefused("adapter_model.safetensors", {"layer 1", "1 layers", "another model"});
}

TEST_F(LoraAdapterTest, RefusesMissingTensors) {
  // A without its B.
  tensors_.erase(tensors_.begin() + 1);
  ExpectRefused("adapter_model.safetensors", {std::string("missing tensor \"") + kB0});
  // A whole layer's module missing.
  tensors_ = RandomAdapterTensors(base_, options_);
  std::erase_if(tensors_, [](const AdapterTensor& t) {
    return t.name.find("h.1.mlp.c_fc.") != std::string::npos;
  });
  ExpectRefused("adapter_model.safetensors",
                {"missing tensor \"base_model.model.transformer.h.1.mlp.c_fc.lora_A.weight\""});
  tensors_.clear();
  ExpectRefused("adapter_model.safetensors", {"no lora_A/lora_B tensor"});
}

TEST_F(LoraAdapterTest, RefusesNonFiniteValues) {
  Find(kB0).values[17] = std::numeric_limits<float>::quiet_NaN();
  ExpectRefused("adapter_model.safetensors", {kB0, "NaN", "element 17"});
  Find(kB0).values[17] = 0.0f;
  Find(kA0).values[3] = -std::numeric_limits<float>::infinity();
  ExpectRefused("adapter_model.safetensors", {kA0, "-Inf", "element 3"});
}

// Finite weights of 3e38 passed the NaN/Inf check and made the logits NaN: each element, and
// the largest change the update can make to a weight, are bounded by 1e4.
TEST_F(LoraAdapterTest, RefusesWeightsWhoseProductCanOverflow) {
  Find(kB0).values[17] = 3e38f;
  ExpectRefused("adapter_model.safetensors", {kB0, "element 17", "[-10000, 10000]", "overflow"});
  Find(kB0).values[17] = -2e4f;
  ExpectRefused("adapter_model.safetensors", {kB0, "element 17", "[-10000, 10000]"});
  // Each element in range, the product not: scaling 2 x r 4 x 100 x 100 = 80000.
  for (float& v : Find(kA0).values) v = 100.0f;
  for (float& v : Find(kB0).values) v = -100.0f;
  ExpectRefused("adapter_model.safetensors",
                {kA0, "up to 80000", "|scaling| 2 x r 4 x max|A| 100 x max|B| 100", "overflow"});
  // Just inside the bound loads.
  for (float& v : Find(kB0).values) v = -12.5f;  // 2 x 4 x 100 x 12.5 = 10000
  Write();
  EXPECT_TRUE(Load().ok()) << Load().status();
}

// An adapter's files are judged before they are read: the config by its size, the weights
// file by its header's length, names, shapes and fit to the base. (A 3 GB file once took
// 3.3 GB of memory to refuse; a tensor of layer 999999 allocated 256 MB first.)
TEST_F(LoraAdapterTest, RefusesAnOversizedConfigByItsSize) {
  Write();
  std::ofstream(dir_ + "/adapter_config.json", std::ios::app) << std::string(2 << 20, ' ');
  ExpectRefusedAsWritten("adapter_config.json", {"is 2097", "more than 1048576"});
}

TEST_F(LoraAdapterTest, RefusesAHugeHeaderLengthWithoutReadingIt) {
  Write();
  const std::string path = dir_ + "/adapter_model.safetensors";
  std::string length(8, '\0');
  const uint64_t n = uint64_t{200} << 20;
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << length;
  fs::resize_file(path, 8 + n);  // sparse: no disk, and nothing to read but zeros
  ExpectRefusedAsWritten("adapter_model.safetensors",
                         {"header length 209715200", "more than", "1048576"});
}

TEST_F(LoraAdapterTest, ChecksTheHeaderAgainstTheBaseBeforeTheData) {
  // Data that would be refused (NaN), in an adapter for a deeper model: the header's layers
  // are what is reported, so no tensor data was judged first.
  Find(kB0).values[0] = std::numeric_limits<float>::quiet_NaN();
  base_.n_layer = 1;
  ExpectRefused("adapter_model.safetensors", {"layer 1", "1 layers", "another model"});
  // A tensor of layer 999999 (with its pair) is refused by its name's layer.
  base_.n_layer = 2;
  AdapterTensor a = Find(kA0), b = Find(kB0);
  a.name = "base_model.model.transformer.h.999999.attn.c_attn.lora_A.weight";
  b.name = "base_model.model.transformer.h.999999.attn.c_attn.lora_B.weight";
  tensors_.push_back(a);
  tensors_.push_back(b);
  ExpectRefused("adapter_model.safetensors", {"layer 999999", "2 layers"});
  Write();
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> loaded = Load();
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.status().message()), Not(HasSubstr("NaN")));
}

TEST_F(LoraAdapterTest, RefusesACorruptSafetensorsFile) {
  Write();
  std::ofstream(dir_ + "/adapter_model.safetensors", std::ios::binary | std::ios::trunc) << "xx";
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> a = Load();
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("adapter_model.safetensors"));
}

}  // namespace
}  // namespace prefixd
