#include "client/cli_args.h"

#include <cstdint>
#include <functional>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/command_line.h"

namespace prefixd {

const char kUsage[] =
    "usage: prefixctl [--server ADDR] [--token T] [--tls-ca FILE] [--connect-timeout S] "
    "COMMAND ...\n"
    "  generate (\"text\" | --ids 1,2,3) [--max-tokens N] [--temperature T] [--top-k K]\n"
    "           [--top-p P] [--seed S] [--samples N] [--salt S] [--top-logprobs N]\n"
    "           [--presence-penalty F] [--frequency-penalty F] [--repetition-penalty F]\n"
    "           [--min-p P] [--logit-bias ID:BIAS,...] [--prompt-logprobs N] [--adapter NAME]\n"
    "           [--json]\n"
    "           (--prompt-logprobs N scores every prompt token, N top entries each, 0-20;\n"
    "            --max-tokens may then be 0)\n"
    "  tokenize \"text\" [--adapter NAME] [--json]\n"
    "  info [--json]\n"
    "  stats [--json]\n"
    "  health              (exit 0 when the server reports SERVING)\n"
    "  bench [--prefix-tokens N] [--suffix-tokens N] [--requests N] [--concurrency N]\n"
    "        [--max-tokens N] [--seed S] [--json]\n"
    "  events --kv-events ENDPOINT [--topic T] [--replay ENDPOINT [--from SEQ]] [--count N]\n"
    "           (a replica's KV event stream, one line per event; ENDPOINT e.g.\n"
    "            tcp://10.0.0.5:5557)\n"
    "ADDR defaults to 127.0.0.1:50051. After \"--\" every argument is a prompt or text,\n"
    "even one that starts with \"--\".\n";

namespace {

absl::Status Bad(const std::string& msg) { return absl::InvalidArgumentError(msg); }

// What a flag's value sets; an error says what is wrong with the value.
using Setter = std::function<absl::Status(const std::string&)>;
using Setters = std::map<std::string, Setter, std::less<>>;

Setter SetString(std::string* out) {
  return [out](const std::string& v) {
    *out = v;
    return absl::OkStatus();
  };
}

template <typename T, typename Parse>
Setter SetParsed(T* out, std::string flag, Parse parse) {
  return [out, flag = std::move(flag), parse](const std::string& v) -> absl::Status {
    auto parsed = parse(v, flag);
    if (!parsed.ok()) return parsed.status();
    *out = *parsed;
    return absl::OkStatus();
  };
}

Setter SetU32(uint32_t* out, std::string flag) {
  return SetParsed(out, std::move(flag), ParseNonNegativeU32);
}

// "ID:BIAS,ID:BIAS": token ids with the bias added to their logits (the server checks the
// ranges: ids below the vocabulary, biases in [-100, 100], at most 300 entries).
absl::StatusOr<std::vector<std::pair<uint32_t, float>>> ParseLogitBias(std::string_view text,
                                                                       std::string_view flag) {
  const std::string name(flag);
  std::vector<std::pair<uint32_t, float>> out;
  // absl::string_view is not std::string_view in this Abseil: the split works on the former.
  for (absl::string_view piece : absl::StrSplit(absl::string_view(text.data(), text.size()), ',')) {
    const absl::string_view entry = absl::StripAsciiWhitespace(piece);
    const size_t colon = entry.find(':');
    if (colon == absl::string_view::npos) {
      return Bad(absl::StrCat(name, " entry \"", entry, "\" is not ID:BIAS (e.g. 50256:-100)"));
    }
    const absl::string_view id_text = absl::StripAsciiWhitespace(entry.substr(0, colon));
    const absl::string_view bias_text = absl::StripAsciiWhitespace(entry.substr(colon + 1));
    absl::StatusOr<uint32_t> id = ParseNonNegativeU32(
        std::string_view(id_text.data(), id_text.size()), absl::StrCat(name, " token id"));
    if (!id.ok()) return id.status();
    absl::StatusOr<float> bias = ParseFiniteFloat(
        std::string_view(bias_text.data(), bias_text.size()), absl::StrCat(name, " bias"));
    if (!bias.ok()) return bias.status();
    out.emplace_back(*id, *bias);
  }
  return out;
}

// The flags that take a value: the global ones, and those of `command` once it is known.
Setters ValueFlags(CliArgs& cli, std::optional<Command> command) {
  Setters s = {
      {"server", SetString(&cli.server)},
      {"token", SetString(&cli.token)},
      {"tls-ca", SetString(&cli.tls_ca)},
      {"connect-timeout",
       [&cli](const std::string& v) -> absl::Status {
         absl::StatusOr<float> t = ParseFiniteFloat(v, "--connect-timeout");
         if (!t.ok()) return t.status();
         if (*t <= 0 || *t > 86400) {
           return Bad(
               absl::StrCat("--connect-timeout must be > 0 and at most 86400 seconds, got ", v));
         }
         cli.connect_timeout_s = *t;
         return absl::OkStatus();
       }},
  };
  GenerateArgs& g = cli.generate;
  BenchArgs& b = cli.bench;
  if (command == Command::kGenerate) {
    s["ids"] = SetParsed(&g.ids, "--ids entry", ParseIdList);
    s["max-tokens"] = SetU32(&g.max_tokens, "--max-tokens");
    s["temperature"] = SetParsed(&g.temperature, "--temperature", ParseFiniteFloat);
    s["top-k"] = SetU32(&g.top_k, "--top-k");
    s["top-p"] = SetParsed(&g.top_p, "--top-p", ParseFiniteFloat);
    s["seed"] = SetParsed(&g.seed, "--seed", ParseNonNegativeU64);
    s["samples"] = SetU32(&g.samples, "--samples");
    s["salt"] = SetString(&g.salt);
    s["adapter"] = SetString(&g.adapter);
    s["top-logprobs"] = SetU32(&g.top_logprobs, "--top-logprobs");
    s["presence-penalty"] =
        SetParsed(&g.presence_penalty, "--presence-penalty", ParseFiniteFloat);
    s["frequency-penalty"] =
        SetParsed(&g.frequency_penalty, "--frequency-penalty", ParseFiniteFloat);
    s["repetition-penalty"] =
        SetParsed(&g.repetition_penalty, "--repetition-penalty", ParseFiniteFloat);
    s["min-p"] = SetParsed(&g.min_p, "--min-p", ParseFiniteFloat);
    s["logit-bias"] = SetParsed(&g.logit_bias, "--logit-bias", ParseLogitBias);
    s["prompt-logprobs"] = SetParsed(&g.prompt_logprobs, "--prompt-logprobs", ParseNonNegativeU32);
  } else if (command == Command::kTokenize) {
    s["adapter"] = SetString(&cli.tokenize_adapter);
  } else if (command == Command::kEvents) {
    EventsArgs& e = cli.events;
    s["kv-events"] = SetString(&e.endpoint);
    s["topic"] = SetString(&e.topic);
    s["replay"] = SetString(&e.replay_endpoint);
    s["from"] = [&e](const std::string& v) -> absl::Status {
      absl::StatusOr<uint64_t> n = ParseNonNegativeU64(v, "--from");
      if (!n.ok()) return n.status();
      if (*n > static_cast<uint64_t>(INT64_MAX)) return Bad("--from must be below 2^63");
      e.from = static_cast<int64_t>(*n);
      return absl::OkStatus();
    };
    s["count"] = SetParsed(&e.count, "--count", ParseNonNegativeU64);
  } else if (command == Command::kBench) {
    s["prefix-tokens"] = SetU32(&b.prefix_tokens, "--prefix-tokens");
    s["suffix-tokens"] = SetU32(&b.suffix_tokens, "--suffix-tokens");
    s["requests"] = SetU32(&b.requests, "--requests");
    s["concurrency"] = SetU32(&b.concurrency, "--concurrency");
    s["max-tokens"] = SetU32(&b.max_tokens, "--max-tokens");
    s["seed"] = SetParsed(&b.seed, "--seed", ParseNonNegativeU64);
  }
  return s;
}

// Every flag the parser knows: the value flags and two switches, valid anywhere.
std::vector<FlagSpec> FlagSpecs(const Setters& setters) {
  std::vector<FlagSpec> specs = {{"json", FlagKind::kSwitch}, {"help", FlagKind::kSwitch}};
  for (const auto& [name, setter] : setters) specs.push_back({name});
  return specs;
}

}  // namespace

absl::StatusOr<CliArgs> ParseCliArgs(const std::vector<std::string>& args) {
  CliArgs cli;
  std::optional<Command> command;
  std::vector<std::string> positional;
  Setters setters = ValueFlags(cli, command);
  std::vector<FlagSpec> specs = FlagSpecs(setters);

  // As before the shared parser, a repeated flag is allowed and its last value wins.
  CommandLineReader reader(args, RepeatedFlags::kAllow);
  while (!reader.Done()) {
    absl::StatusOr<CommandLineArg> arg =
        reader.Next(specs, command.has_value() ? " for this command (see prefixctl --help)"
                                               : " (see prefixctl --help)");
    if (!arg.ok()) return arg.status();
    if (!arg->flag.has_value()) {
      // "help" is a command, not a prompt: only where the command goes. After "--" every
      // word is a prompt or text, even "-h".
      if (!arg->after_double_dash &&
          (arg->value == "-h" || (arg->value == "help" && !command.has_value()))) {
        cli.command = Command::kHelp;
        return cli;
      }
      if (command.has_value()) {
        positional.push_back(arg->value);
        continue;
      }
      static const std::map<std::string, Command> kCommands = {
          {"generate", Command::kGenerate}, {"tokenize", Command::kTokenize},
          {"info", Command::kInfo},         {"stats", Command::kStats},
          {"bench", Command::kBench},       {"health", Command::kHealth},
          {"events", Command::kEvents}};
      auto it = kCommands.find(arg->value);
      if (it == kCommands.end()) {
        return Bad(absl::StrCat("unknown command \"", arg->value,
                                "\": use generate, tokenize, info, stats, bench, health or events"));
      }
      command = it->second;
      setters = ValueFlags(cli, command);
      specs = FlagSpecs(setters);
      continue;
    }
    if (*arg->flag == "help") {
      cli.command = Command::kHelp;
      return cli;
    }
    if (*arg->flag == "json") {
      cli.json = true;
      continue;
    }
    if (absl::Status s = setters.at(*arg->flag)(arg->value); !s.ok()) return s;
  }

  if (!command.has_value())
    return Bad("no command: use generate, tokenize, info, stats, bench, health or events");
  cli.command = *command;
  switch (cli.command) {
    case Command::kGenerate:
      if (positional.size() > 1) {
        return Bad("generate takes one prompt: quote it (prefixctl generate \"some text\")");
      }
      if (positional.size() == 1) cli.generate.text = positional[0];
      if (cli.generate.text.has_value() == cli.generate.ids.has_value()) {
        return Bad("generate needs exactly one prompt: \"text\" or --ids 1,2,3");
      }
      if (cli.generate.samples == 0) return Bad("--samples must be >= 1");
      break;
    case Command::kTokenize:
      if (positional.size() != 1) return Bad("tokenize takes one quoted text");
      cli.tokenize_text = positional[0];
      break;
    case Command::kEvents:
      if (cli.events.endpoint.empty()) {
        return Bad("events needs --kv-events ENDPOINT (the replica's --kv-events, e.g. "
                   "tcp://127.0.0.1:5557)");
      }
      if (cli.events.from != 0 && cli.events.replay_endpoint.empty()) {
        return Bad("--from needs --replay ENDPOINT");
      }
      if (cli.events.count == 0u) return Bad("--count must be >= 1");
      if (!positional.empty()) {
        return Bad(absl::StrCat("unexpected argument \"", positional[0], "\""));
      }
      break;
    case Command::kBench:
      if (cli.bench.requests == 0 || cli.bench.concurrency == 0 || cli.bench.max_tokens == 0) {
        return Bad("--requests, --concurrency and --max-tokens must be >= 1");
      }
      if (cli.bench.prefix_tokens + cli.bench.suffix_tokens == 0) {
        return Bad("--prefix-tokens + --suffix-tokens must be >= 1");
      }
      [[fallthrough]];
    default:
      if (!positional.empty()) {
        return Bad(absl::StrCat("unexpected argument \"", positional[0], "\""));
      }
  }
  return cli;
}

}  // namespace prefixd
