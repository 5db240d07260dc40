// The deployment files parse, and every metric a dashboard panel or the docs refer to is one
// the server exports (docs/SERVER.md's metrics table, which server tests check against
// /metrics). The command lines in the docs: docs_commands_test.cc.

#include <algorithm>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "prefixd/v1/inference.pb.h"
#include "tests/deploy/repo_files.h"
#include "yaml-cpp/yaml.h"

namespace prefixd {
namespace {

using ::prefixd::testing::ReadRepoFile;
using ::prefixd::testing::RepoPath;

// Metric names in docs/SERVER.md's metrics table: rows that start with "| `prefixd_...".
std::set<std::string> DocumentedMetrics() {
  std::set<std::string> names;
  std::istringstream in(ReadRepoFile("docs/SERVER.md"));
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
        "prefixd_kv_evictions_total", "prefixd_kv_cow_copies_total", "prefixd_prefill_tokens_total",
        "prefixd_generated_tokens_total", "prefixd_preemptions_total", "prefixd_requests_total",
        "prefixd_running_requests", "prefixd_waiting_requests",
        "prefixd_time_to_first_token_seconds", "prefixd_time_per_output_token_seconds",
        "prefixd_memory_bytes"}) {
    EXPECT_TRUE(documented.count(name)) << name << " missing from docs/SERVER.md's metrics table";
  }
}

TEST(DeployConfigTest, DashboardPanelsQueryExportedMetrics) {
  const nlohmann::json dash =
      nlohmann::json::parse(ReadRepoFile("deploy/grafana/dashboards/prefixd.json"));
  const std::set<std::string> documented = DocumentedMetrics();
  ASSERT_FALSE(documented.empty());
  std::set<std::string> used;
  ASSERT_TRUE(dash.contains("panels"));
  for (const auto& panel : dash["panels"]) {
    if (panel.value("type", "") == "row") continue;  // a heading; the panels follow it
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
        "prefixd_requests_total", "prefixd_disk_cache_hit_tokens_total",
        "prefixd_disk_cache_spills_total", "prefixd_disk_cache_spills_dropped_total",
        "prefixd_disk_cache_loads_total", "prefixd_disk_cache_corrupt_blocks_total",
        "prefixd_disk_cache_bytes", "prefixd_disk_cache_load_seconds"}) {
    EXPECT_TRUE(used.count(name)) << "no panel shows " << name;
  }
}

// Every metric the prose and the scripts name (queries in the docs, the metrics an endpoint
// picker reads, what scripts/demo and scripts/container-test grep for) is in the table.
TEST(DeployConfigTest, DocsAndScriptsNameExportedMetrics) {
  const std::set<std::string> documented = DocumentedMetrics();
  ASSERT_FALSE(documented.empty());
  for (const char* file : {"README.md", "docs/SERVER.md", "docs/SCALING.md", "docs/BENCHMARKS.md",
                           "deploy/k8s/README.md", "deploy/compose.yaml", "deploy/prometheus.yml",
                           "scripts/demo", "scripts/container-test"}) {
    for (const std::string& name : MetricsIn(ReadRepoFile(file))) {
      EXPECT_TRUE(documented.count(name))
          << file << " names " << name << ", which the server does not export";
    }
  }
}

TEST(DeployConfigTest, ComposeRunsReplicasBehindHaproxyWithPrometheusAndGrafana) {
  const YAML::Node compose = YAML::LoadFile(RepoPath("deploy/compose.yaml"));
  const YAML::Node services = compose["services"];
  ASSERT_TRUE(services.IsMap());
  for (const char* s : {"prefixd", "haproxy", "prometheus", "grafana"}) {
    EXPECT_TRUE(services[s].IsMap()) << "service " << s;
  }
  EXPECT_EQ(services["prefixd"]["deploy"]["replicas"].as<int>(), 3);
  EXPECT_FALSE(services["prefixd"]["ports"].IsDefined()) << "clients go through HAProxy";
  std::set<std::string> ports;
  for (const auto& p : services["haproxy"]["ports"]) ports.insert(p.as<std::string>());
  EXPECT_TRUE(ports.count("50051:50051"));
  EXPECT_TRUE(ports.count("8000:8000")) << "the HTTP front door";
  const YAML::Node env = services["haproxy"]["environment"];
  EXPECT_EQ(env["PREFIXD_REPLICAS_DNS"].as<std::string>(), "prefixd");
  EXPECT_EQ(env["PREFIXD_GRPC_BIND"].as<std::string>(), ":50051");
  // HTTP: routed by the prompt, replicas checked with GET /health on their HTTP port.
  EXPECT_EQ(env["PREFIXD_HTTP_BIND"].as<std::string>(), ":8000");
  EXPECT_EQ(env["PREFIXD_HEALTH"].as<std::string>(), "http");
  EXPECT_EQ(env["PREFIXD_REPLICA_CHECK_PORT"].as<std::string>(), "8000");
  std::set<std::string> exposed;
  for (const auto& p : services["prefixd"]["expose"]) exposed.insert(p.as<std::string>());
  EXPECT_TRUE(exposed.count("8000"));
  bool mounts_haproxy = false, mounts_prometheus = false;
  for (const auto& v : services["haproxy"]["volumes"]) {
    mounts_haproxy |= v.as<std::string>().rfind("./haproxy/haproxy.cfg:", 0) == 0;
  }
  for (const auto& v : services["prometheus"]["volumes"]) {
    mounts_prometheus |= v.as<std::string>().rfind("./prometheus.yml:", 0) == 0;
  }
  EXPECT_TRUE(mounts_haproxy);
  EXPECT_TRUE(mounts_prometheus);

  // Prometheus scrapes every replica (DNS: one address each) and HAProxy's own metrics.
  const YAML::Node prom = YAML::LoadFile(RepoPath("deploy/prometheus.yml"));
  std::map<std::string, YAML::Node> jobs;
  for (const YAML::Node& j : prom["scrape_configs"]) jobs[j["job_name"].as<std::string>()] = j;
  ASSERT_TRUE(jobs.count("prefixd") && jobs.count("haproxy"));
  const YAML::Node sd = jobs["prefixd"]["dns_sd_configs"][0];
  EXPECT_EQ(sd["names"][0].as<std::string>(), "prefixd");
  EXPECT_EQ(sd["port"].as<int>(), 9464);
  const std::string stats = env["PREFIXD_STATS_BIND"].as<std::string>();
  EXPECT_EQ(jobs["haproxy"]["static_configs"][0]["targets"][0].as<std::string>(),
            "haproxy" + stats);
}

// The value after `flag` in a list of arguments, or "" when absent.
std::string ArgAfter(const YAML::Node& args, const std::string& flag) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i].as<std::string>() == flag) return args[i + 1].as<std::string>();
  }
  return "";
}

// The replicas share one remote cache tier whose memory Redis/Valkey bounds by LRU, in
// compose and in Kubernetes, at an address that service answers on.
TEST(DeployConfigTest, ReplicasShareAnLruBoundedRemoteTier) {
  const YAML::Node services = YAML::LoadFile(RepoPath("deploy/compose.yaml"))["services"];
  ASSERT_TRUE(services["kv-cache"].IsMap());
  EXPECT_EQ(ArgAfter(services["prefixd"]["command"], "--kv-remote"), "redis://kv-cache:6379");
  EXPECT_EQ(ArgAfter(services["kv-cache"]["command"], "--maxmemory-policy"), "allkeys-lru");
  EXPECT_FALSE(ArgAfter(services["kv-cache"]["command"], "--maxmemory").empty());
  EXPECT_EQ(services["kv-cache"]["expose"][0].as<std::string>(), "6379");

  const YAML::Node dep = YAML::LoadFile(RepoPath("deploy/k8s/deployment.yaml"));
  const YAML::Node args = dep["spec"]["template"]["spec"]["containers"][0]["args"];
  EXPECT_EQ(ArgAfter(args, "--kv-remote"), "redis://prefixd-kv-cache:6379");
  bool service = false, lru = false;
  for (const YAML::Node& d : YAML::LoadAllFromFile(RepoPath("deploy/k8s/kv-cache.yaml"))) {
    if (d["kind"].as<std::string>() == "Service") {
      service = d["metadata"]["name"].as<std::string>() == "prefixd-kv-cache" &&
                d["spec"]["ports"][0]["port"].as<int>() == 6379;
    }
    if (d["kind"].as<std::string>() == "Deployment") {
      lru = ArgAfter(d["spec"]["template"]["spec"]["containers"][0]["args"],
                     "--maxmemory-policy") == "allkeys-lru";
    }
  }
  EXPECT_TRUE(service);
  EXPECT_TRUE(lru);
}

// Requests split by front end (api="grpc"|"http") and status code, and a row of disk tier
// panels after a row heading, whose bytes panel shows both the used and the cap series.
TEST(DeployConfigTest, DashboardShowsRequestsByApiAndCodeAndADiskTierRow) {
  const nlohmann::json dash =
      nlohmann::json::parse(ReadRepoFile("deploy/grafana/dashboards/prefixd.json"));
  bool by_api_and_code = false, in_disk_row = false, used = false, cap = false;
  int disk_panels = 0;
  for (const auto& panel : dash["panels"]) {
    if (panel.value("type", "") == "row") {
      in_disk_row = panel.value("title", "").find("Disk") != std::string::npos;
      continue;
    }
    for (const auto& target : panel.value("targets", nlohmann::json::array())) {
      const std::string expr = target.at("expr").get<std::string>();
      by_api_and_code |= expr.find("prefixd_requests_total") != std::string::npos &&
                         expr.find("by (api, code)") != std::string::npos;
      if (expr.find("prefixd_disk_cache_") == std::string::npos) continue;
      EXPECT_TRUE(in_disk_row) << "disk tier panel outside the disk tier row: " << expr;
      used |= expr.find("prefixd_disk_cache_bytes{kind=\"used\"}") != std::string::npos;
      cap |= expr.find("prefixd_disk_cache_bytes{kind=\"cap\"}") != std::string::npos;
    }
    if (in_disk_row) ++disk_panels;
  }
  EXPECT_TRUE(by_api_and_code);
  EXPECT_GE(disk_panels, 4);
  EXPECT_TRUE(used);
  EXPECT_TRUE(cap);
}

TEST(DeployConfigTest, DashboardShowsHitRatioAndLoadPerReplica) {
  const nlohmann::json dash =
      nlohmann::json::parse(ReadRepoFile("deploy/grafana/dashboards/prefixd.json"));
  bool hit_per_replica = false, load_per_replica = false, hit_per_adapter = false;
  for (const auto& panel : dash["panels"]) {
    for (const auto& target : panel.value("targets", nlohmann::json::array())) {
      const std::string expr = target.at("expr").get<std::string>();
      // The labelled counters are summed (never read raw): a ratio per adapter sums by it.
      hit_per_adapter |=
          expr.find("sum by (adapter) (rate(prefixd_prefix_cache_hit_tokens_total") !=
          std::string::npos;
      if (expr.find("by (instance)") == std::string::npos) continue;
      hit_per_replica |= expr.find("prefixd_prefix_cache_hit_tokens_total") != std::string::npos;
      load_per_replica |= expr.find("prefixd_running_requests") != std::string::npos;
    }
  }
  EXPECT_TRUE(hit_per_replica);
  EXPECT_TRUE(load_per_replica);
  EXPECT_TRUE(hit_per_adapter);
}

TEST(DeployConfigTest, KubernetesRunsHaproxyOverAHeadlessService) {
  const std::vector<YAML::Node> docs = YAML::LoadAllFromFile(RepoPath("deploy/k8s/haproxy.yaml"));
  bool headless = false, haproxy = false;
  for (const YAML::Node& d : docs) {
    const std::string kind = d["kind"].as<std::string>();
    if (kind == "Service" && d["spec"]["clusterIP"].IsDefined()) {
      headless = d["spec"]["clusterIP"].as<std::string>() == "None" &&
                 d["spec"]["selector"]["app"].as<std::string>() == "prefixd";
    }
    if (kind == "Deployment") {
      const YAML::Node c = d["spec"]["template"]["spec"]["containers"][0];
      for (const auto& e : c["env"]) {
        if (e["name"].as<std::string>() == "PREFIXD_REPLICAS_DNS") {
          haproxy = e["value"].as<std::string>().rfind("prefixd-replicas.", 0) == 0;
        }
      }
      EXPECT_TRUE(c["readinessProbe"].IsDefined());
    }
  }
  EXPECT_TRUE(headless);
  EXPECT_TRUE(haproxy);
}

// haproxy -c accepts the configuration in each way it is used, and refuses a listed replica
// without its health check port. Needs haproxy (scripts/setup installs it).
TEST(DeployConfigTest, HaproxyAcceptsTheConfiguration) {
  if (std::system("command -v haproxy >/dev/null") != 0) GTEST_SKIP() << "no haproxy";
  const std::string check =
      " haproxy -c -f " + RepoPath("deploy/haproxy/haproxy.cfg") + " >/dev/null 2>&1";
  const std::string listed =
      "env PREFIXD_GRPC_BIND=127.0.0.1:50051 PREFIXD_REPLICA_1_GRPC_PORT=50061 "
      "PREFIXD_REPLICA_2_GRPC_PORT=50062 ";
  EXPECT_EQ(std::system((listed +
                         "PREFIXD_REPLICA_1_CHECK_PORT=50061 "
                         "PREFIXD_REPLICA_2_CHECK_PORT=50062" +
                         check)
                            .c_str()),
            0);
  EXPECT_EQ(std::system((listed +
                         "PREFIXD_REPLICA_1_CHECK_PORT=50061 PREFIXD_POLICY=roundrobin "
                         "PREFIXD_REPLICA_2_CHECK_PORT=50062" +
                         check)
                            .c_str()),
            0);
  EXPECT_NE(std::system((listed + "PREFIXD_REPLICA_1_CHECK_PORT=50061" + check).c_str()), 0);
  const std::string dns =
      "env PREFIXD_GRPC_BIND=:50051 PREFIXD_STATS_BIND=:8404 PREFIXD_REPLICAS_DNS=prefixd ";
  EXPECT_EQ(std::system((dns + "PREFIXD_BALANCE_FACTOR=150" + check).c_str()), 0);
  EXPECT_EQ(std::system((dns +
                         "PREFIXD_HTTP_BIND=:8000 PREFIXD_HEALTH=http "
                         "PREFIXD_REPLICA_CHECK_PORT=8000" +
                         check)
                            .c_str()),
            0);
}

// The environment variables a name in haproxy.cfg matches: PREFIXD_ names, with a listed
// replica's number (PREFIXD_REPLICA_3_GRPC_PORT) written as <n> (PREFIXD_REPLICA_<n>_GRPC_PORT).
std::set<std::string> HaproxyVariablesIn(const std::string& text) {
  static const std::regex kName(R"(PREFIXD_REPLICA_<n>_[A-Z_]*[A-Z]|PREFIXD_[A-Z0-9_]*[A-Z0-9])");
  static const std::regex kNumbered(R"(^PREFIXD_REPLICA_[0-9]+_)");
  std::set<std::string> names;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kName);
       it != std::sregex_iterator(); ++it) {
    names.insert(std::regex_replace(it->str(), kNumbered, "PREFIXD_REPLICA_<n>_"));
  }
  return names;
}

// haproxy.cfg's header is where operators (and docs/SCALING.md, which points there) learn
// which variables configure it: it must name exactly the variables the configuration reads.
TEST(DeployConfigTest, HaproxyConfigHeaderNamesEveryVariableItReads) {
  std::istringstream in(ReadRepoFile("deploy/haproxy/haproxy.cfg"));
  std::string header, body, line;
  bool in_header = true;
  while (std::getline(in, line)) {
    in_header = in_header && (line.empty() || line[0] == '#');
    if (in_header) {
      header += line + "\n";
    } else if (line.find_first_not_of(' ') != std::string::npos &&
               line[line.find_first_not_of(' ')] != '#') {
      body += line + "\n";  // directives only: comments in the body are not the interface
    }
  }
  const std::set<std::string> documented = HaproxyVariablesIn(header);
  const std::set<std::string> read = HaproxyVariablesIn(body);
  ASSERT_FALSE(read.empty());
  for (const std::string& name : read) {
    EXPECT_TRUE(documented.count(name)) << name << " is read but not listed in the header";
  }
  for (const std::string& name : documented) {
    EXPECT_TRUE(read.count(name)) << name << " is listed in the header but never read";
  }
}

// HAProxy reads gRPC requests by path and field number: the path must be a method of the
// service, and the fields it keys on must be GenerateRequest's prompt_cache_key, text and
// token_ids' ids, as its comments and docs/SCALING.md say.
TEST(DeployConfigTest, HaproxyKeysOnGenerateRequestsFields) {
  const std::string cfg = ReadRepoFile("deploy/haproxy/haproxy.cfg");
  const google::protobuf::Descriptor* request = v1::GenerateRequest::descriptor();
  const google::protobuf::ServiceDescriptor* service =
      request->file()->FindServiceByName("Inference");
  ASSERT_NE(service, nullptr);
  static const std::regex kPath(R"(path /([a-z0-9.]+)\.([A-Za-z]+)/([A-Za-z]+))");
  int paths = 0;
  for (auto it = std::sregex_iterator(cfg.begin(), cfg.end(), kPath); it != std::sregex_iterator();
       ++it, ++paths) {
    EXPECT_EQ((*it)[1].str() + "." + (*it)[2].str(), service->full_name());
    EXPECT_NE(service->FindMethodByName((*it)[3].str()), nullptr) << it->str();
  }
  EXPECT_GE(paths, 1);
  static const std::regex kField(R"(ungrpc\(([0-9]+)(\.([0-9]+))?\))");
  std::set<std::string> keyed;
  for (auto it = std::sregex_iterator(cfg.begin(), cfg.end(), kField); it != std::sregex_iterator();
       ++it) {
    const google::protobuf::FieldDescriptor* f =
        request->FindFieldByNumber(std::stoi((*it)[1].str()));
    ASSERT_NE(f, nullptr) << it->str();
    std::string name = f->name();
    if ((*it)[3].matched) {
      ASSERT_NE(f->message_type(), nullptr) << it->str();
      const google::protobuf::FieldDescriptor* inner =
          f->message_type()->FindFieldByNumber(std::stoi((*it)[3].str()));
      ASSERT_NE(inner, nullptr) << it->str();
      name += "." + inner->name();
    }
    keyed.insert(name);
  }
  EXPECT_EQ(keyed, (std::set<std::string>{"prompt_cache_key", "text", "token_ids.ids"}));
}

// docs/SERVER.md describes each method of prefixd.v1.Inference in bold (**Generate**), and
// every method the docs name as gRPC's (gRPC `Tokenize`, prefixd.v1.Inference/Generate)
// is one the service has.
TEST(DeployConfigTest, TheDocsNameTheServicesMethods) {
  const google::protobuf::ServiceDescriptor* service =
      v1::GenerateRequest::descriptor()->file()->FindServiceByName("Inference");
  ASSERT_NE(service, nullptr);
  const std::string server_md = ReadRepoFile("docs/SERVER.md");
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string& name = service->method(i)->name();
    EXPECT_NE(server_md.find("**" + name + "**"), std::string::npos)
        << name << " is not described in docs/SERVER.md";
  }
  static const std::regex kNamed(R"(gRPC `([A-Z][A-Za-z]+)`|prefixd\.v1\.Inference/([A-Za-z]+))");
  int named = 0;
  for (const char* file : {"README.md", "docs/SERVER.md", "docs/SCALING.md", "docs/BENCHMARKS.md",
                           "deploy/k8s/README.md"}) {
    const std::string text = ReadRepoFile(file);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), kNamed);
         it != std::sregex_iterator(); ++it, ++named) {
      const std::string method = (*it)[1].matched ? (*it)[1].str() : (*it)[2].str();
      EXPECT_NE(service->FindMethodByName(method), nullptr)
          << file << " names " << it->str() << ", which prefixd.v1.Inference does not have";
    }
  }
  EXPECT_GE(named, 3);
}

TEST(DeployConfigTest, KubernetesProbesTheGrpcHealthServiceAndAsksForAGpu) {
  const YAML::Node dep = YAML::LoadFile(RepoPath("deploy/k8s/deployment.yaml"));
  EXPECT_EQ(dep["kind"].as<std::string>(), "Deployment");
  const YAML::Node c = dep["spec"]["template"]["spec"]["containers"][0];
  for (const char* probe : {"readinessProbe", "livenessProbe", "startupProbe"}) {
    EXPECT_EQ(c[probe]["grpc"]["port"].as<int>(), 50051) << probe;
  }
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"].as<int>(), 1);
  const YAML::Node svc = YAML::LoadFile(RepoPath("deploy/k8s/service.yaml"));
  EXPECT_EQ(svc["kind"].as<std::string>(), "Service");
  EXPECT_EQ(svc["spec"]["ports"][0]["port"].as<int>(), 50051);
}

// The replicas publish KV events for a cache-aware router (docs/SCALING.md), and every pod's
// PUB and replay ports are reachable through the headless Service.
TEST(DeployConfigTest, KubernetesExposesTheKvEventsPorts) {
  auto port_named = [](const YAML::Node& ports, const std::string& name, const char* key) {
    for (const auto& p : ports) {
      if (p["name"].as<std::string>() == name) return p[key].as<int>();
    }
    return 0;
  };
  const YAML::Node dep = YAML::LoadFile(RepoPath("deploy/k8s/deployment.yaml"));
  const YAML::Node c = dep["spec"]["template"]["spec"]["containers"][0];
  std::vector<std::string> args;
  for (const auto& a : c["args"]) args.push_back(a.as<std::string>());
  auto after = [&](const std::string& flag) {
    auto it = std::find(args.begin(), args.end(), flag);
    return it == args.end() || it + 1 == args.end() ? std::string() : *(it + 1);
  };
  EXPECT_EQ(after("--kv-events"), "tcp://*:5557");
  EXPECT_EQ(after("--kv-events-replay"), "tcp://*:5558");
  EXPECT_EQ(port_named(c["ports"], "kv-events", "containerPort"), 5557);
  EXPECT_EQ(port_named(c["ports"], "kv-replay", "containerPort"), 5558);
  bool headless = false;
  for (const YAML::Node& d : YAML::LoadAllFromFile(RepoPath("deploy/k8s/haproxy.yaml"))) {
    if (d["kind"].as<std::string>() == "Service" &&
        d["metadata"]["name"].as<std::string>() == "prefixd-replicas") {
      headless = true;
      EXPECT_EQ(port_named(d["spec"]["ports"], "kv-events", "port"), 5557);
      EXPECT_EQ(port_named(d["spec"]["ports"], "kv-replay", "port"), 5558);
    }
  }
  EXPECT_TRUE(headless);
}

// The `docker run` examples of README.md and the Dockerfile's header, each as
// "file: line".
std::vector<std::string> DockerRunLines() {
  std::vector<std::string> runs;
  for (const char* file : {"README.md", "Dockerfile"}) {
    std::istringstream in(ReadRepoFile(file));
    for (std::string line; std::getline(in, line);) {
      if (line.find("docker run") != std::string::npos) runs.push_back(file + (": " + line));
    }
  }
  return runs;
}

// Docker stops a container with SIGKILL 10 s after SIGTERM unless told otherwise: each
// `docker run` example gives the drain (--shutdown-grace, 30 s by default, plus up to 5 s to
// flush streams) the time to finish, as compose's stop_grace_period and Kubernetes'
// terminationGracePeriodSeconds do.
TEST(DeployConfigTest, DockerRunExamplesLetTheDrainFinish) {
  static const std::regex kStopTimeout(R"(--stop-timeout ([0-9]+))");
  const std::vector<std::string> runs = DockerRunLines();
  EXPECT_GE(runs.size(), 5u);
  for (const std::string& line : runs) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(line, m, kStopTimeout) && std::stoi(m[1]) > 35) << line;
  }
}

// The `docker run` examples (README's and the Dockerfile's header) publish every port the
// image exposes: gRPC, the HTTP API and metrics.
TEST(DeployConfigTest, DockerRunExamplesPublishEveryExposedPort) {
  std::set<std::string> exposed;
  std::istringstream dockerfile(ReadRepoFile("Dockerfile"));
  for (std::string line; std::getline(dockerfile, line);) {
    if (line.rfind("EXPOSE ", 0) != 0) continue;
    for (absl::string_view port : absl::StrSplit(line.substr(7), ' ', absl::SkipEmpty())) {
      exposed.insert(std::string(port));
    }
  }
  ASSERT_EQ(exposed, (std::set<std::string>{"50051", "8000", "9464"}));
  const std::vector<std::string> runs = DockerRunLines();
  EXPECT_GE(runs.size(), 5u);
  for (const std::string& line : runs) {
    for (const std::string& port : exposed) {
      EXPECT_NE(line.find("-p " + port + ":" + port), std::string::npos)
          << line << " does not publish " << port;
    }
  }
}

// The image's entrypoint serves the HTTP API on 8000, and compose and Kubernetes expose it:
// the replicas' containers and Services, and HAProxy's front door with /health checks.
TEST(DeployConfigTest, TheHttpApiIsExposedOnPort8000) {
  EXPECT_NE(ReadRepoFile("deploy/entrypoint.sh").find("--http-listen 0.0.0.0:8000"),
            std::string::npos);
  auto port_named = [](const YAML::Node& ports, const std::string& name, const char* key) {
    for (const auto& p : ports) {
      if (p["name"].as<std::string>() == name) return p[key].as<int>();
    }
    return 0;
  };
  const YAML::Node dep = YAML::LoadFile(RepoPath("deploy/k8s/deployment.yaml"));
  EXPECT_EQ(port_named(dep["spec"]["template"]["spec"]["containers"][0]["ports"], "http",
                       "containerPort"),
            8000);
  const YAML::Node svc = YAML::LoadFile(RepoPath("deploy/k8s/service.yaml"));
  EXPECT_EQ(port_named(svc["spec"]["ports"], "http", "port"), 8000);
  int services_with_http = 0;
  bool health_http = false;
  for (const YAML::Node& d : YAML::LoadAllFromFile(RepoPath("deploy/k8s/haproxy.yaml"))) {
    const std::string kind = d["kind"].as<std::string>();
    if (kind == "Service" && port_named(d["spec"]["ports"], "http", "port") == 8000) {
      ++services_with_http;  // the headless replicas Service and the front door
    }
    if (kind == "Deployment") {
      const YAML::Node c = d["spec"]["template"]["spec"]["containers"][0];
      EXPECT_EQ(port_named(c["ports"], "http", "containerPort"), 8000);
      std::map<std::string, std::string> env;
      for (const auto& e : c["env"])
        env[e["name"].as<std::string>()] = e["value"].as<std::string>();
      EXPECT_EQ(env["PREFIXD_HTTP_BIND"], ":8000");
      EXPECT_EQ(env["PREFIXD_REPLICA_CHECK_PORT"], "8000");
      health_http = env["PREFIXD_HEALTH"] == "http";
    }
  }
  EXPECT_EQ(services_with_http, 2);
  EXPECT_TRUE(health_http);
}

}  // namespace
}  // namespace prefixd
