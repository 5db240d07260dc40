// Writes a complete Hugging Face GPT-2 directory with random weights: the demo and test
// model, since real weights cannot be downloaded everywhere prefixd is built.
//
// The output is what `GPT2LMHeadModel.from_pretrained` loads: config.json as transformers
// writes it, model.safetensors with `__metadata__` {"format": "pt"} and HF's tensor names
// and Conv1D [in, out] layout (no lm_head: tied to wte), plus vocab.json and merges.txt
// copied from the tokenizer directory. Weights depend only on (seed, tensor name, element
// index), so a seed gives the same bytes on every machine and in every dtype up to rounding.
// The init is deliberately not GPT-2's N(0, 0.02): q/k weights are larger so attention is
// far from uniform, and embeddings are scaled so logits differ by O(1) between tokens.
#ifndef PREFIXD_TOOLS_RANDOM_MODEL_H_
#define PREFIXD_TOOLS_RANDOM_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "engine/dtype.h"
#include "engine/model_config.h"

namespace prefixd {

// 2 layers, 2 heads, n_embd 64, 256 positions, GPT-2's 50,257-token vocabulary.
ModelConfig TinyModelConfig();
// GPT-2 small's shapes: 12 layers, 12 heads, 768 wide, 1024 positions (124,439,808
// parameters).
ModelConfig Gpt2ModelConfig();
// "tiny" or "gpt2"; nullopt for other names.
std::optional<ModelConfig> PresetModelConfig(std::string_view preset);

struct RandomModelOptions {
  std::string out_dir;  // created if absent; the four model files are overwritten
  // Holds vocab.json and merges.txt. Empty: DefaultTokenizerDir().
  std::string tokenizer_dir;
  ModelConfig config = TinyModelConfig();
  uint64_t seed = 0;
  DType dtype = DType::kF32;
};

// $PREFIXD_TOKENIZER_DIR if set (as given); else the directory compiled in (the source
// tree's .deps/gpt2-tokenizer, which scripts/setup fills) if it holds vocab.json; else "".
std::string DefaultTokenizerDir();

// Validates the options (config as the loader would, vocab_size at least the tokenizer's
// 50,257 tokens) before writing anything.
absl::Status WriteRandomModel(const RandomModelOptions& options);

}  // namespace prefixd

#endif  // PREFIXD_TOOLS_RANDOM_MODEL_H_
