// GPT-2 hyper-parameters, as read from a Hugging Face config.json.
#ifndef PREFIXD_ENGINE_MODEL_CONFIG_H_
#define PREFIXD_ENGINE_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace prefixd {

struct ModelConfig {
  int32_t n_layer = 0;
  int32_t n_head = 0;
  int32_t n_embd = 0;
  int32_t n_positions = 0;  // context length
  int32_t vocab_size = 0;
  float layer_norm_epsilon = 1e-5f;
  uint32_t bos_token_id = 50256;
  uint32_t eos_token_id = 50256;
  std::string activation_function = "gelu_new";
  // transformers' default: without an lm_head.weight the output layer is wte. False means the
  // checkpoint must carry its own lm_head.weight.
  bool tie_word_embeddings = true;

  int32_t head_dim() const { return n_head > 0 ? n_embd / n_head : 0; }
};

// Every size present and positive (and small enough that byte counts cannot overflow),
// n_embd % n_head == 0, epsilon positive, bos/eos < vocab_size, activation "gelu_new".
absl::Status ValidateModelConfig(const ModelConfig& config);

// Parses and validates a Hugging Face GPT-2 config.json. Refuses settings that change the
// computation in ways prefixd does not implement (n_inner != 4 * n_embd, attention scaling
// options). Errors are INVALID_ARGUMENT and start with `file_label`.
absl::StatusOr<ModelConfig> ParseModelConfigJson(std::string_view json_text,
                                                 std::string_view file_label);

// config.json as transformers writes it for GPT2LMHeadModel; `torch_dtype` is e.g. "float16".
std::string ModelConfigToJson(const ModelConfig& config, std::string_view torch_dtype);

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_MODEL_CONFIG_H_
