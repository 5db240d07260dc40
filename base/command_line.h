// The command-line parser of prefixctl and prefixd-model (the server uses absl flags: one
// global flag set suits it, while these tools have a small flag set per command). Words are
// read left to right:
//   "--name value" or "--name=value"  a flag that takes a value (the next word is its value,
//                                     whatever it looks like);
//   "--name"                          a switch (a flag that takes no value, such as --json);
//   "--"                              ends the flags: every later word is positional, even
//                                     one that starts with "--";
//   anything else                     a positional word ("-", "-h" and "--" + nothing included).
// Every mistake is one INVALID_ARGUMENT line that names the flag: "unknown flag --x",
// "flag --x needs a value", "--x takes no value", "flag --x given twice".
#ifndef PREFIXD_BASE_COMMAND_LINE_H_
#define PREFIXD_BASE_COMMAND_LINE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace prefixd {

enum class FlagKind { kValue, kSwitch };

struct FlagSpec {
  std::string_view name;  // without "--"
  FlagKind kind = FlagKind::kValue;
};

// One word (or, for "--name value", two words) of the command line.
struct CommandLineArg {
  std::optional<std::string> flag;  // the flag's name without "--"; empty: a positional word
  std::string value;                // the flag's value ("" for a switch), or the word itself
  bool after_double_dash = false;   // a positional word that came after "--"
};

// Whether a flag may appear more than once (each occurrence is then returned, so the caller
// decides; prefixctl lets the last one win).
enum class RepeatedFlags { kReject, kAllow };

// Reads a command line one argument at a time, so that the known flags may change on the way
// (prefixctl's flags depend on its command, which comes first).
class CommandLineReader {
 public:
  CommandLineReader(std::vector<std::string> words, RepeatedFlags repeated);

  bool Done() const { return next_ >= words_.size(); }

  // The next argument; a flag must be in `flags`. `unknown_flag_hint` is appended to the
  // "unknown flag --x" error (e.g. " (see prefixctl --help)"). Must not be called when Done().
  absl::StatusOr<CommandLineArg> Next(absl::Span<const FlagSpec> flags,
                                      std::string_view unknown_flag_hint = "");

 private:
  absl::StatusOr<CommandLineArg> ReadArg(absl::Span<const FlagSpec> flags,
                                         std::string_view unknown_flag_hint);
  void SkipDoubleDash();  // the first "--" is not an argument: it ends the flags

  std::vector<std::string> words_;
  size_t next_ = 0;
  bool flags_ended_ = false;  // "--" seen
  RepeatedFlags repeated_;
  std::set<std::string, std::less<>> seen_;
};

// A whole command line against one flag set; a flag may appear once.
struct ParsedCommandLine {
  std::vector<std::string> positional;
  std::map<std::string, std::string, std::less<>> flags;  // name without "--" -> value

  std::optional<std::string> Flag(std::string_view name) const;  // nullopt: not given
  bool Has(std::string_view name) const { return flags.find(name) != flags.end(); }
};

absl::StatusOr<ParsedCommandLine> ParseCommandLine(std::vector<std::string> words,
                                                   absl::Span<const FlagSpec> flags);
// argv-style words (e.g. argv + 2 for the words after a subcommand).
absl::StatusOr<ParsedCommandLine> ParseArgv(absl::Span<char* const> words,
                                            absl::Span<const FlagSpec> flags);

// Typed values. `what` names the value in the error (usually the flag, "--max-tokens").

// A decimal integer in [min, max]: `what "text" is not an integer`,
// `what v is out of range [min, max]`.
absl::StatusOr<int64_t> ParseInteger(std::string_view text, std::string_view what, int64_t min,
                                     int64_t max);

// A decimal integer that fits T (uint32_t or uint64_t):
// `what expects a non-negative integer, got "text"`.
absl::StatusOr<uint32_t> ParseNonNegativeU32(std::string_view text, std::string_view what);
absl::StatusOr<uint64_t> ParseNonNegativeU64(std::string_view text, std::string_view what);

// A finite number (no inf, no nan): `what expects a number, got "text"`.
absl::StatusOr<float> ParseFiniteFloat(std::string_view text, std::string_view what);

// Comma-separated token ids ("15496, 995"): whitespace around an entry is allowed, an empty
// entry is not. Each entry is checked as ParseInteger(entry, what, 0, UINT32_MAX), so `what`
// names an entry ("--ids entry", "token id").
absl::StatusOr<std::vector<uint32_t>> ParseIdList(std::string_view text, std::string_view what);

}  // namespace prefixd

#endif  // PREFIXD_BASE_COMMAND_LINE_H_
