// prefixd-model random: writes a random GPT-2 directory (tools/random_model.h).
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/dtype.h"
#include "engine/model_config.h"
#include "tools/command_line.h"
#include "tools/commands.h"
#include "tools/random_model.h"

namespace prefixd::tools {

int RunRandomCommand(absl::Span<char* const> args) {
  static constexpr FlagSpec kFlags[] = {{"out"},   {"preset"},       {"layers"},    {"heads"},
                                        {"embd"},  {"vocab"},        {"positions"}, {"seed"},
                                        {"dtype"}, {"tokenizer-dir"}};
  absl::StatusOr<ParsedCommandLine> parsed = ParseArgv(args, kFlags);
  if (!parsed.ok()) return ReportError(parsed.status(), kExitUsage);
  if (!parsed->positional.empty()) {
    return ReportError(
        absl::InvalidArgumentError(absl::StrCat("random takes no positional argument (got \"",
                                                parsed->positional[0], "\"); use --out DIR")),
        kExitUsage);
  }
  RandomModelOptions options;
  std::optional<std::string> out = parsed->Flag("out");
  if (!out || out->empty()) {
    return ReportError(absl::InvalidArgumentError("random needs --out DIR"), kExitUsage);
  }
  options.out_dir = *out;

  const std::string preset = parsed->Flag("preset").value_or("tiny");
  std::optional<ModelConfig> config = PresetModelConfig(preset);
  if (!config) {
    return ReportError(absl::InvalidArgumentError(absl::StrCat("unknown --preset \"", preset,
                                                               "\" (expected tiny or gpt2)")),
                       kExitUsage);
  }
  options.config = *config;
  // Shape overrides on top of the preset; the loader's validation checks the result.
  const std::pair<const char*, int32_t*> overrides[] = {{"layers", &options.config.n_layer},
                                                        {"heads", &options.config.n_head},
                                                        {"embd", &options.config.n_embd},
                                                        {"vocab", &options.config.vocab_size},
                                                        {"positions", &options.config.n_positions}};
  for (const auto& [flag, field] : overrides) {
    if (std::optional<std::string> v = parsed->Flag(flag)) {
      absl::StatusOr<int64_t> n = ParseInteger(*v, absl::StrCat("--", flag), 1, INT32_MAX);
      if (!n.ok()) return ReportError(n.status(), kExitUsage);
      *field = static_cast<int32_t>(*n);
    }
  }
  if (std::optional<std::string> v = parsed->Flag("seed")) {
    absl::StatusOr<int64_t> n = ParseInteger(*v, "--seed", 0, INT64_MAX);
    if (!n.ok()) return ReportError(n.status(), kExitUsage);
    options.seed = static_cast<uint64_t>(*n);
  }
  const std::string dtype_name = parsed->Flag("dtype").value_or("f32");
  std::optional<DType> dtype = ParseDType(dtype_name);
  if (!dtype || *dtype == DType::kI8) {
    return ReportError(absl::InvalidArgumentError(absl::StrCat("unknown --dtype \"", dtype_name,
                                                               "\" (expected f32, f16 or bf16)")),
                       kExitUsage);
  }
  options.dtype = *dtype;
  options.tokenizer_dir = parsed->Flag("tokenizer-dir").value_or("");

  if (absl::Status s = WriteRandomModel(options); !s.ok()) return ReportError(s);
  std::printf("wrote %s (%d layers, %d heads, n_embd %d, %d positions, vocab %d, %s, seed %llu)\n",
              options.out_dir.c_str(), options.config.n_layer, options.config.n_head,
              options.config.n_embd, options.config.n_positions, options.config.vocab_size,
              std::string(DTypeName(options.dtype)).c_str(),
              static_cast<unsigned long long>(options.seed));
  return 0;
}

}  // namespace prefixd::tools
