// Argument handling shared by prefixd-model's subcommands. Hand-rolled rather than absl
// flags: each subcommand has its own small flag set, and every mistake must end in exactly
// one clear line on stderr.
#ifndef PREFIXD_TOOLS_COMMAND_LINE_H_
#define PREFIXD_TOOLS_COMMAND_LINE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/tokenizer.h"

namespace prefixd::tools {

// Exit codes: 0 success, 1 the operation failed (bad model, unreadable file), 2 usage.
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

struct ParsedArgs {
  std::vector<std::string> positional;
  std::map<std::string, std::string, std::less<>> flags;  // name without "--" -> value

  std::optional<std::string> Flag(std::string_view name) const;
};

// `args` are the words after the subcommand's name. Flags take a value, as "--name value"
// or "--name=value"; `known_flags` lists the names (without "--"). "--" ends the flags, so
// TEXT may start with "--". Errors are INVALID_ARGUMENT, one line.
absl::StatusOr<ParsedArgs> ParseArgs(absl::Span<char* const> args,
                                     absl::Span<const std::string_view> known_flags);

// Prints "prefixd-model: <message>" as one line on stderr; returns the exit code
// (kExitUsage for INVALID_ARGUMENT raised by argument parsing is the caller's choice).
int ReportError(const absl::Status& status, int exit_code = kExitFailure);

// Parses a decimal integer in [min, max]; `what` names it in the error.
absl::StatusOr<int64_t> ParseInteger(std::string_view text, std::string_view what, int64_t min,
                                     int64_t max);

// The tokenizer of a model directory (DIR/vocab.json, DIR/merges.txt), without loading
// the weights: tokenize and detokenize need nothing else.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelDirTokenizer(const std::string& dir);

}  // namespace prefixd::tools

#endif  // PREFIXD_TOOLS_COMMAND_LINE_H_
