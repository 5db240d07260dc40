#include "tools/command_line.h"

#include <charconv>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace prefixd::tools {
namespace {

absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

std::optional<std::string> ParsedArgs::Flag(std::string_view name) const {
  auto it = flags.find(name);
  if (it == flags.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<ParsedArgs> ParseArgs(absl::Span<char* const> args,
                                     absl::Span<const std::string_view> known_flags) {
  ParsedArgs out;
  bool flags_done = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (flags_done || a.size() < 3 || a.substr(0, 2) != "--") {
      out.positional.emplace_back(a);
      continue;
    }
    if (a == "--") {
      flags_done = true;
      continue;
    }
    a.remove_prefix(2);
    std::string_view name = a;
    std::optional<std::string> value;
    if (size_t eq = a.find('='); eq != std::string_view::npos) {
      name = a.substr(0, eq);
      value = std::string(a.substr(eq + 1));
    }
    bool known = false;
    for (std::string_view k : known_flags) known = known || k == name;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", ToAbsl(name)));
    }
    if (!value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", ToAbsl(name), " needs a value"));
      }
      value = args[++i];
    }
    if (!out.flags.emplace(std::string(name), *value).second) {
      return absl::InvalidArgumentError(absl::StrCat("flag --", ToAbsl(name), " given twice"));
    }
  }
  return out;
}

int ReportError(const absl::Status& status, int exit_code) {
  std::string message(status.message());
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';  // one line, whatever the message holds
  }
  std::fprintf(stderr, "prefixd-model: %s\n", message.c_str());
  return exit_code;
}

absl::StatusOr<int64_t> ParseInteger(std::string_view text, std::string_view what, int64_t min,
                                     int64_t max) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(what), " \"", ToAbsl(text), "\" is not an integer"));
  }
  if (v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(what), " ", v, " is out of range [", min, ", ", max, "]"));
  }
  return v;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelDirTokenizer(const std::string& dir) {
  return Tokenizer::Load(dir + "/vocab.json", dir + "/merges.txt");
}

}  // namespace prefixd::tools
