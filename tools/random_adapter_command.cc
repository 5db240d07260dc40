// prefixd-model random-adapter: writes a random PEFT LoRA adapter for a model directory
// (tools/random_adapter.h).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/lora_adapter.h"
#include "engine/model.h"
#include "tools/command_line.h"
#include "tools/commands.h"
#include "tools/random_adapter.h"

namespace prefixd::tools {

int RunRandomAdapterCommand(absl::Span<char* const> args) {
  static constexpr FlagSpec kFlags[] = {{"base"},  {"out"},     {"rank"},
                                        {"seed"},  {"alpha"},   {"targets"},
                                        {"rslora", FlagKind::kSwitch}};
  absl::StatusOr<ParsedCommandLine> parsed = ParseArgv(args, kFlags);
  if (!parsed.ok()) return ReportError(parsed.status(), kExitUsage);
  if (!parsed->positional.empty()) {
    return ReportError(absl::InvalidArgumentError(absl::StrCat(
                           "random-adapter takes no positional argument (got \"",
                           parsed->positional[0], "\"); use --base DIR --out DIR")),
                       kExitUsage);
  }
  const std::optional<std::string> base = parsed->Flag("base");
  const std::optional<std::string> out = parsed->Flag("out");
  if (!base || base->empty() || !out || out->empty()) {
    return ReportError(absl::InvalidArgumentError("random-adapter needs --base DIR and --out DIR"),
                       kExitUsage);
  }
  RandomAdapterOptions options;
  if (std::optional<std::string> v = parsed->Flag("rank")) {
    absl::StatusOr<int64_t> n = ParseInteger(*v, "--rank", 1, 4096);
    if (!n.ok()) return ReportError(n.status(), kExitUsage);
    options.rank = static_cast<int32_t>(*n);
  }
  options.lora_alpha = 2.0f * static_cast<float>(options.rank);  // scaling 2, a common choice
  if (std::optional<std::string> v = parsed->Flag("alpha")) {
    float alpha = 0;
    if (!absl::SimpleAtof(*v, &alpha) || !std::isfinite(alpha)) {
      return ReportError(absl::InvalidArgumentError(
                             absl::StrCat("--alpha must be a number, got \"", *v, "\"")),
                         kExitUsage);
    }
    options.lora_alpha = alpha;
  }
  if (std::optional<std::string> v = parsed->Flag("seed")) {
    absl::StatusOr<int64_t> n = ParseInteger(*v, "--seed", 0, INT64_MAX);
    if (!n.ok()) return ReportError(n.status(), kExitUsage);
    options.seed = static_cast<uint64_t>(*n);
  }
  if (std::optional<std::string> v = parsed->Flag("targets")) {
    options.target_modules = absl::StrSplit(*v, ',');
  }
  options.use_rslora = parsed->Has("rslora");
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(*base);
  if (!model.ok()) return ReportError(model.status());
  options.base_model_name_or_path = (*model)->name();
  if (absl::Status s = WriteRandomAdapter(*out, (*model)->config(), options); !s.ok()) {
    return ReportError(s, s.code() == absl::StatusCode::kInvalidArgument ? kExitUsage
                                                                         : kExitFailure);
  }
  // Read back through the loader, so what was written is known to load.
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> adapter =
      LoadLoraAdapter(*out, (*model)->config());
  if (!adapter.ok()) return ReportError(adapter.status());
  std::printf("wrote %s (rank %d, alpha %g, %lld parameters, digest %s)\n", out->c_str(),
              options.rank, static_cast<double>(options.lora_alpha),
              static_cast<long long>((*adapter)->num_parameters), (*adapter)->digest.c_str());
  return 0;
}

}  // namespace prefixd::tools
