// A validated PEFT LoRA adapter for GPT-2, as Hugging Face's `peft` writes it:
//   adapter_config.json        peft_type "LORA", r, lora_alpha, target_modules (a list, matched
//                              as PEFT does: a module "transformer.h.{i}.attn.c_proj" is
//                              targeted when it equals an entry or ends with "." + an entry,
//                              so "c_proj" covers attn.c_proj and mlp.c_proj, "attn.c_proj"
//                              the first alone, "h.3.mlp.c_fc" one layer's; every entry must
//                              match one of c_attn, c_proj, c_fc), optional exclude_modules
//                              (a list, the same rule, taken out); fan_in_fan_out true
//                              (GPT-2's Conv1D); bias "none"; optional use_rslora
//   adapter_model.safetensors  base_model.model.transformer.h.{i}.{attn|mlp}.{module}
//                              .lora_A.weight [r, in] and .lora_B.weight [out, r]
// The update of a targeted Conv1D weight W [in, out] is W + scaling · (B·A)ᵀ, with scaling
// lora_alpha / r (or lora_alpha / sqrt(r) with use_rslora); the backends add it as a
// low-rank product, y += scaling · ((x·Aᵀ)·Bᵀ), never merged.
//
// ParseLoraAdapter() accepts a directory only if everything above holds, every tensor is
// finite and of a float dtype, each element within ±1e4 and each module's largest possible
// change to a weight (|scaling|·r·max|A|·max|B|) at most 1e4, so the forward pass's products stay
// far inside float's range; each module's A and B come in pairs of rank r, and nothing is
// there that changes the computation in a way prefixd does not implement (other peft types,
// modules_to_save, DoRA, rank or alpha patterns, layers_to_transform, aLoRA,
// layer_replication, QA-LoRA, BD-LoRA, Arrow, biases, an init_lora_weights that changes the
// base's weights: PiSSA, OLoRA, CorDA, LoftQ). Each error is INVALID_ARGUMENT (NOT_FOUND
// for a missing file) and names the file, the tensor or field, and what is wrong.
// CheckLoraAdapterFits() then refuses an adapter made for another base: every layer of the
// base must have both tensors of every targeted module, with the base's widths.
// LoadLoraAdapter() is both.
//
// Identity: `digest` = SHA-256 over, for adapter_config.json then adapter_model.safetensors,
// the file's name (length-prefixed) and the SHA-256 of its content, exactly as the model
// manifest is formed (engine/manifest.h), from the bytes that were parsed. It enters the cache
// root key (cache/block_key.h), so blocks computed with one adapter are never served to the
// base or to another adapter.
#ifndef PREFIXD_ENGINE_LORA_ADAPTER_H_
#define PREFIXD_ENGINE_LORA_ADAPTER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/sha256.h"
#include "engine/model_config.h"

namespace prefixd {

inline constexpr std::string_view kAdapterConfigFile = "adapter_config.json";
inline constexpr std::string_view kAdapterWeightsFile = "adapter_model.safetensors";

// The four Conv1D layers of a GPT-2 block an adapter may change, in the order the forward
// pass runs them.
enum class LoraTarget { kAttnCAttn = 0, kAttnCProj = 1, kMlpCFc = 2, kMlpCProj = 3 };
inline constexpr int kNumLoraTargets = 4;
// "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj".
std::string_view LoraTargetPath(LoraTarget target);

// One module's update, in the layouts the CPU backend's loops read contiguously.
struct LoraModule {
  int64_t in = 0;   // input width (A's columns)
  int64_t out = 0;  // output width (B's rows)
  std::vector<float> a_t;  // [in, r]: lora_A transposed
  std::vector<float> b_t;  // [r, out]: lora_B transposed
};

struct LoraAdapter {
  std::string dir;
  std::string digest;  // lowercase hex (see above)
  int32_t rank = 0;
  float lora_alpha = 0.0f;
  bool use_rslora = false;
  float scaling = 0.0f;  // lora_alpha / rank, or lora_alpha / sqrt(rank) with use_rslora
  std::vector<std::string> target_modules;   // as adapter_config.json lists them
  std::vector<std::string> exclude_modules;  // likewise; empty when absent
  std::string base_model_name_or_path;      // as written; "" when absent
  // Layers 0..layers.size()-1; an entry with in == 0 is a module the adapter leaves alone.
  std::vector<std::array<LoraModule, kNumLoraTargets>> layers;
  int64_t num_parameters = 0;  // elements of every A and B

  // nullptr when the adapter does not change that module.
  const LoraModule* module(int32_t layer, LoraTarget target) const {
    if (layer < 0 || layer >= static_cast<int32_t>(layers.size())) return nullptr;
    const LoraModule& m = layers[layer][static_cast<int>(target)];
    return m.in == 0 ? nullptr : &m;
  }
  // Host bytes its tensors occupy once loaded (fp32).
  int64_t memory_bytes() const { return num_parameters * 4; }
};

// SHA-256 over the two files' names (length-prefixed) and content digests, in the order
// above. Lowercase hex.
std::string AdapterDigest(const Digest& config_sha256, const Digest& weights_sha256);

// Validates and loads `dir` on its own (see above); widths are taken from the tensors.
absl::StatusOr<std::unique_ptr<LoraAdapter>> ParseLoraAdapter(const std::string& dir);

// INVALID_ARGUMENT naming the tensor when `adapter` was not made for a model of `base`'s
// shape: a layer beyond the base's, a width that differs, or a targeted module missing from a
// layer.
absl::Status CheckLoraAdapterFits(const LoraAdapter& adapter, const ModelConfig& base);

// Limits checked before a file is read: the config is a few KiB; the weights file's JSON
// header a few KiB (an entry per tensor); the weights file at most MaxAdapterWeightsBytes
// (every module of every layer of the base at the adapter's rank, in F32, and a header).
inline constexpr uint64_t kMaxAdapterConfigBytes = uint64_t{1} << 20;
inline constexpr uint64_t kMaxAdapterHeaderBytes = uint64_t{1} << 20;
inline constexpr int32_t kMaxAdapterLayers = 4096;  // a model config's own limit
uint64_t MaxAdapterWeightsBytes(const ModelConfig& base, int32_t rank);

// ParseLoraAdapter and CheckLoraAdapterFits, in the order that reads least: the config, the
// weights file's size and header (names, shapes, the fit to `base`), and only then its data.
absl::StatusOr<std::shared_ptr<const LoraAdapter>> LoadLoraAdapter(const std::string& dir,
                                                                   const ModelConfig& base);

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_LORA_ADAPTER_H_
