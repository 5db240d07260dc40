// What prefixd-model's subcommands share besides the command-line parser (which is
// base/command_line.h, shared with prefixctl): exit codes, the one-line error report, and
// loading a model directory's tokenizer.
#ifndef PREFIXD_TOOLS_COMMAND_LINE_H_
#define PREFIXD_TOOLS_COMMAND_LINE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/command_line.h"
#include "engine/tokenizer.h"

namespace prefixd::tools {

// Exit codes: 0 success, 1 the operation failed (bad model, unreadable file), 2 usage.
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// Prints "prefixd-model: <message>" as one line on stderr; returns the exit code
// (kExitUsage for INVALID_ARGUMENT raised by argument parsing is the caller's choice).
int ReportError(const absl::Status& status, int exit_code = kExitFailure);

// The tokenizer of a model directory (DIR/vocab.json, DIR/merges.txt), without loading
// the weights: tokenize and detokenize need nothing else.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelDirTokenizer(const std::string& dir);

}  // namespace prefixd::tools

#endif  // PREFIXD_TOOLS_COMMAND_LINE_H_
