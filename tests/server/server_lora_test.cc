// LoRA adapters through the server (in-process, CPU backend, tiny model): --adapter at
// start-up, choosing one by gRPC GenerateRequest.adapter and HTTP `model`, GetModelInfo and
// /v1/models listing them with their digests, NOT_FOUND / 404 for an unknown name, cache hits
// only within one adapter, and the start-up refusals, each naming the flag.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "bench/http_client.h"
#include "engine/lora_adapter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/server.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/in_process_server.h"
#include "tests/server/process.h"
#include "tests/server/server_test_peer.h"
#include "tools/random_adapter.h"
#include "tools/random_model.h"

namespace prefixd::testing {
namespace {

using bench::HttpFetch;
using bench::HttpResponse;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

class ServerLoraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = dir_.path() + "/tiny-model";
    ASSERT_TRUE(WriteTinyModel(model_dir_).ok());
    for (int i = 0; i < 2; ++i) {
      RandomAdapterOptions o;
      o.rank = 4 + 4 * i;
      o.lora_alpha = 8;
      o.b_std = 0.1f;
      o.seed = 10 + i;
      const std::string dir = dir_.path() + "/adapter-" + std::to_string(i);
      ASSERT_TRUE(WriteRandomAdapter(dir, TinyModelConfig(), o).ok());
      adapter_dirs_.push_back(dir);
      auto loaded = ParseLoraAdapter(dir);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      digests_.push_back((*loaded)->digest);
    }
  }

  ServerOptions Options() {
    ServerOptions o = TestServerOptions(model_dir_, log_.Writer());
    o.http_listen = "127.0.0.1:0";
    o.adapters.adapters = {"sql=" + adapter_dirs_[0], "chat=" + adapter_dirs_[1]};
    o.adapters.max_adapters = 4;
    return o;
  }

  static v1::GenerateRequest Request(const std::string& adapter) {
    v1::GenerateRequest r = IdsRequest(RandomIds(3, 40), 6);
    r.set_top_logprobs(1);
    r.set_adapter(adapter);
    return r;
  }

  TempDir dir_;
  std::string model_dir_;
  std::vector<std::string> adapter_dirs_;
  std::vector<std::string> digests_;
  LogSink log_;
};

TEST_F(ServerLoraTest, ServesEachAdapterByNameUnderItsOwnCacheIdentity) {
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(Options());
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT(log_.Text(), HasSubstr("adapter sql: " + adapter_dirs_[0] + ", rank 4"));
  EXPECT_THAT(log_.Text(), HasSubstr("sha256 " + digests_[0]));
  auto stub = v1::Inference::NewStub(InsecureChannel((*server)->grpc_address()));

  // GetModelInfo: both adapters, by name, with their digests and the base as parent.
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  ASSERT_EQ(info.adapters_size(), 2);
  EXPECT_EQ(info.max_adapters(), 4u);
  EXPECT_EQ(info.adapters(0).name(), "chat");
  EXPECT_EQ(info.adapters(0).adapter_sha256(), digests_[1]);
  EXPECT_EQ(info.adapters(0).rank(), 8u);
  EXPECT_EQ(info.adapters(1).name(), "sql");
  EXPECT_EQ(info.adapters(1).adapter_sha256(), digests_[0]);
  EXPECT_EQ(info.adapters(1).parent(), info.model_name());

  const GenerateResult sql = Generate(*stub, Request("sql"));
  ASSERT_TRUE(sql.status.ok()) << sql.status.error_message();
  EXPECT_EQ(sql.usage.cached_prompt_tokens(), 0u);
  const GenerateResult sql_again = Generate(*stub, Request("sql"));
  EXPECT_EQ(sql_again.usage.cached_prompt_tokens(), 32u);  // 2 whole blocks of 16
  EXPECT_EQ(sql_again.samples.at(0).logprobs, sql.samples.at(0).logprobs);
  // Same prompt, another adapter or the base: no hit, other answers.
  const GenerateResult chat = Generate(*stub, Request("chat"));
  ASSERT_TRUE(chat.status.ok()) << chat.status.error_message();
  EXPECT_EQ(chat.usage.cached_prompt_tokens(), 0u);
  const GenerateResult base = Generate(*stub, Request(""));
  ASSERT_TRUE(base.status.ok()) << base.status.error_message();
  EXPECT_EQ(base.usage.cached_prompt_tokens(), 0u);
  EXPECT_NE(base.samples.at(0).logprobs, sql.samples.at(0).logprobs);
  EXPECT_NE(chat.samples.at(0).logprobs, sql.samples.at(0).logprobs);

  const GenerateResult unknown = Generate(*stub, Request("nope"));
  EXPECT_EQ(unknown.status.error_code(), grpc::StatusCode::NOT_FOUND);
  // Named as the proto names the field.
  EXPECT_THAT(unknown.status.error_message(), HasSubstr("adapter `nope` is not loaded"));
  EXPECT_THAT(unknown.status.error_message(), HasSubstr("chat, sql"));

  // HTTP: /v1/models lists the base and each adapter with "parent" and its digest.
  absl::StatusOr<HttpResponse> models = HttpFetch((*server)->http_port(), "GET", "/v1/models");
  ASSERT_TRUE(models.ok()) << models.status();
  const json m = json::parse(models->body);
  ASSERT_EQ(m["data"].size(), 3u);
  EXPECT_EQ(m["data"][0]["id"], info.model_name());
  EXPECT_FALSE(m["data"][0].contains("parent"));
  EXPECT_EQ(m["data"][2]["id"], "sql");
  EXPECT_EQ(m["data"][2]["parent"], info.model_name());
  EXPECT_EQ(m["data"][2]["adapter_sha256"], digests_[0]);
  // `model: sql` is the adapter: the same tokens as over gRPC, and its cached prefix.
  const std::vector<uint32_t> ids = RandomIds(3, 40);
  absl::StatusOr<HttpResponse> r = HttpFetch(
      (*server)->http_port(), "POST", "/v1/completions",
      json({{"model", "sql"}, {"prompt", ids}, {"max_tokens", 6}, {"temperature", 0}}).dump());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  const json c = json::parse(r->body);
  EXPECT_EQ(c["model"], "sql");
  EXPECT_EQ(c["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
  EXPECT_EQ(c["choices"][0]["text"], sql.samples.at(0).text);
  r = HttpFetch((*server)->http_port(), "POST", "/v1/completions",
                json({{"model", "nope"}, {"prompt", ids}, {"max_tokens", 2}}).dump());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 404) << r->body;
  const json e = json::parse(r->body);
  EXPECT_EQ(e["error"]["code"], "model_not_found");
  EXPECT_EQ(e["error"]["param"], "model");
}

TEST_F(ServerLoraTest, LoadsAndUnloadsAtRunTimeOverHttpAndGrpc) {
  ServerOptions o = Options();
  o.metrics_listen = "127.0.0.1:0";
  o.adapters.adapters = {"sql=" + adapter_dirs_[0]};
  o.adapters.max_adapters = 2;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(std::move(o));
  ASSERT_TRUE(server.ok()) << server.status();
  const int http = (*server)->http_port();
  auto stub = v1::Inference::NewStub(InsecureChannel((*server)->grpc_address()));
  auto post = [&](const std::string& path, const json& body) {
    absl::StatusOr<HttpResponse> r = HttpFetch(http, "POST", path, body.dump());
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : HttpResponse{};
  };

  HttpResponse r = post("/v1/load_lora_adapter",
                        {{"lora_name", "chat"}, {"lora_path", adapter_dirs_[1]}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["adapter_sha256"], digests_[1]);
  EXPECT_EQ(Generate(*stub, Request("chat")).status.error_code(), grpc::StatusCode::OK);
  // The name is taken; the registry is full; the body must name both fields.
  r = post("/v1/load_lora_adapter", {{"lora_name", "chat"}, {"lora_path", adapter_dirs_[0]}});
  EXPECT_EQ(r.status, 409) << r.body;
  r = post("/v1/load_lora_adapter", {{"lora_name", "third"}, {"lora_path", adapter_dirs_[0]}});
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_THAT(r.body, HasSubstr("--max-adapters 2"));
  r = post("/v1/load_lora_adapter", {{"lora_name", "x"}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("lora_path"));

  absl::StatusOr<std::string> metrics = HttpGet((*server)->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  // (in + out) x rank x 4 bytes over c_attn, attn.c_proj, c_fc, mlp.c_proj of 2 layers:
  // 1024 x 4 x 2 x 4 for rank 4 plus the same for rank 8.
  EXPECT_EQ(MetricValue(*metrics, "prefixd_memory_bytes{kind=\"adapters\"}"),
            1024.0 * 2 * 4 * (4 + 8));

  r = post("/v1/unload_lora_adapter", {{"lora_name", "chat"}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Generate(*stub, Request("chat")).status.error_code(), grpc::StatusCode::NOT_FOUND);
  r = post("/v1/unload_lora_adapter", {{"lora_name", "chat"}});
  EXPECT_EQ(r.status, 404) << r.body;
  // A NUL in the path is refused, not cut there (which loaded the directory before it).
  r = post("/v1/load_lora_adapter",
           {{"lora_name", "nul"}, {"lora_path", adapter_dirs_[1] + std::string("\0/x", 3)}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("lora_path holds a NUL byte"));

  // gRPC: the same, with the info of what was loaded.
  grpc::ClientContext load_ctx;
  v1::LoadLoraAdapterRequest load;
  load.set_lora_name("chat2");
  load.set_lora_path(adapter_dirs_[1]);
  v1::AdapterInfo info;
  ASSERT_TRUE(stub->LoadLoraAdapter(&load_ctx, load, &info).ok());
  EXPECT_EQ(info.adapter_sha256(), digests_[1]);
  EXPECT_EQ(info.rank(), 8u);
  grpc::ClientContext unload_ctx;
  v1::UnloadLoraAdapterRequest unload;
  unload.set_lora_name("chat2");
  v1::UnloadLoraAdapterResponse unloaded;
  EXPECT_TRUE(stub->UnloadLoraAdapter(&unload_ctx, unload, &unloaded).ok());
  grpc::ClientContext bad_ctx;
  load.set_lora_path(dir_.path() + "/nothing-here");
  load.set_lora_name("other");
  const grpc::Status missing = stub->LoadLoraAdapter(&bad_ctx, load, &info);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(missing.error_message(), HasSubstr("nothing-here/adapter_config.json"));
}

// A request that started on an adapter finishes with it after its name is unloaded, with
// the tokens it gets while the adapter is loaded.
TEST_F(ServerLoraTest, UnloadingLetsRequestsInFlightFinish) {
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(Options());
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Inference::NewStub(InsecureChannel((*server)->grpc_address()));
  v1::GenerateRequest req = Request("sql");
  req.set_max_new_tokens(40);
  req.set_ignore_eos(true);
  const GenerateResult loaded = Generate(*stub, req);
  ASSERT_TRUE(loaded.status.ok()) << loaded.status.error_message();

  RequestPath& path = ServerTestPeer::request_path(**server);
  GenerateCall call;
  call.request.prompt = RandomIds(3, 40);
  call.request.max_new_tokens = 40;
  call.request.ignore_eos = true;
  call.adapter = "sql";
  absl::StatusOr<StartedGenerate> started = path.StartGenerate(call);
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_TRUE(path.UnloadAdapter(std::nullopt, "sql").ok());
  std::vector<uint32_t> ids;
  absl::Status done = absl::UnknownError("no kDone");
  RequestEvent e;
  while (started->stream->Wait(&e)) {
    if (e.kind == RequestEvent::Kind::kToken) ids.push_back(e.token.token_id);
    if (e.kind == RequestEvent::Kind::kDone) {
      done = e.status;
      break;
    }
  }
  path.FinishGenerate(Api::kGrpc, started->adapter_label, done.code());
  EXPECT_TRUE(done.ok()) << done;
  EXPECT_EQ(ids, loaded.samples.at(0).token_ids);
  // New requests no longer find it.
  EXPECT_EQ(Generate(*stub, req).status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerLoraTest, RunTimeLoadingNeedsTheAdminColumnWithAuthTokens) {
  const std::string tokens = dir_.path() + "/tokens";
  {
    std::FILE* f = std::fopen(tokens.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("user-token alice\nadmin-token ops admin\n", f);
    std::fclose(f);
  }
  ServerOptions o = Options();
  o.auth_tokens_file = tokens;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(std::move(o));
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT(log_.Text(), Not(HasSubstr("every client is admin")));
  const int http = (*server)->http_port();
  const std::string body = json({{"lora_name", "new"}, {"lora_path", adapter_dirs_[1]}}).dump();
  absl::StatusOr<HttpResponse> r = HttpFetch(http, "POST", "/v1/load_lora_adapter", body,
                                             {{"Authorization", "Bearer user-token"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 403) << r->body;
  EXPECT_THAT(r->body, HasSubstr("not marked admin"));
  r = HttpFetch(http, "POST", "/v1/unload_lora_adapter", json({{"lora_name", "sql"}}).dump(),
                {{"Authorization", "Bearer user-token"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 403) << r->body;
  r = HttpFetch(http, "POST", "/v1/load_lora_adapter", body, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 401) << r->body;
  r = HttpFetch(http, "POST", "/v1/load_lora_adapter", body,
                {{"Authorization", "Bearer admin-token"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200) << r->body;
}

// The answer to GET /health on a fresh connection, or "" when none comes within 30 s.
std::string HealthAnswer(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    char buf[512];
    while (poll(&p, 1, 30000) == 1) {
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

// Reading an adapter's files happens off the HTTP I/O threads: with one I/O thread and a load
// held while it reads, /health is answered. (Two loads of 2 GB files once stalled /health.)
TEST_F(ServerLoraTest, AnAdapterLoadDoesNotHoldTheHttpIoThread) {
  std::atomic<bool> armed{false};
  absl::Notification entered, release;
  ServerOptions o = Options();
  o.http_threads = 1;
  o.adapters.load_hook = [&] {
    if (!armed.load()) return;  // the start-up --adapter loads
    entered.Notify();
    release.WaitForNotification();
  };
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(std::move(o));
  ASSERT_TRUE(server.ok()) << server.status();
  armed = true;
  const int http = (*server)->http_port();
  absl::StatusOr<HttpResponse> loaded;
  std::thread load([&] {
    loaded = HttpFetch(http, "POST", "/v1/load_lora_adapter",
                       json({{"lora_name", "held"}, {"lora_path", adapter_dirs_[1]}}).dump());
  });
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  const std::string health = HealthAnswer(http);
  release.Notify();
  load.join();
  EXPECT_THAT(health, ::testing::StartsWith("HTTP/1.1 200 OK")) << "/health waited for a load";
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->status, 200) << loaded->body;
  EXPECT_EQ(json::parse(loaded->body)["adapter_sha256"], digests_[1]);
}

// Without --auth-tokens every client is admin: start-up says what that lets a client do.
TEST_F(ServerLoraTest, StartUpWarnsThatEveryClientIsAdminWithoutAuthTokens) {
  {
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(Options());
    ASSERT_TRUE(server.ok()) << server.status();
  }
  EXPECT_THAT(log_.Text(), HasSubstr("warning: no --auth-tokens: every client is admin"));
  EXPECT_THAT(log_.Text(), HasSubstr("can load LoRA adapters from directories on this host"));
}

TEST_F(ServerLoraTest, StartUpRefusesBadAdapterFlagsNamingThem) {
  auto refused = [&](ServerOptions o, const std::string& what) {
    absl::StatusOr<std::unique_ptr<Server>> s = Server::Start(std::move(o));
    ASSERT_FALSE(s.ok()) << what;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(what));
  };
  ServerOptions o = Options();
  o.adapters.adapters = {"no-equals-sign"};
  refused(o, "--adapter must be NAME=DIR");
  o.adapters.adapters = {"bad name=" + adapter_dirs_[0]};
  refused(o, "may hold only letters");
  o.adapters.adapters = {"x=" + dir_.path() + "/missing"};
  refused(o, "--adapter x=" + dir_.path() + "/missing: ");
  o.adapters.adapters = {"tiny-model=" + adapter_dirs_[0]};
  refused(o, "is the base model's name");
  o.adapters.adapters = {"a=" + adapter_dirs_[0], "a=" + adapter_dirs_[1]};
  refused(o, "already loaded");
  o.adapters.adapters = {"a=" + adapter_dirs_[0], "b=" + adapter_dirs_[1]};
  o.adapters.max_adapters = 1;
  refused(o, "2 --adapter flags but --max-adapters is 1");
  o.adapters.max_adapters = -1;
  refused(o, "--max-adapters must be 0 to 1024");
  // An adapter made for another model (a 3-layer one).
  RandomAdapterOptions ao;
  ModelConfig other = TinyModelConfig();
  other.n_layer = 3;
  ASSERT_TRUE(WriteRandomAdapter(dir_.path() + "/other", other, ao).ok());
  o = Options();
  o.adapters.adapters = {"other=" + dir_.path() + "/other"};
  refused(o, "the adapter was made for another model");
}

// prefixd_requests_total and the hit/queried token counters by adapter, scraped from the
// real /metrics endpoint: the base's requests under the base model's name, each adapter's
// under its own, a refused unknown name under "" (never as itself); summed over `adapter`
// they are GetCacheStats' totals. An unloaded adapter's series go at the next scrape.
TEST_F(ServerLoraTest, MetricsCountEachAdapterUnderItsName) {
  ServerOptions o = Options();
  o.metrics_listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(std::move(o));
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Inference::NewStub(InsecureChannel((*server)->grpc_address()));
  const std::string base = ServerTestPeer::request_path(**server).model().name;
  ASSERT_FALSE(base.empty());

  // The same 40-token prompt: the first request of each identity computes it, each later one
  // hits its 2 whole blocks (32 tokens).
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(Generate(*stub, Request("")).status.ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Generate(*stub, Request("sql")).status.ok());
  ASSERT_TRUE(Generate(*stub, Request("chat")).status.ok());
  absl::StatusOr<HttpResponse> r = HttpFetch(
      (*server)->http_port(), "POST", "/v1/completions",
      json({{"model", "chat"}, {"prompt", RandomIds(3, 40)}, {"max_tokens", 6}}).dump());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
  EXPECT_EQ(Generate(*stub, Request("nope")).status.error_code(), grpc::StatusCode::NOT_FOUND);

  absl::StatusOr<std::string> text = HttpGet((*server)->metrics_port(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  const auto value = [&](const std::string& family, const std::string& adapter) {
    return MetricValue(*text, family + "{adapter=\"" + adapter + "\"}");
  };
  const std::string queried = "prefixd_prefix_cache_queried_tokens_total";
  const std::string hit = "prefixd_prefix_cache_hit_tokens_total";
  EXPECT_EQ(value(queried, base), 80);
  EXPECT_EQ(value(hit, base), 32);
  EXPECT_EQ(value(queried, "sql"), 120);
  EXPECT_EQ(value(hit, "sql"), 64);
  EXPECT_EQ(value(queried, "chat"), 80);
  EXPECT_EQ(value(hit, "chat"), 32);
  EXPECT_EQ(value(hit, ""), -1);
  EXPECT_EQ(value(hit, "nope"), -1);
  const v1::CacheStats stats = GetStats(*stub);
  EXPECT_EQ(MetricValue(*text, hit), stats.hit_tokens());
  EXPECT_EQ(MetricValue(*text, queried), stats.queried_tokens());
  EXPECT_THAT(*text, HasSubstr("prefixd_requests_total{adapter=\"" + base +
                               "\",api=\"grpc\",code=\"OK\"} 2\n"));
  EXPECT_THAT(*text, HasSubstr("prefixd_requests_total{adapter=\"sql\",api=\"grpc\",code=\"OK\"} 3\n"));
  EXPECT_THAT(*text, HasSubstr("prefixd_requests_total{adapter=\"chat\",api=\"grpc\",code=\"OK\"} 1\n"));
  EXPECT_THAT(*text, HasSubstr("prefixd_requests_total{adapter=\"chat\",api=\"http\",code=\"OK\"} 1\n"));
  EXPECT_THAT(*text, HasSubstr("prefixd_requests_total{adapter=\"\",api=\"grpc\",code=\"NOT_FOUND\"} 1\n"));
  EXPECT_EQ(MetricValue(*text, "prefixd_requests_total{adapter=\"nope\"}"), -1);
  EXPECT_EQ(MetricValue(*text, "prefixd_requests_total"), 8);

  // Unloaded, with nothing new to count since the last scrape: its series are gone.
  ASSERT_TRUE(ServerTestPeer::request_path(**server).UnloadAdapter(std::nullopt, "chat").ok());
  text = HttpGet((*server)->metrics_port(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(value(hit, "chat"), -1);
  EXPECT_EQ(MetricValue(*text, "prefixd_requests_total{adapter=\"chat\"}"), -1);
  EXPECT_EQ(value(hit, "sql"), 64);
}

// An adapter shares the base's tokenizer: /tokenize, /detokenize and gRPC Tokenize take its
// name (HTTP `model`, gRPC `adapter`) and answer as for the base; an unknown name is 404 /
// NOT_FOUND, as for a completion.
TEST_F(ServerLoraTest, TokenizeTakesAnAdapterName) {
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(Options());
  ASSERT_TRUE(server.ok()) << server.status();
  const int http = (*server)->http_port();
  const std::string base = ServerTestPeer::request_path(**server).model().name;
  auto post = [&](const std::string& path, const json& body) {
    absl::StatusOr<HttpResponse> r = HttpFetch(http, "POST", path, body.dump());
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : HttpResponse{};
  };
  HttpResponse want = post("/tokenize", {{"prompt", "Hello world"}});
  ASSERT_EQ(want.status, 200) << want.body;
  const json ids = json::parse(want.body)["tokens"];
  ASSERT_FALSE(ids.empty());
  for (const std::string& model : {base, std::string("sql"), std::string("chat")}) {
    HttpResponse t = post("/tokenize", {{"model", model}, {"prompt", "Hello world"}});
    ASSERT_EQ(t.status, 200) << t.body;
    EXPECT_EQ(json::parse(t.body)["tokens"], ids) << model;
    HttpResponse d = post("/detokenize", {{"model", model}, {"tokens", ids}});
    ASSERT_EQ(d.status, 200) << d.body;
    EXPECT_EQ(json::parse(d.body)["prompt"], "Hello world") << model;
  }
  for (const char* path : {"/tokenize", "/detokenize"}) {
    const HttpResponse e = std::string(path) == "/tokenize"
                               ? post(path, {{"model", "nope"}, {"prompt", "x"}})
                               : post(path, {{"model", "nope"}, {"tokens", json::array({1})}});
    EXPECT_EQ(e.status, 404) << path << ": " << e.body;
    const json j = json::parse(e.body);
    EXPECT_EQ(j["error"]["code"], "model_not_found") << e.body;
    EXPECT_EQ(j["error"]["param"], "model") << e.body;
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("model `nope` is not loaded"));
  }

  auto stub = v1::Inference::NewStub(InsecureChannel((*server)->grpc_address()));
  v1::TokenizeRequest req;
  req.set_text("Hello world");
  req.set_adapter("sql");
  v1::TokenizeResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->Tokenize(&ctx, req, &resp).ok());
  EXPECT_EQ(json(std::vector<uint32_t>(resp.token_ids().begin(), resp.token_ids().end())), ids);
  req.set_adapter("nope");
  grpc::ClientContext ctx2;
  const grpc::Status s = stub->Tokenize(&ctx2, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("adapter `nope` is not loaded"));
}

}  // namespace
}  // namespace prefixd::testing
