// prefixctl's command line: global flags, one command and its flags, parsed into plain
// structs so the parsing is testable without a server. The words are read by the shared
// parser (base/command_line.h): "--flag value" or "--flag=value", --json takes no value, and
// after "--" every word is positional. Global flags and --json may appear anywhere; a
// command's own flags only after it; "help", "-h" and "--help" ask for the usage ("help" only
// where the command goes, so a prompt may read "help"). A repeated flag's last value wins.
#ifndef PREFIXD_CLIENT_CLI_ARGS_H_
#define PREFIXD_CLIENT_CLI_ARGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "client/events.h"

namespace prefixd {

enum class Command { kGenerate, kTokenize, kInfo, kStats, kBench, kHealth, kEvents, kHelp };

struct GenerateArgs {
  std::optional<std::string> text;           // the positional prompt
  std::optional<std::vector<uint32_t>> ids;  // --ids 1,2,3
  uint32_t max_tokens = 32;
  float temperature = 0.0f;
  uint32_t top_k = 0;
  std::optional<float> top_p;
  std::optional<uint64_t> seed;
  uint32_t samples = 1;
  std::string salt;
  std::string adapter;  // a LoRA adapter's name; empty: the base model
  uint32_t top_logprobs = 0;
  // Sampling controls; the server checks their ranges (proto/prefixd/v1/inference.proto).
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<float> repetition_penalty;
  float min_p = 0.0f;
  std::vector<std::pair<uint32_t, float>> logit_bias;  // --logit-bias ID:BIAS,ID:BIAS
  std::optional<uint32_t> prompt_logprobs;             // score the prompt, this many top
};

struct BenchArgs {
  uint32_t prefix_tokens = 256;
  uint32_t suffix_tokens = 16;
  uint32_t requests = 64;
  uint32_t concurrency = 8;
  uint32_t max_tokens = 16;
  uint64_t seed = 1;
};

struct CliArgs {
  std::string server = "127.0.0.1:50051";
  std::string token;
  std::string tls_ca;
  double connect_timeout_s = 5.0;
  bool json = false;
  Command command = Command::kHelp;
  GenerateArgs generate;
  std::string tokenize_text;
  // The adapter the ids are for: it shares the base's tokenizer; an unknown name is NOT_FOUND.
  std::string tokenize_adapter;
  BenchArgs bench;
  EventsArgs events;  // prefixctl events: no gRPC, a ZMQ subscription (client/events.h)
};

// args excludes argv[0]. INVALID_ARGUMENT says which argument is wrong and what is expected.
absl::StatusOr<CliArgs> ParseCliArgs(const std::vector<std::string>& args);

extern const char kUsage[];

}  // namespace prefixd

#endif  // PREFIXD_CLIENT_CLI_ARGS_H_
