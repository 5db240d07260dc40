// The deployment files parse, every metric a dashboard panel or the docs refer to is one the
// server exports (docs/SERVER.md's metrics table, which server tests check against /metrics),
// and every flag the docs, deploy/ and scripts/ pass to the built programs is one they accept.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
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
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "prefixd/v1/inference.pb.h"
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

// Metric names in docs/SERVER.md's metrics table: rows that start with "| `prefixd_...".
std::set<std::string> DocumentedMetrics() {
  std::set<std::string> names;
  std::istringstream in(ReadFile("docs/SERVER.md"));
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
    EXPECT_TRUE(documented.count(name)) << name << " missing from docs/SERVER.md's metrics table";
  }
}

TEST(DeployConfigTest, DashboardPanelsQueryExportedMetrics) {
  const nlohmann::json dash = nlohmann::json::parse(ReadFile("deploy/grafana/dashboards/prefixd.json"));
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
    for (const std::string& name : MetricsIn(ReadFile(file))) {
      EXPECT_TRUE(documented.count(name))
          << file << " names " << name << ", which the server does not export";
    }
  }
}

TEST(DeployConfigTest, ComposeRunsReplicasBehindHaproxyWithPrometheusAndGrafana) {
  const YAML::Node compose = YAML::LoadFile(Path("deploy/compose.yaml"));
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
  const YAML::Node prom = YAML::LoadFile(Path("deploy/prometheus.yml"));
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
  const YAML::Node services = YAML::LoadFile(Path("deploy/compose.yaml"))["services"];
  ASSERT_TRUE(services["kv-cache"].IsMap());
  EXPECT_EQ(ArgAfter(services["prefixd"]["command"], "--kv-remote"), "redis://kv-cache:6379");
  EXPECT_EQ(ArgAfter(services["kv-cache"]["command"], "--maxmemory-policy"), "allkeys-lru");
  EXPECT_FALSE(ArgAfter(services["kv-cache"]["command"], "--maxmemory").empty());
  EXPECT_EQ(services["kv-cache"]["expose"][0].as<std::string>(), "6379");

  const YAML::Node dep = YAML::LoadFile(Path("deploy/k8s/deployment.yaml"));
  const YAML::Node args = dep["spec"]["template"]["spec"]["containers"][0]["args"];
  EXPECT_EQ(ArgAfter(args, "--kv-remote"), "redis://prefixd-kv-cache:6379");
  bool service = false, lru = false;
  for (const YAML::Node& d : YAML::LoadAllFromFile(Path("deploy/k8s/kv-cache.yaml"))) {
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
  const nlohmann::json dash = nlohmann::json::parse(ReadFile("deploy/grafana/dashboards/prefixd.json"));
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
  const nlohmann::json dash = nlohmann::json::parse(ReadFile("deploy/grafana/dashboards/prefixd.json"));
  bool hit_per_replica = false, load_per_replica = false, hit_per_adapter = false;
  for (const auto& panel : dash["panels"]) {
    for (const auto& target : panel.value("targets", nlohmann::json::array())) {
      const std::string expr = target.at("expr").get<std::string>();
      // The labelled counters are summed (never read raw): a ratio per adapter sums by it.
      hit_per_adapter |= expr.find("sum by (adapter) (rate(prefixd_prefix_cache_hit_tokens_total") !=
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
  const std::vector<YAML::Node> docs = YAML::LoadAllFromFile(Path("deploy/k8s/haproxy.yaml"));
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
  const std::string check = " haproxy -c -f " + Path("deploy/haproxy/haproxy.cfg") + " >/dev/null 2>&1";
  const std::string listed =
      "env PREFIXD_GRPC_BIND=127.0.0.1:50051 PREFIXD_REPLICA_1_GRPC_PORT=50061 "
      "PREFIXD_REPLICA_2_GRPC_PORT=50062 ";
  EXPECT_EQ(std::system((listed + "PREFIXD_REPLICA_1_CHECK_PORT=50061 "
                         "PREFIXD_REPLICA_2_CHECK_PORT=50062" + check).c_str()), 0);
  EXPECT_EQ(std::system((listed + "PREFIXD_REPLICA_1_CHECK_PORT=50061 PREFIXD_POLICY=roundrobin "
                         "PREFIXD_REPLICA_2_CHECK_PORT=50062" + check).c_str()), 0);
  EXPECT_NE(std::system((listed + "PREFIXD_REPLICA_1_CHECK_PORT=50061" + check).c_str()), 0);
  const std::string dns =
      "env PREFIXD_GRPC_BIND=:50051 PREFIXD_STATS_BIND=:8404 PREFIXD_REPLICAS_DNS=prefixd ";
  EXPECT_EQ(std::system((dns + "PREFIXD_BALANCE_FACTOR=150" + check).c_str()), 0);
  EXPECT_EQ(std::system((dns + "PREFIXD_HTTP_BIND=:8000 PREFIXD_HEALTH=http "
                         "PREFIXD_REPLICA_CHECK_PORT=8000" + check).c_str()), 0);
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
  std::istringstream in(ReadFile("deploy/haproxy/haproxy.cfg"));
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
  const std::string cfg = ReadFile("deploy/haproxy/haproxy.cfg");
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
  const std::string server_md = ReadFile("docs/SERVER.md");
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string& name = service->method(i)->name();
    EXPECT_NE(server_md.find("**" + name + "**"), std::string::npos)
        << name << " is not described in docs/SERVER.md";
  }
  static const std::regex kNamed(R"(gRPC `([A-Z][A-Za-z]+)`|prefixd\.v1\.Inference/([A-Za-z]+))");
  int named = 0;
  for (const char* file : {"README.md", "docs/SERVER.md", "docs/SCALING.md", "docs/BENCHMARKS.md",
                           "deploy/k8s/README.md"}) {
    const std::string text = ReadFile(file);
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

// The replicas publish KV events for a cache-aware router (docs/SCALING.md), and every pod's
// PUB and replay ports are reachable through the headless Service.
TEST(DeployConfigTest, KubernetesExposesTheKvEventsPorts) {
  auto port_named = [](const YAML::Node& ports, const std::string& name, const char* key) {
    for (const auto& p : ports) {
      if (p["name"].as<std::string>() == name) return p[key].as<int>();
    }
    return 0;
  };
  const YAML::Node dep = YAML::LoadFile(Path("deploy/k8s/deployment.yaml"));
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
  for (const YAML::Node& d : YAML::LoadAllFromFile(Path("deploy/k8s/haproxy.yaml"))) {
    if (d["kind"].as<std::string>() == "Service" &&
        d["metadata"]["name"].as<std::string>() == "prefixd-replicas") {
      headless = true;
      EXPECT_EQ(port_named(d["spec"]["ports"], "kv-events", "port"), 5557);
      EXPECT_EQ(port_named(d["spec"]["ports"], "kv-replay", "port"), 5558);
    }
  }
  EXPECT_TRUE(headless);
}

// Docker stops a container with SIGKILL 10 s after SIGTERM unless told otherwise: each
// `docker run` example gives the drain (--shutdown-grace, 30 s by default, plus up to 5 s to
// flush streams) the time to finish, as compose's stop_grace_period and Kubernetes'
// terminationGracePeriodSeconds do.
TEST(DeployConfigTest, DockerRunExamplesLetTheDrainFinish) {
  static const std::regex kStopTimeout(R"(--stop-timeout ([0-9]+))");
  int runs = 0;
  for (const char* file : {"README.md", "Dockerfile"}) {
    std::istringstream in(ReadFile(file));
    for (std::string line; std::getline(in, line);) {
      if (line.find("docker run") == std::string::npos) continue;
      ++runs;
      std::smatch m;
      EXPECT_TRUE(std::regex_search(line, m, kStopTimeout) && std::stoi(m[1]) > 35)
          << file << ": " << line;
    }
  }
  EXPECT_GE(runs, 5);
}

// The `docker run` examples (README's and the Dockerfile's header) publish every port the
// image exposes: gRPC, the HTTP API and metrics.
TEST(DeployConfigTest, DockerRunExamplesPublishEveryExposedPort) {
  std::set<std::string> exposed;
  std::istringstream dockerfile(ReadFile("Dockerfile"));
  for (std::string line; std::getline(dockerfile, line);) {
    if (line.rfind("EXPOSE ", 0) != 0) continue;
    for (absl::string_view port : absl::StrSplit(line.substr(7), ' ', absl::SkipEmpty())) {
      exposed.insert(std::string(port));
    }
  }
  ASSERT_EQ(exposed, (std::set<std::string>{"50051", "8000", "9464"}));
  int runs = 0;
  for (const char* file : {"README.md", "Dockerfile"}) {
    std::istringstream in(ReadFile(file));
    for (std::string line; std::getline(in, line);) {
      if (line.find("docker run") == std::string::npos) continue;
      ++runs;
      for (const std::string& port : exposed) {
        EXPECT_NE(line.find("-p " + port + ":" + port), std::string::npos)
            << file << ": " << line << " does not publish " << port;
      }
    }
  }
  EXPECT_GE(runs, 5);
}

// The image's entrypoint serves the HTTP API on 8000, and compose and Kubernetes expose it:
// the replicas' containers and Services, and HAProxy's front door with /health checks.
TEST(DeployConfigTest, TheHttpApiIsExposedOnPort8000) {
  EXPECT_NE(ReadFile("deploy/entrypoint.sh").find("--http-listen 0.0.0.0:8000"), std::string::npos);
  auto port_named = [](const YAML::Node& ports, const std::string& name, const char* key) {
    for (const auto& p : ports) {
      if (p["name"].as<std::string>() == name) return p[key].as<int>();
    }
    return 0;
  };
  const YAML::Node dep = YAML::LoadFile(Path("deploy/k8s/deployment.yaml"));
  EXPECT_EQ(port_named(dep["spec"]["template"]["spec"]["containers"][0]["ports"], "http",
                       "containerPort"), 8000);
  const YAML::Node svc = YAML::LoadFile(Path("deploy/k8s/service.yaml"));
  EXPECT_EQ(port_named(svc["spec"]["ports"], "http", "port"), 8000);
  int services_with_http = 0;
  bool health_http = false;
  for (const YAML::Node& d : YAML::LoadAllFromFile(Path("deploy/k8s/haproxy.yaml"))) {
    const std::string kind = d["kind"].as<std::string>();
    if (kind == "Service" && port_named(d["spec"]["ports"], "http", "port") == 8000) {
      ++services_with_http;  // the headless replicas Service and the front door
    }
    if (kind == "Deployment") {
      const YAML::Node c = d["spec"]["template"]["spec"]["containers"][0];
      EXPECT_EQ(port_named(c["ports"], "http", "containerPort"), 8000);
      std::map<std::string, std::string> env;
      for (const auto& e : c["env"]) env[e["name"].as<std::string>()] = e["value"].as<std::string>();
      EXPECT_EQ(env["PREFIXD_HTTP_BIND"], ":8000");
      EXPECT_EQ(env["PREFIXD_REPLICA_CHECK_PORT"], "8000");
      health_http = env["PREFIXD_HEALTH"] == "http";
    }
  }
  EXPECT_EQ(services_with_http, 2);
  EXPECT_TRUE(health_http);
}

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
TEST(DeployConfigTest, ServerMdFlagTableMatchesPrefixdHelp) {
  const std::map<std::string, std::string> flags = PrefixdFlags();
  ASSERT_GE(flags.size(), 30u);
  std::map<std::string, std::string> documented;  // absl name -> the row's default
  std::istringstream in(ReadFile("docs/SERVER.md"));
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
TEST(DeployConfigTest, HelpSaysTheConnectionFlagsCoverHttpToo) {
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
  for (const auto& [line_no, line] : CommandLines(ReadFile(file), markdown)) {
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
TEST(DeployConfigTest, EveryPrefixdCommandLineUsesFlagsItAccepts) {
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
  runs.push_back(
      {"deploy/compose.yaml (services.prefixd.command)",
       yaml_args(YAML::LoadFile(Path("deploy/compose.yaml"))["services"]["prefixd"]["command"])});
  runs.push_back(
      {"deploy/k8s/deployment.yaml (args)",
       yaml_args(YAML::LoadFile(Path(
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
TEST(DeployConfigTest, ClusterScriptCommandLinesUseOptionsTheScriptsTake) {
  static const std::regex kPattern(R"((--[a-z-]+)(?=[|)]))");
  for (const std::string script : {"cluster", "cluster-bench"}) {
    const std::string source = ReadFile("scripts/" + script);
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
TEST(DeployConfigTest, EveryPrefixctlAndPrefixdModelCommandLineUsesFlagsTheyHave) {
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
TEST(DeployConfigTest, ReadmeProgramsTableListsEveryCommand) {
  const std::string readme = ReadFile("README.md");
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
