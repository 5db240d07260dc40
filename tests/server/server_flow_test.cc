// A request held in flight: prefixd::Server in-process on the gated fake backend
// (tests/engine/fake_backend.h), whose first engine step blocks until the test opens the gate.
// Cancels, deadlines, disconnects, a full queue and the drain then happen while the request
// is certainly running, however fast or slow the machine.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/engine/fake_backend.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/in_process_server.h"
#include "tests/server/process.h"
#include "tests/server/server_test_peer.h"

namespace prefixd::testing {
namespace {

using ::testing::HasSubstr;

struct FlowSetup {
  int64_t blocks = 64;  // of 16 tokens: 1024 tokens, more than the 256-token context
  bool gate_first_step = true;
  bool fail_first_step = false;  // with a fatal device error
  int32_t max_queue = 1024;
  absl::Duration write_timeout = absl::Seconds(60);  // --response-write-timeout
};

class ServerFlowTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    model_dir_ = dir_->path() + "/tiny-model";
    ASSERT_TRUE(WriteTinyModel(model_dir_).ok());
  }
  static void TearDownTestSuite() { delete dir_; }

  void StartServer(const FlowSetup& setup = {}) {
    ServerOptions o = TestServerOptions(model_dir_, log_.Writer());
    o.metrics_listen = "127.0.0.1:0";
    o.engine.max_queue = setup.max_queue;
    o.response_write_timeout = setup.write_timeout;
    o.backend_factory = [this, setup](const Model& m) -> absl::StatusOr<std::unique_ptr<Backend>> {
      auto b = std::make_unique<FakeBackend>(setup.blocks, 16, m.config().vocab_size);
      if (setup.gate_first_step) b->set_gate(&gate_, 0);
      if (setup.fail_first_step) {
        b->set_fail_at_call(0);
        b->set_fail_fatally(true);
      }
      backend_ = b.get();
      return std::unique_ptr<Backend>(std::move(b));
    };
    absl::StatusOr<std::unique_ptr<Server>> s = Server::Start(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    channel_ = InsecureChannel(server_->grpc_address());
    stub_ = v1::Inference::NewStub(channel_);
  }

  void TearDown() override {
    if (!gate_.HasBeenNotified()) gate_.Notify();  // the server cannot stop inside a step
    server_.reset();
  }

  // Blocks until the engine is inside its first step: the request is admitted, holds blocks,
  // and stays that way until OpenGate().
  void WaitUntilRunning() {
    ASSERT_TRUE(backend_->entered().WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  void OpenGate() { gate_.Notify(); }

  bool BlocksReleased() {
    const EngineStats s = server_->engine().Stats();
    return s.cache.blocks_active == 0 && s.scheduler.running_requests == 0;
  }

  double Metric(const std::string& series) {
    absl::StatusOr<std::string> text = HttpGet(server_->metrics_port(), "/metrics");
    return text.ok() ? MetricValue(*text, series) : -1;
  }

  static v1::GenerateRequest Long(uint32_t seed, uint32_t samples = 1) {
    v1::GenerateRequest req = IdsRequest(RandomIds(seed, 20), 200);
    req.set_num_samples(samples);
    req.set_temperature(1.0f);
    req.set_seed(seed);
    req.set_ignore_eos(true);
    return req;
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string model_dir_;
  LogSink log_;
  absl::Notification gate_;
  FakeBackend* backend_ = nullptr;  // owned by server_
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(ServerFlowTest, CancelReleasesTheBlocksAndIsCounted) {
  StartServer();
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Long(1));
  WaitUntilRunning();
  ctx.TryCancel();
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  OpenGate();
  EXPECT_TRUE(PollUntil([&] { return BlocksReleased(); }, absl::Seconds(10)));
  EXPECT_TRUE(PollUntil(
      [&] { return Metric("prefixd_requests_total{api=\"grpc\",code=\"CANCELLED\"}") == 1; },
      absl::Seconds(10)));
  // The server goes on serving.
  EXPECT_TRUE(Generate(*stub_, IdsRequest({1, 2, 3}, 2)).status.ok());
}

TEST_F(ServerFlowTest, ADeadlineThatPassesMidRequestIsDeadlineExceeded) {
  StartServer();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  auto reader = stub_->Generate(&ctx, Long(2));
  WaitUntilRunning();
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  OpenGate();
  EXPECT_TRUE(PollUntil([&] { return BlocksReleased(); }, absl::Seconds(10)));
  // Counted as a passed deadline, not as a cancellation.
  EXPECT_TRUE(PollUntil(
      [&] {
        return Metric("prefixd_requests_total{api=\"grpc\",code=\"DEADLINE_EXCEEDED\"}") == 1;
      },
      absl::Seconds(10)));
  EXPECT_EQ(Metric("prefixd_requests_total{api=\"grpc\",code=\"CANCELLED\"}"), -1);
}

TEST_F(ServerFlowTest, AClientThatDisconnectsIsCancelled) {
  StartServer();
  // A real client process, killed mid-stream: its connection closes without a cancel.
  absl::StatusOr<std::unique_ptr<Process>> client =
      Process::Start({BuiltBinary("client/prefixctl"), "--server", server_->grpc_address(),
                      "generate", "--ids", "1,2,3,4,5,6,7,8", "--max-tokens", "200"});
  ASSERT_TRUE(client.ok()) << client.status();
  WaitUntilRunning();
  (*client)->Signal(SIGKILL);
  (*client)->Wait(absl::Seconds(10));
  EXPECT_TRUE(PollUntil([&] { return ServerTestPeer::live_generate_calls(*server_) == 0; },
                        absl::Seconds(10)));
  OpenGate();
  EXPECT_TRUE(PollUntil([&] { return BlocksReleased(); }, absl::Seconds(10)));
  EXPECT_TRUE(PollUntil(
      [&] { return Metric("prefixd_requests_total{api=\"grpc\",code=\"CANCELLED\"}") == 1; },
      absl::Seconds(10)));
}

TEST_F(ServerFlowTest, AFullQueueRefusesWithResourceExhausted) {
  StartServer({.max_queue = 1});
  grpc::ClientContext actx;
  auto a = stub_->Generate(&actx, IdsRequest(RandomIds(3, 8), 20));
  WaitUntilRunning();  // A runs
  grpc::ClientContext bctx;
  auto b = stub_->Generate(&bctx, IdsRequest(RandomIds(4, 8), 20));
  // B waits behind A (the one queue slot) once the server has accepted it.
  ASSERT_TRUE(PollUntil([&] { return ServerTestPeer::accepted_generates(*server_) == 2; },
                        absl::Seconds(10)));
  GenerateResult c = Generate(*stub_, IdsRequest(RandomIds(5, 8), 20));
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(c.status.error_message(), HasSubstr("request queue is full (1 requests waiting)"));
  OpenGate();
  v1::GenerateResponse msg;
  while (a->Read(&msg)) {
  }
  EXPECT_TRUE(a->Finish().ok());
  while (b->Read(&msg)) {
  }
  EXPECT_TRUE(b->Finish().ok()) << "the queued request runs once A is done";
  EXPECT_EQ(Metric("prefixd_requests_total{api=\"grpc\",code=\"RESOURCE_EXHAUSTED\"}"), 1);
}

TEST_F(ServerFlowTest, ARequestLargerThanThePoolIsRefusedAtOnce) {
  StartServer({.blocks = 8, .gate_first_step = false});  // 128 tokens < the 256 context
  GenerateResult big = Generate(*stub_, IdsRequest(RandomIds(1, 100), 40));
  EXPECT_EQ(big.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(big.status.error_message(), HasSubstr("whole pool holds 8 blocks (128 tokens)"));
  EXPECT_TRUE(Generate(*stub_, IdsRequest(RandomIds(1, 100), 20)).status.ok());
}

TEST_F(ServerFlowTest, DrainLetsTheRequestInFlightFinish) {
  StartServer();
  v1::GenerateRequest req = Long(5, 2);
  req.set_max_new_tokens(50);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  WaitUntilRunning();

  server_->BeginDrain(absl::Seconds(60));
  EXPECT_TRUE(server_->draining());
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext hctx;
  grpc::health::v1::HealthCheckResponse hresp;
  ASSERT_TRUE(health->Check(&hctx, grpc::health::v1::HealthCheckRequest(), &hresp).ok());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  GenerateResult refused = Generate(*stub_, IdsRequest({1, 2}, 2));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("shutting down"));

  OpenGate();
  uint32_t tokens = 0;
  v1::Usage usage;
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    tokens += msg.token_ids_size();
    if (msg.has_usage()) usage = msg.usage();
  }
  EXPECT_TRUE(reader->Finish().ok()) << "the request in flight completes";
  EXPECT_EQ(tokens, 2u * 50u);
  EXPECT_EQ(usage.completion_tokens(), 2u * 50u);
  EXPECT_TRUE(server_->Wait().ok());
  EXPECT_THAT(log_.Text(), HasSubstr("engine stopped"));
}

TEST_F(ServerFlowTest, ASecondDrainEndsALongGraceAtOnce) {
  StartServer();
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Long(6, 16));
  WaitUntilRunning();
  server_->BeginDrain(absl::Seconds(600));
  server_->BeginDrain(absl::ZeroDuration());
  OpenGate();
  uint32_t tokens = 0;
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) tokens += msg.token_ids_size();
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("shutting down"));
  EXPECT_LT(tokens, 16u * 200u) << "the request was cut short, not run to its end";
  EXPECT_TRUE(server_->Wait().ok());
}

TEST_F(ServerFlowTest, AFatalBackendErrorDrainsTheServerAndWaitReportsIt) {
  StartServer({.gate_first_step = false, .fail_first_step = true});
  GenerateResult r = Generate(*stub_, IdsRequest({1, 2, 3}, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INTERNAL);
  const absl::Status ended = server_->Wait();
  EXPECT_FALSE(ended.ok());
  EXPECT_THAT(std::string(ended.message()), HasSubstr("injected failure"));
  EXPECT_TRUE(server_->draining());
  EXPECT_THAT(log_.Text(), HasSubstr("fatal backend error, shutting down"));
}

// The engine thread only schedules a Generate call's pump (server/generate_reactor.h): with
// every pump thread stuck, the engine still runs every decode step of a call that cannot
// deliver and of a request beside it, and the call's tokens all arrive once its pump runs.
TEST_F(ServerFlowTest, AStuckGrpcPumpDoesNotStallTheEngine) {
  StartServer();
  constexpr uint32_t kTokens = 8;
  v1::GenerateRequest a_req = IdsRequest(RandomIds(11, 8), kTokens);
  a_req.set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, a_req);
  WaitUntilRunning();  // A is admitted; the engine is inside its first step
  ServerTestPeer::PumpBlocker blocker(*server_);
  std::atomic<int> a_messages{0};
  uint32_t a_tokens = 0;
  std::thread a_client([&] {
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      a_messages.fetch_add(1);
      a_tokens += static_cast<uint32_t>(msg.token_ids_size());
    }
  });

  EngineRequest b;
  b.request_id = "beside";
  b.prompt = RandomIds(12, 8);
  b.max_new_tokens = kTokens;
  b.ignore_eos = true;
  absl::StatusOr<std::shared_ptr<RequestStream>> b_stream = server_->engine().Submit(b);
  ASSERT_TRUE(b_stream.ok()) << b_stream.status();
  OpenGate();
  uint32_t b_tokens = 0;
  RequestEvent e;
  do {
    ASSERT_TRUE((*b_stream)->Wait(&e, absl::Now() + absl::Seconds(60)));
    if (e.kind == RequestEvent::Kind::kToken) ++b_tokens;
  } while (e.kind != RequestEvent::Kind::kDone);
  EXPECT_TRUE(e.status.ok()) << e.status;
  EXPECT_EQ(b_tokens, kTokens);
  // A ran to its end in the engine too: every token of both was generated.
  ASSERT_TRUE(PollUntil(
      [&] {
        const EngineStats s = server_->engine().Stats();
        return s.scheduler.running_requests == 0 && s.scheduler.waiting_requests == 0;
      },
      absl::Seconds(60)));
  EXPECT_EQ(server_->engine().Stats().scheduler.generated_tokens, 2 * kTokens);
  // ... while A's pump could not run: nothing of it reached its client.
  EXPECT_EQ(a_messages.load(), 0);

  blocker.Release();
  a_client.join();
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(a_tokens, kTokens);
}

// A client that stops reading holds one write in flight (HTTP/2 flow control). The call's
// stop strings must still be applied to the tokens that arrive meanwhile, so that the engine
// stops the samples there instead of computing (and holding blocks for) them to max_new_tokens.
TEST_F(ServerFlowTest, AStopStringEndsTheSamplesOfAClientThatStoppedReading) {
  StartServer({.gate_first_step = false});
  constexpr uint32_t kTokens = 200;
  constexpr uint32_t kSamples = 4;
  v1::GenerateRequest req = IdsRequest(RandomIds(21, 8), kTokens);
  req.set_num_samples(kSamples);  // greedy: every sample the same text
  req.set_top_logprobs(20);       // large messages: the client's window fills early
  const GenerateResult reference = Generate(*stub_, req);
  ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();
  // The stop string: the text of one of sample 0's messages past its 40th token, printable
  // ASCII and found there first; `stop_tokens` of the sample's tokens carry it.
  const std::string& text = reference.samples.at(0).text;
  std::string stop;
  uint32_t stop_tokens = 0;
  size_t at = 0;
  for (const v1::GenerateResponse& m : reference.messages) {
    if (m.sample_index() != 0 || m.token_ids_size() == 0) continue;
    stop_tokens += static_cast<uint32_t>(m.token_ids_size());
    const std::string& t = m.text();
    if (stop_tokens > 40 && t.size() >= 3 && t.size() <= 64 && text.find(t) == at &&
        std::all_of(t.begin(), t.end(), [](char c) { return c >= 0x20 && c < 0x7f; })) {
      stop = t;
      break;
    }
    at += t.size();
  }
  ASSERT_FALSE(stop.empty()) << text;
  ASSERT_LT(stop_tokens, kTokens / 2);
  // Forward calls: the prefill emits every sample's first token, each later call one more.
  // The call after the one that emits the stop string's last token waits for the test.
  const int64_t gate_call = backend_->forward_calls() + stop_tokens;
  backend_->set_gate(&gate_, gate_call);
  const uint64_t before = server_->engine().Stats().scheduler.generated_tokens;

  // A client with a small flow-control window that never reads.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 4096);
  auto stub = v1::Inference::NewStub(
      grpc::CreateCustomChannel(server_->grpc_address(), grpc::InsecureChannelCredentials(), args));
  req.add_stop(stop);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  auto ended = [&] {
    const EngineStats s = server_->engine().Stats();
    return s.scheduler.generated_tokens > before && s.scheduler.running_requests == 0 &&
           s.scheduler.waiting_requests == 0;
  };
  // The samples end before the gated call when the call's pump was quick to see the stop.
  ASSERT_TRUE(PollUntil([&] { return backend_->entered().HasBeenNotified() || ended(); },
                        absl::Seconds(60)));
  // Every pump posted before now has run: the call has seen the stop string.
  { ServerTestPeer::PumpBlocker every_pump_ran(*server_); }
  OpenGate();
  ASSERT_TRUE(PollUntil(ended, absl::Seconds(60)));
  // The gated call was the samples' last.
  EXPECT_LE(server_->engine().Stats().scheduler.generated_tokens - before,
            kSamples * (stop_tokens + 1))
      << "the samples ran on past their stop string";
  ctx.TryCancel();
}

// A client that stops reading (its window full, a write in flight) is cancelled once it has
// taken none of a message for --response-write-timeout: its request ends as CANCELLED and
// gives back its blocks, instead of holding its call and output for as long as it lives.
TEST_F(ServerFlowTest, AClientThatStopsReadingIsCancelledAfterTheWriteTimeout) {
  StartServer({.gate_first_step = false, .write_timeout = absl::Milliseconds(300)});
  v1::GenerateRequest req = Long(7, /*samples=*/4);
  req.set_top_logprobs(20);  // large messages: the client's window fills early
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 4096);
  auto stub = v1::Inference::NewStub(
      grpc::CreateCustomChannel(server_->grpc_address(), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  EXPECT_TRUE(PollUntil(
      [&] { return Metric("prefixd_requests_total{api=\"grpc\",code=\"CANCELLED\"}") == 1; },
      absl::Seconds(30)))
      << "the call of a client that stopped reading was not ended";
  EXPECT_TRUE(PollUntil([&] { return BlocksReleased(); }, absl::Seconds(10)));
  ctx.TryCancel();
}

}  // namespace
}  // namespace prefixd::testing
