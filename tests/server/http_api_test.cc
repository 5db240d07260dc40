// The HTTP API in-process: prefixd::Server with its HTTP front end on a free loopback port,
// the tiny random model on the CPU backend. Completions are compared with gRPC's for the
// same ids and seed; every endpoint and error is exercised. (Held requests: below, on the
// gated fake backend.)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "engine/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/server.h"
#include "tests/engine/fake_backend.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/http_client.h"
#include "tests/server/in_process_server.h"
#include "tests/server/process.h"
#include "tests/server/server_test_peer.h"

namespace prefixd::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

class HttpApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    model_dir_ = dir_->path() + "/tiny-model";
    ASSERT_TRUE(WriteTinyModel(model_dir_).ok());
    ServerOptions o = TestServerOptions(model_dir_);
    o.device.kv_cache_bytes = 8388608;
    o.metrics_listen = "127.0.0.1:0";
    o.http_listen = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<Server>> s = Server::Start(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = s->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Inference::NewStub(InsecureChannel(server_->grpc_address()));
  }

  static json Post(const std::string& path, const json& body, int expect_status = 200) {
    absl::StatusOr<HttpResponse> r = HttpFetch(server_->http_port(), "POST", path, body.dump());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return json();
    EXPECT_EQ(r->status, expect_status) << r->body;
    EXPECT_EQ(r->headers["content-type"], "application/json");
    return json::parse(r->body);
  }

  // A streamed completion: the chunks' JSON, in order, and whether [DONE] ended it.
  static std::vector<json> Stream(const json& body, bool* done) {
    absl::StatusOr<std::unique_ptr<HttpEventStream>> s =
        HttpEventStream::Open(server_->http_port(), "/v1/completions", body.dump());
    EXPECT_TRUE(s.ok()) << s.status();
    std::vector<json> chunks;
    *done = false;
    if (!s.ok()) return chunks;
    EXPECT_EQ((*s)->status(), 200);
    while (std::optional<std::string> e = (*s)->Next()) {
      EXPECT_FALSE(*done) << "nothing after [DONE]";
      if (*e == "[DONE]") {
        *done = true;
      } else {
        chunks.push_back(json::parse(*e));
      }
    }
    return chunks;
  }

  static double Metric(const std::string& series) {
    absl::StatusOr<std::string> text = HttpGet(server_->metrics_port(), "/metrics");
    return text.ok() ? MetricValue(*text, series) : -1;
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string model_dir_;
  static inline Server* server_ = nullptr;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(HttpApiTest, CompletionEqualsGrpcForTheSameIdsAndSeed) {
  const std::vector<uint32_t> ids = RandomIds(21, 12);
  v1::GenerateRequest g = IdsRequest(ids, 10);
  g.set_num_samples(2);
  g.set_temperature(0.8f);
  g.set_seed(5);
  g.set_ignore_eos(true);
  GenerateResult grpc = Generate(*stub_, g);
  ASSERT_TRUE(grpc.status.ok()) << grpc.status.error_message();

  const json r = Post("/v1/completions", {{"prompt", ids},
                                          {"max_tokens", 10},
                                          {"n", 2},
                                          {"temperature", 0.8},
                                          {"seed", 5},
                                          {"ignore_eos", true},
                                          {"model", "tiny-model"}});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "tiny-model");
  EXPECT_THAT(r["id"].get<std::string>(), ::testing::StartsWith("cmpl-"));
  ASSERT_EQ(r["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_EQ(r["choices"][i]["text"], grpc.samples[i].text) << i;
    EXPECT_EQ(r["choices"][i]["finish_reason"], "length");
    EXPECT_TRUE(r["choices"][i]["logprobs"].is_null());
  }
  EXPECT_EQ(r["usage"]["prompt_tokens"], 12);
  EXPECT_EQ(r["usage"]["completion_tokens"], 20);
  EXPECT_EQ(r["usage"]["total_tokens"], 32);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 11)
      << "the gRPC call cached the prompt";
}

TEST_F(HttpApiTest, StreamedEqualsNotStreamed) {
  const json body = {{"prompt", "The quick brown fox"},
                     {"max_tokens", 12},
                     {"n", 2},
                     {"temperature", 1.0},
                     {"seed", 9},
                     {"ignore_eos", true}};
  const json whole = Post("/v1/completions", body);
  json streamed_body = body;
  streamed_body["stream"] = true;
  streamed_body["stream_options"] = {{"include_usage", true}};
  bool done = false;
  const std::vector<json> chunks = Stream(streamed_body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(chunks.size(), 3u);
  std::map<int, std::string> text;
  std::map<int, std::string> finish;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i]["object"], "text_completion");
    EXPECT_EQ(chunks[i]["id"], chunks[0]["id"]) << "one id for the whole stream";
    ASSERT_EQ(chunks[i]["choices"].size(), 1u);
    const json& c = chunks[i]["choices"][0];
    text[c["index"].get<int>()] += c["text"].get<std::string>();
    if (!c["finish_reason"].is_null()) finish[c["index"].get<int>()] = c["finish_reason"];
    EXPECT_FALSE(chunks[i].contains("usage"));
  }
  const json& last = chunks.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], 24);
  EXPECT_EQ(last["usage"]["prompt_tokens"], whole["usage"]["prompt_tokens"]);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(text[i], whole["choices"][i]["text"]) << i;
    EXPECT_EQ(finish[i], "length");
  }
  // Without include_usage there is no usage chunk.
  streamed_body.erase("stream_options");
  const std::vector<json> plain = Stream(streamed_body, &done);
  EXPECT_TRUE(done);
  for (const json& c : plain) EXPECT_FALSE(c.contains("usage"));
}

TEST_F(HttpApiTest, LogprobsMatchGrpcsInOpenAisShape) {
  const std::vector<uint32_t> ids = RandomIds(22, 6);
  v1::GenerateRequest g = IdsRequest(ids, 5);
  g.set_top_logprobs(3);
  g.set_ignore_eos(true);
  GenerateResult grpc = Generate(*stub_, g);
  ASSERT_TRUE(grpc.status.ok());
  const json r = Post("/v1/completions", {{"prompt", ids},
                                          {"max_tokens", 5},
                                          {"temperature", 0},
                                          {"logprobs", 3},
                                          {"ignore_eos", true}});
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u);
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  ASSERT_EQ(lp["top_logprobs"].size(), 5u);
  ASSERT_EQ(lp["text_offset"].size(), 5u);
  std::string text;
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_FLOAT_EQ(lp["token_logprobs"][i].get<float>(), grpc.samples[0].logprobs[i]);
    EXPECT_LE(lp["top_logprobs"][i].size(), 3u);
    EXPECT_GE(lp["top_logprobs"][i].size(), 1u);
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), text.size());
    const std::string name = lp["tokens"][i];
    if (name.rfind("bytes:", 0) != 0)
      text += name;
    else
      break;  // a token that is part of a character: offsets past it are not checked
  }
}

TEST_F(HttpApiTest, ARepeatedPromptReportsCachedTokens) {
  const std::vector<uint32_t> ids = RandomIds(23, 48);  // 3 full blocks: all are indexed
  const json first = Post("/v1/completions", {{"prompt", ids}, {"max_tokens", 2}});
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  const json second = Post("/v1/completions", {{"prompt", ids}, {"max_tokens", 2}});
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_tokens"], 47);
  // Another cache_salt is another namespace.
  const json salted =
      Post("/v1/completions", {{"prompt", ids}, {"max_tokens", 2}, {"cache_salt", "x"}});
  EXPECT_EQ(salted["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

TEST_F(HttpApiTest, StopStringsCutTheTextInBothFrontEnds) {
  const std::vector<uint32_t> ids = RandomIds(24, 8);
  v1::GenerateRequest g = IdsRequest(ids, 24);
  g.set_ignore_eos(true);
  GenerateResult full = Generate(*stub_, g);
  ASSERT_TRUE(full.status.ok());
  const SampleResult& s = full.samples[0];
  // Token texts, to pick a stop string that spans a token boundary.
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::Load(model_dir_ + "/vocab.json", model_dir_ + "/merges.txt");
  ASSERT_TRUE(tok.ok());
  std::vector<size_t> ends;  // text end of each token, in bytes
  std::string text;
  for (uint32_t id : s.token_ids) {
    text += (*tok)->TokenBytes(id);
    ends.push_back(text.size());
  }
  ASSERT_EQ(text, s.text) << "a random model can emit partial characters; pick another seed";
  // The stop string: the last 2 bytes of token 5 and the first 2 of token 6, when both are
  // long enough; else 2 bytes from token 5's end onwards.
  const size_t boundary = ends[4];
  const size_t start = boundary >= 2 && ends[4] - ends[3] >= 2 ? boundary - 2 : boundary;
  const std::string stop = text.substr(start, 4);
  ASSERT_EQ(stop.size(), 4u);
  const size_t k = text.find(stop);  // the first occurrence decides
  size_t expected_tokens = 0;
  for (size_t i = 0; i < ends.size(); ++i) {
    const size_t token_start = i == 0 ? 0 : ends[i - 1];
    if (token_start < k) expected_tokens = i + 1;
  }

  g.add_stop(stop);
  GenerateResult grpc = Generate(*stub_, g);
  ASSERT_TRUE(grpc.status.ok());
  EXPECT_EQ(grpc.samples[0].text, text.substr(0, k));
  EXPECT_EQ(grpc.samples[0].finish, v1::FINISH_REASON_STOP);
  EXPECT_EQ(grpc.samples[0].token_ids.size(), expected_tokens);
  EXPECT_EQ(grpc.usage.completion_tokens(), expected_tokens);

  const json r = Post("/v1/completions", {{"prompt", ids},
                                          {"max_tokens", 24},
                                          {"temperature", 0},
                                          {"ignore_eos", true},
                                          {"stop", stop}});
  EXPECT_EQ(r["choices"][0]["text"], text.substr(0, k));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["completion_tokens"], expected_tokens);

  bool done = false;
  std::string streamed;
  for (const json& c : Stream({{"prompt", ids},
                               {"max_tokens", 24},
                               {"temperature", 0},
                               {"ignore_eos", true},
                               {"stop", json::array({stop, "never-there"})},
                               {"stream", true}},
                              &done)) {
    streamed += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(streamed, text.substr(0, k));

  // More than 4 stop strings, or an empty one, is refused naming `stop`.
  const json bad = Post("/v1/completions",
                        {{"prompt", ids}, {"stop", json::array({"a", "b", "c", "d", "e"})}}, 400);
  EXPECT_EQ(bad["error"]["param"], "stop");
  EXPECT_THAT(bad["error"]["message"].get<std::string>(), HasSubstr("at most 4"));
}

TEST_F(HttpApiTest, ErrorsSayWhatToFix) {
  json e = Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 300}}, 400);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "max_tokens");
  EXPECT_THAT(e["error"]["message"].get<std::string>(), HasSubstr("lower max_tokens"));
  e = Post("/v1/completions", {{"prompt", "x"}, {"model", "gpt-4"}}, 404);
  EXPECT_EQ(e["error"]["code"], "model_not_found");
  e = Post("/v1/completions", {{"prompt", "x"}, {"n", 17}}, 400);
  EXPECT_EQ(e["error"]["param"], "n");
  e = Post("/v1/completions", {{"prompt", "x"}, {"frobnicate", true}}, 400);
  EXPECT_EQ(e["error"]["param"], "frobnicate");
  e = Post("/v1/chat/completions", {{"messages", json::array()}}, 400);
  EXPECT_THAT(e["error"]["message"].get<std::string>(), HasSubstr("model has no chat template"));
  e = Post("/v2/whatever", json::object(), 404);
  EXPECT_THAT(e["error"]["message"].get<std::string>(), HasSubstr("no such endpoint"));
  absl::StatusOr<HttpResponse> r =
      HttpFetch(server_->http_port(), "POST", "/v1/completions", "{\"prompt\": ");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(r->body, HasSubstr("not valid JSON"));
  r = HttpFetch(server_->http_port(), "GET", "/v1/completions");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 405);
  // A body over the limit is refused before it is read.
  r = HttpFetch(server_->http_port(), "POST", "/v1/completions", std::string(9 << 20, ' '));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 413);
  EXPECT_THAT(r->body, HasSubstr("larger than 8388608 bytes"));
  // Refusals are counted like gRPC's, under api="http".
  EXPECT_GE(Metric("prefixd_requests_total{api=\"http\",code=\"INVALID_ARGUMENT\"}"), 4);
  EXPECT_GE(Metric("prefixd_requests_total{api=\"http\",code=\"NOT_FOUND\"}"), 1);
}

// Numbers past a double's range (and past a float's, where a field is a float) are a 400
// naming the field, on every endpoint that parses a body; the server goes on serving.
TEST_F(HttpApiTest, NumbersThatOverflowAre400AndTheServerGoesOn) {
  struct Case {
    const char* path;
    const char* body;
    const char* param;  // the error's `param`
  };
  const Case cases[] = {
      {"/v1/completions", R"({"prompt":"hi","max_tokens":1e400})", "max_tokens"},
      {"/v1/completions", R"({"prompt":"hi","temperature":-1e400})", "temperature"},
      {"/v1/completions", R"({"prompt":"hi","top_p":1e39})", "top_p"},
      {"/v1/completions", R"({"prompt":[1,2,1e999]})", "prompt"},
      {"/v1/completions", R"({"prompt":"hi","stream_options":{"include_usage":1e400}})",
       "include_usage"},
      {"/tokenize", R"({"prompt":"hi","x":1e999})", "x"},
      {"/detokenize", R"({"tokens":[1e400]})", "tokens"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<HttpResponse> r = HttpFetch(server_->http_port(), "POST", c.path, c.body);
    ASSERT_TRUE(r.ok()) << c.body << ": " << r.status();
    EXPECT_EQ(r->status, 400) << c.body;
    const json e = json::parse(r->body);
    EXPECT_EQ(e["error"]["type"], "invalid_request_error") << c.body;
    EXPECT_EQ(e["error"]["param"], c.param) << c.body;
  }
  const json ok = Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}});
  EXPECT_EQ(ok["choices"].size(), 1u);
}

TEST_F(HttpApiTest, ModelsHealthTokenizeDetokenize) {
  absl::StatusOr<HttpResponse> r = HttpFetch(server_->http_port(), "GET", "/v1/models");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
  const json models = json::parse(r->body);
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], "tiny-model");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(models["data"][0]["owned_by"], "prefixd");
  EXPECT_GT(models["data"][0]["created"].get<int64_t>(), 1600000000);
  r = HttpFetch(server_->http_port(), "GET", "/health");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
  const json t = Post("/tokenize", {{"prompt", "Hello world"}});
  EXPECT_EQ(t["tokens"], json::array({15496, 995}));
  EXPECT_EQ(t["count"], 2);
  EXPECT_EQ(t["max_model_len"], 256);
  const json d = Post("/detokenize", {{"tokens", json::array({15496, 995})}});
  EXPECT_EQ(d["prompt"], "Hello world");
  const json bad = Post("/detokenize", {{"tokens", json::array({60000})}}, 400);
  EXPECT_EQ(bad["error"]["param"], "tokens");
}

TEST_F(HttpApiTest, CompletionsAreCountedUnderTheHttpLabel) {
  const double before = Metric("prefixd_requests_total{api=\"http\",code=\"OK\"}");
  Post("/v1/completions",
       {{"prompt", json::array({json::array({1, 2}), json::array({3})})}, {"max_tokens", 1}});
  EXPECT_EQ(Metric("prefixd_requests_total{api=\"http\",code=\"OK\"}"), before + 2)
      << "one per prompt";
}

// ---- held in flight: the gated fake backend ----

class HttpFlowTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    model_dir_ = dir_->path() + "/tiny-model";
    ASSERT_TRUE(WriteTinyModel(model_dir_).ok());
    std::ofstream(dir_->path() + "/tokens") << "secret-a alice\n";
  }
  static void TearDownTestSuite() { delete dir_; }

  void StartServer(int32_t max_queue = 1024, bool auth = false, int32_t max_connections = 0) {
    ServerOptions o = TestServerOptions(model_dir_);
    o.max_connections = max_connections;
    o.metrics_listen = "127.0.0.1:0";
    o.http_listen = "127.0.0.1:0";
    o.max_queue = max_queue;
    if (auth) o.auth_tokens_file = dir_->path() + "/tokens";
    o.backend_factory = [this](const Model& m) -> absl::StatusOr<std::unique_ptr<Backend>> {
      auto b = std::make_unique<FakeBackend>(64, 16, m.config().vocab_size);
      b->set_gate(&gate_, 0);
      backend_ = b.get();
      return std::unique_ptr<Backend>(std::move(b));
    };
    absl::StatusOr<std::unique_ptr<Server>> s = Server::Start(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  void TearDown() override {
    if (!gate_.HasBeenNotified()) gate_.Notify();
    server_.reset();
  }
  double Metric(const std::string& series) {
    absl::StatusOr<std::string> text = HttpGet(server_->metrics_port(), "/metrics");
    return text.ok() ? MetricValue(*text, series) : -1;
  }
  bool BlocksReleased() {
    const EngineStats s = server_->engine().Stats();
    return s.cache.blocks_active == 0 && s.scheduler.running_requests == 0;
  }
  static std::string LongBody(bool stream) {
    return json{{"prompt", json::array({1, 2, 3, 4})},
                {"max_tokens", 200},
                {"ignore_eos", true},
                {"stream", stream}}
        .dump();
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string model_dir_;
  absl::Notification gate_;
  FakeBackend* backend_ = nullptr;
  std::unique_ptr<Server> server_;
};

TEST_F(HttpFlowTest, AClientThatDisconnectsIsNoticedWhileNoTokenIsWritten) {
  StartServer();
  for (bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "streamed" : "not streamed");
    // A non-streamed response has no head until it is complete: do not wait for it.
    absl::StatusOr<std::unique_ptr<HttpEventStream>> s = HttpEventStream::Open(
        server_->http_port(), "/v1/completions", LongBody(stream), {}, /*read_head=*/stream);
    ASSERT_TRUE(s.ok()) << s.status();
    if (stream) {
      ASSERT_TRUE(backend_->entered().WaitForNotificationWithTimeout(absl::Seconds(30)));
    } else {
      ASSERT_TRUE(PollUntil([&] { return ServerTestPeer::accepted_generates(*server_) == 2; },
                            absl::Seconds(10)));
    }
    (*s)->Abort();
    // The engine is stuck in its step (the gate): nothing is written, yet the request is
    // cancelled within a second.
    const double want = stream ? 1 : 2;
    EXPECT_TRUE(PollUntil(
        [&] { return Metric("prefixd_requests_total{api=\"http\",code=\"CANCELLED\"}") == want; },
        absl::Seconds(1)));
  }
  gate_.Notify();
  EXPECT_TRUE(PollUntil([&] { return BlocksReleased(); }, absl::Seconds(10)));
}

TEST_F(HttpFlowTest, FullQueueIs429AndDrainingIs503) {
  StartServer(/*max_queue=*/1);
  absl::StatusOr<std::unique_ptr<HttpEventStream>> a =
      HttpEventStream::Open(server_->http_port(), "/v1/completions", LongBody(true));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(backend_->entered().WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::StatusOr<std::unique_ptr<HttpEventStream>> b =
      HttpEventStream::Open(server_->http_port(), "/v1/completions", LongBody(true));
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(PollUntil([&] { return ServerTestPeer::accepted_generates(*server_) == 2; }, absl::Seconds(10)));
  absl::StatusOr<HttpResponse> c =
      HttpFetch(server_->http_port(), "POST", "/v1/completions", LongBody(false));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->status, 429);
  EXPECT_THAT(c->body, HasSubstr("request queue is full"));

  server_->BeginDrain(absl::Seconds(60));
  absl::StatusOr<HttpResponse> health = HttpFetch(server_->http_port(), "GET", "/health");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, 503);
  absl::StatusOr<HttpResponse> refused =
      HttpFetch(server_->http_port(), "POST", "/v1/completions", LongBody(false));
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->status, 503);
  EXPECT_THAT(refused->body, HasSubstr("shutting down"));
  gate_.Notify();
  // The streams in flight finish within the grace.
  for (auto* s : {a->get(), b->get()}) {
    std::optional<std::string> last;
    while (std::optional<std::string> e = s->Next()) last = e;
    EXPECT_EQ(last, std::optional<std::string>("[DONE]"));
  }
  EXPECT_TRUE(server_->Wait().ok());
}

TEST_F(HttpFlowTest, BearerTokensAsInGrpc) {
  StartServer(1024, /*auth=*/true);
  gate_.Notify();
  const std::string body = json{{"prompt", json::array({1, 2})}, {"max_tokens", 2}}.dump();
  absl::StatusOr<HttpResponse> r = HttpFetch(server_->http_port(), "POST", "/v1/completions", body);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "authentication_error");
  r = HttpFetch(server_->http_port(), "POST", "/v1/completions", body,
                {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(r->status, 401);
  r = HttpFetch(server_->http_port(), "POST", "/v1/completions", body,
                {{"Authorization", "Bearer secret-a"}});
  EXPECT_EQ(r->status, 200) << r->body;
  // The token is checked before the body is parsed: a body that does not parse, or
  // numbers that overflow, are 401 without a token.
  for (const char* path : {"/v1/completions", "/tokenize", "/detokenize", "/v1/models"}) {
    r = HttpFetch(server_->http_port(), "POST", path, R"({"prompt":"hi","max_tokens":1e400})");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, 401) << path;
  }
  r = HttpFetch(server_->http_port(), "POST", "/v1/completions", "{not json");
  EXPECT_EQ(r->status, 401);
  // /health needs no token (a load balancer asks it).
  r = HttpFetch(server_->http_port(), "GET", "/health");
  EXPECT_EQ(r->status, 200);
}

// Past --max-connections a connection waits in the listen queue, and is served once another
// closes.
TEST_F(HttpFlowTest, ConnectionsPastTheLimitWaitForOneToClose) {
  StartServer(1024, false, /*max_connections=*/2);
  gate_.Notify();
  auto connect_to = [&]() {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server_->http_port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return fd;
  };
  const int idle1 = connect_to();
  const int idle2 = connect_to();
  const int third = connect_to();
  const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(send(third, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  pollfd p{.fd = third, .events = POLLIN, .revents = 0};
  EXPECT_EQ(poll(&p, 1, 500), 0) << "served although two connections were open";
  close(idle1);
  ASSERT_EQ(poll(&p, 1, 5000), 1) << "not served after a connection closed";
  char buf[64] = {};
  ASSERT_GT(recv(third, buf, sizeof(buf) - 1, 0), 0);
  EXPECT_THAT(std::string(buf), HasSubstr("HTTP/1.1 200"));
  close(idle2);
  close(third);
}

}  // namespace
}  // namespace prefixd::testing
