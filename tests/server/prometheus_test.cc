// A real Prometheus scrapes a real prefixd: the cache-hit counter read back through
// Prometheus' HTTP API equals what the server reports, and promtool accepts the exposition.
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/server/grpc_helpers.h"
#include "tests/server/process.h"

namespace prefixd::testing {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr char kPromtool[] = "/usr/bin/promtool";

TEST(PrometheusTest, ScrapesCacheHitsAndPassesPromtool) {
  if (access(kPrometheus, X_OK) != 0 || access(kPromtool, X_OK) != 0) {
    GTEST_SKIP() << "the Debian package prometheus is not installed (scripts/setup installs it)";
  }
  TempDir dir;
  const std::string model = dir.path() + "/model";
  ASSERT_TRUE(WriteTinyModel(model).ok());
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(model, {"--kv-cache-bytes=4194304"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Inference::NewStub(InsecureChannel((*server)->address()));

  const int prom_port = PickFreePort();
  ASSERT_NE(prom_port, 0);
  const std::string config = dir.path() + "/prometheus.yml";
  std::ofstream(config) << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                        << "scrape_configs:\n  - job_name: prefixd\n    static_configs:\n"
                        << "      - targets: ['127.0.0.1:" << (*server)->metrics_port() << "']\n";
  absl::StatusOr<std::unique_ptr<Process>> prom = Process::Start(
      {kPrometheus, "--config.file=" + config, "--storage.tsdb.path=" + dir.path() + "/data",
       "--web.listen-address=127.0.0.1:" + std::to_string(prom_port), "--log.level=warn"});
  ASSERT_TRUE(prom.ok()) << prom.status();

  const std::vector<uint32_t> prompt = RandomIds(8, 48);
  ASSERT_TRUE(Generate(*stub, IdsRequest(prompt, 4)).status.ok());
  GenerateResult warm = Generate(*stub, IdsRequest(prompt, 4));
  ASSERT_TRUE(warm.status.ok());
  ASSERT_EQ(warm.usage.cached_prompt_tokens(), 47u);
  const uint64_t hits = GetStats(*stub).hit_tokens();
  ASSERT_EQ(hits, 47u);

  // Prometheus scrapes on its own schedule, so poll its API until the sample arrives.
  double seen = -1;
  std::string last_answer;
  const bool arrived = PollUntil(
      [&] {
        absl::StatusOr<std::string> body =
            HttpGet(prom_port, "/api/v1/query?query=sum(prefixd_prefix_cache_hit_tokens_total)");
        if (!body.ok()) return false;
        last_answer = *body;
        nlohmann::json j = nlohmann::json::parse(*body, nullptr, false);
        if (j.is_discarded() || j["status"] != "success") return false;
        const auto& result = j["data"]["result"];
        if (result.empty()) return false;
        seen = std::stod(result[0]["value"][1].get<std::string>());
        return seen == static_cast<double>(hits);
      },
      absl::Seconds(45));
  EXPECT_TRUE(arrived) << "last value " << seen << ", last answer: " << last_answer
                       << "\nprometheus output:\n"
                       << (*prom)->Output();

  // promtool lints the live exposition (names, units, help texts, counter suffixes).
  absl::StatusOr<std::string> text = HttpGet((*server)->metrics_port(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  const std::string path = dir.path() + "/metrics.txt";
  std::ofstream(path) << *text;
  CommandResult lint =
      RunCommand({"/bin/sh", "-c", std::string(kPromtool) + " check metrics < " + path});
  EXPECT_EQ(lint.exit_code, 0) << lint.output;
  EXPECT_EQ(lint.output, "");
}

}  // namespace
}  // namespace prefixd::testing
