#include "tools/random_model.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/safetensors.h"
#include "nlohmann/json.hpp"
#include "tools/counter_normals.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;

using internal::FillNormal;
using internal::Fnv1a;
using internal::SplitMix64;

// The init of one tensor from standard normals z (see the header for why it is not GPT-2's).
std::function<float(float)> InitFor(std::string_view name, int64_t e) {
  const auto ends = [&](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  const float inv_sqrt_e = 1.0f / std::sqrt(static_cast<float>(e));
  // Layernorm gains in (0.9, 1.1): near 1, but not all equal.
  if (ends("ln_1.weight") || ends("ln_2.weight") || ends("ln_f.weight")) {
    return [](float z) { return 1.0f + 0.1f * std::tanh(z); };
  }
  float std_dev = 0.02f;  // every bias
  if (name == "wte.weight") {
    std_dev = 1.5f * inv_sqrt_e;  // logits (h . wte) of std ~1.5 whatever the width
  } else if (name == "wpe.weight") {
    std_dev = 0.5f * inv_sqrt_e;
  } else if (ends("attn.c_attn.weight")) {
    std_dev = std::sqrt(2.0f) * inv_sqrt_e;  // q.k / sqrt(d) of std ~2: peaked attention
  } else if (ends("attn.c_proj.weight") || ends("mlp.c_proj.weight")) {
    std_dev = 0.5f * inv_sqrt_e * (ends("mlp.c_proj.weight") ? 0.5f : 1.0f);
  } else if (ends("mlp.c_fc.weight")) {
    std_dev = inv_sqrt_e;
  }
  return [std_dev](float z) { return std_dev * z; };
}

std::vector<SafetensorsEntry> Layout(const ModelConfig& c, DType dtype) {
  const int64_t e = c.n_embd;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"wte.weight", {c.vocab_size, e}}, {"wpe.weight", {c.n_positions, e}}};
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string p = absl::StrCat("h.", i, ".");
    for (auto& [suffix, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"ln_1.weight", {e}},
             {"ln_1.bias", {e}},
             {"attn.c_attn.weight", {e, 3 * e}},
             {"attn.c_attn.bias", {3 * e}},
             {"attn.c_proj.weight", {e, e}},
             {"attn.c_proj.bias", {e}},
             {"ln_2.weight", {e}},
             {"ln_2.bias", {e}},
             {"mlp.c_fc.weight", {e, 4 * e}},
             {"mlp.c_fc.bias", {4 * e}},
             {"mlp.c_proj.weight", {4 * e, e}},
             {"mlp.c_proj.bias", {e}}}) {
      shapes.emplace_back(p + suffix, shape);
    }
  }
  shapes.push_back({"ln_f.weight", {e}});
  shapes.push_back({"ln_f.bias", {e}});

  std::vector<SafetensorsEntry> entries;
  uint64_t offset = 0;
  for (auto& [name, shape] : shapes) {
    SafetensorsEntry en;
    en.name = name;
    en.dtype = dtype;
    en.shape = shape;
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    en.begin = offset;
    en.end = offset + static_cast<uint64_t>(numel * DTypeSize(dtype));
    offset = en.end;
    entries.push_back(std::move(en));
  }
  return entries;
}

void Encode(const std::vector<float>& values, DType dtype, std::string* out) {
  out->resize(values.size() * DTypeSize(dtype));
  char* p = out->data();
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(p + 4 * i, &values[i], 4);
    } else {
      const uint16_t h = dtype == DType::kF16 ? FloatToHalf(values[i]) : FloatToBF16(values[i]);
      std::memcpy(p + 2 * i, &h, 2);
    }
  }
}

absl::Status CountVocab(const std::string& vocab_path, size_t* count) {
  std::ifstream in(vocab_path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(vocab_path, ": cannot open"));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(vocab_path, ": not a JSON object"));
  }
  *count = j.size();
  return absl::OkStatus();
}

absl::Status WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace

ModelConfig TinyModelConfig() {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 64;
  c.n_positions = 256;
  c.vocab_size = 50257;
  return c;
}

ModelConfig Gpt2ModelConfig() {
  ModelConfig c;
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  c.n_positions = 1024;
  c.vocab_size = 50257;
  return c;
}

std::optional<ModelConfig> PresetModelConfig(std::string_view preset) {
  if (preset == "tiny") return TinyModelConfig();
  if (preset == "gpt2") return Gpt2ModelConfig();
  return std::nullopt;
}

std::string DefaultTokenizerDir() {
  if (const char* env = std::getenv("PREFIXD_TOKENIZER_DIR"); env != nullptr && *env != '\0') {
    return env;  // an explicit choice: reported as is if it lacks the files
  }
#ifdef PREFIXD_TOKENIZER_DIR
  std::error_code ec;
  if (fs::is_regular_file(fs::path(PREFIXD_TOKENIZER_DIR) / "vocab.json", ec)) {
    return PREFIXD_TOKENIZER_DIR;
  }
#endif
  return "";
}

absl::Status WriteRandomModel(const RandomModelOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("no output directory given");
  if (options.dtype == DType::kI8) {
    return absl::InvalidArgumentError(
        "a checkpoint is f32, f16 or bf16 (int8 is a CPU backend's storage, made at load)");
  }
  if (absl::Status s = ValidateModelConfig(options.config); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid model shape: ", s.message()));
  }
  const std::string tok_dir =
      options.tokenizer_dir.empty() ? DefaultTokenizerDir() : options.tokenizer_dir;
  if (tok_dir.empty()) {
    return absl::InvalidArgumentError(
        "no GPT-2 tokenizer files found: pass --tokenizer-dir DIR (holding vocab.json and "
        "merges.txt) or set PREFIXD_TOKENIZER_DIR");
  }
  const std::string vocab = tok_dir + "/vocab.json";
  const std::string merges = tok_dir + "/merges.txt";
  std::error_code ec;
  for (const std::string& f : {vocab, merges}) {
    if (!fs::is_regular_file(f, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, ": missing (tokenizer directory ", tok_dir, ")"));
    }
  }
  size_t tokens = 0;
  if (absl::Status s = CountVocab(vocab, &tokens); !s.ok()) return s;
  if (static_cast<size_t>(options.config.vocab_size) < tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab size ", options.config.vocab_size, " is below the tokenizer's ", tokens, " tokens"));
  }

  fs::create_directories(options.out_dir, ec);
  if (ec || !fs::is_directory(options.out_dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.out_dir, ": cannot create directory: ", ec.message()));
  }
  const std::string torch_dtype = options.dtype == DType::kF32   ? "float32"
                                  : options.dtype == DType::kF16 ? "float16"
                                                                 : "bfloat16";
  if (absl::Status s = WriteFile(options.out_dir + "/config.json",
                                 ModelConfigToJson(options.config, torch_dtype));
      !s.ok()) {
    return s;
  }

  // Written under a temporary name and renamed, so an interrupted run never leaves a
  // truncated model.safetensors that looks complete.
  const std::string weights = options.out_dir + "/model.safetensors";
  const std::string tmp = weights + ".tmp";
  const std::vector<SafetensorsEntry> layout = Layout(options.config, options.dtype);
  {
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(tmp.c_str(), "wb"), &std::fclose);
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
    }
    const std::string header = EncodeSafetensorsHeader(layout, {{"format", "pt"}});
    bool ok = std::fwrite(header.data(), 1, header.size(), f.get()) == header.size();
    std::vector<float> values;
    std::string bytes;
    const uint64_t seed_key = SplitMix64(options.seed);
    for (const SafetensorsEntry& e : layout) {
      if (!ok) break;
      values.resize((e.end - e.begin) / DTypeSize(options.dtype));
      FillNormal(SplitMix64(seed_key ^ Fnv1a(e.name)), &values);
      const std::function<float(float)> init = InitFor(e.name, options.config.n_embd);
      for (float& v : values) v = init(v);
      Encode(values, options.dtype, &bytes);
      ok = std::fwrite(bytes.data(), 1, bytes.size(), f.get()) == bytes.size();
    }
    if (std::fclose(f.release()) != 0) ok = false;
    if (!ok) return absl::InternalError(absl::StrCat(tmp, ": write failed"));
  }
  fs::rename(tmp, weights, ec);
  if (ec) return absl::InternalError(absl::StrCat(weights, ": rename failed: ", ec.message()));

  for (const auto& [from, name] :
       {std::pair<std::string, std::string>{vocab, "vocab.json"}, {merges, "merges.txt"}}) {
    const std::string to = options.out_dir + "/" + name;
    if (fs::exists(to, ec) && fs::equivalent(from, to, ec)) continue;  // --out == tokenizer dir
    fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("copying ", from, " into ", options.out_dir, ": ", ec.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace prefixd
