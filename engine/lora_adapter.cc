#include "engine/lora_adapter.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/escape.h"
#include "base/file.h"
#include "engine/dtype.h"
#include "engine/safetensors.h"
#include "engine/weights_scan.h"
#include "nlohmann/json.hpp"

namespace prefixd {
namespace {

// Debian's absl has its own string_view type; StrCat takes only that one.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The largest rank accepted: far above any fine-tune's (PEFT's default is 8), low enough
// that r · width cannot overflow anything.
constexpr int64_t kMaxRank = 4096;

// The largest |element| of an A or B, and the largest change the merged update
// scaling·(B·A) can make to one weight, bounded by |scaling|·r·max|A|·max|B|. Trained
// adapters stay far below 1 (PEFT starts A at ±1/sqrt(in) and B at 0); 1e4 leaves room for any
// real one while every product the forward pass forms (x·Aᵀ over at most 4·n_embd inputs,
// then ·Bᵀ, then ·scaling) stays many orders of magnitude inside float's range. Finite weights
// of 3e38 passed the NaN/Inf check and made the logits NaN.
constexpr double kMaxAbsLoraWeight = 1e4;
constexpr double kMaxLoraUpdate = 1e4;

constexpr std::string_view kTensorPrefix = "base_model.model.transformer.h.";

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// What a tensor name says, when it is one of an adapter's.
struct TensorName {
  int32_t layer = 0;
  LoraTarget target = LoraTarget::kAttnCAttn;
  bool is_a = true;
};

// "base_model.model.transformer.h.{i}.{attn.c_attn|attn.c_proj|mlp.c_fc|mlp.c_proj}
// .lora_{A|B}.weight", or nullopt.
std::optional<TensorName> ParseTensorName(std::string_view name) {
  if (name.substr(0, kTensorPrefix.size()) != kTensorPrefix) return std::nullopt;
  name.remove_prefix(kTensorPrefix.size());
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot > 6) return std::nullopt;
  const std::string_view digits = name.substr(0, dot);
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  int32_t layer = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    layer = layer * 10 + (c - '0');
  }
  name.remove_prefix(dot + 1);
  for (int t = 0; t < kNumLoraTargets; ++t) {
    const std::string_view path = LoraTargetPath(static_cast<LoraTarget>(t));
    if (name.substr(0, path.size()) != path) continue;
    const std::string_view rest = name.substr(path.size());
    if (rest == ".lora_A.weight" || rest == ".lora_B.weight") {
      return TensorName{layer, static_cast<LoraTarget>(t), rest == ".lora_A.weight"};
    }
  }
  return std::nullopt;
}

// The module's name in the model PEFT wraps (GPT2LMHeadModel): "transformer.h.3.attn.c_attn".
std::string ModuleNameOf(int32_t layer, LoraTarget t) {
  return absl::StrCat("transformer.h.", layer, ".", ToAbsl(LoraTargetPath(t)));
}

// PEFT's check_target_module_exists for a list of names: a module is matched when its name
// equals an entry or ends with "." + the entry ("c_proj" matches both attn.c_proj and
// mlp.c_proj, "attn.c_proj" only the first, "h.3.mlp.c_fc" one layer's).
bool PeftNameMatches(std::string_view module_name, std::string_view entry) {
  if (module_name == entry) return true;
  return module_name.size() > entry.size() &&
         module_name.substr(module_name.size() - entry.size()) == entry &&
         module_name[module_name.size() - entry.size() - 1] == '.';
}

bool AnyMatches(const std::vector<std::string>& entries, std::string_view module_name) {
  return std::any_of(entries.begin(), entries.end(),
                     [&](const std::string& entry) { return PeftNameMatches(module_name, entry); });
}

// Whether `entry` matches a Conv1D module of some layer: it ends with one of the four paths'
// dotted suffixes ("c_attn", "attn.c_attn", ...), and anything before that is a dotted
// suffix of "transformer.h.{i}" for a layer i written as PEFT writes it ("3", "h.3", ...).
bool NamesSomeModule(std::string_view entry) {
  for (int t = 0; t < kNumLoraTargets; ++t) {
    const std::string_view path = LoraTargetPath(static_cast<LoraTarget>(t));
    if (PeftNameMatches(path, entry)) return true;
    if (entry.size() <= path.size() + 1 || entry.substr(entry.size() - path.size()) != path ||
        entry[entry.size() - path.size() - 1] != '.') {
      continue;
    }
    std::string_view layer = entry.substr(0, entry.size() - path.size() - 1);
    for (std::string_view prefix : {"transformer.h.", "h."}) {
      if (layer.substr(0, prefix.size()) == prefix) {
        layer.remove_prefix(prefix.size());
        break;
      }
    }
    if (layer.empty() || layer.size() > 6 || (layer.size() > 1 && layer[0] == '0')) continue;
    if (std::all_of(layer.begin(), layer.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return true;
    }
  }
  return false;
}

// Whether PEFT gave the module a LoRA update: target_modules matches it and exclude_modules
// does not.
bool Targeted(const std::vector<std::string>& targets, const std::vector<std::string>& excluded,
              int32_t layer, LoraTarget t) {
  const std::string name = ModuleNameOf(layer, t);
  return AnyMatches(targets, name) && !AnyMatches(excluded, name);
}

std::string TensorNameOf(int32_t layer, LoraTarget t, bool is_a) {
  return absl::StrCat(ToAbsl(kTensorPrefix), layer, ".", ToAbsl(LoraTargetPath(t)),
                      is_a ? ".lora_A.weight" : ".lora_B.weight");
}

float ElementAsFloat(DType dtype, const std::byte* data, int64_t i) {
  if (dtype == DType::kF32) {
    float f;
    std::memcpy(&f, data + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, data + 2 * i, 2);
  return dtype == DType::kF16 ? HalfToFloat(h) : BF16ToFloat(h);
}

// A field that must be absent, null, false or empty: what changes the computation in a way
// prefixd does not implement.
bool IsUnset(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return true;
  if (it->is_boolean()) return !it->get<bool>();
  if (it->is_array() || it->is_object() || it->is_string()) return it->empty();
  return false;
}

struct ParsedConfig {
  int32_t rank = 0;
  float alpha = 0;
  bool use_rslora = false;
  std::vector<std::string> target_modules;
  std::vector<std::string> exclude_modules;
  std::string base_model;
};

absl::StatusOr<ParsedConfig> ParseAdapterConfig(const std::string& text, const std::string& path) {
  auto bad = [&](std::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", ToAbsl(what)));
  };
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  ParsedConfig c;
  auto peft = j.find("peft_type");
  if (peft == j.end() || !peft->is_string()) {
    return bad("missing \"peft_type\" (a LoRA adapter says \"LORA\")");
  }
  if (peft->get<std::string>() != "LORA") {
    return bad(absl::StrCat("peft_type is \"", EscapeBytes(peft->get<std::string>()),
                            "\"; only LoRA adapters (\"LORA\") are supported"));
  }
  auto r = j.find("r");
  if (r == j.end() || !r->is_number_integer() || r->get<int64_t>() < 1 ||
      r->get<int64_t>() > kMaxRank) {
    return bad(absl::StrCat("\"r\" must be an integer in [1, ", kMaxRank, "]"));
  }
  c.rank = static_cast<int32_t>(r->get<int64_t>());
  auto alpha = j.find("lora_alpha");
  if (alpha == j.end() || !alpha->is_number() || !std::isfinite(alpha->get<double>()) ||
      std::fabs(alpha->get<double>()) > 1e6) {
    return bad("\"lora_alpha\" must be a finite number (|lora_alpha| <= 1e6)");
  }
  c.alpha = static_cast<float>(alpha->get<double>());
  if (auto it = j.find("use_rslora"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return bad("\"use_rslora\" must be true or false");
    c.use_rslora = it->get<bool>();
  }
  auto targets = j.find("target_modules");
  if (targets == j.end() || !targets->is_array() || targets->empty()) {
    return bad(
        "\"target_modules\" must be a non-empty list of module names (\"c_attn\", \"c_proj\", "
        "\"c_fc\", or a longer suffix of a module's name such as \"attn.c_proj\"; a regular "
        "expression is not supported)");
  }
  for (const nlohmann::json& t : *targets) {
    const std::string name = t.is_string() ? t.get<std::string>() : t.dump();
    if (!t.is_string() || !NamesSomeModule(name)) {
      return bad(absl::StrCat(
          "target_modules names \"", EscapeBytes(name),
          "\"; GPT-2 adapters may target only its blocks' Conv1D layers, named as PEFT matches "
          "them: \"c_attn\", \"c_proj\", \"c_fc\", or a longer suffix of "
          "\"transformer.h.{i}.attn.c_attn\", \"transformer.h.{i}.attn.c_proj\", "
          "\"transformer.h.{i}.mlp.c_fc\" or \"transformer.h.{i}.mlp.c_proj\""));
    }
    c.target_modules.push_back(name);
  }
  // PEFT takes these out of target_modules' matches by the same rule.
  if (auto it = j.find("exclude_modules"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) {
      return bad(absl::StrCat("\"exclude_modules\" is ", it->dump(),
                              "; only a list of module names is supported (a regular expression "
                              "is not)"));
    }
    for (const nlohmann::json& t : *it) {
      if (!t.is_string()) {
        return bad(absl::StrCat("exclude_modules holds ", t.dump(), ", not a module name"));
      }
      c.exclude_modules.push_back(t.get<std::string>());
    }
  }
  auto fifo = j.find("fan_in_fan_out");
  if (fifo == j.end() || !fifo->is_boolean() || !fifo->get<bool>()) {
    return bad(
        "\"fan_in_fan_out\" must be true: GPT-2's layers are Conv1D ([in, out] weights), and "
        "an adapter saved without it was made for another architecture");
  }
  if (auto it = j.find("bias"); it != j.end() && !it->is_null() &&
                                (!it->is_string() || it->get<std::string>() != "none")) {
    return bad(absl::StrCat("\"bias\" is ", it->dump(),
                            "; only \"none\" is supported (adapters that train biases are not)"));
  }
  // PiSSA, OLoRA and CorDA start by moving part of each targeted weight into A and B, LoftQ by
  // quantizing it: the adapter is trained against that changed base, not this one. PEFT saves
  // it as a plain LoRA of the original base only when asked to convert it, and then writes
  // init_lora_weights true. The initialisations accepted leave the base's weights alone.
  if (auto it = j.find("init_lora_weights"); it != j.end() && it->is_string()) {
    const std::string init = it->get<std::string>();
    if (init != "gaussian" && init != "eva" && init != "orthogonal") {
      return bad(absl::StrCat(
          "\"init_lora_weights\" is \"", EscapeBytes(init),
          "\": an adapter so initialised (PiSSA, OLoRA, CorDA, LoftQ) was trained against base "
          "weights that its initialisation changed, so added to the original weights it computes "
          "another model; save it converted to plain LoRA (PEFT's save_pretrained with "
          "path_initial_model_for_weight_conversion, which writes init_lora_weights true)"));
    }
  }
  // Each, set, computes something other than plain LoRA, some with the very tensors plain LoRA
  // has: aLoRA acts only after its invocation tokens, layer_replication reorders the layers,
  // QA-LoRA pools the inputs, BD-LoRA's blocks and Arrow's routing are not plain products.
  for (const char* key :
       {"modules_to_save", "use_dora", "rank_pattern", "alpha_pattern", "layers_to_transform",
        "layers_pattern", "megatron_config", "alora_invocation_tokens", "layer_replication",
        "use_qalora", "use_bdlora", "arrow_config"}) {
    if (!IsUnset(j, key)) {
      return bad(absl::StrCat("\"", key, "\" is set (", j[key].dump(),
                              "); prefixd serves plain LoRA only, without it"));
    }
  }
  if (auto it = j.find("base_model_name_or_path"); it != j.end() && it->is_string()) {
    c.base_model = it->get<std::string>();
  }
  return c;
}

}  // namespace

std::string_view LoraTargetPath(LoraTarget target) {
  switch (target) {
    case LoraTarget::kAttnCAttn:
      return "attn.c_attn";
    case LoraTarget::kAttnCProj:
      return "attn.c_proj";
    case LoraTarget::kMlpCFc:
      return "mlp.c_fc";
    case LoraTarget::kMlpCProj:
      return "mlp.c_proj";
  }
  return "";
}

std::string AdapterDigest(const Digest& config_sha256, const Digest& weights_sha256) {
  Sha256 h;
  h.UpdateLengthPrefixed(kAdapterConfigFile);
  h.Update(config_sha256.data(), config_sha256.size());
  h.UpdateLengthPrefixed(kAdapterWeightsFile);
  h.Update(weights_sha256.data(), weights_sha256.size());
  return DigestHex(h.Final());
}

namespace {

// A file's bytes, at most `max_bytes` of them: a larger file is refused by its size before
// any of it is read (INVALID_ARGUMENT naming the file, its size and `why`).
absl::StatusOr<std::string> ReadCappedFile(const std::string& path, uint64_t max_bytes,
                                           std::string_view why) {
  absl::StatusOr<int> fd = OpenRegularFile(path);
  if (!fd.ok()) return fd.status();
  struct stat st {};
  const bool sized = ::fstat(*fd, &st) == 0;
  if (sized && static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(*fd);
    return absl::InvalidArgumentError(absl::StrCat(
        EscapeBytes(path), ": is ", st.st_size, " bytes, more than ", max_bytes, " (",
        ToAbsl(why), ")"));
  }
  ::close(*fd);
  // Read through the one reader every file goes through; it may have grown meanwhile.
  absl::StatusOr<std::string> bytes = ReadWholeFile(path);
  if (bytes.ok() && bytes->size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(EscapeBytes(path), ": grew past ", max_bytes, " bytes while it was read"));
  }
  return bytes;
}

// The first 8 + N bytes of a safetensors file (N its header length, at most
// kMaxAdapterHeaderBytes), and the file's size.
absl::StatusOr<SafetensorsFile> ReadSafetensorsHeader(const std::string& path,
                                                      uint64_t* file_size) {
  absl::StatusOr<int> fd = OpenRegularFile(path);
  if (!fd.ok()) return fd.status();
  auto read_exactly = [&](char* out, size_t n) {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::read(*fd, out + got, n - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  };
  struct stat st {};
  if (::fstat(*fd, &st) != 0) {
    ::close(*fd);
    return absl::DataLossError(absl::StrCat(EscapeBytes(path), ": cannot stat"));
  }
  *file_size = static_cast<uint64_t>(st.st_size);
  std::string header(8, '\0');
  if (*file_size < 8 || !read_exactly(header.data(), 8)) {
    ::close(*fd);
    return absl::InvalidArgumentError(absl::StrCat(
        EscapeBytes(path), ": file is ", *file_size, " bytes, too short for a safetensors header"));
  }
  const uint64_t n = SafetensorsHeaderLength(
      absl::MakeConstSpan(reinterpret_cast<const std::byte*>(header.data()), 8));
  if (n > kMaxAdapterHeaderBytes || n > *file_size - 8) {
    ::close(*fd);
    return absl::InvalidArgumentError(absl::StrCat(
        EscapeBytes(path), ": header length ", n, " is more than the file's ", *file_size - 8,
        " remaining bytes or than ", kMaxAdapterHeaderBytes, " (an adapter's header is a few KiB)"));
  }
  header.resize(8 + n);
  const bool read = read_exactly(header.data() + 8, n);
  ::close(*fd);
  if (!read) return absl::DataLossError(absl::StrCat(EscapeBytes(path), ": short read"));
  return ParseSafetensorsHeader(
      absl::MakeConstSpan(reinterpret_cast<const std::byte*>(header.data()), header.size()),
      *file_size, path);
}

// What one tensor entry says, or INVALID_ARGUMENT naming it: its name must be an adapter's, of
// a module the config targets, of a float dtype, with a shape of rank r.
absl::StatusOr<TensorName> CheckEntry(const SafetensorsEntry& e, const ParsedConfig& config,
                                      const std::string& weights_path) {
  const int64_t r = config.rank;
  const std::string quoted = absl::StrCat("tensor \"", EscapeBytes(e.name), "\"");
  auto bad = [&](std::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(weights_path, ": ", quoted, " ", ToAbsl(what)));
  };
  const std::optional<TensorName> n = ParseTensorName(e.name);
  if (!n) {
    return bad(absl::StrCat(
        "is not part of a GPT-2 LoRA adapter (expected only ", ToAbsl(kTensorPrefix),
        "{i}.{attn.c_attn|attn.c_proj|mlp.c_fc|mlp.c_proj}.lora_A.weight and .lora_B.weight; "
        "modules_to_save, embeddings and biases are not supported)"));
  }
  if (!Targeted(config.target_modules, config.exclude_modules, n->layer, n->target)) {
    const std::string module = ModuleNameOf(n->layer, n->target);
    return bad(absl::StrCat("belongs to module \"", module, "\", which ",
                            AnyMatches(config.target_modules, module)
                                ? "exclude_modules names"
                                : "target_modules does not name"));
  }
  if (!e.float_dtype) {
    return bad(absl::StrCat("has dtype ", EscapeBytes(e.dtype_name),
                            "; adapter weights must be F32, F16 or BF16"));
  }
  if (e.shape.size() != 2 || (n->is_a ? e.shape[0] : e.shape[1]) != r ||
      (n->is_a ? e.shape[1] : e.shape[0]) < 1) {
    return bad(absl::StrCat("has shape ", ShapeString(e.shape), " but r = ", r, " implies ",
                            n->is_a ? "[r, in] = [" : "[out, r] = [",
                            n->is_a ? absl::StrCat(r, ", in]") : absl::StrCat("out, ", r, "]")));
  }
  return *n;
}

// The adapter's shape from its header alone (no tensor data): every entry checked, layers and
// widths taken from the shapes (no weights), then, with `base`, checked to fit it. So an
// adapter for another model, or with a tensor of layer 999999, is refused before its data is
// read or anything is allocated for its layers.
absl::Status CheckHeader(const SafetensorsFile& st, const ParsedConfig& config,
                         const ModelConfig* base, const std::string& dir,
                         const std::string& weights_path) {
  const int32_t max_layers = base != nullptr ? base->n_layer : kMaxAdapterLayers;
  LoraAdapter shape;
  shape.dir = dir;
  shape.rank = config.rank;
  shape.target_modules = config.target_modules;
  shape.exclude_modules = config.exclude_modules;
  std::map<std::pair<int32_t, int>, std::pair<int64_t, int64_t>> widths;  // (in, out), 0: absent
  for (const SafetensorsEntry& e : st.tensors) {
    absl::StatusOr<TensorName> n = CheckEntry(e, config, weights_path);
    if (!n.ok()) return n.status();
    if (n->layer >= max_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          weights_path, ": has tensors for layer ", n->layer, " but ",
          base != nullptr ? "the base model has " : "a GPT-2 model has at most ", max_layers,
          " layers: the adapter was made for another model"));
    }
    auto& [in, out] = widths[{n->layer, static_cast<int>(n->target)}];
    (n->is_a ? in : out) = n->is_a ? e.shape[1] : e.shape[0];
  }
  if (widths.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(weights_path, ": holds no lora_A/lora_B tensor"));
  }
  for (const auto& [key, w] : widths) {
    if (w.first != 0 && w.second != 0) continue;
    const LoraTarget t = static_cast<LoraTarget>(key.second);
    return absl::InvalidArgumentError(absl::StrCat(
        weights_path, ": missing tensor \"", TensorNameOf(key.first, t, w.first == 0),
        "\" (its pair \"", TensorNameOf(key.first, t, w.first != 0), "\" is there)"));
  }
  if (base == nullptr) return absl::OkStatus();
  shape.layers.resize(widths.rbegin()->first.first + 1);
  for (const auto& [key, w] : widths) {
    LoraModule& m = shape.layers[key.first][key.second];
    m.in = w.first;
    m.out = w.second;
  }
  return CheckLoraAdapterFits(shape, *base);
}

absl::StatusOr<std::unique_ptr<LoraAdapter>> ParseLoraAdapterFor(const std::string& dir,
                                                                 const ModelConfig* base) {
  const std::string config_path = absl::StrCat(dir, "/", ToAbsl(kAdapterConfigFile));
  const std::string weights_path = absl::StrCat(dir, "/", ToAbsl(kAdapterWeightsFile));
  absl::StatusOr<std::string> config_text =
      ReadCappedFile(config_path, kMaxAdapterConfigBytes, "an adapter's config is a few KiB");
  if (!config_text.ok()) {
    if (config_text.status().code() != absl::StatusCode::kNotFound) return config_text.status();
    return absl::NotFoundError(absl::StrCat(config_text.status().message(),
                                            " (a LoRA adapter directory holds ",
                                            ToAbsl(kAdapterConfigFile), " and ",
                                            ToAbsl(kAdapterWeightsFile), ")"));
  }
  absl::StatusOr<ParsedConfig> config = ParseAdapterConfig(*config_text, config_path);
  if (!config.ok()) return config.status();
  // The header first: names, shapes and (with a base) the fit, and the file's size against
  // what this rank can need, before a byte of tensor data is read.
  uint64_t file_size = 0;
  absl::StatusOr<SafetensorsFile> header = ReadSafetensorsHeader(weights_path, &file_size);
  if (!header.ok()) return header.status();
  if (absl::Status s = CheckHeader(*header, *config, base, dir, weights_path); !s.ok()) return s;
  // Tiled tensors that fit the base already bound the size; this says so outright.
  if (base != nullptr) {
    const uint64_t cap = MaxAdapterWeightsBytes(*base, config->rank);
    if (file_size > cap) {
      return absl::InvalidArgumentError(absl::StrCat(
          weights_path, ": is ", file_size, " bytes, more than an adapter of rank ", config->rank,
          " for this base can need (", cap, ": every module of every layer in F32, and a header)"));
    }
  }
  absl::StatusOr<std::string> weights = ReadCappedFile(
      weights_path, base != nullptr ? MaxAdapterWeightsBytes(*base, config->rank) : file_size,
      "the size it had when its header was read");
  if (!weights.ok()) return weights.status();
  const auto* bytes = reinterpret_cast<const std::byte*>(weights->data());
  absl::StatusOr<SafetensorsFile> st = ParseSafetensors({bytes, weights->size()}, weights_path);
  if (!st.ok()) return st.status();

  auto adapter = std::make_unique<LoraAdapter>();
  adapter->dir = dir;
  adapter->rank = config->rank;
  adapter->lora_alpha = config->alpha;
  adapter->use_rslora = config->use_rslora;
  adapter->scaling = config->use_rslora
                         ? config->alpha / std::sqrt(static_cast<float>(config->rank))
                         : config->alpha / static_cast<float>(config->rank);
  adapter->target_modules = config->target_modules;
  adapter->exclude_modules = config->exclude_modules;
  adapter->base_model_name_or_path = config->base_model;
  const int64_t r = config->rank;

  // Each (layer, target)'s A and B as found; pairs are checked after the loop.
  struct Pair {
    const SafetensorsEntry* a = nullptr;
    const SafetensorsEntry* b = nullptr;
    double max_abs_a = 0;
    double max_abs_b = 0;
  };
  std::map<std::pair<int32_t, int>, Pair> pairs;
  for (const SafetensorsEntry& e : st->tensors) {
    const std::string quoted = absl::StrCat("tensor \"", EscapeBytes(e.name), "\"");
    auto bad = [&](std::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(weights_path, ": ", quoted, " ", ToAbsl(what)));
    };
    // Checked from the header already; the file is read again, so once more.
    absl::StatusOr<TensorName> n = CheckEntry(e, *config, weights_path);
    if (!n.ok()) return n.status();
    if (n->layer >= kMaxAdapterLayers) return bad("is of a layer past any GPT-2's");
    const std::byte* data = bytes + st->data_start + e.begin;
    if (const int64_t i = FirstNonFinite(e.dtype, {data, e.end - e.begin}); i >= 0) {
      const float f = ElementAsFloat(e.dtype, data, i);
      return bad(absl::StrCat("holds ", std::isnan(f) ? "NaN" : (f > 0 ? "+Inf" : "-Inf"),
                              " at element ", i, ": the adapter is corrupt"));
    }
    double max_abs = 0;
    const int64_t count = static_cast<int64_t>(e.end - e.begin) / DTypeSize(e.dtype);
    for (int64_t i = 0; i < count; ++i) {
      const double v = std::fabs(ElementAsFloat(e.dtype, data, i));
      if (v > kMaxAbsLoraWeight) {
        return bad(absl::StrCat("holds ", ElementAsFloat(e.dtype, data, i), " at element ", i,
                                ": adapter weights must lie in [-", kMaxAbsLoraWeight, ", ",
                                kMaxAbsLoraWeight,
                                "] (larger ones overflow float in the forward pass)"));
      }
      max_abs = std::max(max_abs, v);
    }
    Pair& p = pairs[{n->layer, static_cast<int>(n->target)}];
    (n->is_a ? p.a : p.b) = &e;
    (n->is_a ? p.max_abs_a : p.max_abs_b) = max_abs;
  }
  if (pairs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(weights_path, ": holds no lora_A/lora_B tensor"));
  }
  const int32_t n_layers = pairs.rbegin()->first.first + 1;
  adapter->layers.resize(n_layers);
  for (const auto& [key, p] : pairs) {
    const LoraTarget t = static_cast<LoraTarget>(key.second);
    if (p.a == nullptr || p.b == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          weights_path, ": missing tensor \"", TensorNameOf(key.first, t, p.a == nullptr),
          "\" (its pair \"", TensorNameOf(key.first, t, p.a != nullptr), "\" is there)"));
    }
    const double update = std::fabs(static_cast<double>(adapter->scaling)) *
                          static_cast<double>(r) * p.max_abs_a * p.max_abs_b;
    if (update > kMaxLoraUpdate) {
      return absl::InvalidArgumentError(absl::StrCat(
          weights_path, ": tensors \"", TensorNameOf(key.first, t, true), "\" and \".lora_B\" ",
          "can change a weight by up to ", update, " (|scaling| ", adapter->scaling, " x r ", r,
          " x max|A| ", p.max_abs_a, " x max|B| ", p.max_abs_b, "): at most ", kMaxLoraUpdate,
          " is accepted (a larger update overflows float in the forward pass)"));
    }
    LoraModule& m = adapter->layers[key.first][key.second];
    m.in = p.a->shape[1];
    m.out = p.b->shape[0];
    m.a_t.resize(static_cast<size_t>(m.in * r));
    m.b_t.resize(static_cast<size_t>(r * m.out));
    const std::byte* a = bytes + st->data_start + p.a->begin;
    const std::byte* b = bytes + st->data_start + p.b->begin;
    for (int64_t j = 0; j < r; ++j) {
      for (int64_t k = 0; k < m.in; ++k) m.a_t[k * r + j] = ElementAsFloat(p.a->dtype, a, j * m.in + k);
    }
    for (int64_t o = 0; o < m.out; ++o) {
      for (int64_t j = 0; j < r; ++j) m.b_t[j * m.out + o] = ElementAsFloat(p.b->dtype, b, o * r + j);
    }
    adapter->num_parameters += (m.in + m.out) * r;
  }
  // Identity from the very bytes that were parsed.
  adapter->digest = AdapterDigest(Sha256Of(*config_text), Sha256Of(*weights));
  return adapter;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LoraAdapter>> ParseLoraAdapter(const std::string& dir) {
  return ParseLoraAdapterFor(dir, nullptr);
}

uint64_t MaxAdapterWeightsBytes(const ModelConfig& base, int32_t rank) {
  // Σ over the four targets of (in + out) = (e + 3e) + (e + e) + (e + 4e) + (4e + e) = 16e.
  const uint64_t per_layer = 16 * static_cast<uint64_t>(base.n_embd);
  return 8 + kMaxAdapterHeaderBytes +
         static_cast<uint64_t>(base.n_layer) * per_layer * static_cast<uint64_t>(rank) * 4;
}

absl::Status CheckLoraAdapterFits(const LoraAdapter& adapter, const ModelConfig& base) {
  const std::string weights_path = absl::StrCat(adapter.dir, "/", ToAbsl(kAdapterWeightsFile));
  const int32_t layers = static_cast<int32_t>(adapter.layers.size());
  if (layers > base.n_layer) {
    return absl::InvalidArgumentError(absl::StrCat(
        weights_path, ": has tensors for layer ", layers - 1, " but the base model has ",
        base.n_layer, " layers: the adapter was made for another model"));
  }
  const int64_t e = base.n_embd;
  const std::array<std::pair<int64_t, int64_t>, kNumLoraTargets> widths = {
      std::pair<int64_t, int64_t>{e, 3 * e}, {e, e}, {e, 4 * e}, {4 * e, e}};
  for (int32_t i = 0; i < base.n_layer; ++i) {
    for (int t = 0; t < kNumLoraTargets; ++t) {
      const LoraTarget target = static_cast<LoraTarget>(t);
      const LoraModule* m = adapter.module(i, target);
      if (m == nullptr) {
        if (!Targeted(adapter.target_modules, adapter.exclude_modules, i, target)) continue;
        return absl::InvalidArgumentError(
            absl::StrCat(weights_path, ": missing tensor \"", TensorNameOf(i, target, true),
                         "\" (target_modules names the base's module \"", ModuleNameOf(i, target),
                         "\", so PEFT gives it a lora_A and a lora_B)"));
      }
      const auto [in, out] = widths[t];
      if (m->in != in || m->out != out) {
        return absl::InvalidArgumentError(absl::StrCat(
            weights_path, ": tensors \"", TensorNameOf(i, target, true), "\" and \".lora_B\" are ",
            ShapeString({adapter.rank, m->in}), " and ", ShapeString({m->out, adapter.rank}),
            " but the base model (n_embd ", e, ") needs ", ShapeString({adapter.rank, in}),
            " and ", ShapeString({out, adapter.rank}), ": the adapter was made for another model"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const LoraAdapter>> LoadLoraAdapter(const std::string& dir,
                                                                   const ModelConfig& base) {
  absl::StatusOr<std::unique_ptr<LoraAdapter>> adapter = ParseLoraAdapterFor(dir, &base);
  if (!adapter.ok()) return adapter.status();
  if (absl::Status s = CheckLoraAdapterFits(**adapter, base); !s.ok()) return s;
  return std::shared_ptr<const LoraAdapter>(*std::move(adapter));
}

}  // namespace prefixd
