// prefixd-model inspect DIR: validates a model directory, or a LoRA adapter directory (one
// holding adapter_config.json; with --base MODEL_DIR also checked against that model), and
// prints what it is.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "cache/kv_layout.h"
#include "engine/lora_adapter.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/command_line.h"
#include "tools/commands.h"

namespace prefixd::tools {
namespace {

int InspectAdapter(const std::string& dir, const std::optional<std::string>& base) {
  absl::StatusOr<std::unique_ptr<LoraAdapter>> adapter = ParseLoraAdapter(dir);
  if (!adapter.ok()) return ReportError(adapter.status());
  const LoraAdapter& a = **adapter;
  nlohmann::json out = {
      {"kind", "lora_adapter"},
      {"dir", a.dir},
      {"adapter_sha256", a.digest},
      {"rank", a.rank},
      {"lora_alpha", a.lora_alpha},
      {"use_rslora", a.use_rslora},
      {"scaling", a.scaling},
      {"target_modules", a.target_modules},
      {"base_model_name_or_path", a.base_model_name_or_path},
      {"layers", a.layers.size()},
      {"parameters", a.num_parameters},
      {"memory_bytes", a.memory_bytes()},
  };
  if (base) {
    absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(*base);
    if (!model.ok()) return ReportError(model.status());
    if (absl::Status s = CheckLoraAdapterFits(a, (*model)->config()); !s.ok()) {
      return ReportError(s);
    }
    out["base"] = {{"dir", (*model)->dir()}, {"manifest_sha256", (*model)->manifest_sha256()}};
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

int RunInspectCommand(absl::Span<char* const> args) {
  static constexpr FlagSpec kFlags[] = {{"base"}};
  absl::StatusOr<ParsedCommandLine> parsed = ParseArgv(args, kFlags);
  if (!parsed.ok()) return ReportError(parsed.status(), kExitUsage);
  if (parsed->positional.size() != 1) {
    return ReportError(absl::InvalidArgumentError("usage: prefixd-model inspect DIR [--base DIR]"),
                       kExitUsage);
  }
  std::error_code ec;
  if (std::filesystem::exists(
          std::filesystem::path(parsed->positional[0]) / std::string(kAdapterConfigFile), ec)) {
    return InspectAdapter(parsed->positional[0], parsed->Flag("base"));
  }
  if (parsed->Has("base")) {
    return ReportError(absl::InvalidArgumentError(absl::StrCat(
                           "--base is for adapter directories; ", parsed->positional[0],
                           " holds no ", std::string(kAdapterConfigFile))),
                       kExitUsage);
  }
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(parsed->positional[0]);
  if (!model.ok()) return ReportError(model.status());
  const Model& m = **model;
  const ModelConfig& c = m.config();
  nlohmann::json out = {
      {"name", m.name()},
      {"dir", m.dir()},
      {"manifest_sha256", m.manifest_sha256()},
      {"parameters", m.num_parameters()},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_embd", c.n_embd},
      {"head_dim", c.head_dim()},
      {"vocab_size", c.vocab_size},
      {"tokenizer_vocab_size", m.tokenizer().vocab_size()},
      {"context_length", c.n_positions},
      {"dtype", std::string(DTypeName(m.dtype()))},
      {"tied_lm_head", m.Find("lm_head.weight") == nullptr},
      // 7 significant digits: the float's decimal spelling ("1e-05"), not its binary value.
      {"layer_norm_epsilon", std::stod(absl::StrFormat("%.7g", c.layer_norm_epsilon))},
      {"activation_function", c.activation_function},
      // KV stored in the weights' dtype, as the backends do by default.
      {"kv_bytes_per_token",
       KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), DTypeSize(m.dtype()))},
  };
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace prefixd::tools
