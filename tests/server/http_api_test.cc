// The HTTP API in-process: prefixd::Server with its HTTP front end on a free loopback port,
// the tiny random model on the CPU backend. Completions are compared with gRPC's for the
// same ids and seed; every endpoint and error is exercised. (Requests held in flight:
// http_flow_test.cc.)
#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/http_client.h"
#include "engine/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/server.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/in_process_server.h"
#include "tests/server/process.h"

namespace prefixd::testing {

using bench::HttpEventStream;
using bench::HttpFetch;
using bench::HttpResponse;
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
    o.device.kv_pool.budget_bytes = 8388608;
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

// Ids the server makes up are 128 random bits, not a counter that tells one tenant how many
// requests others sent (gRPC's request_id and HTTP's "cmpl-" id alike).
TEST_F(HttpApiTest, ResponseIdsAreRandomNotACounter) {
  std::set<std::string> seen;
  for (int i = 0; i < 3; ++i) {
    const json r = Post("/v1/completions", {{"prompt", json::array({1, 2})}, {"max_tokens", 1}});
    const std::string id = r["id"].get<std::string>();
    EXPECT_THAT(id, ::testing::MatchesRegex("cmpl-prefixd-[0-9a-f]{32}"));
    seen.insert(id);
    GenerateResult g = Generate(*stub_, IdsRequest({1, 2}, 1));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    ASSERT_FALSE(g.messages.empty());
    EXPECT_THAT(g.messages[0].request_id(), ::testing::MatchesRegex("prefixd-[0-9a-f]{32}"));
    seen.insert(g.messages[0].request_id());
  }
  EXPECT_EQ(seen.size(), 6u);
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
  // All from the pool (no tiers here): the split beside OpenAI's field says so.
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_pool_tokens"], 47);
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_disk_tokens"], 0);
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_remote_tokens"], 0);
  // Another cache_salt is another namespace.
  const json salted =
      Post("/v1/completions", {{"prompt", ids}, {"max_tokens", 2}, {"cache_salt", "x"}});
  EXPECT_EQ(salted["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

// OpenAI's prompt cache fields: "24h" retains the prompt (its tokens then count as retained
// when served), the key comes back in the usage, and any other retention is a 400 naming it.
TEST_F(HttpApiTest, PromptCacheRetentionAndKey) {
  const std::vector<uint32_t> ids = RandomIds(31, 48);
  const json first = Post("/v1/completions", {{"prompt", ids},
                                               {"max_tokens", 2},
                                               {"prompt_cache_retention", "24h"},
                                               {"prompt_cache_key", "conv-1"}});
  EXPECT_EQ(first["usage"]["prompt_cache_key"], "conv-1");
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_retained_tokens"], 0);
  const json second = Post("/v1/completions", {{"prompt", ids}, {"max_tokens", 2}});
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_tokens"], 47);
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_retained_tokens"], 47);
  EXPECT_FALSE(second["usage"].contains("prompt_cache_key"));
  for (const json& bad : {json("1h"), json("24H"), json(24)}) {
    const json e = Post("/v1/completions",
                        {{"prompt", ids}, {"max_tokens", 2}, {"prompt_cache_retention", bad}}, 400);
    EXPECT_EQ(e["error"]["param"], "prompt_cache_retention") << bad.dump();
  }
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

// The sampling controls through both front ends: the same tokens for the same ids, seed and
// parameters, and out-of-range values refused naming the field and its range.
TEST_F(HttpApiTest, SamplingControlsEqualGrpcsAndAreRangeChecked) {
  const std::vector<uint32_t> ids = RandomIds(33, 20);
  v1::GenerateRequest g = IdsRequest(ids, 24);
  g.set_num_samples(2);
  g.set_temperature(0.9f);
  g.set_seed(11);
  g.set_ignore_eos(true);
  g.set_presence_penalty(0.5f);
  g.set_frequency_penalty(1.0f);
  g.set_repetition_penalty(1.2f);
  g.set_min_p(0.02f);
  (*g.mutable_logit_bias())[ids[0]] = 5.0f;
  (*g.mutable_logit_bias())[7] = -100.0f;
  GenerateResult grpc = Generate(*stub_, g);
  ASSERT_TRUE(grpc.status.ok()) << grpc.status.error_message();
  v1::GenerateRequest plain = g;
  plain.clear_presence_penalty();
  plain.clear_frequency_penalty();
  plain.clear_repetition_penalty();
  plain.clear_min_p();
  plain.clear_logit_bias();
  GenerateResult unpenalised = Generate(*stub_, plain);
  ASSERT_TRUE(unpenalised.status.ok());

  const json r =
      Post("/v1/completions", {{"prompt", ids},
                               {"max_tokens", 24},
                               {"n", 2},
                               {"temperature", 0.9},
                               {"seed", 11},
                               {"ignore_eos", true},
                               {"presence_penalty", 0.5},
                               {"frequency_penalty", 1.0},
                               {"repetition_penalty", 1.2},
                               {"min_p", 0.02},
                               {"logit_bias", {{std::to_string(ids[0]), 5}, {"7", -100}}}});
  ASSERT_EQ(r["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(r["choices"][i]["text"], grpc.samples[i].text) << i;
    EXPECT_NE(grpc.samples[i].token_ids, unpenalised.samples[i].token_ids) << i;
    for (uint32_t id : grpc.samples[i].token_ids) EXPECT_NE(id, 7u) << "banned by logit_bias";
  }

  struct Bad {
    json fields;
    std::string param;
    std::string fix;  // what the message tells the client to do
  };
  const Bad bad[] = {
      {{{"presence_penalty", 2.5}}, "presence_penalty", "use a value in [-2, 2]"},
      {{{"frequency_penalty", -3}}, "frequency_penalty", "use a value in [-2, 2]"},
      {{{"repetition_penalty", 0}}, "repetition_penalty", "use a value in [0.01, 100]"},
      {{{"repetition_penalty", 1e-40}}, "repetition_penalty", "use a value in [0.01, 100]"},
      {{{"min_p", 1.5}}, "min_p", "use a value in [0, 1]"},
      {{{"logit_bias", {{"50257", 1}}}}, "logit_bias", "ids must be < vocab_size 50257"},
      {{{"logit_bias", {{"5", 101}}}}, "logit_bias", "use a value in [-100, 100]"},
  };
  for (const auto& [fields, param, fix] : bad) {
    json body = {{"prompt", "x"}};
    body.update(fields);
    const json e = Post("/v1/completions", body, 400);
    EXPECT_EQ(e["error"]["param"], param) << body.dump();
    const std::string message = e["error"]["message"].get<std::string>();
    EXPECT_THAT(message, HasSubstr(param)) << body.dump();
    EXPECT_THAT(message, HasSubstr(fix)) << body.dump();
  }
}

// lm-evaluation-harness's `local-completions` loglikelihood requests, in their exact shape:
// a batch of token-id prompts (context + continuation), temperature 0, max_tokens 1,
// logprobs 1, seed 1234, echo. The harness reads token_logprobs[ctxlen:-1] (summed) and
// top_logprobs[ctxlen:-1] (is the continuation greedy?). A multiple-choice set: 3 questions
// x 4 choices behind one shared preamble. Cold (a fresh cache_salt) and cached answers are
// the same JSON, equal gRPC's prompt_logprobs, and the cached ones come from score records.
TEST_F(HttpApiTest, LmEvalLoglikelihoodRequestsScoreFromTheCache) {
  const std::vector<uint32_t> preamble = RandomIds(71, 40);
  std::vector<std::vector<uint32_t>> prompts;
  std::vector<size_t> ctxlen;
  for (uint32_t q = 0; q < 3; ++q) {
    std::vector<uint32_t> context = preamble;
    for (uint32_t id : RandomIds(100 + q, 9)) context.push_back(id);
    for (uint32_t c = 0; c < 4; ++c) {
      std::vector<uint32_t> prompt = context;
      for (uint32_t id : RandomIds(200 + q * 4 + c, 2 + c)) prompt.push_back(id);
      prompts.push_back(prompt);
      ctxlen.push_back(context.size());
    }
  }
  auto batch = [&](const std::string& salt) {
    json body = {{"model", "tiny-model"}, {"prompt", prompts}, {"temperature", 0},
                 {"max_tokens", 1},       {"logprobs", 1},     {"seed", 1234},
                 {"echo", true}};
    if (!salt.empty()) body["cache_salt"] = salt;
    return Post("/v1/completions", body);
  };
  const double cached_before = Metric("prefixd_prompt_logprob_tokens_cached_total");
  const double scored_before = Metric("prefixd_prompt_logprob_tokens_total");
  const json cold = batch("lm-eval-cold");
  const json warm = batch("lm-eval-cold");  // the same namespace again: everything cached
  ASSERT_EQ(cold["choices"].size(), prompts.size());
  size_t prompt_tokens = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("prompt ", i));
    prompt_tokens += prompts[i].size();
    const json& lp = cold["choices"][i]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), prompts[i].size() + 1) << "the prompt, then the new token";
    ASSERT_EQ(lp["token_logprobs"].size(), prompts[i].size() + 1);
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());
    EXPECT_EQ(lp["text_offset"][0], 0);
    EXPECT_EQ(cold["choices"][i]["finish_reason"], "length");
    EXPECT_EQ(warm["choices"][i]["logprobs"], lp) << "cached == cold";
    EXPECT_EQ(warm["choices"][i]["text"], cold["choices"][i]["text"]);

    // What the harness computes: the continuation's loglikelihood and greediness.
    double loglikelihood = 0.0;
    bool greedy = true;
    for (size_t t = ctxlen[i]; t + 1 < lp["token_logprobs"].size(); ++t) {
      loglikelihood += lp["token_logprobs"][t].get<double>();
      // The most likely entry, and the token itself when it is not that one (OpenAI's "up
      // to logprobs+1"): the harness takes the entry of the highest logprob.
      const json& top = lp["top_logprobs"][t];
      ASSERT_GE(top.size(), 1u);
      ASSERT_LE(top.size(), 2u);
      ASSERT_TRUE(top.contains(lp["tokens"][t].get<std::string>()));
      auto best = top.begin();
      for (auto it = top.begin(); it != top.end(); ++it) {
        if (it.value().get<double>() > best.value().get<double>()) best = it;
      }
      greedy = greedy && best.key() == lp["tokens"][t].get<std::string>();
    }
    EXPECT_LT(loglikelihood, 0.0);

    // gRPC's prompt_logprobs for the same ids: the same numbers.
    v1::GenerateRequest g = IdsRequest(prompts[i], 1);
    g.set_prompt_logprobs(1);
    g.set_seed(1234);
    g.set_cache_salt("lm-eval-grpc");
    const GenerateResult r = Generate(*stub_, g);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_FALSE(r.messages.empty());
    const v1::GenerateResponse& first = r.messages[0];
    ASSERT_EQ(first.prompt_token_ids_size(), static_cast<int>(prompts[i].size()));
    ASSERT_EQ(first.prompt_logprobs_size(), static_cast<int>(prompts[i].size()) - 1);
    ASSERT_EQ(first.token_ids_size(), 0) << "the prompt comes before any generated token";
    double grpc_loglikelihood = 0.0;
    bool grpc_greedy = true;
    for (size_t t = ctxlen[i]; t < prompts[i].size(); ++t) {
      EXPECT_EQ(first.prompt_logprobs(static_cast<int>(t) - 1),
                lp["token_logprobs"][t].get<float>());
      grpc_loglikelihood += first.prompt_logprobs(static_cast<int>(t) - 1);
      const v1::TopLogprobs& top = first.prompt_top_logprobs(static_cast<int>(t) - 1);
      ASSERT_EQ(top.token_ids_size(), 1);
      grpc_greedy = grpc_greedy && top.token_ids(0) == prompts[i][t];
    }
    EXPECT_DOUBLE_EQ(grpc_loglikelihood, loglikelihood);
    EXPECT_EQ(grpc_greedy, greedy);
    EXPECT_EQ(r.samples.at(0).token_ids.size(), 1u);
  }
  // 24 prompts (12 HTTP, 12 gRPC), each scored at prompt length - 1 positions; the warm batch
  // took its scores from records (all but the recomputed last row's position and its tail).
  const double scored = Metric("prefixd_prompt_logprob_tokens_total") - scored_before;
  EXPECT_EQ(scored, 3.0 * (prompt_tokens - prompts.size()));
  EXPECT_GT(Metric("prefixd_prompt_logprob_tokens_cached_total") - cached_before,
            0.5 * (prompt_tokens - prompts.size()));
}

TEST_F(HttpApiTest, EchoStreamsThePromptFirstAndMaxTokensZeroScoresOnly) {
  const std::vector<uint32_t> ids = RandomIds(81, 20);
  const json body = {{"prompt", ids}, {"max_tokens", 5},    {"logprobs", 2}, {"echo", true},
                     {"n", 2},        {"temperature", 0.7}, {"seed", 3},     {"ignore_eos", true}};
  const json whole = Post("/v1/completions", body);
  json streamed_body = body;
  streamed_body["stream"] = true;
  bool done = false;
  const std::vector<json> chunks = Stream(streamed_body, &done);
  EXPECT_TRUE(done);
  std::vector<std::string> text(2);
  std::vector<json> token_logprobs(2, json::array()), offsets(2, json::array());
  for (const json& c : chunks) {
    ASSERT_EQ(c["choices"].size(), 1u);
    const json& choice = c["choices"][0];
    const int i = choice["index"];
    if (text[i].empty()) {
      // The first chunk of a choice is the whole prompt, with its logprobs.
      ASSERT_EQ(choice["logprobs"]["tokens"].size(), ids.size());
    }
    text[i] += choice["text"].get<std::string>();
    for (const json& v : choice["logprobs"]["token_logprobs"]) token_logprobs[i].push_back(v);
    for (const json& v : choice["logprobs"]["text_offset"]) offsets[i].push_back(v);
  }
  ASSERT_EQ(whole["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const json& choice = whole["choices"][i];
    EXPECT_EQ(text[i], choice["text"]) << i;
    EXPECT_EQ(token_logprobs[i], choice["logprobs"]["token_logprobs"]) << i;
    EXPECT_EQ(offsets[i], choice["logprobs"]["text_offset"]) << i;
    EXPECT_EQ(choice["logprobs"]["tokens"].size(), ids.size() + 5);
    // n > 1 repeats the prompt part in each choice.
    for (size_t t = 0; t < ids.size(); ++t) {
      EXPECT_EQ(choice["logprobs"]["token_logprobs"][t],
                whole["choices"][0]["logprobs"]["token_logprobs"][t]);
    }
  }
  EXPECT_NE(whole["choices"][0]["text"], whole["choices"][1]["text"]);

  // max_tokens 0 with echo: the prompt alone; echo without logprobs: text only.
  json prompt_only = {{"prompt", ids}, {"max_tokens", 0}, {"logprobs", 0}, {"echo", true}};
  const json scored = Post("/v1/completions", prompt_only);
  ASSERT_EQ(scored["choices"].size(), 1u);
  EXPECT_EQ(scored["choices"][0]["logprobs"]["tokens"].size(), ids.size());
  EXPECT_EQ(scored["usage"]["completion_tokens"], 0);
  EXPECT_EQ(scored["choices"][0]["finish_reason"], "length");
  const std::string prompt_text = scored["choices"][0]["text"];
  EXPECT_EQ(whole["choices"][0]["text"].get<std::string>().substr(0, prompt_text.size()),
            prompt_text);
  prompt_only.erase("logprobs");
  const json echoed = Post("/v1/completions", prompt_only);
  EXPECT_EQ(echoed["choices"][0]["text"], prompt_text);
  EXPECT_TRUE(echoed["choices"][0]["logprobs"].is_null());
  // Without echo, max_tokens 0 is still refused, naming the field.
  const json e = Post("/v1/completions", {{"prompt", ids}, {"max_tokens", 0}}, 400);
  EXPECT_EQ(e["error"]["param"], "max_tokens");
  EXPECT_THAT(e["error"]["message"].get<std::string>(), HasSubstr("allowed only with"));
}

// lm-evaluation-harness scores a continuation with `echo`, `logprobs` and `max_tokens: 1`,
// summing token_logprobs[ctxlen:-1]: it drops the last entry as the generated token. When that
// token is EOS it must still be listed (OpenAI and vLLM do), or the continuation's own last
// token is dropped instead and the score is silently wrong.
TEST_F(HttpApiTest, AStopTokenIsTheLastLogprobsEntryAfterAnEchoedPrompt) {
  const std::vector<uint32_t> ids = RandomIds(91, 12);
  json body = {{"prompt", ids},
               {"max_tokens", 1},
               {"logprobs", 1},
               {"echo", true},
               {"temperature", 0},
               {"seed", 1234},
               {"logit_bias", {{"50256", 100}}}};  // EOS is the greedy token
  const json whole = Post("/v1/completions", body);
  ASSERT_EQ(whole["choices"].size(), 1u);
  const json& choice = whole["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "stop");
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size() + 1) << "the prompt, then the stop token";
  ASSERT_EQ(lp["token_logprobs"].size(), ids.size() + 1);
  ASSERT_EQ(lp["top_logprobs"].size(), ids.size() + 1);
  ASSERT_EQ(lp["text_offset"].size(), ids.size() + 1);
  EXPECT_EQ(lp["tokens"].back(), "<|endoftext|>");
  EXPECT_LE(lp["token_logprobs"].back().get<double>(), 0.0);
  // The most likely entry, and EOS itself when it is not that one (the bias made it the
  // greedy token; logprobs are the raw logits').
  EXPECT_GE(lp["top_logprobs"].back().size(), 1u);
  EXPECT_LE(lp["top_logprobs"].back().size(), 2u);
  EXPECT_TRUE(lp["top_logprobs"].back().contains("<|endoftext|>"));
  // Not in the text, nor counted (as over gRPC): its offset is the text's end.
  EXPECT_EQ(lp["text_offset"].back(), choice["text"].get<std::string>().size());
  EXPECT_EQ(whole["usage"]["completion_tokens"], 0);

  // Streamed: the same entries.
  body["stream"] = true;
  bool done = false;
  json tokens = json::array(), offsets = json::array();
  for (const json& c : Stream(body, &done)) {
    for (const json& v : c["choices"][0]["logprobs"]["tokens"]) tokens.push_back(v);
    for (const json& v : c["choices"][0]["logprobs"]["text_offset"]) offsets.push_back(v);
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(tokens, lp["tokens"]);
  EXPECT_EQ(offsets, lp["text_offset"]);
}

TEST_F(HttpApiTest, ErrorsSayWhatToFix) {
  // The engine's rules name each field as OpenAI's API does, first in the message and as
  // `param`.
  json e = Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 300}}, 400);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "max_tokens");
  EXPECT_THAT(e["error"]["message"].get<std::string>(),
              HasSubstr("max_tokens 300 + the prompt's 1 tokens = 301, more than the model's "
                        "context length 256: lower it or shorten the prompt"));
  e = Post("/v1/completions", {{"prompt", "x"}, {"model", "gpt-4"}}, 404);
  EXPECT_EQ(e["error"]["code"], "model_not_found");
  EXPECT_EQ(e["error"]["param"], "model");
  EXPECT_THAT(e["error"]["message"].get<std::string>(), HasSubstr("model `gpt-4` is not loaded"));
  e = Post("/v1/completions", {{"prompt", "x"}, {"n", 17}}, 400);
  EXPECT_EQ(e["error"]["param"], "n");
  EXPECT_THAT(e["error"]["message"].get<std::string>(),
              HasSubstr("n 17 exceeds this server's limit 16 (--max-samples)"));
  // OpenAI's n is at least 1 (gRPC's num_samples 0 is "unset", one sample).
  e = Post("/v1/completions", {{"prompt", "x"}, {"n", 0}}, 400);
  EXPECT_EQ(e["error"]["param"], "n");
  EXPECT_THAT(e["error"]["message"].get<std::string>(),
              HasSubstr("n is 0: ask for at least 1 sample"));
  e = Post("/v1/completions", {{"prompt", ""}}, 400);
  EXPECT_EQ(e["error"]["param"], "prompt");
  EXPECT_THAT(e["error"]["message"].get<std::string>(), HasSubstr("prompt is an empty prompt"));
  e = Post("/v1/completions", {{"prompt", json::array({1, 50257})}}, 400);
  EXPECT_EQ(e["error"]["param"], "prompt");
  EXPECT_THAT(e["error"]["message"].get<std::string>(),
              HasSubstr("prompt has token id 50257 at position 1, out of range"));
  e = Post("/v1/completions", {{"prompt", "x"}, {"stop", json::array({""})}}, 400);
  EXPECT_EQ(e["error"]["param"], "stop");
  EXPECT_THAT(e["error"]["message"].get<std::string>(),
              HasSubstr("stop has a string of 0 bytes: each must be 1 to 64 bytes"));
  e = Post("/detokenize", {{"tokens", json::array({1, 50257})}}, 400);
  EXPECT_EQ(e["error"]["param"], "tokens");
  EXPECT_THAT(e["error"]["message"].get<std::string>(), HasSubstr("tokens has token id 50257"));
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
  EXPECT_EQ(r->headers["allow"], "POST");  // a 405 says which methods the path takes
  r = HttpFetch(server_->http_port(), "POST", "/v1/models", "{}");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->headers["allow"], "GET");
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

// docs/SERVER.md's endpoint table is the API's list: each endpoint it names answers its
// method (an empty body may be refused, but not as an unknown path or method), and each
// endpoint the server's unknown-path answer lists is in the table.
TEST_F(HttpApiTest, TheDocumentedEndpointsAreTheServedOnes) {
  std::ifstream in(std::string(PREFIXD_SOURCE_DIR) + "/docs/SERVER.md");
  ASSERT_TRUE(in.good());
  static const std::regex kRow(R"(^\| `(GET|POST|HEAD) (/[a-z0-9_/]*)`)");
  std::set<std::string> documented;
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (!std::regex_search(line, m, kRow)) continue;
    const std::string method = m[1], path = m[2];
    documented.insert(method + " " + path);
    absl::StatusOr<HttpResponse> r =
        HttpFetch(server_->http_port(), method, path, method == "POST" ? "{}" : "");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NE(r->status, 405) << method << " " << path << ": " << r->body;
    EXPECT_EQ(r->body.find("no such endpoint"), std::string::npos) << method << " " << path;
  }
  ASSERT_GE(documented.size(), 8u);
  absl::StatusOr<HttpResponse> unknown = HttpFetch(server_->http_port(), "GET", "/no-such-path");
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->status, 404);
  const std::string served = json::parse(unknown->body)["error"]["message"];
  static const std::regex kServed(R"((GET|POST|HEAD) (/[a-z0-9_/]*))");
  int listed = 0;
  for (auto it = std::sregex_iterator(served.begin(), served.end(), kServed);
       it != std::sregex_iterator(); ++it, ++listed) {
    EXPECT_TRUE(documented.count(it->str())) << it->str() << " is served but not documented";
  }
  EXPECT_GE(listed, 7) << served;
}

TEST_F(HttpApiTest, CompletionsAreCountedUnderTheHttpLabel) {
  const double before = Metric("prefixd_requests_total{api=\"http\",code=\"OK\"}");
  Post("/v1/completions",
       {{"prompt", json::array({json::array({1, 2}), json::array({3})})}, {"max_tokens", 1}});
  EXPECT_EQ(Metric("prefixd_requests_total{api=\"http\",code=\"OK\"}"), before + 2)
      << "one per prompt";
}

// A completion is all or nothing: when one of its prompts is refused, the others are not run.
// Each still counts once, with the code the client was answered: the one queued before the
// refusal was not cancelled (the client cancelled nothing), and the one after it counts too.
TEST_F(HttpApiTest, APromptRefusedCountsEveryPromptOfItsCompletionWithTheRefusal) {
  auto count = [](const char* code) {
    return std::max(
        0.0, Metric(absl::StrCat("prefixd_requests_total{api=\"http\",code=\"", code, "\"}")));
  };
  const double invalid = count("INVALID_ARGUMENT");
  const double cancelled = count("CANCELLED");
  const json e = Post("/v1/completions",
                      {{"prompt", json::array({"Hello", "", "world"})}, {"max_tokens", 1}}, 400);
  EXPECT_EQ(e["error"]["param"], "prompt");
  EXPECT_EQ(count("INVALID_ARGUMENT") - invalid, 3) << "one per prompt";
  EXPECT_EQ(count("CANCELLED") - cancelled, 0);
}

}  // namespace
}  // namespace prefixd::testing
