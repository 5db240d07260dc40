#include "base/command_line.h"

#include <charconv>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace prefixd {
namespace {

// absl 20220623 may be built with its own string_view.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status Bad(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

}  // namespace

CommandLineReader::CommandLineReader(std::vector<std::string> words, RepeatedFlags repeated)
    : words_(std::move(words)), repeated_(repeated) {
  SkipDoubleDash();
}

void CommandLineReader::SkipDoubleDash() {
  if (!flags_ended_ && next_ < words_.size() && words_[next_] == "--") {
    flags_ended_ = true;
    ++next_;
  }
}

absl::StatusOr<CommandLineArg> CommandLineReader::Next(absl::Span<const FlagSpec> flags,
                                                       std::string_view unknown_flag_hint) {
  absl::StatusOr<CommandLineArg> arg = ReadArg(flags, unknown_flag_hint);
  SkipDoubleDash();
  return arg;
}

absl::StatusOr<CommandLineArg> CommandLineReader::ReadArg(absl::Span<const FlagSpec> flags,
                                                          std::string_view unknown_flag_hint) {
  CommandLineArg arg;
  std::string_view word = words_[next_++];
  if (flags_ended_ || word.size() < 3 || word.substr(0, 2) != "--") {
    arg.value = std::string(word);
    arg.after_double_dash = flags_ended_;
    return arg;
  }
  word.remove_prefix(2);
  std::string_view name = word;
  std::optional<std::string_view> value;
  if (size_t eq = word.find('='); eq != std::string_view::npos) {
    name = word.substr(0, eq);
    value = word.substr(eq + 1);
  }
  const FlagSpec* spec = nullptr;
  for (const FlagSpec& f : flags) {
    if (f.name == name) spec = &f;
  }
  if (spec == nullptr) {
    return Bad(absl::StrCat("unknown flag --", ToAbsl(name), ToAbsl(unknown_flag_hint)));
  }
  if (spec->kind == FlagKind::kSwitch) {
    if (value.has_value()) return Bad(absl::StrCat("--", ToAbsl(name), " takes no value"));
  } else if (!value.has_value()) {
    if (Done()) return Bad(absl::StrCat("flag --", ToAbsl(name), " needs a value"));
    value = words_[next_++];
  }
  if (!seen_.emplace(name).second && repeated_ == RepeatedFlags::kReject) {
    return Bad(absl::StrCat("flag --", ToAbsl(name), " given twice"));
  }
  arg.flag = std::string(name);
  arg.value = std::string(value.value_or(""));
  return arg;
}

std::optional<std::string> ParsedCommandLine::Flag(std::string_view name) const {
  auto it = flags.find(name);
  if (it == flags.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<ParsedCommandLine> ParseCommandLine(std::vector<std::string> words,
                                                   absl::Span<const FlagSpec> flags) {
  ParsedCommandLine out;
  CommandLineReader reader(std::move(words), RepeatedFlags::kReject);
  while (!reader.Done()) {
    absl::StatusOr<CommandLineArg> arg = reader.Next(flags);
    if (!arg.ok()) return arg.status();
    if (arg->flag.has_value()) {
      out.flags.emplace(*arg->flag, std::move(arg->value));
    } else {
      out.positional.push_back(std::move(arg->value));
    }
  }
  return out;
}

absl::StatusOr<ParsedCommandLine> ParseArgv(absl::Span<char* const> words,
                                            absl::Span<const FlagSpec> flags) {
  return ParseCommandLine(std::vector<std::string>(words.begin(), words.end()), flags);
}

absl::StatusOr<int64_t> ParseInteger(std::string_view text, std::string_view what, int64_t min,
                                     int64_t max) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return Bad(absl::StrCat(ToAbsl(what), " \"", ToAbsl(text), "\" is not an integer"));
  }
  if (v < min || v > max) {
    return Bad(absl::StrCat(ToAbsl(what), " ", v, " is out of range [", min, ", ", max, "]"));
  }
  return v;
}

namespace {

template <typename T>
absl::StatusOr<T> ParseNonNegative(std::string_view text, std::string_view what) {
  T v;
  if (!absl::SimpleAtoi(ToAbsl(text), &v)) {
    return Bad(
        absl::StrCat(ToAbsl(what), " expects a non-negative integer, got \"", ToAbsl(text), "\""));
  }
  return v;
}

}  // namespace

absl::StatusOr<uint32_t> ParseNonNegativeU32(std::string_view text, std::string_view what) {
  return ParseNonNegative<uint32_t>(text, what);
}

absl::StatusOr<uint64_t> ParseNonNegativeU64(std::string_view text, std::string_view what) {
  return ParseNonNegative<uint64_t>(text, what);
}

absl::StatusOr<float> ParseFiniteFloat(std::string_view text, std::string_view what) {
  float v;
  if (!absl::SimpleAtof(ToAbsl(text), &v) || !std::isfinite(v)) {
    return Bad(absl::StrCat(ToAbsl(what), " expects a number, got \"", ToAbsl(text), "\""));
  }
  return v;
}

absl::StatusOr<std::vector<uint32_t>> ParseIdList(std::string_view text, std::string_view what) {
  std::vector<uint32_t> ids;
  for (absl::string_view piece : absl::StrSplit(ToAbsl(text), ',')) {
    const absl::string_view entry = absl::StripAsciiWhitespace(piece);
    absl::StatusOr<int64_t> id =
        ParseInteger(std::string_view(entry.data(), entry.size()), what, 0, UINT32_MAX);
    if (!id.ok()) return id.status();
    ids.push_back(static_cast<uint32_t>(*id));
  }
  return ids;
}

}  // namespace prefixd
