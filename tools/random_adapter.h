// Writes PEFT LoRA adapter directories for GPT-2 (engine/lora_adapter.h's format): the
// random adapters of `prefixd-model random-adapter`, and, for tests, adapters with given
// tensors or a deliberately broken config.
//
// The output is what PEFT's `PeftModel.from_pretrained` loads: adapter_config.json with
// peft_type "LORA", fan_in_fan_out true and bias "none", and adapter_model.safetensors with
// PEFT's tensor names (lora_A [r, in], lora_B [out, r]). Values depend only on (seed, tensor
// name, element index). Unlike PEFT's own initialisation (B = 0, an adapter that changes
// nothing), B is random too, so the adapter visibly changes the model.
#ifndef PREFIXD_TOOLS_RANDOM_ADAPTER_H_
#define PREFIXD_TOOLS_RANDOM_ADAPTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/dtype.h"
#include "engine/model_config.h"
#include "nlohmann/json.hpp"

namespace prefixd {

struct AdapterTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // row-major
};

struct RandomAdapterOptions {
  int32_t rank = 8;
  float lora_alpha = 16.0f;
  bool use_rslora = false;
  std::vector<std::string> target_modules = {"c_attn", "c_proj", "c_fc"};
  uint64_t seed = 0;
  // Standard deviations of A's and B's elements; A's is divided by sqrt(in). b_std = 0 gives
  // PEFT's initial adapter (no change to the model).
  float a_std = 1.0f;
  float b_std = 0.02f;
  std::string base_model_name_or_path;
};

// adapter_config.json's content for `options`, as PEFT writes it.
nlohmann::json AdapterConfigJson(const RandomAdapterOptions& options);

// Every tensor of an adapter for `base` (each targeted module of each layer).
std::vector<AdapterTensor> RandomAdapterTensors(const ModelConfig& base,
                                                const RandomAdapterOptions& options);

// Writes both files into `dir` (created if absent): `config` as JSON, `tensors` at `dtype`.
absl::Status WriteAdapterFiles(const std::string& dir, const nlohmann::json& config,
                               const std::vector<AdapterTensor>& tensors,
                               DType dtype = DType::kF32);

// Validates the options (rank >= 1, targets among c_attn, c_proj, c_fc), then writes.
absl::Status WriteRandomAdapter(const std::string& dir, const ModelConfig& base,
                                const RandomAdapterOptions& options);

}  // namespace prefixd

#endif  // PREFIXD_TOOLS_RANDOM_ADAPTER_H_
