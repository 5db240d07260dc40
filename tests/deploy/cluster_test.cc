// scripts/cluster end to end: two replicas behind HAProxy with prefix-affinity routing. Requests
// sharing a prompt start go to one replica and hit its cache; a SIGKILLed replica's prompts
// go to the other; a restarted replica rejoins; `down` stops everything. Needs haproxy
// (scripts/setup installs it); skipped without it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "prefixd/v1/inference.grpc.pb.h"
#include "tests/server/process.h"

namespace prefixd {
namespace {

struct ShResult {
  int rc = -1;
  std::string output;  // stdout and stderr
};

ShResult Sh(const std::string& command) {
  ShResult r;
  FILE* f = popen((command + " 2>&1").c_str(), "r");
  if (f == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(f);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string Cluster() { return absl::StrCat(PREFIXD_SOURCE_DIR, "/scripts/cluster"); }

// Running (a zombie is not: the processes the script starts outlive it, and whoever adopts
// them reaps them in its own time).
bool Alive(int pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string pid_field, comm, state;
  if (!(stat >> pid_field >> comm >> state)) return false;
  return state != "Z";
}

struct Reply {
  grpc::Status status;
  std::string replica;
  uint32_t cached = 0;
};

// One Generate call: prompt `prompt`'s 64 shared ids, then 8 ids of request `request`.
Reply Generate(v1::Inference::Stub& stub, uint32_t prompt, uint32_t request) {
  v1::GenerateRequest req;
  for (uint32_t k = 0; k < 64; ++k) req.mutable_token_ids()->add_ids(1000 + prompt * 97 + k);
  for (uint32_t k = 0; k < 8; ++k) req.mutable_token_ids()->add_ids(30000 + request * 13 + k);
  req.set_max_new_tokens(2);
  req.set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse msg;
  Reply r;
  while (reader->Read(&msg)) {
    if (msg.has_usage()) r.cached = msg.usage().cached_prompt_tokens();
  }
  r.status = reader->Finish();
  const auto& md = ctx.GetServerInitialMetadata();
  auto it = md.find("x-prefixd-replica");
  if (it != md.end()) r.replica.assign(it->second.data(), it->second.size());
  return r;
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Sh("command -v haproxy").rc != 0) GTEST_SKIP() << "haproxy is not installed";
    ASSERT_TRUE(testing::WriteTinyModel(model_.path()).ok());
  }
  void TearDown() override {
    if (!state_.empty()) Sh(absl::StrCat(Cluster(), " down --state ", state_));
  }
  testing::TempDir model_, dir_;
  std::string state_;
};

TEST_F(ClusterTest, AffinityFailoverRestartDown) {
  state_ = dir_.path() + "/state";
  // The shared 64 ids (2-byte varints) are 128 bytes of the packed ids: a key of 64 bytes
  // falls inside them (the default 256 would take in the suffix, and every request would
  // hash on its own).
  const ShResult up =
      Sh(absl::StrCat(Cluster(), " up --replicas 2 --policy affinity --key-bytes 64 --model ",
                      model_.path(), " --state ", state_, " --build-dir ", PREFIXD_BINARY_DIR));
  ASSERT_EQ(up.rc, 0) << up.output;
  std::ifstream in(state_ + "/cluster.json");
  const nlohmann::json c = nlohmann::json::parse(in);
  ASSERT_EQ(c["replicas"].size(), 2u);
  std::vector<int> pids;
  for (const auto& r : c["replicas"]) {
    pids.push_back(r["pid"].get<int>());
    EXPECT_TRUE(Alive(pids.back()));
  }
  EXPECT_TRUE(Alive(c["haproxy_pid"].get<int>()));

  auto stub = v1::Inference::NewStub(
      grpc::CreateChannel(c["grpc"].get<std::string>(), grpc::InsecureChannelCredentials()));
  // Each prompt's requests go to one replica (its home); after the first, the 64 shared ids
  // (4 blocks of 16) come from that replica's cache.
  constexpr uint32_t kPrompts = 6;
  std::vector<std::string> home(kPrompts);
  for (uint32_t p = 0; p < kPrompts; ++p) {
    for (uint32_t r = 0; r < 3; ++r) {
      const Reply reply = Generate(*stub, p, r);
      ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
      ASSERT_FALSE(reply.replica.empty());
      if (r == 0) {
        home[p] = reply.replica;
        EXPECT_EQ(reply.cached, 0u);
      } else {
        EXPECT_EQ(reply.replica, home[p]) << "prompt " << p;
        EXPECT_EQ(reply.cached, 64u) << "prompt " << p;
      }
    }
  }

  // SIGKILL prompt 0's home: its next requests succeed on the other replica.
  const int victim = home[0] == "r1" ? 1 : 2;
  const std::string other = victim == 1 ? "r2" : "r1";
  ASSERT_EQ(kill(pids[victim - 1], SIGKILL), 0);
  for (uint32_t r = 3; r < 5; ++r) {
    const Reply reply = Generate(*stub, 0, r);
    ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
    EXPECT_EQ(reply.replica, other);
  }
  EXPECT_EQ(Generate(*stub, 0, 5).cached, 64u) << "the other replica now caches prompt 0";

  // Restarted, it rejoins at its old address and gets its prompts back (with a cold cache).
  const ShResult restart =
      Sh(absl::StrCat(Cluster(), " restart --state ", state_, " --replica ", victim));
  ASSERT_EQ(restart.rc, 0) << restart.output;
  const ShResult status = Sh(absl::StrCat(Cluster(), " status --state ", state_));
  EXPECT_EQ(status.rc, 0);
  EXPECT_NE(status.output.find(absl::StrCat("r", victim, " ")), std::string::npos);
  EXPECT_EQ(status.output.find("DOWN"), std::string::npos) << status.output;
  const Reply back = Generate(*stub, 0, 6);
  ASSERT_TRUE(back.status.ok());
  EXPECT_EQ(back.replica, home[0]);
  EXPECT_EQ(back.cached, 0u);

  std::ifstream in2(state_ + "/cluster.json");
  const nlohmann::json c2 = nlohmann::json::parse(in2);
  const int new_pid = c2["replicas"][victim - 1]["pid"].get<int>();
  EXPECT_NE(new_pid, pids[victim - 1]);
  const ShResult down = Sh(absl::StrCat(Cluster(), " down --state ", state_));
  EXPECT_EQ(down.rc, 0) << down.output;
  state_.clear();
  // `down` waits for each process to exit.
  EXPECT_FALSE(Alive(new_pid));
  EXPECT_FALSE(Alive(pids[2 - victim]));
  EXPECT_FALSE(Alive(c2["haproxy_pid"].get<int>()));
}

// --remote: round-robin routing sends each prompt's requests to every replica in turn; with
// the shared Redis tier, the one replica that computed a prompt's prefix publishes it and the
// others load it instead of computing it again. `down` stops the redis-server too.
TEST_F(ClusterTest, RoundRobinWithTheSharedTierHitsOnEveryReplica) {
  if (Sh("command -v redis-server").rc != 0) GTEST_SKIP() << "redis-server is not installed";
  state_ = dir_.path() + "/state";
  const ShResult up = Sh(absl::StrCat(
      Cluster(), " up --replicas 2 --policy roundrobin --remote --model ", model_.path(),
      " --state ", state_, " --build-dir ", PREFIXD_BINARY_DIR,
      // A loaded test machine meets it (the 20 ms default is for a production network).
      " -- --kv-remote-timeout 2s"));
  ASSERT_EQ(up.rc, 0) << up.output;
  std::ifstream in(state_ + "/cluster.json");
  const nlohmann::json c = nlohmann::json::parse(in);
  ASSERT_EQ(c.value("remote", ""), "unix://" + state_ + "/redis.sock") << c.dump();
  auto stub = v1::Inference::NewStub(
      grpc::CreateChannel(c["grpc"].get<std::string>(), grpc::InsecureChannelCredentials()));
  std::set<std::string> replicas;
  for (uint32_t p = 0; p < 3; ++p) {
    const Reply first = Generate(*stub, p, 0);
    ASSERT_TRUE(first.status.ok()) << first.status.error_message();
    EXPECT_EQ(first.cached, 0u);
    // Publishing is asynchronous; a moment is plenty on loopback.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (uint32_t r = 1; r < 5; ++r) {
      const Reply reply = Generate(*stub, p, r);
      ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
      replicas.insert(reply.replica);
      // The 64 shared ids (4 blocks of 16), from the pool or from Redis.
      EXPECT_EQ(reply.cached, 64u) << "prompt " << p << " request " << r << " on " << reply.replica;
    }
  }
  EXPECT_EQ(replicas.size(), 2u) << "round-robin used both replicas";
  int redis_pid = 0;
  std::ifstream state_sh(state_ + "/state.sh");
  for (std::string line; std::getline(state_sh, line);) {
    const size_t at = line.find("REDIS_PID=\"");
    if (at != std::string::npos) redis_pid = std::stoi(line.substr(at + 11));
  }
  ASSERT_GT(redis_pid, 0);
  EXPECT_TRUE(Alive(redis_pid));
  const ShResult down = Sh(absl::StrCat(Cluster(), " down --state ", state_));
  EXPECT_EQ(down.rc, 0) << down.output;
  state_.clear();
  EXPECT_FALSE(Alive(redis_pid));
}

// The HTTP front door (the replicas run the OpenAI-compatible API): completions are routed by
// the start of their JSON "prompt", HAProxy's health checks read each replica's /health, and
// requests for a replica that is shutting down (503 while it drains, then refused
// connections) are served by the other one.
TEST_F(ClusterTest, HttpFrontDoorRoutesByPromptAndSurvivesADrain) {
  state_ = dir_.path() + "/state";
  const ShResult up =
      Sh(absl::StrCat(Cluster(), " up --replicas 2 --policy affinity --key-bytes 64 --model ",
                      model_.path(), " --state ", state_, " --build-dir ", PREFIXD_BINARY_DIR));
  ASSERT_EQ(up.rc, 0) << up.output;
  std::ifstream in(state_ + "/cluster.json");
  const nlohmann::json c = nlohmann::json::parse(in);
  ASSERT_TRUE(c.contains("http")) << c.dump();
  const std::string http = c["http"].get<std::string>();
  for (const auto& r : c["replicas"]) ASSERT_TRUE(r.contains("http")) << c.dump();

  struct HttpReply {
    int status = 0;
    std::string replica;
    int cached = -1;
    std::string key;  // usage.prompt_cache_key, echoed
  };
  // A completion whose prompt is system prompt `prompt` (over 64 bytes) and question `request`,
  // with OpenAI's prompt_cache_key when `key` is not empty.
  auto complete = [&](uint32_t prompt, const std::string& request, const std::string& key = "") {
    nlohmann::json body{
        {"prompt", absl::StrCat("System prompt ", prompt, ": you answer questions about the ",
                                "cache briefly and well. Question ", request, "?")},
        {"max_tokens", 2},
        {"temperature", 0}};
    if (!key.empty()) body["prompt_cache_key"] = key;
    const std::string file = absl::StrCat(dir_.path(), "/body.json");
    std::ofstream(file) << body.dump();
    const ShResult r = Sh(absl::StrCat(
        "curl -s --max-time 20 -D - -H 'Content-Type: ", "application/json' --data-binary @", file,
        " http://", http, "/v1/completions"));
    HttpReply reply;
    const size_t status = r.output.find("HTTP/1.1 ");
    if (status != std::string::npos) reply.status = std::stoi(r.output.substr(status + 9, 3));
    const size_t header = r.output.find("x-prefixd-replica: ");
    if (header != std::string::npos) reply.replica = r.output.substr(header + 19, 2);
    const size_t json = r.output.find("\r\n\r\n");
    if (json != std::string::npos) {
      const nlohmann::json j = nlohmann::json::parse(r.output.substr(json + 4), nullptr, false);
      if (!j.is_discarded() && j.contains("usage")) {
        reply.cached = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
        reply.key = j["usage"].value("prompt_cache_key", "");
      }
    }
    return reply;
  };

  constexpr uint32_t kPrompts = 4;
  std::vector<std::string> home(kPrompts);
  for (uint32_t p = 0; p < kPrompts; ++p) {
    for (uint32_t r = 0; r < 3; ++r) {
      const HttpReply reply = complete(p, absl::StrCat(r));
      ASSERT_EQ(reply.status, 200) << "prompt " << p;
      ASSERT_FALSE(reply.replica.empty());
      if (r == 0) {
        home[p] = reply.replica;
      } else {
        EXPECT_EQ(reply.replica, home[p]) << "prompt " << p;
        // The system prompt is 15 tokens; the rest differs by request.
        EXPECT_GE(reply.cached, 12) << "prompt " << p << ": its system prompt is cached";
      }
    }
  }

  // A conversation that names itself (prompt_cache_key) stays on one replica whatever its
  // prompt's first bytes: eight system prompts, which without the key spread over both
  // replicas (all eight on one by chance: 1 in 128).
  std::set<std::string> key_homes;
  for (uint32_t p = 10; p < 18; ++p) {
    const HttpReply reply = complete(p, "k", "conversation-7");
    ASSERT_EQ(reply.status, 200) << "prompt " << p;
    EXPECT_EQ(reply.key, "conversation-7");
    key_homes.insert(reply.replica);
  }
  EXPECT_EQ(key_homes.size(), 1u) << "a prompt_cache_key's requests went to several replicas";

  // SIGTERM prompt 0's home: it drains (503 on /health and to new completions), then exits.
  // No client sees either: HAProxy sends its requests to the other replica.
  const int victim = home[0] == "r1" ? 1 : 2;
  const std::string other = victim == 1 ? "r2" : "r1";
  ASSERT_EQ(kill(c["replicas"][victim - 1]["pid"].get<int>(), SIGTERM), 0);
  for (uint32_t r = 3; r < 8; ++r) {
    const HttpReply reply = complete(0, absl::StrCat(r));
    EXPECT_EQ(reply.status, 200) << "request " << r;
    EXPECT_EQ(reply.replica, other) << "request " << r;
  }
  // HAProxy's check of /health has taken it out of the ring.
  bool down = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!down && absl::Now() < deadline) {
    const ShResult status = Sh(absl::StrCat(Cluster(), " status --state ", state_));
    down = status.output.find(absl::StrCat("r", victim, " ")) != std::string::npos &&
           status.output.find("DOWN") != std::string::npos;
    if (!down) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(down);
}

TEST_F(ClusterTest, BadArgumentsStartNothing) {
  const std::string state = dir_.path() + "/bad";
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"--replicas 0 --policy affinity", "--replicas must be 1 to 8"},
      {"--replicas 2 --policy random", "--policy must be affinity or roundrobin"},
      {"--replicas 2", "--policy affinity|roundrobin is required"},
      {"--replicas 2 --policy affinity --balance-factor 90", "--balance-factor must be"},
  };
  for (const Case& k : cases) {
    const ShResult r =
        Sh(absl::StrCat(Cluster(), " up ", k.args, " --model ", model_.path(), " --state ", state));
    EXPECT_NE(r.rc, 0) << k.args;
    EXPECT_NE(r.output.find(k.message), std::string::npos) << k.args << ": " << r.output;
  }
  const ShResult no_model =
      Sh(absl::StrCat(Cluster(), " up --replicas 1 --policy affinity --model ", dir_.path(),
                      "/none --state ", state));
  EXPECT_NE(no_model.rc, 0);
  EXPECT_NE(no_model.output.find("not a model directory"), std::string::npos) << no_model.output;
  const ShResult down = Sh(absl::StrCat(Cluster(), " down --state ", state));
  EXPECT_NE(down.rc, 0);
  EXPECT_NE(down.output.find("holds no cluster"), std::string::npos) << down.output;
}

// A replica that cannot start (a model directory it cannot load) fails `up` with its log, and
// no cluster is recorded.
TEST_F(ClusterTest, AReplicaThatDoesNotStartFailsUpWithItsLog) {
  const std::string bad_model = dir_.path() + "/broken";
  ASSERT_EQ(
      Sh(absl::StrCat("mkdir -p ", bad_model, " && echo '{}' > ", bad_model, "/config.json")).rc,
      0);
  const std::string state = dir_.path() + "/s";
  const ShResult r =
      Sh(absl::StrCat(Cluster(), " up --replicas 2 --policy affinity --model ", bad_model,
                      " --state ", state, " --build-dir ", PREFIXD_BINARY_DIR));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.output.find("replica 1 exited during start-up"), std::string::npos) << r.output;
  EXPECT_FALSE(std::ifstream(state + "/cluster.json").good());
}

}  // namespace
}  // namespace prefixd
