// prefixd-model detokenize DIR IDS: prints the text of comma-separated token ids.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/tokenizer.h"
#include "tools/command_line.h"
#include "tools/commands.h"

namespace prefixd::tools {

int RunDetokenizeCommand(absl::Span<char* const> args) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, {});
  if (!parsed.ok()) return ReportError(parsed.status(), kExitUsage);
  if (parsed->positional.size() != 2) {
    return ReportError(
        absl::InvalidArgumentError("usage: prefixd-model detokenize DIR IDS (e.g. 15496,995)"),
        kExitUsage);
  }
  std::vector<uint32_t> ids;
  for (absl::string_view piece : absl::StrSplit(parsed->positional[1], ',')) {
    std::string word(absl::StripAsciiWhitespace(piece));
    absl::StatusOr<int64_t> id = ParseInteger(word, "token id", 0, UINT32_MAX);
    if (!id.ok()) return ReportError(id.status(), kExitUsage);
    ids.push_back(static_cast<uint32_t>(*id));
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadModelDirTokenizer(parsed->positional[0]);
  if (!tokenizer.ok()) return ReportError(tokenizer.status());
  absl::StatusOr<std::string> text = (*tokenizer)->Decode(ids);
  if (!text.ok()) return ReportError(text.status());
  // The decoded bytes exactly (possibly a partial UTF-8 character), then a newline.
  std::fwrite(text->data(), 1, text->size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace prefixd::tools
