#include "tools/command_line.h"

#include <cstdio>

namespace prefixd::tools {

int ReportError(const absl::Status& status, int exit_code) {
  std::string message(status.message());
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';  // one line, whatever the message holds
  }
  std::fprintf(stderr, "prefixd-model: %s\n", message.c_str());
  return exit_code;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelDirTokenizer(const std::string& dir) {
  return Tokenizer::Load(dir + "/vocab.json", dir + "/merges.txt");
}

}  // namespace prefixd::tools
