#include "client/cli_args.h"

#include "client/bench.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<CliArgs> Parse(std::vector<std::string> args) { return ParseCliArgs(args); }

std::string Error(std::vector<std::string> args) {
  absl::StatusOr<CliArgs> a = ParseCliArgs(args);
  EXPECT_FALSE(a.ok());
  return std::string(a.status().message());
}

TEST(CliArgsTest, GenerateWithTextAndEveryFlag) {
  absl::StatusOr<CliArgs> a = Parse({"--server",
                                     "10.0.0.1:9",
                                     "--token=abc",
                                     "generate",
                                     "Hello there",
                                     "--max-tokens",
                                     "7",
                                     "--temperature=0.5",
                                     "--top-k",
                                     "40",
                                     "--top-p",
                                     "0.9",
                                     "--seed",
                                     "123",
                                     "--samples",
                                     "3",
                                     "--salt",
                                     "s1",
                                     "--adapter",
                                     "sql-lora",
                                     "--top-logprobs",
                                     "2",
                                     "--json"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->command, Command::kGenerate);
  EXPECT_EQ(a->server, "10.0.0.1:9");
  EXPECT_EQ(a->token, "abc");
  EXPECT_TRUE(a->json);
  const GenerateArgs& g = a->generate;
  EXPECT_EQ(g.text, "Hello there");
  EXPECT_FALSE(g.ids.has_value());
  EXPECT_EQ(g.max_tokens, 7u);
  EXPECT_FLOAT_EQ(g.temperature, 0.5f);
  EXPECT_EQ(g.top_k, 40u);
  EXPECT_FLOAT_EQ(*g.top_p, 0.9f);
  EXPECT_EQ(*g.seed, 123u);
  EXPECT_EQ(g.samples, 3u);
  EXPECT_EQ(g.salt, "s1");
  EXPECT_EQ(g.adapter, "sql-lora");
  EXPECT_EQ(g.top_logprobs, 2u);
}

TEST(CliArgsTest, GenerateSamplingControlsAndPromptLogprobs) {
  absl::StatusOr<CliArgs> a =
      Parse({"generate", "--ids", "1,2", "--presence-penalty", "0.5", "--frequency-penalty=-1",
             "--repetition-penalty", "1.2", "--min-p", "0.05", "--logit-bias",
             "50256:-100, 13:2.5", "--prompt-logprobs", "3", "--max-tokens", "0"});
  ASSERT_TRUE(a.ok()) << a.status();
  const GenerateArgs& g = a->generate;
  EXPECT_FLOAT_EQ(g.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(g.frequency_penalty, -1.0f);
  ASSERT_TRUE(g.repetition_penalty.has_value());
  EXPECT_FLOAT_EQ(*g.repetition_penalty, 1.2f);
  EXPECT_FLOAT_EQ(g.min_p, 0.05f);
  ASSERT_EQ(g.logit_bias.size(), 2u);
  EXPECT_EQ(g.logit_bias[0], std::make_pair(50256u, -100.0f));
  EXPECT_EQ(g.logit_bias[1], std::make_pair(13u, 2.5f));
  EXPECT_EQ(g.prompt_logprobs, 3u);
  EXPECT_EQ(g.max_tokens, 0u);

  absl::StatusOr<CliArgs> d = Parse({"generate", "x"});
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->generate.repetition_penalty.has_value());
  EXPECT_FALSE(d->generate.prompt_logprobs.has_value());
  EXPECT_TRUE(d->generate.logit_bias.empty());
}

TEST(CliArgsTest, BadSamplingControlValuesNameTheFlag) {
  EXPECT_THAT(Error({"generate", "x", "--logit-bias", "50256"}),
              HasSubstr("--logit-bias entry \"50256\" is not ID:BIAS"));
  EXPECT_THAT(Error({"generate", "x", "--logit-bias", "a:1"}), HasSubstr("--logit-bias token id"));
  EXPECT_THAT(Error({"generate", "x", "--logit-bias", "5:nan"}), HasSubstr("--logit-bias bias"));
  EXPECT_THAT(Error({"generate", "x", "--logit-bias", "5:1,"}), HasSubstr("--logit-bias"));
  EXPECT_THAT(Error({"generate", "x", "--min-p", "lots"}), HasSubstr("--min-p"));
  EXPECT_THAT(Error({"generate", "x", "--prompt-logprobs", "-1"}),
              HasSubstr("--prompt-logprobs"));
  EXPECT_THAT(Error({"generate", "x", "--presence-penalty", "inf"}),
              HasSubstr("--presence-penalty"));
}

TEST(CliArgsTest, DefaultsAndIds) {
  absl::StatusOr<CliArgs> a = Parse({"generate", "--ids", "1, 2,3"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->server, "127.0.0.1:50051");
  EXPECT_THAT(*a->generate.ids, ElementsAre(1u, 2u, 3u));
  EXPECT_FALSE(a->generate.top_p.has_value());
  EXPECT_FALSE(a->generate.seed.has_value());
  EXPECT_FALSE(a->json);
}

TEST(CliArgsTest, OtherCommands) {
  EXPECT_EQ(Parse({"tokenize", "a b"})->tokenize_text, "a b");
  EXPECT_EQ(Parse({"tokenize", "a b"})->tokenize_adapter, "");
  EXPECT_EQ(Parse({"tokenize", "a b", "--adapter", "legal"})->tokenize_adapter, "legal");
  EXPECT_THAT(Error({"info", "--adapter", "legal"}), HasSubstr("--adapter"));
  EXPECT_EQ(Parse({"info"})->command, Command::kInfo);
  EXPECT_TRUE(Parse({"stats", "--json"})->json);
  absl::StatusOr<CliArgs> b =
      Parse({"bench", "--prefix-tokens", "64", "--suffix-tokens=8", "--requests", "10",
             "--concurrency", "2", "--max-tokens", "4"});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->bench.prefix_tokens, 64u);
  EXPECT_EQ(b->bench.suffix_tokens, 8u);
  EXPECT_EQ(b->bench.requests, 10u);
  EXPECT_EQ(b->bench.concurrency, 2u);
  EXPECT_EQ(b->bench.max_tokens, 4u);
  EXPECT_EQ(Parse({"--help"})->command, Command::kHelp);
}

TEST(CliArgsTest, HelpOnlyWhereTheCommandGoesAndDoubleDashEndsTheFlags) {
  EXPECT_EQ(Parse({"help"})->command, Command::kHelp);
  EXPECT_EQ(Parse({"--server", "h:1", "help"})->command, Command::kHelp);
  EXPECT_EQ(Parse({"generate", "-h"})->command, Command::kHelp);
  // A prompt that reads "help" is a prompt.
  absl::StatusOr<CliArgs> t = Parse({"tokenize", "help"});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->command, Command::kTokenize);
  EXPECT_EQ(t->tokenize_text, "help");
  // After "--", text that looks like a flag (or like -h) is the prompt.
  absl::StatusOr<CliArgs> g = Parse({"generate", "--max-tokens", "3", "--", "--verbose please"});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->command, Command::kGenerate);
  EXPECT_EQ(g->generate.text, std::optional<std::string>("--verbose please"));
  EXPECT_EQ(g->generate.max_tokens, 3u);
  absl::StatusOr<CliArgs> h = Parse({"tokenize", "--", "-h"});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->tokenize_text, "-h");
  EXPECT_THAT(Error({"generate", "--", "a", "b"}), HasSubstr("quote it"));
}

TEST(CliArgsTest, BadCommandLinesSayWhatIsWrong) {
  EXPECT_THAT(Error({"--connect-timeout", "1e30", "info"}),
              HasSubstr("--connect-timeout must be > 0 and at most 86400 seconds"));
  EXPECT_THAT(Error({"--connect-timeout", "0", "info"}), HasSubstr("--connect-timeout"));
  EXPECT_THAT(Error({}), HasSubstr("no command"));
  EXPECT_THAT(Error({"frobnicate"}), HasSubstr("unknown command \"frobnicate\""));
  EXPECT_THAT(Error({"generate"}), HasSubstr("exactly one prompt"));
  EXPECT_THAT(Error({"generate", "text", "--ids", "1"}), HasSubstr("exactly one prompt"));
  EXPECT_THAT(Error({"generate", "a", "b"}), HasSubstr("quote it"));
  EXPECT_THAT(Error({"generate", "a", "--max-tokens", "many"}),
              HasSubstr("--max-tokens expects a non-negative integer"));
  EXPECT_THAT(Error({"generate", "a", "--max-tokens", "-3"}), HasSubstr("--max-tokens"));
  EXPECT_THAT(Error({"generate", "a", "--temperature", "hot"}), HasSubstr("--temperature"));
  EXPECT_THAT(Error({"generate", "--ids", "1,x"}), HasSubstr("--ids"));
  EXPECT_THAT(Error({"generate", "a", "--max-tokens"}), HasSubstr("needs a value"));
  EXPECT_THAT(Error({"generate", "a", "--samples", "0"}), HasSubstr("--samples"));
  EXPECT_THAT(Error({"info", "--max-tokens", "3"}), HasSubstr("unknown flag --max-tokens"));
  EXPECT_THAT(Error({"info", "extra"}), HasSubstr("unexpected argument"));
  EXPECT_THAT(Error({"bench", "--requests", "0"}), HasSubstr("--requests"));
  EXPECT_THAT(Error({"--json=1", "info"}), HasSubstr("--json takes no value"));
}

TEST(BenchMathTest, NearestRankPercentiles) {
  EXPECT_EQ(Percentile({}, 50), 0);
  EXPECT_EQ(Percentile({5}, 99), 5);
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(Percentile(v, 50), 50);
  EXPECT_EQ(Percentile(v, 90), 90);
  EXPECT_EQ(Percentile(v, 99), 99);
  EXPECT_EQ(Percentile(v, 100), 100);
  EXPECT_EQ(Percentile({3, 1, 2}, 50), 2);
}

TEST(BenchMathTest, ReportTableHasEveryFigure) {
  BenchReport r;
  r.requests_ok = 4;
  r.wall_s = 2.0;
  r.completion_tokens = 40;
  r.prompt_tokens = 100;
  r.cached_prompt_tokens = 75;
  r.ttft_s = {0.010, 0.020, 0.030, 0.040};
  r.itl_s = {0.001, 0.002};
  std::ostringstream out;
  PrintBenchReport(r, false, out);
  EXPECT_THAT(out.str(), HasSubstr("requests/s        2.00"));
  EXPECT_THAT(out.str(), HasSubstr("tokens/s          20.0"));
  EXPECT_THAT(out.str(), HasSubstr("cache hit ratio   0.750"));
  EXPECT_THAT(out.str(), HasSubstr("TTFT"));
  EXPECT_THAT(out.str(), HasSubstr("20.00"));  // p50 TTFT in ms
  std::ostringstream js;
  PrintBenchReport(r, true, js);
  EXPECT_THAT(js.str(), HasSubstr("\"cache_hit_ratio\":0.75"));
}

}  // namespace
}  // namespace prefixd
