// The deployment files parse, and every metric a dashboard panel or the docs refer to is one
// the server exports (the README's metrics table, which server tests check against /metrics).
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "yaml-cpp/yaml.h"

namespace prefixd {
namespace {

std::string Path(const std::string& rel) { return std::string(PREFIXD_SOURCE_DIR) + "/" + rel; }

std::string ReadFile(const std::string& rel) {
  std::ifstream in(Path(rel));
  EXPECT_TRUE(in.good()) << rel;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Metric names in the README's metrics table: rows that start with "| `prefixd_...".
std::set<std::string> DocumentedMetrics() {
  std::set<std::string> names;
  std::istringstream in(ReadFile("README.md"));
  static const std::regex kRow(R"(^\| `(prefixd_[a-z0-9_]+)[`{])");
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, kRow)) names.insert(m[1]);
  }
  return names;
}

// Base metric names a PromQL expression refers to (histogram suffixes stripped).
std::set<std::string> MetricsIn(const std::string& expr) {
  std::set<std::string> out;
  static const std::regex kName(R"(prefixd_[a-z0-9_]+)");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), kName);
       it != std::sregex_iterator(); ++it) {
    std::string n = it->str();
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s(suffix);
      if (n.size() > s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0 &&
          n.find("_seconds") != std::string::npos) {
        n.resize(n.size() - s.size());
      }
    }
    out.insert(n);
  }
  return out;
}

TEST(DeployConfigTest, ReadmeListsTheMetricsTheIssueRequires) {
  const std::set<std::string> documented = DocumentedMetrics();
  for (const char* name :
       {"prefixd_prefix_cache_queried_tokens_total", "prefixd_prefix_cache_hit_tokens_total",
        "prefixd_kv_blocks", "prefixd_kv_pool_bytes", "prefixd_kv_bytes_per_token",
        "prefixd_kv_evictions_total", "prefixd_kv_cow_copies_total",
        "prefixd_prefill_tokens_total", "prefixd_generated_tokens_total",
        "prefixd_preemptions_total", "prefixd_requests_total", "prefixd_running_requests",
        "prefixd_waiting_requests", "prefixd_time_to_first_token_seconds",
        "prefixd_time_per_output_token_seconds", "prefixd_memory_bytes"}) {
    EXPECT_TRUE(documented.count(name)) << name << " missing from the README's metrics table";
  }
}

TEST(DeployConfigTest, DashboardPanelsQueryExportedMetrics) {
  const nlohmann::json dash = nlohmann::json::parse(ReadFile("deploy/grafana/dashboards/prefixd.json"));
  const std::set<std::string> documented = DocumentedMetrics();
  ASSERT_FALSE(documented.empty());
  std::set<std::string> used;
  ASSERT_TRUE(dash.contains("panels"));
  for (const auto& panel : dash["panels"]) {
    ASSERT_TRUE(panel.contains("targets")) << panel["title"];
    ASSERT_FALSE(panel["targets"].empty()) << panel["title"];
    for (const auto& target : panel["targets"]) {
      const std::string expr = target.at("expr").get<std::string>();
      const auto names = MetricsIn(expr);
      EXPECT_FALSE(names.empty()) << expr;
      for (const auto& n : names) {
        EXPECT_TRUE(documented.count(n)) << "panel '" << panel["title"] << "' queries " << n
                                         << ", which the server does not export";
        used.insert(n);
      }
    }
  }
  // The panels the deployment issue asks for.
  for (const char* name :
       {"prefixd_prefix_cache_hit_tokens_total", "prefixd_prefix_cache_queried_tokens_total",
        "prefixd_kv_blocks", "prefixd_kv_pool_bytes", "prefixd_kv_evictions_total",
        "prefixd_kv_cow_copies_total", "prefixd_preemptions_total",
        "prefixd_time_to_first_token_seconds", "prefixd_time_per_output_token_seconds",
        "prefixd_requests_total"}) {
    EXPECT_TRUE(used.count(name)) << "no panel shows " << name;
  }
}

TEST(DeployConfigTest, ComposeRunsPrefixdPrometheusAndGrafana) {
  const YAML::Node compose = YAML::LoadFile(Path("deploy/compose.yaml"));
  const YAML::Node services = compose["services"];
  ASSERT_TRUE(services.IsMap());
  for (const char* s : {"prefixd", "prometheus", "grafana"}) {
    EXPECT_TRUE(services[s].IsMap()) << "service " << s;
  }
  std::set<std::string> ports;
  for (const auto& p : services["prefixd"]["ports"]) ports.insert(p.as<std::string>());
  EXPECT_TRUE(ports.count("50051:50051"));
  EXPECT_TRUE(ports.count("9464:9464"));
  bool mounts_config = false;
  for (const auto& v : services["prometheus"]["volumes"]) {
    mounts_config |= v.as<std::string>().rfind("./prometheus.yml:", 0) == 0;
  }
  EXPECT_TRUE(mounts_config);

  const YAML::Node prom = YAML::LoadFile(Path("deploy/prometheus.yml"));
  const YAML::Node target = prom["scrape_configs"][0]["static_configs"][0]["targets"][0];
  EXPECT_EQ(target.as<std::string>(), "prefixd:9464");
}

TEST(DeployConfigTest, KubernetesProbesTheGrpcHealthServiceAndAsksForAGpu) {
  const YAML::Node dep = YAML::LoadFile(Path("deploy/k8s/deployment.yaml"));
  EXPECT_EQ(dep["kind"].as<std::string>(), "Deployment");
  const YAML::Node c = dep["spec"]["template"]["spec"]["containers"][0];
  for (const char* probe : {"readinessProbe", "livenessProbe", "startupProbe"}) {
    EXPECT_EQ(c[probe]["grpc"]["port"].as<int>(), 50051) << probe;
  }
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"].as<int>(), 1);
  const YAML::Node svc = YAML::LoadFile(Path("deploy/k8s/service.yaml"));
  EXPECT_EQ(svc["kind"].as<std::string>(), "Service");
  EXPECT_EQ(svc["spec"]["ports"][0]["port"].as<int>(), 50051);
}

}  // namespace
}  // namespace prefixd
