// prefixd-model end to end: runs the built binary in a temporary directory.
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/files.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using json = nlohmann::json;

using ::prefixd::testing::ReadFile;

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

class PrefixdModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "prefixd_model_cli_XXXXXX").string();
    PREFIXD_CHECK(::mkdtemp(tmpl.data()) != nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }

  // Runs prefixd-model with `args` (and `env`, e.g. "PREFIXD_TOKENIZER_DIR=x"), in root_.
  Result Run(const std::vector<std::string>& args, const std::string& env = "") {
    std::string cmd =
        "cd " + ShellQuote(root_.string()) + " && " + env + " " + ShellQuote(PREFIXD_MODEL_BINARY);
    for (const std::string& a : args) cmd += " " + ShellQuote(a);
    cmd += " >" + ShellQuote((root_ / "stdout").string()) + " 2>" +
           ShellQuote((root_ / "stderr").string()) + " </dev/null";
    const int status = std::system(cmd.c_str());
    Result r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = ReadFile(root_ / "stdout");
    r.err = ReadFile(root_ / "stderr");
    return r;
  }

  // A failure: non-zero exit, nothing on stdout, exactly one line on stderr.
  void ExpectOneLineError(const std::vector<std::string>& args, const std::string& problem) {
    Result r = Run(args);
    std::string joined;
    for (const std::string& a : args) joined += a + " ";
    EXPECT_NE(r.exit_code, 0) << joined;
    EXPECT_EQ(r.out, "") << joined;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << joined << ": " << r.err;
    EXPECT_THAT(r.err, StartsWith("prefixd-model: ")) << joined;
    EXPECT_THAT(r.err, HasSubstr(problem)) << joined;
  }

  std::string Tokenizer() const { return PREFIXD_TOKENIZER_DIR; }

  fs::path root_;
};

TEST_F(PrefixdModelTest, RandomTinyThenInspect) {
  Result w = Run({"random", "--out", "tiny", "--preset", "tiny", "--seed", "3", "--tokenizer-dir",
                  Tokenizer()});
  ASSERT_EQ(w.exit_code, 0) << w.err;
  EXPECT_EQ(w.err, "");
  Result r = Run({"inspect", "tiny"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  // V*E + P*E + L*(12E^2 + 13E) + 2E for V 50257, P 256, L 2, E 64.
  EXPECT_EQ(j["parameters"], 50257 * 64 + 256 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64);
  EXPECT_EQ(j["n_layer"], 2);
  EXPECT_EQ(j["n_head"], 2);
  EXPECT_EQ(j["n_embd"], 64);
  EXPECT_EQ(j["vocab_size"], 50257);
  EXPECT_EQ(j["context_length"], 256);
  EXPECT_EQ(j["dtype"], "f32");
  EXPECT_EQ(j["kv_bytes_per_token"], 2 * 2 * 2 * 32 * 4);
  const std::string manifest = j["manifest_sha256"];
  EXPECT_EQ(manifest.size(), 64u);

  // Same seed elsewhere: same identity. Another dtype: another identity.
  ASSERT_EQ(
      Run({"random", "--out", "again", "--seed", "3", "--tokenizer-dir", Tokenizer()}).exit_code,
      0);
  EXPECT_EQ(json::parse(Run({"inspect", "again"}).out)["manifest_sha256"], manifest);
  ASSERT_EQ(
      Run({"random", "--out=half", "--seed=3", "--dtype=f16", "--tokenizer-dir=" + Tokenizer()})
          .exit_code,
      0);
  const json half = json::parse(Run({"inspect", "half"}).out);
  EXPECT_NE(half["manifest_sha256"], manifest);
  EXPECT_EQ(half["dtype"], "f16");
  EXPECT_EQ(half["kv_bytes_per_token"], 2 * 2 * 2 * 32 * 2);
}

TEST_F(PrefixdModelTest, ShapeFlagsOverrideThePreset) {
  ASSERT_EQ(Run({"random", "--out", "m", "--layers", "3", "--heads", "4", "--embd", "32",
                 "--positions", "8", "--vocab", "50260", "--dtype", "bf16"},
                "PREFIXD_TOKENIZER_DIR=" + ShellQuote(Tokenizer()))
                .exit_code,
            0);
  Result r = Run({"inspect", "m"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["n_layer"], 3);
  EXPECT_EQ(j["n_head"], 4);
  EXPECT_EQ(j["context_length"], 8);
  EXPECT_EQ(j["vocab_size"], 50260);
  EXPECT_EQ(j["dtype"], "bf16");
  EXPECT_EQ(j["kv_bytes_per_token"], 2 * 3 * 4 * 8 * 2);
}

// GPT-2 small's shapes (f16 to halve the 500 MB file): the parameter count HF reports.
TEST_F(PrefixdModelTest, Gpt2PresetHasGpt2ParameterCount) {
  Result w = Run({"random", "--out", "gpt2", "--preset", "gpt2", "--dtype", "f16",
                  "--tokenizer-dir", Tokenizer()});
  ASSERT_EQ(w.exit_code, 0) << w.err;
  Result r = Run({"inspect", "gpt2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["parameters"], 124439808);
  EXPECT_EQ(j["n_layer"], 12);
  EXPECT_EQ(j["context_length"], 1024);
  EXPECT_EQ(j["kv_bytes_per_token"], 36864);  // GPT-2 small fp16 (cache/kv_layout.h)
}

TEST_F(PrefixdModelTest, TokenizeAndDetokenize) {
  ASSERT_EQ(Run({"random", "--out", "m", "--tokenizer-dir", Tokenizer()}).exit_code, 0);
  Result r = Run({"tokenize", "m", "Hello world"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[15496,995]\n");

  std::ofstream(root_ / "in.jsonl") << "\"Hello world\"\n\n\"\\n\\tcaf\\u00e9\"\n\"\"\n";
  r = Run({"tokenize", "m", "--jsonl", "in.jsonl"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string first, second, third, extra;
  ASSERT_TRUE(std::getline(lines, first) && std::getline(lines, second) &&
              std::getline(lines, third));
  EXPECT_FALSE(std::getline(lines, extra));
  EXPECT_EQ(first, "[15496,995]");
  EXPECT_EQ(third, "[]");
  const std::vector<uint32_t> ids = json::parse(second).get<std::vector<uint32_t>>();
  std::string csv;
  for (uint32_t id : ids) csv += (csv.empty() ? "" : ",") + std::to_string(id);
  r = Run({"detokenize", "m", csv});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "\n\tcaf\xC3\xA9\n");

  r = Run({"detokenize", "m", "15496, 995"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Hello world\n");
}

TEST_F(PrefixdModelTest, BadInputsExitNonZeroWithOneLine) {
  ASSERT_EQ(Run({"random", "--out", "m", "--tokenizer-dir", Tokenizer()}).exit_code, 0);
  fs::create_directories(root_ / "broken");
  for (const char* f : {"config.json", "vocab.json", "merges.txt"}) {
    fs::copy_file(root_ / "m" / f, root_ / "broken" / f);
  }
  std::ofstream(root_ / "broken" / "model.safetensors") << "short";
  std::ofstream(root_ / "bad.jsonl") << "\"ok\"\nnot json\n";

  ExpectOneLineError({}, "missing command");
  ExpectOneLineError({"frobnicate"}, "unknown command \"frobnicate\"");
  ExpectOneLineError({"random"}, "needs --out");
  ExpectOneLineError({"random", "--out", "x", "--bogus", "1"}, "unknown flag --bogus");
  ExpectOneLineError({"random", "--out"}, "--out needs a value");
  ExpectOneLineError({"random", "--out", "x", "--dtype", "f64"}, "unknown --dtype \"f64\"");
  ExpectOneLineError({"random", "--out", "x", "--preset", "huge"}, "unknown --preset");
  ExpectOneLineError({"random", "--out", "x", "--layers", "two"}, "--layers \"two\"");
  ExpectOneLineError({"random", "--out", "x", "--heads", "3", "--tokenizer-dir", Tokenizer()},
                     "not divisible by n_head");
  ExpectOneLineError({"random", "--out", "x", "--tokenizer-dir", "nowhere"}, "vocab.json: missing");
  ExpectOneLineError({"inspect"}, "usage: prefixd-model inspect DIR");
  ExpectOneLineError({"inspect", "nowhere"}, "nowhere/config.json: missing");
  ExpectOneLineError({"inspect", "broken"}, "broken/model.safetensors");
  ExpectOneLineError({"tokenize", "m"}, "usage: prefixd-model tokenize");
  ExpectOneLineError({"tokenize", "nowhere", "text"}, "nowhere");
  ExpectOneLineError({"tokenize", "m", "--jsonl", "bad.jsonl"}, "bad.jsonl:2: not a JSON string");
  ExpectOneLineError({"tokenize", "m", "--jsonl", "absent.jsonl"}, "absent.jsonl");
  ExpectOneLineError({"detokenize", "m", "15496,abc"}, "\"abc\" is not an integer");
  ExpectOneLineError({"detokenize", "m", "99999"}, "99999");
  EXPECT_FALSE(fs::exists(root_ / "x"));
}

// A directory that would serve wrong answers is refused by inspect, naming the file and, for
// weights, the tensor.
TEST_F(PrefixdModelTest, InspectRefusesEmptyMergesAndNonFiniteWeights) {
  ASSERT_EQ(Run({"random", "--out", "m", "--tokenizer-dir", Tokenizer()}).exit_code, 0);
  for (const char* dir : {"no_merges", "nan"}) {
    fs::create_directories(root_ / dir);
    for (const char* f : {"config.json", "model.safetensors", "vocab.json", "merges.txt"}) {
      fs::copy_file(root_ / "m" / f, root_ / dir / f);
    }
  }
  std::ofstream(root_ / "no_merges" / "merges.txt", std::ios::trunc) << "#version: 0.2\n";
  {
    // The file ends with the last tensor's last element (f32): make it NaN.
    std::fstream w(root_ / "nan" / "model.safetensors",
                   std::ios::binary | std::ios::in | std::ios::out);
    w.seekp(-4, std::ios::end);
    const unsigned char nan[4] = {0x00, 0x00, 0xc0, 0x7f};
    w.write(reinterpret_cast<const char*>(nan), 4);
  }
  ExpectOneLineError({"inspect", "no_merges"}, "no_merges/merges.txt: holds no merges");
  EXPECT_EQ(Run({"inspect", "no_merges"}).exit_code, 1);
  ExpectOneLineError({"inspect", "nan"}, "nan/model.safetensors: tensor \"");
  Result r = Run({"inspect", "nan"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("holds NaN at element"));
  // The same files load through the other commands' loader too.
  ExpectOneLineError({"tokenize", "no_merges", "Hello world"}, "holds no merges");
}

TEST_F(PrefixdModelTest, HelpListsEveryCommand) {
  Result r = Run({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* c : {"random", "inspect", "tokenize", "detokenize"}) {
    EXPECT_THAT(r.out, HasSubstr(std::string("prefixd-model ") + c)) << c;
  }
}

}  // namespace
}  // namespace prefixd
