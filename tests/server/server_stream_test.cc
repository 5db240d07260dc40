// prefixd over gRPC, in-process: a prefixd::Server on a free loopback port serving a tiny
// random model on the CPU backend. (Holding requests in flight: server_flow_test.cc.)
#include <unistd.h>

#include <filesystem>
#include <numeric>

#include "absl/synchronization/notification.h"
#include "engine/tokenizer.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "src/proto/grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/in_process_server.h"
#include "tests/server/process.h"

namespace prefixd::testing {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    model_dir_ = dir_->path() + "/tiny-model";
    ASSERT_TRUE(WriteTinyModel(model_dir_).ok());
    ServerOptions o = TestServerOptions(model_dir_);
    o.device.kv_pool.budget_bytes = 8388608;  // 8192 tokens of the tiny model: room for every test
    o.metrics_listen = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<Server>> s = Server::Start(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = s->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    delete dir_;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    channel_ = InsecureChannel(server_->grpc_address());
    stub_ = v1::Inference::NewStub(channel_);
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string model_dir_;
  static inline Server* server_ = nullptr;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(ServerTest, StreamsTokenIdsTextAndUsage) {
  v1::GenerateRequest req = IdsRequest(RandomIds(1, 10), 12);
  req.set_request_id("r-1");
  GenerateResult r = Generate(*stub_, req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.samples.size(), 1u);
  const SampleResult& s = r.samples[0];
  EXPECT_EQ(s.token_ids.size(), 12u);
  EXPECT_EQ(s.logprobs.size(), 12u);
  for (float lp : s.logprobs) EXPECT_LE(lp, 0.0f);
  EXPECT_EQ(s.finish, v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(s.finish_messages, 1);
  EXPECT_EQ(r.usage_messages, 1);
  EXPECT_TRUE(r.messages.back().has_usage()) << "usage must come last";
  EXPECT_EQ(r.usage.prompt_tokens(), 10u);
  EXPECT_EQ(r.usage.completion_tokens(), 12u);
  for (const v1::GenerateResponse& m : r.messages) EXPECT_EQ(m.request_id(), "r-1");

  // The streamed text is the tokens' bytes with no character split (the model is random,
  // so invalid sequences become U+FFFD exactly as one decoder over all bytes makes them).
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::Load(model_dir_ + "/vocab.json", model_dir_ + "/merges.txt");
  ASSERT_TRUE(tok.ok());
  absl::StatusOr<std::string> bytes = (*tok)->Decode(s.token_ids);
  ASSERT_TRUE(bytes.ok());
  Utf8StreamDecoder whole;
  EXPECT_EQ(s.text, whole.Push(*bytes) + whole.Flush());

  // Greedy decoding is deterministic.
  GenerateResult again = Generate(*stub_, req);
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.samples[0].token_ids, s.token_ids);
  EXPECT_EQ(again.samples[0].logprobs, s.logprobs);
}

TEST_F(ServerTest, TextPromptsAreTokenizedByTheServer) {
  v1::GenerateRequest req;
  req.set_text("Hello world");
  req.set_max_new_tokens(3);
  req.set_ignore_eos(true);
  GenerateResult r = Generate(*stub_, req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.usage.prompt_tokens(), 2u);  // "Hello world" = 15496 995
  EXPECT_FALSE(r.messages.front().request_id().empty()) << "the server names the request";

  grpc::ClientContext ctx;
  v1::TokenizeRequest treq;
  treq.set_text("Hello world");
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(stub_->Tokenize(&ctx, treq, &tresp).ok());
  EXPECT_THAT(tresp.token_ids(), ElementsAreArray({15496u, 995u}));
}

TEST_F(ServerTest, TopLogprobsAndSamples) {
  v1::GenerateRequest req = IdsRequest(RandomIds(2, 6), 5);
  req.set_top_logprobs(3);
  req.set_num_samples(3);
  req.set_temperature(1.0f);
  req.set_seed(11);
  GenerateResult r = Generate(*stub_, req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.samples.size(), 3u);
  uint32_t total = 0;
  for (auto& [index, s] : r.samples) {
    EXPECT_EQ(s.finish, v1::FINISH_REASON_LENGTH) << index;
    EXPECT_EQ(s.finish_messages, 1) << index;
    ASSERT_EQ(s.top.size(), s.token_ids.size());
    for (size_t i = 0; i < s.top.size(); ++i) {
      ASSERT_EQ(s.top[i].token_ids_size(), 3);
      ASSERT_EQ(s.top[i].logprobs_size(), 3);
      EXPECT_GE(s.top[i].logprobs(0), s.top[i].logprobs(1));
      EXPECT_GE(s.top[i].logprobs(1), s.top[i].logprobs(2));
      EXPECT_LE(s.logprobs[i], s.top[i].logprobs(0));
    }
    total += s.token_ids.size();
  }
  EXPECT_EQ(r.usage.completion_tokens(), total);
  EXPECT_EQ(total, 15u);

  // The same seed gives the same samples.
  GenerateResult again = Generate(*stub_, req);
  ASSERT_TRUE(again.status.ok());
  for (auto& [index, s] : r.samples) EXPECT_EQ(again.samples[index].token_ids, s.token_ids);
}

TEST_F(ServerTest, EveryValidationCaseIsInvalidArgument) {
  auto expect_invalid = [&](const v1::GenerateRequest& req, const std::string& what) {
    GenerateResult r = Generate(*stub_, req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << what;
    EXPECT_THAT(r.status.error_message(), HasSubstr(what));
    EXPECT_TRUE(r.messages.empty());
  };
  const v1::GenerateRequest ok = IdsRequest({1, 2, 3}, 4);
  v1::GenerateRequest r = ok;
  r.clear_prompt();
  expect_invalid(r, "no prompt");
  r = ok;
  r.mutable_token_ids()->clear_ids();
  expect_invalid(r, "empty prompt");
  r = ok;
  r.set_text("");
  expect_invalid(r, "text is an empty prompt");
  r = ok;
  r.mutable_token_ids()->add_ids(50257);
  // Each refusal names the proto's field first.
  expect_invalid(r, "token_ids has token id 50257 at position 3, out of range: ids must be < "
                    "vocab_size 50257");
  r = ok;
  r.set_max_new_tokens(254);  // 3 + 254 > 256
  expect_invalid(r, "max_new_tokens 254 + the prompt's 3 tokens = 257, more than the model's "
                    "context length 256");
  r = ok;
  r.set_max_new_tokens(0);
  expect_invalid(r, "max_new_tokens is 0");
  r = ok;
  r.set_num_samples(17);
  expect_invalid(r, "num_samples 17 exceeds this server's limit 16 (--max-samples)");
  r = ok;
  r.set_temperature(-1);
  expect_invalid(r, "temperature");
  r = ok;
  r.set_temperature(std::numeric_limits<float>::quiet_NaN());
  expect_invalid(r, "temperature");
  r = ok;
  r.set_top_p(0);
  expect_invalid(r, "top_p");
  r = ok;
  r.set_top_p(1.5f);
  expect_invalid(r, "top_p");
  r = ok;
  r.set_top_logprobs(21);
  expect_invalid(r, "top_logprobs 21 is too large: use 0..20");
  r = ok;
  r.set_prompt_cache_retention("1h");
  expect_invalid(r, "prompt_cache_retention must be \"in_memory\" or \"24h\", got \"1h\"");
  r = ok;
  r.add_stop_token_ids(60000);
  expect_invalid(r, "stop_token_ids has token id 60000 at position 0, out of range");
  r = ok;
  r.set_presence_penalty(2.01f);
  expect_invalid(r, "presence_penalty 2.00999999 is invalid: use a value in [-2, 2]");
  r = ok;
  r.set_frequency_penalty(-2.5f);
  expect_invalid(r, "frequency_penalty -2.5 is invalid: use a value in [-2, 2]");
  r = ok;
  r.set_repetition_penalty(0.0f);  // set, unlike an unset field (= 1)
  expect_invalid(r, "repetition_penalty 0 is invalid: use a value in [0.01, 100]");
  r = ok;
  r.set_min_p(-0.5f);
  expect_invalid(r, "min_p -0.5 is invalid: use a value in [0, 1]");
  r = ok;
  (*r.mutable_logit_bias())[50257] = 1.0f;
  expect_invalid(r, "logit_bias token id 50257 is out of range");
  r = ok;
  (*r.mutable_logit_bias())[3] = -250.0f;
  expect_invalid(r, "logit_bias for token 3 is -250: use a value in [-100, 100]");
  r = ok;
  for (uint32_t i = 0; i < 301; ++i) (*r.mutable_logit_bias())[i] = 1.0f;
  expect_invalid(r, "logit_bias has 301 entries: give at most 300");
  r = ok;
  r.set_prompt_logprobs(21);
  expect_invalid(r, "prompt_logprobs 21 is too large: use 0..20");
  r = ok;
  r.set_request_id(std::string(257, 'x'));
  expect_invalid(r, "request_id is 257 bytes: use at most 256");
  r = ok;
  r.set_request_id("tab\there");
  expect_invalid(r, "request_id has byte 0x09 at offset 3");
  r = ok;
  for (int i = 0; i < 1025; ++i) r.add_stop_token_ids(i);
  expect_invalid(r, "stop_token_ids has 1025 ids: give at most 1024");
  r = ok;
  r.set_text(std::string(256 * 128 + 1, 'a'));  // context 256 x 128 bytes, GPT-2's longest
  expect_invalid(r, "text is 32769 bytes, more than any text of at most 256 tokens");
  r = ok;
  std::string words;
  for (int i = 0; i < 300; ++i) words += " a";  // 300 tokens in 600 bytes
  r.set_text(words);
  expect_invalid(r, "text has more than 256 tokens, the model's context length");
  // Nothing was queued by any of them.
  EXPECT_EQ(GetStats(*stub_).blocks_active(), 0u);
  EXPECT_TRUE(Generate(*stub_, ok).status.ok());
  // proto3's 0 is "unset": num_samples 0 is one sample (the gRPC parser's default, not a
  // rule; OpenAI's n = 0 is refused, tests/server/http_api_test.cc).
  r = ok;
  r.set_num_samples(0);
  const GenerateResult one = Generate(*stub_, r);
  ASSERT_TRUE(one.status.ok()) << one.status.error_message();
  EXPECT_EQ(one.samples.size(), 1u);
}

// Sends `raw` bytes as the request of `method` (a Inference method name) and returns the status.
grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                          const std::string& raw) {
  grpc::GenericStub generic(channel);
  grpc::Slice slice(raw.data(), raw.size());
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  absl::Notification done;
  grpc::Status status;
  generic.UnaryCall(&ctx, "/prefixd.v1.Inference/" + method, grpc::StubOptions(), &request,
                    &response, [&](grpc::Status s) {
                      status = std::move(s);
                      done.Notify();
                    });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  return status;
}

TEST_F(ServerTest, UnparsableRequestsAreInvalidArgumentAndCounted) {
  const auto invalid_argument = [&] {
    absl::StatusOr<std::string> text = HttpGet(server_->metrics_port(), "/metrics");
    return text.ok() ? MetricValue(*text,
                                   "prefixd_requests_total{api=\"grpc\",code=\"INVALID_ARGUMENT\"}")
                     : -2;
  };
  const double before = std::max(0.0, invalid_argument());
  // TokenizeRequest{text = "\xC3\x28"}: field 1, length 2, an invalid UTF-8 sequence that
  // protobuf refuses to parse into a `string` field.
  grpc::Status status = RawUnaryCall(channel_, "Tokenize", std::string("\x0A\x02\xC3\x28", 4));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("the request is not a valid prefixd.v1.TokenizeRequest: it did not parse"));
  // Not protobuf at all (a field 1 of length 100 in 3 bytes).
  status = RawUnaryCall(channel_, "GetModelInfo", std::string("\x0A\x64xy", 4));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // GenerateRequest{request_id = "\xff"}, as a server-streaming call: refused the same way,
  // and counted with the Generate calls.
  grpc::GenericStub generic(channel_);
  const std::string raw("\x0A\x01\xFF", 3);
  grpc::Slice slice(raw.data(), raw.size());
  grpc::ByteBuffer request(&slice, 1);
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  auto call = generic.PrepareCall(&ctx, "/prefixd.v1.Inference/Generate", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Status gstatus;
  call->Finish(&gstatus, reinterpret_cast<void*>(4));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_EQ(gstatus.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(gstatus.error_message(), HasSubstr("prefixd.v1.GenerateRequest"));
  EXPECT_EQ(invalid_argument(), before + 1);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }

  grpc::ClientContext ctx2;
  v1::TokenizeRequest treq;
  treq.set_text("still serving");
  v1::TokenizeResponse tresp;
  EXPECT_TRUE(stub_->Tokenize(&ctx2, treq, &tresp).ok());
  EXPECT_GT(tresp.token_ids_size(), 0);
}

// gRPC's own answer for a method the service does not have stays UNIMPLEMENTED: only a
// method whose request failed to parse is rewritten, for this service or any other.
TEST_F(ServerTest, UnknownMethodsStayUnimplemented) {
  for (const std::string& method :
       {std::string("/prefixd.v1.Inference/NoSuchMethod"),
        std::string("/prefixd.v1.Other/Generate"), std::string("/prefixd.v1.Inference/")}) {
    grpc::GenericStub generic(channel_);
    grpc::Slice slice(std::string(""));
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::ClientContext ctx;
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << method;
    EXPECT_THAT(status.error_message(), Not(HasSubstr("did not parse"))) << method;
  }
  // A malformed request of a real method is still rewritten.
  EXPECT_EQ(RawUnaryCall(channel_, "Tokenize", std::string("\x0A\x02\xC3\x28", 4)).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ServerTest, TokenizeRefusesTextsLongerThanAnyPrompt) {
  grpc::ClientContext ctx;
  v1::TokenizeRequest req;
  req.set_text(std::string(256 * 128 + 1, 'a'));
  v1::TokenizeResponse resp;
  const grpc::Status s = stub_->Tokenize(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("text is 32769 bytes"));
  EXPECT_EQ(resp.token_ids_size(), 0);
}

TEST_F(ServerTest, ModelInfo) {
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.model_name(), "tiny-model");
  EXPECT_EQ(info.manifest_sha256().size(), 64u);
  EXPECT_EQ(info.n_layer(), 2u);
  EXPECT_EQ(info.n_head(), 2u);
  EXPECT_EQ(info.n_embd(), 64u);
  EXPECT_EQ(info.vocab_size(), 50257u);
  EXPECT_EQ(info.context_length(), 256u);
  EXPECT_EQ(info.dtype(), "f32");
  EXPECT_EQ(info.device(), "cpu");
  EXPECT_EQ(info.block_size(), 16u);
  EXPECT_EQ(info.kv_bytes_per_token(), 2u * 2 * 64 * 4);  // 2 x layers x embd x 4 bytes
  EXPECT_EQ(info.kv_pool_blocks(), 8388608u / (16 * info.kv_bytes_per_token()));
}

// GenerateRequest's prompt cache fields: "24h" retains the prompt, a later hit reports the
// retained tokens, and the key comes back in Usage.
TEST_F(ServerTest, PromptCacheRetentionAndKeyOverGrpc) {
  const std::vector<uint32_t> prompt = RandomIds(9, 48);
  v1::GenerateRequest retained = IdsRequest(prompt, 2);
  retained.set_prompt_cache_retention("24h");
  retained.set_prompt_cache_key("conv-9");
  GenerateResult first = Generate(*stub_, retained);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.usage.prompt_cache_key(), "conv-9");
  EXPECT_EQ(first.usage.cached_retained_tokens(), 0u);
  GenerateResult again = Generate(*stub_, IdsRequest(prompt, 2));
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.usage.cached_prompt_tokens(), 47u);
  EXPECT_EQ(again.usage.cached_retained_tokens(), 47u);
  EXPECT_EQ(again.usage.prompt_cache_key(), "");
}

TEST_F(ServerTest, CacheHitsAcrossRequestsButNotAcrossSalts) {
  const std::vector<uint32_t> prompt = RandomIds(3, 48);  // 3 full blocks
  GenerateResult cold = Generate(*stub_, IdsRequest(prompt, 4));
  ASSERT_TRUE(cold.status.ok());
  EXPECT_EQ(cold.usage.cached_prompt_tokens(), 0u);

  // The identical prompt: all but its last token (which must be computed for its logits).
  GenerateResult warm = Generate(*stub_, IdsRequest(prompt, 4));
  ASSERT_TRUE(warm.status.ok());
  EXPECT_EQ(warm.usage.cached_prompt_tokens(), 47u);
  EXPECT_EQ(warm.samples[0].token_ids, cold.samples[0].token_ids);
  EXPECT_EQ(warm.samples[0].logprobs, cold.samples[0].logprobs);

  std::vector<uint32_t> longer = prompt;
  for (uint32_t id : RandomIds(4, 5)) longer.push_back(id);
  GenerateResult extended = Generate(*stub_, IdsRequest(longer, 4));
  EXPECT_EQ(extended.usage.cached_prompt_tokens(), 48u);

  v1::GenerateRequest salted = IdsRequest(prompt, 4);
  salted.set_cache_salt("user-42");
  GenerateResult s1 = Generate(*stub_, salted);
  EXPECT_EQ(s1.usage.cached_prompt_tokens(), 0u) << "a salt narrows the namespace";
  GenerateResult s2 = Generate(*stub_, salted);
  EXPECT_EQ(s2.usage.cached_prompt_tokens(), 47u);
  EXPECT_EQ(s2.samples[0].token_ids, cold.samples[0].token_ids);

  // A prompt that leaves the cached one inside its third block: two blocks are shared, and
  // the third block's first 8 rows are copied into a block of its own (copy-on-write).
  const v1::CacheStats before = GetStats(*stub_);
  std::vector<uint32_t> diverged(prompt.begin(), prompt.begin() + 40);
  for (uint32_t id : RandomIds(5, 8)) diverged.push_back(id);
  GenerateResult partial = Generate(*stub_, IdsRequest(diverged, 4));
  ASSERT_TRUE(partial.status.ok());
  EXPECT_EQ(partial.usage.cached_prompt_tokens(), 40u);
  const v1::CacheStats after = GetStats(*stub_);
  EXPECT_EQ(after.cow_copies(), before.cow_copies() + 1);
  EXPECT_EQ(after.cow_rows(), before.cow_rows() + 8);
  // The metrics read the same numbers.
  absl::StatusOr<std::string> text = HttpGet(server_->metrics_port(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(MetricValue(*text, "prefixd_kv_cow_rows_total"), after.cow_rows());
  EXPECT_EQ(MetricValue(*text, "prefixd_kv_cow_copies_total"), after.cow_copies());

  const v1::CacheStats stats = GetStats(*stub_);
  EXPECT_GE(stats.hit_tokens(), 47u + 48u + 47u + 40u);
  EXPECT_EQ(stats.blocks_active(), 0u);
  EXPECT_EQ(stats.blocks_total(), stats.blocks_free() + stats.blocks_cached());
}

TEST_F(ServerTest, ReflectionCanBeTurnedOff) {
  ServerOptions o = TestServerOptions(model_dir_);
  o.reflection = false;
  absl::StatusOr<std::unique_ptr<Server>> off = Server::Start(std::move(o));
  ASSERT_TRUE(off.ok()) << off.status();
  auto channel = InsecureChannel((*off)->grpc_address());
  auto reflection = grpc::reflection::v1alpha::ServerReflection::NewStub(channel);
  grpc::ClientContext rctx;
  auto stream = reflection->ServerReflectionInfo(&rctx);
  grpc::reflection::v1alpha::ServerReflectionRequest rreq;
  rreq.set_list_services("");
  stream->Write(rreq);
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse rresp;
  EXPECT_FALSE(stream->Read(&rresp));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  // The API itself is served.
  auto stub = v1::Inference::NewStub(channel);
  EXPECT_TRUE(Generate(*stub, IdsRequest({1, 2, 3}, 2)).status.ok());
}

// Connections that send half a request (or nothing) hold no thread of the metrics listener:
// a scrape still answers at once.
TEST_F(ServerTest, MetricsAnswerDespiteHalfOpenConnections) {
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) {
    const int fd = ConnectLoopback(server_->metrics_port());
    ASSERT_GE(fd, 0);
    if (i % 2 == 0) {
      const std::string half = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
      ASSERT_EQ(write(fd, half.data(), half.size()), static_cast<ssize_t>(half.size()));
    }
    idle.push_back(fd);
  }
  for (int round = 0; round < 3; ++round) {
    absl::StatusOr<std::string> text =
        HttpGet(server_->metrics_port(), "/metrics", absl::Seconds(3));
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_THAT(*text, HasSubstr("prefixd_kv_pool_bytes"));
  }
  for (int fd : idle) close(fd);
}

TEST_F(ServerTest, HealthAndReflection) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext hctx;
  grpc::health::v1::HealthCheckRequest hreq;
  grpc::health::v1::HealthCheckResponse hresp;
  ASSERT_TRUE(health->Check(&hctx, hreq, &hresp).ok());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  auto reflection = grpc::reflection::v1alpha::ServerReflection::NewStub(channel_);
  grpc::ClientContext rctx;
  auto stream = reflection->ServerReflectionInfo(&rctx);
  grpc::reflection::v1alpha::ServerReflectionRequest rreq;
  rreq.set_list_services("");
  ASSERT_TRUE(stream->Write(rreq));
  grpc::reflection::v1alpha::ServerReflectionResponse rresp;
  ASSERT_TRUE(stream->Read(&rresp));
  std::vector<std::string> services;
  for (const auto& s : rresp.list_services_response().service()) services.push_back(s.name());
  EXPECT_THAT(services, ::testing::Contains("prefixd.v1.Inference"));
  EXPECT_THAT(services, ::testing::Contains("grpc.health.v1.Health"));
  // The descriptor of the API is served too.
  rreq.set_file_containing_symbol("prefixd.v1.GenerateRequest");
  ASSERT_TRUE(stream->Write(rreq));
  ASSERT_TRUE(stream->Read(&rresp));
  EXPECT_GT(rresp.file_descriptor_response().file_descriptor_proto_size(), 0);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ServerTest, MetricsEndpointReportsCacheHits) {
  const std::vector<uint32_t> prompt = RandomIds(6, 32);
  ASSERT_TRUE(Generate(*stub_, IdsRequest(prompt, 2)).status.ok());
  ASSERT_TRUE(Generate(*stub_, IdsRequest(prompt, 2)).status.ok());
  const v1::CacheStats stats = GetStats(*stub_);
  EXPECT_GE(stats.hit_tokens(), 31u);
  absl::StatusOr<std::string> text = HttpGet(server_->metrics_port(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(MetricValue(*text, "prefixd_prefix_cache_hit_tokens_total"), stats.hit_tokens());
  EXPECT_EQ(MetricValue(*text, "prefixd_prefix_cache_queried_tokens_total"),
            stats.queried_tokens());
  EXPECT_GE(MetricValue(*text, "prefixd_requests_total{api=\"grpc\",code=\"OK\"}"), 2);
  EXPECT_GE(MetricValue(*text, "prefixd_time_to_first_token_seconds_count"), 2);
  EXPECT_GE(MetricValue(*text, "prefixd_generated_tokens_total"), 4);
}

}  // namespace
}  // namespace prefixd::testing
