#include "tools/random_adapter.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/lora_adapter.h"
#include "engine/safetensors.h"
#include "tools/counter_normals.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;

// Writes `bytes` under a temporary name, then renames it, so an interrupted run never leaves
// a truncated file that looks complete.
absl::Status WriteFileReplacing(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(tmp.c_str(), "wb"), &std::fclose);
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
    }
    bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f.get()) == bytes.size();
    if (std::fclose(f.release()) != 0) ok = false;
    if (!ok) return absl::InternalError(absl::StrCat(tmp, ": write failed"));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat(path, ": rename failed: ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

nlohmann::json AdapterConfigJson(const RandomAdapterOptions& options) {
  return {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", options.base_model_name_or_path},
      {"r", options.rank},
      {"lora_alpha", options.lora_alpha},
      {"lora_dropout", 0.0},
      {"target_modules", options.target_modules},
      {"fan_in_fan_out", true},
      {"bias", "none"},
      {"use_rslora", options.use_rslora},
      {"modules_to_save", nullptr},
      {"init_lora_weights", true},
      {"inference_mode", true},
  };
}

std::vector<AdapterTensor> RandomAdapterTensors(const ModelConfig& base,
                                                const RandomAdapterOptions& options) {
  const int64_t e = base.n_embd;
  const int64_t r = options.rank;
  const uint64_t seed_key = internal::SplitMix64(options.seed);
  std::vector<AdapterTensor> out;
  auto targeted = [&](std::string_view module) {
    for (const std::string& t : options.target_modules) {
      if (t == module) return true;
    }
    return false;
  };
  struct Module {
    std::string_view path, module;
    int64_t in, out;
  };
  const Module modules[] = {{"attn.c_attn", "c_attn", e, 3 * e},
                            {"attn.c_proj", "c_proj", e, e},
                            {"mlp.c_fc", "c_fc", e, 4 * e},
                            {"mlp.c_proj", "c_proj", 4 * e, e}};
  for (int32_t i = 0; i < base.n_layer; ++i) {
    for (const Module& m : modules) {
      if (!targeted(m.module)) continue;
      const std::string p = absl::StrCat("base_model.model.transformer.h.", i, ".",
                                         absl::string_view(m.path.data(), m.path.size()));
      for (bool is_a : {true, false}) {
        AdapterTensor t;
        t.name = p + (is_a ? ".lora_A.weight" : ".lora_B.weight");
        t.shape = is_a ? std::vector<int64_t>{r, m.in} : std::vector<int64_t>{m.out, r};
        t.values.resize(static_cast<size_t>(r * (is_a ? m.in : m.out)));
        const float std_dev =
            is_a ? options.a_std / std::sqrt(static_cast<float>(m.in)) : options.b_std;
        if (std_dev == 0.0f) {
          std::fill(t.values.begin(), t.values.end(), 0.0f);
        } else {
          internal::FillNormal(internal::SplitMix64(seed_key ^ internal::Fnv1a(t.name)),
                               &t.values);
          for (float& v : t.values) v *= std_dev;
        }
        out.push_back(std::move(t));
      }
    }
  }
  return out;
}

absl::Status WriteAdapterFiles(const std::string& dir, const nlohmann::json& config,
                               const std::vector<AdapterTensor>& tensors, DType dtype) {
  if (dtype == DType::kI8) {
    return absl::InvalidArgumentError("adapter weights are f32, f16 or bf16");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": cannot create directory: ", ec.message()));
  }
  std::vector<SafetensorsEntry> entries;
  std::string data;
  for (const AdapterTensor& t : tensors) {
    SafetensorsEntry en;
    en.name = t.name;
    en.dtype = dtype;
    en.shape = t.shape;
    en.begin = data.size();
    for (float v : t.values) {
      if (dtype == DType::kF32) {
        data.append(reinterpret_cast<const char*>(&v), 4);
      } else {
        const uint16_t h = dtype == DType::kF16 ? FloatToHalf(v) : FloatToBF16(v);
        data.append(reinterpret_cast<const char*>(&h), 2);
      }
    }
    en.end = data.size();
    entries.push_back(std::move(en));
  }
  const std::string weights = EncodeSafetensorsHeader(entries, {{"format", "pt"}}) + data;
  const std::string dir_slash = dir + "/";
  if (absl::Status s = WriteFileReplacing(dir_slash + std::string(kAdapterConfigFile),
                                          config.dump(2) + "\n");
      !s.ok()) {
    return s;
  }
  return WriteFileReplacing(dir_slash + std::string(kAdapterWeightsFile), weights);
}

absl::Status WriteRandomAdapter(const std::string& dir, const ModelConfig& base,
                                const RandomAdapterOptions& options) {
  if (dir.empty()) return absl::InvalidArgumentError("no output directory given");
  if (options.rank < 1 || options.rank > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank must be in [1, 4096], got ", options.rank));
  }
  if (options.target_modules.empty()) {
    return absl::InvalidArgumentError("an adapter needs at least one target module");
  }
  for (const std::string& t : options.target_modules) {
    if (t != "c_attn" && t != "c_proj" && t != "c_fc") {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown target module \"", t, "\" (GPT-2's are c_attn, c_proj and c_fc)"));
    }
  }
  return WriteAdapterFiles(dir, AdapterConfigJson(options), RandomAdapterTensors(base, options));
}

}  // namespace prefixd
