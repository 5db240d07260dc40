// prefixctl: the command-line client of prefixd (docs/SERVER.md). Exit codes: 0 success,
// 1 the server could not be reached or a call failed, 2 bad command line.
#include <iostream>
#include <string>
#include <vector>

#include "client/bench.h"
#include "client/cli_args.h"
#include "client/commands.h"
#include "client/connection.h"
#include "client/events.h"

int main(int argc, char** argv) {
  using namespace prefixd;  // NOLINT: a .cc entry point
  absl::StatusOr<CliArgs> args = ParseCliArgs({argv + 1, argv + argc});
  if (!args.ok()) {
    std::cerr << "prefixctl: " << args.status().message() << "\n" << kUsage;
    return 2;
  }
  if (args->command == Command::kHelp) {
    std::cout << kUsage;
    return 0;
  }
  if (args->command == Command::kEvents) return RunEvents(args->events, std::cout, std::cerr);
  absl::StatusOr<std::unique_ptr<Connection>> conn = Connection::Open(*args);
  if (!conn.ok()) {
    std::cerr << "prefixctl: " << conn.status().message() << "\n";
    return 1;
  }
  switch (args->command) {
    case Command::kGenerate:
      return RunGenerate(**conn, *args, std::cout, std::cerr);
    case Command::kTokenize:
      return RunTokenize(**conn, *args, std::cout, std::cerr);
    case Command::kInfo:
      return RunInfo(**conn, *args, std::cout, std::cerr);
    case Command::kStats:
      return RunStats(**conn, *args, std::cout, std::cerr);
    case Command::kBench:
      return RunBench(**conn, *args, std::cout, std::cerr);
    case Command::kHealth:
      return RunHealth(**conn, std::cout, std::cerr);
    case Command::kEvents:
    case Command::kHelp:
      break;
  }
  return 0;
}
