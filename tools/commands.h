// prefixd-model's subcommands, one file each (tools/<name>_command.cc). Each takes the words
// after its name and returns the process exit code (tools/command_line.h).
#ifndef PREFIXD_TOOLS_COMMANDS_H_
#define PREFIXD_TOOLS_COMMANDS_H_

#include "absl/types/span.h"

namespace prefixd::tools {

int RunRandomCommand(absl::Span<char* const> args);
int RunRandomAdapterCommand(absl::Span<char* const> args);
int RunInspectCommand(absl::Span<char* const> args);
int RunTokenizeCommand(absl::Span<char* const> args);
int RunDetokenizeCommand(absl::Span<char* const> args);
int RunGenerateCommand(absl::Span<char* const> args);  // tools/generate_command.cc

}  // namespace prefixd::tools

#endif  // PREFIXD_TOOLS_COMMANDS_H_
