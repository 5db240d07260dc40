// prefixd-model detokenize DIR IDS: prints the text of comma-separated token ids.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/tokenizer.h"
#include "tools/command_line.h"
#include "tools/commands.h"

namespace prefixd::tools {

int RunDetokenizeCommand(absl::Span<char* const> args) {
  absl::StatusOr<ParsedCommandLine> parsed = ParseArgv(args, {});
  if (!parsed.ok()) return ReportError(parsed.status(), kExitUsage);
  if (parsed->positional.size() != 2) {
    return ReportError(
        absl::InvalidArgumentError("usage: prefixd-model detokenize DIR IDS (e.g. 15496,995)"),
        kExitUsage);
  }
  absl::StatusOr<std::vector<uint32_t>> ids = ParseIdList(parsed->positional[1], "token id");
  if (!ids.ok()) return ReportError(ids.status(), kExitUsage);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadModelDirTokenizer(parsed->positional[0]);
  if (!tokenizer.ok()) return ReportError(tokenizer.status());
  absl::StatusOr<std::string> text = (*tokenizer)->Decode(*ids);
  if (!text.ok()) return ReportError(text.status());
  // The decoded bytes exactly (possibly a partial UTF-8 character), then a newline.
  std::fwrite(text->data(), 1, text->size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace prefixd::tools
