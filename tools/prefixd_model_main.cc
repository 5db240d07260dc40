// prefixd-model: the operator tool for model directories. Dispatches to one subcommand;
// each lives in its own file (tools/commands.h).
#include <cstdio>
#include <string_view>

#include "absl/types/span.h"
#include "tools/command_line.h"
#include "tools/commands.h"

namespace {

struct Command {
  std::string_view name;
  int (*run)(absl::Span<char* const> args);
  const char* usage;
};

constexpr Command kCommands[] = {
    {"random", prefixd::tools::RunRandomCommand,
     "random --out DIR [--preset tiny|gpt2] [--layers L --heads H --embd E --vocab V "
     "--positions P] [--seed S] [--dtype f32|f16|bf16] [--tokenizer-dir DIR]"},
    {"random-adapter", prefixd::tools::RunRandomAdapterCommand,
     "random-adapter --base DIR --out DIR [--rank R] [--alpha A] [--seed S] "
     "[--targets c_attn,c_proj,c_fc] [--rslora]"},
    {"inspect", prefixd::tools::RunInspectCommand, "inspect DIR [--base MODEL_DIR]"},
    {"tokenize", prefixd::tools::RunTokenizeCommand, "tokenize DIR (TEXT | --jsonl FILE|-)"},
    {"detokenize", prefixd::tools::RunDetokenizeCommand, "detokenize DIR IDS"},
    {"generate", prefixd::tools::RunGenerateCommand,
     "generate DIR (--ids 1,2,3 | --text TEXT) --max-tokens N [--top-logprobs K] "
     "[--threads T] [--device auto|cpu|cuda] [--ignore-eos] [--json]"},
    // New subcommands go here, one line each: {"name", RunNameCommand, "usage"}, with
    // RunNameCommand declared in tools/commands.h and defined in tools/name_command.cc.
};

void PrintUsage(FILE* out) {
  std::fprintf(out, "usage: prefixd-model COMMAND ...\n");
  for (const Command& c : kCommands) std::fprintf(out, "  prefixd-model %s\n", c.usage);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "prefixd-model: missing command; see prefixd-model --help\n");
    return prefixd::tools::kExitUsage;
  }
  const std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    PrintUsage(stdout);
    return 0;
  }
  for (const Command& c : kCommands) {
    if (c.name == name) return c.run(absl::Span<char* const>(argv + 2, argc - 2));
  }
  std::fprintf(stderr, "prefixd-model: unknown command \"%s\"; see prefixd-model --help\n",
               argv[1]);
  return prefixd::tools::kExitUsage;
}
