// `prefixd-model generate` against a direct greedy loop over the CPU backend.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/kernels/test_models.h"

namespace prefixd {
namespace {

struct Result {
  int exit_code = -1;
  std::string out;
};

Result RunTool(const std::string& args) {
  const std::string cmd = std::string(PREFIXD_MODEL_TOOL) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  Result r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(GenerateCommandTest, JsonMatchesDirectGreedyLoop) {
  std::unique_ptr<Model> model = testing::WriteAndLoad(TinyModelConfig(), 31, "generate");
  ASSERT_NE(model, nullptr);
  const Result r = RunTool("generate " + model->dir() +
                           " --ids 464,2068,7586 --max-tokens 6 --top-logprobs 4 "
                           "--ignore-eos --threads 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_ids"], nlohmann::json({464, 2068, 7586}));
  ASSERT_EQ(j["generated_ids"].size(), 6u);
  ASSERT_EQ(j["logprobs"].size(), 6u);
  ASSERT_EQ(j["top_logprobs"].size(), 6u);

  // The same greedy loop by hand, through the backend.
  auto backend = testing::MakeBackend(*model, 1, 4);
  std::vector<uint32_t> tokens = {464, 2068, 7586};
  const std::vector<int32_t> table = {0, 1, 2, 3};
  for (int i = 0; i < 6; ++i) {
    const std::vector<float> logits = testing::Prefill(
        *backend, tokens, table, 0, static_cast<int>(tokens.size()) - (i == 0 ? 3 : 1));
    const uint32_t best =
        static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    double sum = 0;
    for (float x : logits) sum += std::exp(double{x} - logits[best]);
    const double logprob = -std::log(sum);
    EXPECT_EQ(j["generated_ids"][i].get<uint32_t>(), best) << i;
    EXPECT_NEAR(j["logprobs"][i].get<double>(), logprob, 1e-9) << i;
    const auto& top = j["top_logprobs"][i];
    ASSERT_EQ(top["token_ids"].size(), 4u);
    EXPECT_EQ(top["token_ids"][0].get<uint32_t>(), best);
    EXPECT_EQ(top["logprobs"][0].get<double>(), j["logprobs"][i].get<double>());
    for (int k = 1; k < 4; ++k) {
      EXPECT_LE(top["logprobs"][k].get<double>(), top["logprobs"][k - 1].get<double>());
      const uint32_t id = top["token_ids"][k].get<uint32_t>();
      EXPECT_NEAR(top["logprobs"][k].get<double>(), logits[id] - logits[best] + logprob, 1e-9);
    }
    tokens.push_back(best);
  }

  const Result text = RunTool("generate " + model->dir() + " --text \"Hello\" --max-tokens 2");
  EXPECT_EQ(text.exit_code, 0) << text.out;
  EXPECT_FALSE(text.out.empty());
}

TEST(GenerateCommandTest, StopsAtEosUnlessIgnored) {
  std::unique_ptr<Model> model = testing::WriteAndLoad(TinyModelConfig(), 33, "generate");
  ASSERT_NE(model, nullptr);
  const std::string args = " --ids 11,22,33 --max-tokens 5 --json";
  const Result first = RunTool("generate " + model->dir() + args + " --ignore-eos");
  ASSERT_EQ(first.exit_code, 0) << first.out;
  const uint32_t first_id = nlohmann::json::parse(first.out)["generated_ids"][0];
  // A copy whose config names that first token as EOS: same weights, so the same greedy
  // choice, which now ends the generation.
  const std::string dir = testing::MakeTempDir("eos");
  for (const char* f : {"model.safetensors", "vocab.json", "merges.txt"}) {
    std::filesystem::copy_file(std::filesystem::path(model->dir()) / f,
                               std::filesystem::path(dir) / f);
  }
  std::ifstream in(std::filesystem::path(model->dir()) / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["eos_token_id"] = first_id;
  std::ofstream(std::filesystem::path(dir) / "config.json") << config.dump(2);
  const Result stopped = RunTool("generate " + dir + args);
  ASSERT_EQ(stopped.exit_code, 0) << stopped.out;
  EXPECT_EQ(nlohmann::json::parse(stopped.out)["generated_ids"], nlohmann::json({first_id}));
  const Result ignored = RunTool("generate " + dir + args + " --ignore-eos");
  ASSERT_EQ(ignored.exit_code, 0) << ignored.out;
  EXPECT_EQ(nlohmann::json::parse(ignored.out)["generated_ids"],
            nlohmann::json::parse(first.out)["generated_ids"]);
}

TEST(GenerateCommandTest, RefusesCudaAndBadArguments) {
  std::unique_ptr<Model> model = testing::WriteAndLoad(TinyModelConfig(), 32, "generate");
  ASSERT_NE(model, nullptr);
  const Result cuda = RunTool("generate " + model->dir() + " --ids 1 --max-tokens 1 --device cuda");
  EXPECT_NE(cuda.exit_code, 0);
  EXPECT_NE(cuda.out.find("cuda"), std::string::npos) << cuda.out;
  const Result both = RunTool("generate " + model->dir() + " --ids 1 --text x --max-tokens 1");
  EXPECT_EQ(both.exit_code, 2) << both.out;
  const Result too_long = RunTool("generate " + model->dir() + " --ids 1,2 --max-tokens 400");
  EXPECT_EQ(too_long.exit_code, 1) << too_long.out;
  EXPECT_NE(too_long.out.find("context"), std::string::npos) << too_long.out;
  const Result bad_id = RunTool("generate " + model->dir() + " --ids 1,60000 --max-tokens 1");
  EXPECT_EQ(bad_id.exit_code, 1) << bad_id.out;
}

}  // namespace
}  // namespace prefixd
