#include "client/cli_args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace prefixd {

const char kUsage[] =
    "usage: prefixctl [--server ADDR] [--token T] [--tls-ca FILE] [--connect-timeout S] "
    "COMMAND ...\n"
    "  generate (\"text\" | --ids 1,2,3) [--max-tokens N] [--temperature T] [--top-k K]\n"
    "           [--top-p P] [--seed S] [--samples N] [--salt S] [--top-logprobs N] [--json]\n"
    "  tokenize \"text\" [--json]\n"
    "  info [--json]\n"
    "  stats [--json]\n"
    "  health              (exit 0 when the server reports SERVING)\n"
    "  bench [--prefix-tokens N] [--suffix-tokens N] [--requests N] [--concurrency N]\n"
    "        [--max-tokens N] [--seed S] [--json]\n"
    "ADDR defaults to 127.0.0.1:50051. After \"--\" every argument is a prompt or text,\n"
    "even one that starts with \"--\".\n";

namespace {

absl::Status Bad(const std::string& msg) { return absl::InvalidArgumentError(msg); }

absl::Status ParseU32(const std::string& flag, const std::string& v, uint32_t* out) {
  if (!absl::SimpleAtoi(v, out)) {
    return Bad(absl::StrCat(flag, " expects a non-negative integer, got \"", v, "\""));
  }
  return absl::OkStatus();
}

absl::Status ParseU64(const std::string& flag, const std::string& v, uint64_t* out) {
  if (!absl::SimpleAtoi(v, out)) {
    return Bad(absl::StrCat(flag, " expects a non-negative integer, got \"", v, "\""));
  }
  return absl::OkStatus();
}

absl::Status ParseFloat(const std::string& flag, const std::string& v, float* out) {
  if (!absl::SimpleAtof(v, out) || !std::isfinite(*out)) {
    return Bad(absl::StrCat(flag, " expects a number, got \"", v, "\""));
  }
  return absl::OkStatus();
}

absl::Status ParseIds(const std::string& v, std::vector<uint32_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
    uint32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return Bad(absl::StrCat("--ids expects comma-separated token ids, got \"", v, "\""));
    }
    out->push_back(id);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CliArgs> ParseCliArgs(const std::vector<std::string>& args) {
  CliArgs cli;
  std::optional<Command> command;
  std::vector<std::string> positional;
  using Setter = std::function<absl::Status(const std::string&)>;
  const std::string kFlagHelp = " (see prefixctl --help)";

  bool only_positional = false;  // after "--": a prompt may start with "--" or be "help"
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!only_positional && a == "--") {
      only_positional = true;
      continue;
    }
    // "help" is a command, not a prompt: only where the command goes.
    if (!only_positional &&
        (a == "-h" || a == "--help" || (a == "help" && !command.has_value()))) {
      cli.command = Command::kHelp;
      return cli;
    }
    if (only_positional || a.size() < 3 || a.rfind("--", 0) != 0) {
      if (!command.has_value()) {
        static const std::map<std::string, Command> kCommands = {{"generate", Command::kGenerate},
                                                                 {"tokenize", Command::kTokenize},
                                                                 {"info", Command::kInfo},
                                                                 {"stats", Command::kStats},
                                                                 {"bench", Command::kBench},
                                                                 {"health", Command::kHealth}};
        auto it = kCommands.find(a);
        if (it == kCommands.end()) {
          return Bad(absl::StrCat("unknown command \"", a,
                                  "\": use generate, tokenize, info, stats, bench or health"));
        }
        command = it->second;
      } else {
        positional.push_back(a);
      }
      continue;
    }
    std::string name = a.substr(2);
    std::optional<std::string> value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name == "json") {
      if (value.has_value()) return Bad("--json takes no value");
      cli.json = true;
      continue;
    }
    GenerateArgs& g = cli.generate;
    BenchArgs& b = cli.bench;
    const Command cmd = command.value_or(Command::kHelp);
    std::map<std::string, Setter> setters = {
        {"server",
         [&](const std::string& v) {
           cli.server = v;
           return absl::OkStatus();
         }},
        {"token",
         [&](const std::string& v) {
           cli.token = v;
           return absl::OkStatus();
         }},
        {"tls-ca",
         [&](const std::string& v) {
           cli.tls_ca = v;
           return absl::OkStatus();
         }},
        {"connect-timeout",
         [&](const std::string& v) {
           float s;
           absl::Status st = ParseFloat("--connect-timeout", v, &s);
           if (st.ok() && (s <= 0 || s > 86400)) {
             st = Bad(absl::StrCat("--connect-timeout must be > 0 and at most 86400 seconds, got ",
                                   v));
           }
           cli.connect_timeout_s = s;
           return st;
         }},
    };
    if (cmd == Command::kGenerate) {
      setters["ids"] = [&](const std::string& v) {
        g.ids.emplace();
        return ParseIds(v, &*g.ids);
      };
      setters["max-tokens"] = [&](const std::string& v) {
        return ParseU32("--max-tokens", v, &g.max_tokens);
      };
      setters["temperature"] = [&](const std::string& v) {
        return ParseFloat("--temperature", v, &g.temperature);
      };
      setters["top-k"] = [&](const std::string& v) { return ParseU32("--top-k", v, &g.top_k); };
      setters["top-p"] = [&](const std::string& v) {
        float p;
        absl::Status s = ParseFloat("--top-p", v, &p);
        g.top_p = p;
        return s;
      };
      setters["seed"] = [&](const std::string& v) {
        uint64_t s;
        absl::Status st = ParseU64("--seed", v, &s);
        g.seed = s;
        return st;
      };
      setters["samples"] = [&](const std::string& v) {
        return ParseU32("--samples", v, &g.samples);
      };
      setters["salt"] = [&](const std::string& v) {
        g.salt = v;
        return absl::OkStatus();
      };
      setters["top-logprobs"] = [&](const std::string& v) {
        return ParseU32("--top-logprobs", v, &g.top_logprobs);
      };
    } else if (cmd == Command::kBench) {
      setters["prefix-tokens"] = [&](const std::string& v) {
        return ParseU32("--prefix-tokens", v, &b.prefix_tokens);
      };
      setters["suffix-tokens"] = [&](const std::string& v) {
        return ParseU32("--suffix-tokens", v, &b.suffix_tokens);
      };
      setters["requests"] = [&](const std::string& v) {
        return ParseU32("--requests", v, &b.requests);
      };
      setters["concurrency"] = [&](const std::string& v) {
        return ParseU32("--concurrency", v, &b.concurrency);
      };
      setters["max-tokens"] = [&](const std::string& v) {
        return ParseU32("--max-tokens", v, &b.max_tokens);
      };
      setters["seed"] = [&](const std::string& v) { return ParseU64("--seed", v, &b.seed); };
    }
    auto it = setters.find(name);
    if (it == setters.end()) {
      return Bad(absl::StrCat("unknown flag --", name,
                              command.has_value() ? " for this command" : "", kFlagHelp));
    }
    if (!value.has_value()) {
      if (i + 1 >= args.size()) return Bad(absl::StrCat("--", name, " needs a value"));
      value = args[++i];
    }
    absl::Status s = it->second(*value);
    if (!s.ok()) return s;
  }

  if (!command.has_value()) return Bad("no command: use generate, tokenize, info, stats, bench or health");
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
