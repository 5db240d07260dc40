// Every command line the docs, deploy/ and scripts/ give the built programs (prefixd, prefixctl,
// prefixd-model) uses flags and values they accept, SERVER.md's flag table is prefixd's
// --help, and README's table of programs lists every command.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/deploy/repo_files.h"
#include "yaml-cpp/yaml.h"

namespace prefixd {
namespace {

using ::prefixd::testing::ReadRepoFile;
using ::prefixd::testing::RepoPath;

// ---- The built programs' flags ----------------------------------------------------------

struct Ran {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

std::string ShellQuote(const std::string& s) {
  return "'" + absl::StrReplaceAll(s, {{"'", "'\\''"}}) + "'";
}

Ran RunArgv(const std::vector<std::string>& argv) {
  std::vector<std::string> quoted;
  for (const std::string& a : argv) quoted.push_back(ShellQuote(a));
  Ran r;
  FILE* pipe = popen((absl::StrJoin(quoted, " ") + " </dev/null 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) r.output.append(buf, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string Built(const std::string& rel) { return std::string(PREFIXD_BINARY_DIR) + "/" + rel; }

// prefixd's own flags (server/main.cc) as `prefixd --help` lists them: absl name -> default
// as printed (strings unquoted).
std::map<std::string, std::string> PrefixdFlags() {
  const Ran help = RunArgv({Built("server/prefixd"), "--help"});
  std::map<std::string, std::string> flags;
  static const std::regex kStart(R"(^    --([a-z0-9_]+) \()");
  std::string name, entry;
  auto finish = [&] {
    if (name.empty()) return;
    const size_t at = entry.rfind("; default: ");
    EXPECT_NE(at, std::string::npos) << entry;
    if (at == std::string::npos) return;
    std::string def = entry.substr(at + 11);
    def.resize(std::min(def.size(), def.find(';')));  // the last entry has help text after it
    if (def.size() >= 2 && def.front() == '"' && def.back() == '"')
      def = def.substr(1, def.size() - 2);
    flags[name] = def;
  };
  std::istringstream in(help.output);
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, m, kStart)) {
      finish();
      name = m[1];
      entry = line;
    } else if (!name.empty()) {
      entry += " " + std::string(absl::StripLeadingAsciiWhitespace(line));
    }
  }
  finish();
  return flags;
}

std::string AbslName(std::string flag) {
  std::replace(flag.begin(), flag.end(), '-', '_');
  return flag;
}

// docs/SERVER.md's flag table (under "Running prefixd") is the operators' reference: it has a
// row for every flag server/main.cc defines, none for a flag it lacks, and each row's default
// is the binary's (durations compared as durations: `300s` is `5m`; off, none and empty are
// an empty string or false).
TEST(DocsCommandsTest, ServerMdFlagTableMatchesPrefixdHelp) {
  const std::map<std::string, std::string> flags = PrefixdFlags();
  ASSERT_GE(flags.size(), 30u);
  std::map<std::string, std::string> documented;  // absl name -> the row's default
  std::istringstream in(ReadRepoFile("docs/SERVER.md"));
  bool in_section = false;
  static const std::regex kFlag(R"(--([a-z0-9-]+))");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) in_section = line == "## Running prefixd";
    if (!in_section || line.rfind("| `--", 0) != 0) continue;
    const std::vector<std::string> cells = absl::StrSplit(line, " | ");
    ASSERT_GE(cells.size(), 3u) << line;
    const std::string def = absl::StrReplaceAll(cells[1], {{"`", ""}});
    for (auto it = std::sregex_iterator(cells[0].begin(), cells[0].end(), kFlag);
         it != std::sregex_iterator(); ++it) {
      documented[AbslName((*it)[1])] = def;
    }
  }
  for (const auto& [name, def] : flags) {
    auto doc = documented.find(name);
    if (doc == documented.end()) {
      ADD_FAILURE() << "--" << name << " (server/main.cc) has no row in docs/SERVER.md";
      continue;
    }
    const std::string& d = doc->second;
    absl::Duration doc_duration, flag_duration;
    if (d == "off" || d == "none" || d == "empty" || d == "(required)") {
      EXPECT_TRUE(def.empty() || def == "false")
          << "--" << name << ": docs say " << d << ", the binary's default is " << def;
    } else if (absl::ParseDuration(d, &doc_duration) && absl::ParseDuration(def, &flag_duration) &&
               d != "0" && def != "0") {
      EXPECT_EQ(doc_duration, flag_duration) << "--" << name << ": docs say " << d;
    } else {
      EXPECT_EQ(d, def) << "--" << name << ": docs/SERVER.md's default against the binary's";
    }
  }
  for (const auto& [name, def] : documented) {
    EXPECT_TRUE(flags.count(name))
        << "docs/SERVER.md documents --" << name << ", which prefixd does not define";
  }
}

// --max-connections and --connection-idle-timeout govern the HTTP front end's connections as
// well as gRPC's (docs/SERVER.md): prefixd --help must not present them as gRPC's alone.
TEST(DocsCommandsTest, HelpSaysTheConnectionFlagsCoverHttpToo) {
  const std::string help = RunArgv({Built("server/prefixd"), "--help"}).output;
  for (const char* flag : {"--max_connections (", "--connection_idle_timeout ("}) {
    const size_t at = help.find(flag);
    ASSERT_NE(at, std::string::npos) << flag;
    const std::string entry = help.substr(at, help.find("; default:", at) - at);
    EXPECT_NE(entry.find("HTTP"), std::string::npos) << entry;
  }
}

// Shell-like words of one command line: quotes removed, a quoted word kept whole.
std::vector<std::string> ShellWords(const std::string& line) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (char c : line) {
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else {
        word += c;
      }
    } else if (c == '"' || c == '\'') {
      quote = c;
      in_word = true;
    } else if (c == ' ' || c == '\t') {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

// One place a file passes arguments to one of the programs.
struct Invocation {
  std::string where;               // file:line
  std::vector<std::string> words;  // the arguments after the program's name
};

// The command lines of `text` (a shell script, or a Markdown file's code: fenced blocks and
// inline `spans`), continuations joined, each with its line number.
std::vector<std::pair<int, std::string>> CommandLines(const std::string& text, bool markdown) {
  std::vector<std::pair<int, std::string>> out;
  std::istringstream in(text);
  bool fenced = false;
  std::string joined;
  int first = 0, n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (markdown && line.rfind("```", 0) == 0) {
      fenced = !fenced;
      continue;
    }
    if (markdown && !fenced) {
      const std::vector<std::string> parts = absl::StrSplit(line, '`');
      for (size_t i = 1; i < parts.size(); i += 2) out.push_back({n, parts[i]});
      continue;
    }
    if (joined.empty()) first = n;
    if (!line.empty() && line.back() == '\\') {
      joined += line.substr(0, line.size() - 1) + " ";
      continue;
    }
    out.push_back({first, joined + line});
    joined.clear();
  }
  return out;
}

// Every place `file` runs `program` (a word ending in /program or equal to it; for prefixd
// also scripts/cluster's argument arrays), with the words that follow up to the end of the
// command (a redirection, a pipe, `&`, `;`, a comment or a closing parenthesis).
std::vector<Invocation> InvocationsOf(const std::string& program, const std::string& file) {
  const bool markdown = file.size() > 3 && file.compare(file.size() - 3, 3, ".md") == 0;
  std::vector<Invocation> out;
  for (const auto& [line_no, line] : CommandLines(ReadRepoFile(file), markdown)) {
    if (line.find("--target ") != std::string::npos) continue;  // cmake builds them
    // `docker run ... prefixd --demo`: the image's entrypoint takes --demo itself.
    const bool image = line.find("docker run") != std::string::npos ||
                       line.find("podman run") != std::string::npos;
    std::vector<std::string> words;
    for (std::string w : ShellWords(line)) {
      if (!markdown && w[0] == '#') break;  // a comment
      // Usage notation: [--flag VALUE] is --flag VALUE; a Dockerfile's exec form
      // ["prefixctl", "health"] is prefixctl health.
      if (w.rfind("[", 0) == 0 && w.size() > 1) w.erase(0, 1);
      while (w.size() > 1 && (w.back() == ']' || (file == "Dockerfile" && w.back() == ','))) {
        w.pop_back();
      }
      if (!(image && w == "--demo")) words.push_back(w);
    }
    for (size_t i = 0; i < words.size(); ++i) {
      const std::string& w = words[i];
      const bool named = w == program || (w.size() > program.size() &&
                                          w.compare(w.size() - program.size() - 1,
                                                    program.size() + 1, "/" + program) == 0);
      // scripts/cluster's argument arrays, and the Dockerfile's CMD (the entrypoint's
      // arguments, which it passes on to prefixd).
      const bool array =
          program == "prefixd" && (w.rfind("args=(", 0) == 0 || w.rfind("args+=(", 0) == 0 ||
                                   (file == "Dockerfile" && i == 0 && w == "CMD"));
      // `--target prefixd` (cmake) and `--build-dir` are not runs of it.
      if (!array && (!named || (i > 0 && words[i - 1].rfind("--", 0) == 0))) continue;
      Invocation inv{file + ":" + std::to_string(line_no), {}};
      std::vector<std::string> rest(words.begin() + i + 1, words.end());
      if (array && w != "CMD") rest.insert(rest.begin(), w.substr(w.find('(') + 1));
      for (std::string arg : rest) {
        if (arg.empty()) continue;
        const bool closes = arg.back() == ')' && arg.find('(') == std::string::npos;
        if (closes) arg.pop_back();
        if (arg == "&" || arg == "&&" || arg == "|" || arg == "||" || arg == ";" || arg[0] == '>' ||
            arg[0] == '<' || arg[0] == '#' || arg.rfind("2>", 0) == 0) {
          break;
        }
        if (arg.back() == ';') arg.pop_back();
        if (!arg.empty()) inv.words.push_back(arg);
        if (closes) break;
      }
      if (!inv.words.empty()) out.push_back(std::move(inv));
    }
  }
  return out;
}

const std::vector<std::string>& DocumentedFiles() {
  static const auto* files = new std::vector<std::string>{"README.md",
                                                          "docs/SERVER.md",
                                                          "docs/SCALING.md",
                                                          "docs/BENCHMARKS.md",
                                                          "deploy/k8s/README.md",
                                                          "deploy/entrypoint.sh",
                                                          "Dockerfile",
                                                          "scripts/demo",
                                                          "scripts/cluster",
                                                          "scripts/cluster-bench",
                                                          "scripts/bench-peer",
                                                          "scripts/gpu-check",
                                                          "scripts/container-test"};
  return *files;
}

// A value that stands for one (DIR, N, tcp://HOST:5557, "$MODEL", a list of choices).
bool IsPlaceholder(const std::string& v) {
  static const std::regex kUpper("[A-Z]{2,}|^[A-Z]$");
  return v.find('$') != std::string::npos || v.find('|') != std::string::npos ||
         v.find("...") != std::string::npos || v.find("\xE2\x80\xA6") != std::string::npos ||
         std::regex_search(v, kUpper);
}

// Flags naming files or directories: the check below runs prefixd without them (the files of
// an example do not exist here), after checking their names.
bool TakesAPath(const std::string& absl_name) {
  static const std::set<std::string> kPaths = {
      "model",     "auth_tokens", "tls_cert", "tls_key", "kv_remote_password_file",
      "cache_dir", "adapter"};
  return kPaths.count(absl_name) > 0;
}

// Checks one prefixd argument list: every flag is one prefixd defines, and prefixd, run with
// the list's values (a placeholder replaced by the flag's default) and a model directory that
// does not exist, gets as far as looking for the model: absl accepted every value's form, and
// the flags checked before the model loads (listeners, --device, --dtype, --kv-events...)
// accepted theirs.
void CheckPrefixdArgs(const std::map<std::string, std::string>& flags, const std::string& where,
                      const std::vector<std::string>& words) {
  const std::string missing_model = "/nonexistent-deploy-config-test/model";
  std::vector<std::string> argv = {Built("server/prefixd"), "--model", missing_model};
  bool cuda = false;
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i].rfind("--", 0) != 0 || words[i] == "--") continue;
    std::string name = words[i].substr(2), value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    const std::string absl_name = AbslName(name);
    if (absl_name == "help" || absl_name == "helpfull") continue;  // absl's own
    auto flag = flags.find(absl_name);
    if (flag == flags.end()) {
      ADD_FAILURE() << where << ": prefixd has no flag --" << name;
      continue;
    }
    const bool is_bool = flag->second == "true" || flag->second == "false";
    if (!has_value && !is_bool && i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0) {
      value = words[++i];
      has_value = true;
    }
    if (TakesAPath(absl_name) || is_bool) {
      if (is_bool && !TakesAPath(absl_name)) argv.push_back("--" + name);
      continue;
    }
    if (!has_value || IsPlaceholder(value)) value = flag->second;
    cuda |= absl_name == "device" && value == "cuda";
    argv.push_back("--" + name + "=" + value);
  }
  if (std::find(words.begin(), words.end(), "--helpfull") != words.end()) return;  // lists them
  const Ran r = RunArgv(argv);
  const bool reached_model = r.output.find(missing_model) != std::string::npos;
  const bool no_cuda_here = cuda && r.output.find("no usable CUDA device") != std::string::npos;
  EXPECT_TRUE(r.exit_code == 1 && (reached_model || no_cuda_here))
      << where << ": prefixd refuses " << absl::StrJoin(words, " ") << ":\n"
      << r.output;
}

// Every prefixd command line in the docs, deploy/ and scripts/ (and the argument lists compose
// and Kubernetes give the image's entrypoint) uses flags prefixd has, with values of the form
// it accepts, so that renaming a flag or changing its type fails here, not in a deployment.
TEST(DocsCommandsTest, EveryPrefixdCommandLineUsesFlagsItAccepts) {
  const std::map<std::string, std::string> flags = PrefixdFlags();
  ASSERT_TRUE(flags.count("listen"));
  std::vector<Invocation> runs;
  for (const std::string& file : DocumentedFiles()) {
    for (Invocation& inv : InvocationsOf("prefixd", file)) runs.push_back(std::move(inv));
  }
  auto yaml_args = [](const YAML::Node& node) {
    std::vector<std::string> words;
    for (const auto& a : node) words.push_back(a.as<std::string>());
    return words;
  };
  runs.push_back({"deploy/compose.yaml (services.prefixd.command)",
                  yaml_args(YAML::LoadFile(
                      RepoPath("deploy/compose.yaml"))["services"]["prefixd"]["command"])});
  runs.push_back(
      {"deploy/k8s/deployment.yaml (args)",
       yaml_args(YAML::LoadFile(RepoPath(
           "deploy/k8s/deployment.yaml"))["spec"]["template"]["spec"]["containers"][0]["args"])});
  std::set<std::string> seen;
  for (const Invocation& inv : runs) {
    for (const std::string& w : inv.words) {
      if (w.rfind("--", 0) == 0) seen.insert(AbslName(w.substr(2, w.find('=') - 2)));
    }
    CheckPrefixdArgs(flags, inv.where, inv.words);
  }
  // The extraction finds the command lines it is meant to (the entrypoint's, the demo's,
  // scripts/cluster's arrays, the compose and Kubernetes arguments).
  for (const char* flag : {"listen", "http_listen", "metrics_listen", "threads", "shutdown_grace",
                           "kv_remote", "kv_events", "kv_events_replay", "kv_cache_bytes"}) {
    EXPECT_TRUE(seen.count(flag)) << "no command line found passing --" << flag;
  }
}

// The docs' scripts/cluster and scripts/cluster-bench command lines use options the scripts
// parse (the words of their `case` patterns), up to the `--` after which the rest goes on to
// prefixd or cluster_bench.
TEST(DocsCommandsTest, ClusterScriptCommandLinesUseOptionsTheScriptsTake) {
  static const std::regex kPattern(R"((--[a-z-]+)(?=[|)]))");
  for (const std::string script : {"cluster", "cluster-bench"}) {
    const std::string source = ReadRepoFile("scripts/" + script);
    std::set<std::string> options;
    for (auto it = std::sregex_iterator(source.begin(), source.end(), kPattern);
         it != std::sregex_iterator(); ++it) {
      options.insert((*it)[1]);
    }
    ASSERT_GE(options.size(), 8u) << script;
    int checked = 0;
    for (const std::string& file : DocumentedFiles()) {
      for (const Invocation& inv : InvocationsOf(script, file)) {
        for (const std::string& w : inv.words) {
          if (w == "--") break;
          if (w.rfind("--", 0) != 0) continue;
          EXPECT_TRUE(options.count(w)) << inv.where << ": scripts/" << script << " takes no " << w;
          ++checked;
        }
      }
    }
    EXPECT_GE(checked, 5) << "no scripts/" << script << " command lines found";
  }
}

// The flags prefixctl's or prefixd-model's usage lists for each command (and, under "", the
// ones before the command): `--name` words on the command's lines of `usage`.
std::map<std::string, std::set<std::string>> UsageFlags(const std::string& usage,
                                                        const std::string& program) {
  std::map<std::string, std::set<std::string>> out;
  static const std::regex kFlag(R"(--([a-z0-9-]+))");
  std::string command;
  std::istringstream in(usage);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("usage: " + program, 0) == 0) {
      command = "";
    } else if (line.rfind("  " + program + " ", 0) == 0) {  // prefixd-model: one per line
      command = std::vector<std::string>(absl::StrSplit(line.substr(program.size() + 3), ' '))[0];
    } else if (line.size() > 2 && line.rfind("  ", 0) == 0 && line[2] != ' ') {
      command = std::vector<std::string>(absl::StrSplit(line.substr(2), ' '))[0];
    }
    out[command];  // a command without flags is one too
    for (auto it = std::sregex_iterator(line.begin(), line.end(), kFlag);
         it != std::sregex_iterator(); ++it) {
      out[command].insert((*it)[1]);
    }
  }
  return out;
}

// The flags a usage text shows with a value after them (`--max-tokens N`, `--ids 1,2,3`).
std::set<std::string> UsageValueFlags(const std::string& usage) {
  std::set<std::string> out;
  static const std::regex kValued(R"(--([a-z0-9-]+) [A-Za-z0-9"])");
  for (auto it = std::sregex_iterator(usage.begin(), usage.end(), kValued);
       it != std::sregex_iterator(); ++it) {
    out.insert((*it)[1]);
  }
  return out;
}

// Every prefixctl and prefixd-model command line in the docs, deploy/ and scripts/ names a
// command the program has and only flags its usage lists for that command (or, for prefixctl,
// before it), so a renamed command or flag fails here.
TEST(DocsCommandsTest, EveryPrefixctlAndPrefixdModelCommandLineUsesFlagsTheyHave) {
  for (const auto& [program, rel] :
       {std::pair<std::string, std::string>{"prefixctl", "client/prefixctl"},
        {"prefixd-model", "tools/prefixd-model"}}) {
    const Ran help = RunArgv({Built(rel), "--help"});
    ASSERT_EQ(help.exit_code, 0) << help.output;
    const auto usage = UsageFlags(help.output, program);
    const std::set<std::string> valued = UsageValueFlags(help.output);
    ASSERT_GE(usage.size(), 4u) << help.output;
    int checked = 0;
    for (const std::string& file : DocumentedFiles()) {
      for (const Invocation& inv : InvocationsOf(program, file)) {
        std::string command;
        const std::set<std::string>& global =
            usage.count("") ? usage.at("") : std::set<std::string>();
        for (size_t i = 0; i < inv.words.size(); ++i) {
          const std::string& w = inv.words[i];
          if (w == "--") break;
          if (w.rfind("--", 0) != 0) {
            if (command.empty()) {
              command = w;
              EXPECT_TRUE(IsPlaceholder(command) || usage.count(command))
                  << inv.where << ": " << program << " has no command " << command;
            }
            continue;
          }
          const std::string name = w.substr(2, w.find('=') - 2);
          if (w.find('=') == std::string::npos && valued.count(name)) ++i;  // its value
          const bool known = global.count(name) || IsPlaceholder(command) ||
                             (usage.count(command) && usage.at(command).count(name));
          EXPECT_TRUE(known) << inv.where << ": " << program << " " << command << " has no flag --"
                             << name;
          ++checked;
        }
      }
    }
    EXPECT_GE(checked, 5) << "no " << program << " command lines found";
  }
}

// README's table of programs names every command each tool has (and only those), so a reader
// learns of each one there.
TEST(DocsCommandsTest, ReadmeProgramsTableListsEveryCommand) {
  const std::string readme = ReadRepoFile("README.md");
  for (const auto& [program, rel] :
       {std::pair<std::string, std::string>{"prefixctl", "client/prefixctl"},
        {"prefixd-model", "tools/prefixd-model"}}) {
    std::set<std::string> commands;
    for (const auto& [command, flags] :
         UsageFlags(RunArgv({Built(rel), "--help"}).output, program)) {
      if (!command.empty()) commands.insert(command);
    }
    ASSERT_GE(commands.size(), 4u) << program;
    const size_t row = readme.find("| `build/" + rel + "` | ");
    ASSERT_NE(row, std::string::npos) << program << " has no row in README's table";
    const std::string line = readme.substr(row, readme.find('\n', row) - row);
    const std::vector<std::string> cells = absl::StrSplit(line, " | ");
    ASSERT_GE(cells.size(), 2u) << line;
    std::set<std::string> listed;
    const std::vector<std::string> parts = absl::StrSplit(cells[1], '`');
    for (size_t i = 1; i < parts.size(); i += 2) listed.insert(parts[i]);
    EXPECT_EQ(listed, commands) << program << ": README's table against its usage";
  }
}

}  // namespace
}  // namespace prefixd
