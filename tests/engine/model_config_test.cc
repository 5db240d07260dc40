#include "engine/model_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace prefixd {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// GPT-2 small's config.json as published on the Hugging Face hub.
json Gpt2Config() {
  return json::parse(R"({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
    "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
    "resid_pdrop": 0.1, "summary_activation": null, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": true, "summary_type": "cls_index", "summary_use_proj": true,
    "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
    "vocab_size": 50257})");
}

absl::StatusOr<ModelConfig> Parse(const json& j) {
  return ParseModelConfigJson(j.dump(), "dir/config.json");
}

std::string Error(const json& j) {
  absl::StatusOr<ModelConfig> c = Parse(j);
  EXPECT_FALSE(c.ok()) << j.dump();
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("dir/config.json: "));
  return std::string(c.status().message());
}

TEST(ModelConfigTest, ParsesGpt2) {
  absl::StatusOr<ModelConfig> c = Parse(Gpt2Config());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_layer, 12);
  EXPECT_EQ(c->n_head, 12);
  EXPECT_EQ(c->n_embd, 768);
  EXPECT_EQ(c->n_positions, 1024);
  EXPECT_EQ(c->vocab_size, 50257);
  EXPECT_EQ(c->head_dim(), 64);
  EXPECT_FLOAT_EQ(c->layer_norm_epsilon, 1e-5f);
  EXPECT_EQ(c->bos_token_id, 50256u);
  EXPECT_EQ(c->eos_token_id, 50256u);
  EXPECT_EQ(c->activation_function, "gelu_new");
}

TEST(ModelConfigTest, ParsesTheWholeGpt2Family) {
  struct Size {
    int layers, heads, embd;
  };
  for (Size s : {Size{24, 16, 1024}, Size{36, 20, 1280}, Size{48, 25, 1600}}) {
    json j = Gpt2Config();
    j["n_layer"] = s.layers;
    j["n_head"] = s.heads;
    j["n_embd"] = s.embd;
    absl::StatusOr<ModelConfig> c = Parse(j);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->n_layer, s.layers);
    EXPECT_EQ(c->head_dim(), 64);
  }
}

TEST(ModelConfigTest, OptionalFieldsDefault) {
  json j = Gpt2Config();
  for (const char* k : {"layer_norm_epsilon", "bos_token_id", "eos_token_id", "activation_function",
                        "model_type"}) {
    j.erase(k);
  }
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->layer_norm_epsilon, 1e-5f);
  EXPECT_EQ(c->eos_token_id, 50256u);
}

TEST(ModelConfigTest, RefusesNonJson) {
  for (const char* text : {"", "{", "not json", "{\"n_layer\": 12,}"}) {
    absl::StatusOr<ModelConfig> c = ParseModelConfigJson(text, "dir/config.json");
    EXPECT_THAT(c.status().message(), HasSubstr("dir/config.json: not valid JSON")) << text;
  }
  EXPECT_THAT(Error(json::array({1, 2})), HasSubstr("not a JSON object"));
}

TEST(ModelConfigTest, RefusesAbsentSizes) {
  for (const char* k : {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"}) {
    json j = Gpt2Config();
    j.erase(k);
    EXPECT_THAT(Error(j), HasSubstr(std::string("\"") + k + "\" is missing"));
    j[k] = nullptr;
    EXPECT_THAT(Error(j), HasSubstr(std::string("\"") + k + "\" is missing"));
  }
}

TEST(ModelConfigTest, RefusesZeroNegativeAndNonIntegerSizes) {
  for (const char* k : {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"}) {
    json j = Gpt2Config();
    j[k] = 0;
    EXPECT_THAT(Error(j), HasSubstr(std::string(k) + " is 0, must be positive"));
    j[k] = -12;
    EXPECT_THAT(Error(j), HasSubstr("must be positive"));
    j[k] = 12.5;
    EXPECT_THAT(Error(j), HasSubstr("is not an integer"));
    j[k] = "12";
    EXPECT_THAT(Error(j), HasSubstr("is not an integer"));
    j[k] = uint64_t{1} << 40;
    EXPECT_THAT(Error(j), HasSubstr("above the limit"));
  }
}

TEST(ModelConfigTest, RefusesInconsistentHeads) {
  json j = Gpt2Config();
  j["n_head"] = 7;
  EXPECT_THAT(Error(j), HasSubstr("n_embd (768) is not divisible by n_head (7)"));
}

TEST(ModelConfigTest, RefusesUnsupportedSettings) {
  const std::pair<const char*, json> cases[] = {
      {"model_type", "llama"},
      {"activation_function", "relu"},
      {"layer_norm_epsilon", 0},
      {"layer_norm_epsilon", "small"},
      {"n_inner", 1000},
      {"scale_attn_weights", false},
      {"scale_attn_by_inverse_layer_idx", true},
      {"reorder_and_upcast_attn", true},
      {"eos_token_id", 50257},
      {"bos_token_id", -1},
  };
  for (const auto& [key, value] : cases) {
    json j = Gpt2Config();
    j[key] = value;
    EXPECT_THAT(Error(j), HasSubstr(key)) << key << "=" << value.dump();
  }
  json j = Gpt2Config();
  j["n_inner"] = 3072;  // 4 * n_embd spelled out is fine
  EXPECT_TRUE(Parse(j).ok());
}

TEST(ModelConfigTest, ToJsonWritesWhatTransformersWritesAndParsesBack) {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 64;
  c.n_positions = 256;
  c.vocab_size = 50257;
  json j = json::parse(ModelConfigToJson(c, "float16"));
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(j["activation_function"], "gelu_new");
  EXPECT_EQ(j["layer_norm_epsilon"].get<double>(), 1e-5);
  EXPECT_EQ(j["n_ctx"], 256);
  EXPECT_EQ(j["torch_dtype"], "float16");
  EXPECT_EQ(j["bos_token_id"], 50256);
  EXPECT_EQ(j["eos_token_id"], 50256);
  absl::StatusOr<ModelConfig> back = Parse(j);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->n_layer, 2);
  EXPECT_EQ(back->n_embd, 64);
  EXPECT_EQ(back->n_positions, 256);
  EXPECT_TRUE(back->tie_word_embeddings);
}

// Found by fuzz/model_config_fuzz: an untied config was written without the key, so it read
// back as tied.
TEST(ModelConfigTest, ToJsonKeepsAnUntiedLmHead) {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 64;
  c.n_positions = 256;
  c.vocab_size = 50257;
  c.tie_word_embeddings = false;
  absl::StatusOr<ModelConfig> back = Parse(json::parse(ModelConfigToJson(c, "float32")));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->tie_word_embeddings);
}

}  // namespace
}  // namespace prefixd
