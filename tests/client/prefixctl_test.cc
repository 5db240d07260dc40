// prefixctl end to end against a real prefixd.
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/server/process.h"

namespace prefixd::testing {
namespace {

using ::testing::HasSubstr;

class PrefixctlTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(suite_.Prepare().ok());
    // One LoRA adapter, written by the project's tool, for --adapter.
    const std::string adapter = suite_.dir() + "/adapter-a";
    const CommandResult w =
        RunCommand({BuiltBinary("tools/prefixd-model"), "random-adapter", "--base",
                    suite_.model_dir(), "--out", adapter, "--rank", "4", "--seed", "7"});
    ASSERT_EQ(w.exit_code, 0) << w.output;
    const absl::Status s = suite_.Start({"--kv-cache-bytes=4194304", "--adapter=a=" + adapter});
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() { suite_.Stop(); }
  CommandResult Ctl(std::vector<std::string> args) {
    std::vector<std::string> argv = {BuiltBinary("client/prefixctl"), "--server",
                                     suite_.server()->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  }

  static inline SuiteServer suite_;
};

TEST_F(PrefixctlTest, GenerateJsonThenACacheHit) {
  const std::vector<std::string> args = {"generate",
                                         "--ids",
                                         "11,22,33,44,55,66,77,88,99,111,222,333,444,555,666,"
                                         "777,888,999",
                                         "--max-tokens",
                                         "5",
                                         "--json"};
  CommandResult first = Ctl(args);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  nlohmann::json j = nlohmann::json::parse(first.output);
  ASSERT_EQ(j["samples"].size(), 1u);
  EXPECT_EQ(j["samples"][0]["index"], 0);
  EXPECT_EQ(j["samples"][0]["token_ids"].size(), j["usage"]["completion_tokens"].get<size_t>());
  EXPECT_EQ(j["samples"][0]["logprobs"].size(), j["samples"][0]["token_ids"].size());
  EXPECT_TRUE(j["samples"][0]["text"].is_string());
  EXPECT_TRUE(j["samples"][0]["finish_reason"] == "length" ||
              j["samples"][0]["finish_reason"] == "stop");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 18);
  EXPECT_EQ(j["usage"]["cached_prompt_tokens"], 0);

  CommandResult second = Ctl(args);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  nlohmann::json k = nlohmann::json::parse(second.output);
  EXPECT_EQ(k["usage"]["cached_prompt_tokens"], 16);  // one full block of 16
  EXPECT_EQ(k["samples"][0]["token_ids"], j["samples"][0]["token_ids"]);
}

TEST_F(PrefixctlTest, GenerateStreamsTextWithUsage) {
  CommandResult r = Ctl(
      {"generate", "Once upon a time", "--max-tokens", "4", "--seed", "1", "--temperature", "0.8"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[prompt_tokens=4 cached_prompt_tokens="));
}

TEST_F(PrefixctlTest, AdapterFlagsReachTheServer) {
  // The adapter shares the base's tokenizer: the same ids; an unknown name is NOT_FOUND.
  CommandResult t = Ctl({"tokenize", "Hello world", "--adapter", "a"});
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_EQ(t.output, "15496,995\n");
  CommandResult unknown = Ctl({"tokenize", "Hello world", "--adapter", "nope"});
  EXPECT_EQ(unknown.exit_code, 1) << unknown.output;
  EXPECT_THAT(unknown.output, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(unknown.output, HasSubstr("nope"));
  // generate --adapter runs the adapter: other log-probabilities than the base's, and its
  // own cache. The prompt (20 ids) fills one 16-token block, which the base caches first.
  const std::vector<std::string> g = {
      "generate", "--ids", "5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24",
      "--max-tokens", "2", "--json"};
  std::vector<std::string> with_adapter = g;
  with_adapter.insert(with_adapter.end(), {"--adapter", "a"});
  CommandResult base = Ctl(g), adapted = Ctl(with_adapter), again = Ctl(with_adapter);
  ASSERT_EQ(base.exit_code, 0) << base.output;
  ASSERT_EQ(adapted.exit_code, 0) << adapted.output;
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const nlohmann::json b = nlohmann::json::parse(base.output);
  const nlohmann::json a = nlohmann::json::parse(adapted.output);
  const nlohmann::json a2 = nlohmann::json::parse(again.output);
  EXPECT_NE(a["samples"][0]["logprobs"], b["samples"][0]["logprobs"]);
  EXPECT_EQ(a["usage"]["cached_prompt_tokens"], 0) << "no block of the base is the adapter's";
  EXPECT_EQ(a2["usage"]["cached_prompt_tokens"], 16) << "the adapter's own block is";
  EXPECT_EQ(a2["samples"][0]["logprobs"], a["samples"][0]["logprobs"]);
  CommandResult bad = Ctl({"generate", "--ids", "5,6", "--adapter", "nope"});
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("NOT_FOUND"));
}

TEST_F(PrefixctlTest, TokenizeInfoStats) {
  CommandResult t = Ctl({"tokenize", "Hello world"});
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_EQ(t.output, "15496,995\n");
  CommandResult info = Ctl({"info", "--json"});
  ASSERT_EQ(info.exit_code, 0) << info.output;
  nlohmann::json j = nlohmann::json::parse(info.output);
  EXPECT_EQ(j["model_name"], "tiny-model");  // the model directory's name
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["context_length"], 256);
  CommandResult human = Ctl({"info"});
  EXPECT_THAT(human.output, HasSubstr("KV pool"));
  CommandResult stats = Ctl({"stats"});
  ASSERT_EQ(stats.exit_code, 0) << stats.output;
  EXPECT_THAT(stats.output, HasSubstr("KV blocks"));
  EXPECT_THAT(stats.output, ::testing::Not(HasSubstr("disk tier")));  // no --cache-dir
  CommandResult sj = Ctl({"stats", "--json"});
  ASSERT_EQ(sj.exit_code, 0) << sj.output;
  nlohmann::json s = nlohmann::json::parse(sj.output);
  EXPECT_EQ(s["blocks_total"].get<uint64_t>(), s["blocks_free"].get<uint64_t>() +
                                                   s["blocks_active"].get<uint64_t>() +
                                                   s["blocks_cached"].get<uint64_t>());
  EXPECT_EQ(s["disk_cap_bytes"].get<uint64_t>(), 0u);
}

TEST_F(PrefixctlTest, HealthReportsServing) {
  CommandResult h = Ctl({"health"});
  EXPECT_EQ(h.exit_code, 0) << h.output;
  EXPECT_EQ(h.output, "SERVING\n");
}

TEST_F(PrefixctlTest, SmallBench) {
  CommandResult r = Ctl({"bench", "--prefix-tokens", "32", "--suffix-tokens", "4", "--requests",
                         "6", "--concurrency", "2", "--max-tokens", "3", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The progress bar goes to stderr (merged here, lines ended by '\r'); the JSON is the line
  // that starts with '{'.
  std::string json_line;
  for (absl::string_view line : absl::StrSplit(r.output, absl::ByAnyChar("\r\n"))) {
    if (!line.empty() && line[0] == '{') json_line = std::string(line);
  }
  ASSERT_FALSE(json_line.empty()) << r.output;
  nlohmann::json j = nlohmann::json::parse(json_line);
  EXPECT_EQ(j["requests_ok"], 6);
  EXPECT_EQ(j["completion_tokens"], 18);
  EXPECT_EQ(j["prompt_tokens"], 6 * 36);
  // Every request after the first ones shares the 32-token prefix (2 full blocks).
  EXPECT_GE(j["cached_prompt_tokens"].get<int>(), 4 * 32);
  EXPECT_GT(j["cache_hit_ratio"].get<double>(), 0.5);
  EXPECT_GT(j["ttft_s"]["p50"].get<double>(), 0);
  EXPECT_THAT(r.output, HasSubstr("6/6"));
}

// --prompt-logprobs: the prompt's scores in --json (first null) and as text. The greedy
// token's logprob after a prompt is the score of that token when it ends a longer prompt, and
// a second run (from the cache's score records) prints the same numbers.
TEST_F(PrefixctlTest, PromptLogprobsAreReturnedAndPrinted) {
  const std::string ids = "464,2068,7586,21831,18045,625,262,16931,3290,13,383,2068,7586,21831";
  CommandResult gen = Ctl({"generate", "--ids", ids, "--max-tokens", "1", "--json"});
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  const nlohmann::json g = nlohmann::json::parse(gen.output);
  const uint32_t next = g["samples"][0]["token_ids"][0];
  EXPECT_FALSE(g.contains("prompt"));

  const std::string longer = ids + "," + std::to_string(next);
  const std::vector<std::string> score = {"generate", "--ids", longer, "--prompt-logprobs", "2",
                                          "--max-tokens", "0", "--json"};
  CommandResult first = Ctl(score);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const nlohmann::json j = nlohmann::json::parse(first.output);
  const nlohmann::json& p = j["prompt"];
  ASSERT_EQ(p["token_ids"].size(), 15u);
  ASSERT_EQ(p["logprobs"].size(), 15u);
  ASSERT_EQ(p["top_logprobs"].size(), 15u);
  EXPECT_TRUE(p["logprobs"][0].is_null());
  EXPECT_TRUE(p["top_logprobs"][0].is_null());
  EXPECT_EQ(p["token_ids"][14], next);
  EXPECT_EQ(p["logprobs"][14].get<float>(), g["samples"][0]["logprobs"][0].get<float>());
  for (size_t i = 1; i < 15; ++i) {
    ASSERT_EQ(p["top_logprobs"][i].size(), 2u) << i;
    EXPECT_GE(p["top_logprobs"][i][0]["logprob"].get<float>(),
              p["top_logprobs"][i][1]["logprob"].get<float>());
    EXPECT_LE(p["logprobs"][i].get<float>(), 0.0f);
  }
  // Greedy: the last token is the most likely there.
  EXPECT_EQ(p["top_logprobs"][14][0]["id"], next);
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  EXPECT_TRUE(j["samples"].empty() || j["samples"][0]["token_ids"].empty());

  CommandResult again = Ctl(score);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(nlohmann::json::parse(again.output)["prompt"], p);

  CommandResult text = Ctl({"generate", "--ids", longer, "--prompt-logprobs", "1",
                            "--max-tokens", "2", "--presence-penalty", "0.5",
                            "--frequency-penalty", "0.5", "--repetition-penalty", "1.1",
                            "--min-p", "0.01", "--logit-bias", "13:-5"});
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr("--- prompt logprobs"));
  EXPECT_THAT(text.output, HasSubstr("    0    464          -\n"));
  EXPECT_THAT(text.output, HasSubstr("--- sum of 14 prompt logprobs: "));
  EXPECT_THAT(text.output, HasSubstr("[prompt_tokens=15 "));
}

TEST_F(PrefixctlTest, OutOfRangeSamplingControlsAreRefusedByTheServer) {
  CommandResult penalty = Ctl({"generate", "--ids", "1,2", "--presence-penalty", "3"});
  EXPECT_EQ(penalty.exit_code, 1);
  EXPECT_THAT(penalty.output, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(penalty.output, HasSubstr("presence_penalty"));
  CommandResult bias = Ctl({"generate", "--ids", "1,2", "--logit-bias", "5:101"});
  EXPECT_EQ(bias.exit_code, 1);
  EXPECT_THAT(bias.output, HasSubstr("logit_bias"));
  CommandResult top = Ctl({"generate", "--ids", "1,2", "--prompt-logprobs", "21"});
  EXPECT_EQ(top.exit_code, 1);
  EXPECT_THAT(top.output, HasSubstr("prompt_logprobs"));
}

TEST_F(PrefixctlTest, BadFlagsAndUnreachableServerFailClearly) {
  CommandResult bad = Ctl({"generate"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.output, HasSubstr("exactly one prompt"));
  CommandResult invalid = Ctl({"generate", "--ids", "1", "--max-tokens", "0"});
  EXPECT_EQ(invalid.exit_code, 1);
  EXPECT_THAT(invalid.output, HasSubstr("INVALID_ARGUMENT"));
  const int port = PickFreePort();
  CommandResult down =
      RunCommand({BuiltBinary("client/prefixctl"), "--server", "127.0.0.1:" + std::to_string(port),
                  "--connect-timeout", "1", "info"});
  EXPECT_EQ(down.exit_code, 1);
  EXPECT_THAT(down.output, HasSubstr("cannot reach prefixd at 127.0.0.1:" + std::to_string(port)));
  CommandResult down_health =
      RunCommand({BuiltBinary("client/prefixctl"), "--server", "127.0.0.1:" + std::to_string(port),
                  "--connect-timeout", "1", "health"});
  EXPECT_EQ(down_health.exit_code, 1);
}

}  // namespace
}  // namespace prefixd::testing
