// Fuzz target: config.json bytes → ParseModelConfigJson.
//
// An accepted config must pass ValidateModelConfig on its own, and the JSON that
// ModelConfigToJson writes for it must parse back to the same values (the epsilon to the 7
// digits it is written with).
#include <cmath>
#include <string>

#include "engine/model_config.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using prefixd::ModelConfig;
  absl::StatusOr<ModelConfig> c =
      prefixd::ParseModelConfigJson(prefixd::fuzz::AsText(data, size), "config.json");
  if (!c.ok()) {
    PREFIXD_CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  PREFIXD_CHECK(prefixd::ValidateModelConfig(*c).ok());
  const std::string written = prefixd::ModelConfigToJson(*c, "float32");
  absl::StatusOr<ModelConfig> again = prefixd::ParseModelConfigJson(written, "written");
  PREFIXD_CHECK(again.ok());
  PREFIXD_CHECK(again->n_layer == c->n_layer && again->n_head == c->n_head &&
                again->n_embd == c->n_embd && again->n_positions == c->n_positions &&
                again->vocab_size == c->vocab_size &&
                // Written with 7 significant digits, as transformers spells it ("1e-05").
                std::fabs(again->layer_norm_epsilon - c->layer_norm_epsilon) <=
                    c->layer_norm_epsilon * 1e-6f &&
                again->bos_token_id == c->bos_token_id && again->eos_token_id == c->eos_token_id &&
                again->activation_function == c->activation_function &&
                again->tie_word_embeddings == c->tie_word_embeddings);
  return 0;
}
