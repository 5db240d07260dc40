// A validated, memory-mapped Hugging Face GPT-2 model directory:
// config.json, model.safetensors, vocab.json, merges.txt (other files are ignored).
//
// Load() validates everything before returning (see model_loader tests for each refusal);
// after that every tensor named in kTensorNames exists with the shape the config implies
// and holds only finite values, so backends can Get() without checking.
#ifndef PREFIXD_ENGINE_MODEL_H_
#define PREFIXD_ENGINE_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/dtype.h"
#include "engine/model_config.h"

namespace prefixd {

class Tokenizer;

struct Tensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // points into the mmapped file; little-endian
  size_t size_bytes = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

class Model {
 public:
  // Loads and validates `dir`. Errors name the file and the problem.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir);
  virtual ~Model() = default;

  const ModelConfig& config() const { return config_; }
  // Hex SHA-256 over config.json, model.safetensors, vocab.json, merges.txt (name + digest of
  // each, in that order). Independent of the directory's name.
  const std::string& manifest_sha256() const { return manifest_sha256_; }
  const std::string& dir() const { return dir_; }
  const std::string& name() const { return name_; }  // the directory's base name
  // The weights' element type (the most common one if they are mixed).
  DType dtype() const { return dtype_; }
  int64_t num_parameters() const { return num_parameters_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

  // Canonical tensor names have no "transformer." prefix: "wte.weight", "wpe.weight",
  // "h.{i}.ln_1.weight", "h.{i}.attn.c_attn.weight" ([E, 3E], HF Conv1D [in, out] layout),
  // ..., "ln_f.bias", and "lm_head.weight" ([V, E]) only when the file has it (else tied
  // to wte). Returns nullptr when absent.
  const Tensor* Find(std::string_view name) const;
  // Like Find, for tensors validation guarantees; PREFIXD_CHECKs presence.
  const Tensor& Get(std::string_view name) const;
  // The tensor converted to fp32, row-major in its stored shape.
  std::vector<float> ToFloat(const Tensor& t) const;

 protected:
  Model() = default;
  ModelConfig config_;
  std::string manifest_sha256_;
  std::string dir_;
  std::string name_;
  DType dtype_ = DType::kF32;
  int64_t num_parameters_ = 0;
  std::unique_ptr<Tokenizer> tokenizer_;
  // By canonical name; the data pointers stay valid while `mapping_` (which owns the mmap)
  // lives. Subclasses (test fakes) may fill both.
  std::map<std::string, Tensor, std::less<>> tensors_;
  std::shared_ptr<const void> mapping_;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_MODEL_H_
