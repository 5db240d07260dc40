// prefixd-model tokenize DIR TEXT | --jsonl FILE: prints token ids as JSON arrays.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/command_line.h"
#include "tools/commands.h"

namespace prefixd::tools {
namespace {

std::string IdsLine(const std::vector<uint32_t>& ids) { return nlohmann::json(ids).dump() + "\n"; }

// Each non-empty line of `in` is one JSON string; prints one array per such line, all at
// the end, so that a bad line fails the whole file instead of leaving half an output.
absl::Status TokenizeJsonl(const Tokenizer& tokenizer, std::istream& in, const std::string& label) {
  std::string line;
  std::string out;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.empty() || line == "\r") continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(label, ":", line_no, ": not a JSON string"));
    }
    out += IdsLine(tokenizer.Encode(j.get<std::string>()));
  }
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(label, ": read error"));
  std::fwrite(out.data(), 1, out.size(), stdout);
  return absl::OkStatus();
}

}  // namespace

int RunTokenizeCommand(absl::Span<char* const> args) {
  static constexpr FlagSpec kFlags[] = {{"jsonl"}};
  absl::StatusOr<ParsedCommandLine> parsed = ParseArgv(args, kFlags);
  if (!parsed.ok()) return ReportError(parsed.status(), kExitUsage);
  const std::optional<std::string> jsonl = parsed->Flag("jsonl");
  const size_t want_positional = jsonl ? 1 : 2;
  if (parsed->positional.size() != want_positional) {
    return ReportError(absl::InvalidArgumentError(
                           "usage: prefixd-model tokenize DIR TEXT, or tokenize DIR --jsonl "
                           "FILE (FILE '-' reads stdin)"),
                       kExitUsage);
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadModelDirTokenizer(parsed->positional[0]);
  if (!tokenizer.ok()) return ReportError(tokenizer.status());
  if (!jsonl) {
    const std::string out = IdsLine((*tokenizer)->Encode(parsed->positional[1]));
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  absl::Status status;
  if (*jsonl == "-") {
    status = TokenizeJsonl(**tokenizer, std::cin, "<stdin>");
  } else {
    std::ifstream in(*jsonl, std::ios::binary);
    if (!in) {
      return ReportError(absl::InvalidArgumentError(absl::StrCat(*jsonl, ": cannot open")));
    }
    status = TokenizeJsonl(**tokenizer, in, *jsonl);
  }
  return status.ok() ? 0 : ReportError(status);
}

}  // namespace prefixd::tools
