// GPT-2 hyper-parameters, as read from a Hugging Face config.json.
#ifndef PREFIXD_ENGINE_MODEL_CONFIG_H_
#define PREFIXD_ENGINE_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

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

  int32_t head_dim() const { return n_head > 0 ? n_embd / n_head : 0; }
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_MODEL_CONFIG_H_
