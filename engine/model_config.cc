#include "engine/model_config.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/escape.h"
#include "nlohmann/json.hpp"

namespace prefixd {
namespace {

using json = nlohmann::json;

// Debian's absl has its own string_view type; StrCat takes only that one.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Upper bounds far above GPT-2-xl (48 layers, 25 heads, 1600 wide, 1024 positions) that keep
// every byte count of a model well inside int64.
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxEmbd = 65536;
constexpr int64_t kMaxPositions = int64_t{1} << 20;
constexpr int64_t kMaxVocab = int64_t{1} << 22;

absl::Status CheckSize(const char* key, int64_t value, int64_t max) {
  if (value <= 0)
    return absl::InvalidArgumentError(absl::StrCat(key, " is ", value, ", must be positive"));
  if (value > max) {
    return absl::InvalidArgumentError(absl::StrCat(key, " is ", value, ", above the limit ", max));
  }
  return absl::OkStatus();
}

// Reads a required integer field. `out` is untouched on error.
absl::Status ReadSize(const json& config, const char* key, int64_t max, int32_t* out) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" is missing"));
  }
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" is not an integer"));
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(max)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" is above the limit ", max));
  }
  const int64_t v = it->get<int64_t>();
  if (absl::Status s = CheckSize(key, v, max); !s.ok()) return s;
  *out = static_cast<int32_t>(v);
  return absl::OkStatus();
}

absl::Status ReadTokenId(const json& config, const char* key, uint32_t* out) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return absl::OkStatus();  // default 50256
  if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
      it->get<int64_t>() > int64_t{UINT32_MAX}) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" is not a non-negative integer"));
  }
  *out = static_cast<uint32_t>(it->get<int64_t>());
  return absl::OkStatus();
}

// A boolean option that must have `required` (or be absent) for prefixd's forward pass.
absl::Status CheckBoolOption(const json& config, const char* key, bool required) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean() || it->get<bool>() != required) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be ",
                                                   required ? "true" : "false",
                                                   " (prefixd implements only GPT-2's default)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseObject(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  ModelConfig c;
  if (auto it = j.find("model_type"); it != j.end() && *it != "gpt2") {
    return absl::InvalidArgumentError(
        absl::StrCat("model_type is ", it->dump(), ", expected \"gpt2\""));
  }
  for (auto [key, max, field] :
       {std::tuple{"n_layer", kMaxLayers, &c.n_layer}, std::tuple{"n_head", kMaxHeads, &c.n_head},
        std::tuple{"n_embd", kMaxEmbd, &c.n_embd},
        std::tuple{"n_positions", kMaxPositions, &c.n_positions},
        std::tuple{"vocab_size", kMaxVocab, &c.vocab_size}}) {
    if (absl::Status s = ReadSize(j, key, max, field); !s.ok()) return s;
  }
  if (auto it = j.find("layer_norm_epsilon"); it != j.end() && !it->is_null()) {
    if (!it->is_number()) {
      return absl::InvalidArgumentError("\"layer_norm_epsilon\" is not a number");
    }
    c.layer_norm_epsilon = static_cast<float>(it->get<double>());
  }
  if (auto it = j.find("activation_function"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) {
      return absl::InvalidArgumentError("\"activation_function\" is not a string");
    }
    c.activation_function = it->get<std::string>();
  }
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return absl::InvalidArgumentError("\"tie_word_embeddings\" is not true or false");
    }
    c.tie_word_embeddings = it->get<bool>();
  }
  if (absl::Status s = ReadTokenId(j, "bos_token_id", &c.bos_token_id); !s.ok()) return s;
  if (absl::Status s = ReadTokenId(j, "eos_token_id", &c.eos_token_id); !s.ok()) return s;
  if (auto it = j.find("n_inner"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != int64_t{4} * c.n_embd) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"n_inner\" is ", it->dump(),
          "; prefixd supports only 4 * n_embd = ", int64_t{4} * c.n_embd, " (or null)"));
    }
  }
  for (auto [key, required] :
       {std::pair{"scale_attn_weights", true}, std::pair{"scale_attn_by_inverse_layer_idx", false},
        std::pair{"reorder_and_upcast_attn", false}}) {
    if (absl::Status s = CheckBoolOption(j, key, required); !s.ok()) return s;
  }
  if (absl::Status s = ValidateModelConfig(c); !s.ok()) return s;
  return c;
}

}  // namespace

absl::Status ValidateModelConfig(const ModelConfig& c) {
  if (absl::Status s = CheckSize("n_layer", c.n_layer, kMaxLayers); !s.ok()) return s;
  if (absl::Status s = CheckSize("n_head", c.n_head, kMaxHeads); !s.ok()) return s;
  if (absl::Status s = CheckSize("n_embd", c.n_embd, kMaxEmbd); !s.ok()) return s;
  if (absl::Status s = CheckSize("n_positions", c.n_positions, kMaxPositions); !s.ok()) return s;
  if (absl::Status s = CheckSize("vocab_size", c.vocab_size, kMaxVocab); !s.ok()) return s;
  if (c.n_embd % c.n_head != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_embd (", c.n_embd, ") is not divisible by n_head (", c.n_head, ")"));
  }
  if (!(c.layer_norm_epsilon > 0.0f) || !std::isfinite(c.layer_norm_epsilon) ||
      c.layer_norm_epsilon >= 1.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer_norm_epsilon is ", c.layer_norm_epsilon, ", must be in (0, 1)"));
  }
  if (c.bos_token_id >= static_cast<uint32_t>(c.vocab_size) ||
      c.eos_token_id >= static_cast<uint32_t>(c.vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat("bos_token_id ", c.bos_token_id,
                                                   " / eos_token_id ", c.eos_token_id,
                                                   " must be below vocab_size ", c.vocab_size));
  }
  if (c.activation_function != "gelu_new") {
    return absl::InvalidArgumentError(absl::StrCat("activation_function \"",
                                                   EscapeBytes(c.activation_function),
                                                   "\" is not supported (only \"gelu_new\")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseModelConfigJson(std::string_view json_text,
                                                 std::string_view file_label) {
  json j = json::parse(json_text.begin(), json_text.end(), /*cb=*/nullptr,
                       /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(file_label), ": not valid JSON"));
  }
  absl::StatusOr<ModelConfig> c = ParseObject(j);
  if (!c.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(file_label), ": ", c.status().message()));
  }
  return c;
}

std::string ModelConfigToJson(const ModelConfig& c, std::string_view torch_dtype) {
  // Printed with 7 significant digits first so that 1e-5f is written "1e-05", as HF does,
  // not as the float's exact binary value.
  const double eps = std::stod(absl::StrFormat("%.7g", c.layer_norm_epsilon));
  json j = {
      {"activation_function", c.activation_function},
      {"architectures", {"GPT2LMHeadModel"}},
      {"attn_pdrop", 0.1},
      {"bos_token_id", c.bos_token_id},
      {"embd_pdrop", 0.1},
      {"eos_token_id", c.eos_token_id},
      {"initializer_range", 0.02},
      {"layer_norm_epsilon", eps},
      {"model_type", "gpt2"},
      {"n_ctx", c.n_positions},
      {"n_embd", c.n_embd},
      {"n_head", c.n_head},
      {"n_inner", nullptr},
      {"n_layer", c.n_layer},
      {"n_positions", c.n_positions},
      {"reorder_and_upcast_attn", false},
      {"resid_pdrop", 0.1},
      {"scale_attn_by_inverse_layer_idx", false},
      {"scale_attn_weights", true},
      {"summary_activation", nullptr},
      {"summary_first_dropout", 0.1},
      {"summary_proj_to_labels", true},
      {"summary_type", "cls_index"},
      {"summary_use_proj", true},
      // Always written: omitted, it would read back as true whatever the config said.
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"torch_dtype", torch_dtype},
      {"use_cache", true},
      {"vocab_size", c.vocab_size},
  };
  return j.dump(2) + "\n";
}

}  // namespace prefixd
