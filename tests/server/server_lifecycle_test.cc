// prefixd's life: start-up refusals, a pool smaller than the context, a full queue, and the
// SIGTERM drain with a request in flight.
#include <signal.h>

#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/process.h"

namespace prefixd::testing {
namespace {

using ::testing::HasSubstr;

// 16 samples x 240 tokens: on a server started with --testing-step-delay=5ms, at least
// 1.2 s in flight, so a test can signal the server while it runs.
v1::GenerateRequest LongSampledRequest(uint32_t seed) {
  v1::GenerateRequest req = IdsRequest(RandomIds(seed, 16), 240);
  req.set_num_samples(16);
  req.set_temperature(1.0f);
  req.set_ignore_eos(true);
  return req;
}

class LifecycleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    model_ = dir_->path() + "/model";
    ASSERT_TRUE(WriteTinyModel(model_).ok());
  }
  static void TearDownTestSuite() { delete dir_; }

  static inline TempDir* dir_ = nullptr;
  static inline std::string model_;
};

TEST_F(LifecycleTest, BadStartupsExitNonZeroWithAMessage) {
  const std::string prefixd = BuiltBinary("server/prefixd");
  CommandResult r = RunCommand({prefixd});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--model DIR is required"));
  r = RunCommand({prefixd, "--model", dir_->path() + "/nope", "--device", "cpu"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("nope"));
  r = RunCommand({prefixd, "--model", model_, "--device", "tpu"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--device=tpu"));
  r = RunCommand({prefixd, "--model", model_, "--device", "cpu", "--dtype", "f64"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--dtype=f64 is not one of auto, f32, f16, bf16"));
  r = RunCommand({prefixd, "--model", model_, "--unknown-flag=1"});
  EXPECT_NE(r.exit_code, 0);
  // Numeric flags are checked up front, each error naming its flag and value.
  const std::vector<std::pair<std::string, std::string>> bad_flags = {
      {"--kv-cache-bytes=-1",
       "--kv-cache-bytes must be 0 (the default budget) or positive, got -1"},
      {"--block-size=3", "--block-size must be a power of two from 1 to 1024, got 3"},
      {"--block-size=0", "--block-size must be a power of two from 1 to 1024, got 0"},
      {"--max-batch-tokens=0", "--max-batch-tokens must be at least 1, got 0"},
      {"--max-queue=-5", "--max-queue must be at least 1, got -5"},
      {"--max-samples=0", "--max-samples must be at least 1, got 0"},
      {"--threads=-1", "--threads must be 0 (all cores) or positive, got -1"},
      {"--shutdown-grace=-1s", "--shutdown-grace must not be negative, got -1s"},
      {"--testing-step-delay=-1ms", "--testing-step-delay must be from 0 to 1s, got -1ms"},
      // More than any machine's memory: refused before the pool is allocated.
      {"--kv-cache-bytes=1000000000000000000", "is more than this machine's"},
  };
  for (const auto& [flag, message] : bad_flags) {
    r = RunCommand({prefixd, "--model", model_, "--device", "cpu", flag});
    EXPECT_EQ(r.exit_code, 1) << flag;
    EXPECT_THAT(r.output, HasSubstr(message)) << flag;
  }
}

TEST_F(LifecycleTest, ASecondServerOnTheSamePortExitsInsteadOfSharingIt) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> first = ServerProcess::Start(model_, {});
  ASSERT_TRUE(first.ok()) << first.status();
  // Its own metrics port, so that only the gRPC port is contested.
  const CommandResult second =
      RunCommand({BuiltBinary("server/prefixd"), "--model", model_, "--device", "cpu",
                  "--listen", (*first)->address(), "--metrics-listen", "127.0.0.1:0"},
                 absl::Seconds(30));
  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_THAT(second.output, HasSubstr("cannot listen on " + (*first)->address()));
  // The first one still serves.
  auto stub = v1::Inference::NewStub(InsecureChannel((*first)->address()));
  EXPECT_TRUE(Generate(*stub, IdsRequest({1, 2, 3}, 2)).status.ok());
}

TEST_F(LifecycleTest, ServesOnAUnixSocketAndLogsItsPath) {
  TempDir dir;
  const std::string address = "unix:" + dir.path() + "/prefixd.sock";
  absl::StatusOr<std::unique_ptr<Process>> server =
      Process::Start({BuiltBinary("server/prefixd"), "--model", model_, "--device", "cpu",
                      "--listen", address, "--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->WaitForLine("listening on " + address, absl::Seconds(30)))
      << (*server)->Output();
  auto stub = v1::Inference::NewStub(InsecureChannel(address));
  GenerateResult r = Generate(*stub, IdsRequest({1, 2, 3}, 2));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  (*server)->Signal(SIGTERM);
  EXPECT_EQ((*server)->Wait(absl::Seconds(30)), std::optional<int>(0)) << (*server)->Output();
}

TEST_F(LifecycleTest, SmallPoolRefusesWhatCouldNeverFitAndQueueOverflows) {
  // 128 KiB = 128 tokens = 8 blocks: smaller than the 256-token context.
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(model_, {"--kv-cache-bytes=131072", "--max-queue=1",
                                    "--testing-step-delay=5ms"});  // A runs >= 0.6 s
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Inference::NewStub(InsecureChannel((*server)->address()));

  GenerateResult big = Generate(*stub, IdsRequest(RandomIds(1, 100), 40));
  EXPECT_EQ(big.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(big.status.error_message(), HasSubstr("whole pool holds 8 blocks (128 tokens)"));

  // A holds blocks while it runs; B's 120-token prompt needs all 8 blocks, so B waits in
  // the queue (max 1) and C is refused.
  grpc::ClientContext actx;
  auto a = stub->Generate(&actx, IdsRequest(RandomIds(2, 8), 120));
  v1::GenerateResponse msg;
  ASSERT_TRUE(a->Read(&msg));
  grpc::ClientContext bctx;
  auto b = stub->Generate(&bctx, IdsRequest(RandomIds(3, 120), 8));
  // B's call and C's could reach the server in either order: send C only once the server
  // reports B waiting (polling its metrics; B is queued as soon as it arrives).
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  double waiting = -1;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> text = HttpGet((*server)->metrics_port(), "/metrics");
    ASSERT_TRUE(text.ok()) << text.status();
    waiting = MetricValue(*text, "prefixd_waiting_requests");
    if (waiting == 1) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(waiting, 1) << "B never showed as waiting behind A";
  GenerateResult c = Generate(*stub, IdsRequest(RandomIds(4, 120), 8));
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << c.status.error_message();
  while (a->Read(&msg)) {
  }
  EXPECT_TRUE(a->Finish().ok());
  while (b->Read(&msg)) {
  }
  EXPECT_TRUE(b->Finish().ok()) << "the queued request runs once A is done";
}

TEST_F(LifecycleTest, SigtermDrainsTheRequestInFlightAndExitsZero) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(model_, {"--kv-cache-bytes=4194304", "--shutdown-grace=60s",
                                    "--testing-step-delay=5ms"});  // >= 0.5 s in flight
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = InsecureChannel((*server)->address());
  auto stub = v1::Inference::NewStub(channel);
  auto health = grpc::health::v1::Health::NewStub(channel);

  v1::GenerateRequest req = IdsRequest(RandomIds(5, 16), 100);
  req.set_num_samples(2);
  req.set_temperature(1.0f);
  req.set_seed(3);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));  // it runs

  (*server)->process().Signal(SIGTERM);
  ASSERT_TRUE((*server)->process().WaitForLine("SIGTERM: draining", absl::Seconds(10)));

  grpc::ClientContext hctx;
  grpc::health::v1::HealthCheckResponse hresp;
  ASSERT_TRUE(health->Check(&hctx, grpc::health::v1::HealthCheckRequest(), &hresp).ok());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  GenerateResult refused = Generate(*stub, IdsRequest({1, 2}, 2));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);

  uint32_t tokens = msg.token_ids_size();
  v1::Usage usage;
  while (reader->Read(&msg)) {
    tokens += msg.token_ids_size();
    if (msg.has_usage()) usage = msg.usage();
  }
  EXPECT_TRUE(reader->Finish().ok()) << "the request in flight completes";
  EXPECT_EQ(tokens, 2u * 100u);
  EXPECT_EQ(usage.completion_tokens(), 2u * 100u);
  EXPECT_EQ((*server)->process().Wait(absl::Seconds(30)), std::optional<int>(0))
      << (*server)->process().Output();
}

TEST_F(LifecycleTest, ASecondSignalEndsALongGraceAtOnce) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(model_, {"--kv-cache-bytes=8388608", "--shutdown-grace=600s",
                                    "--testing-step-delay=5ms"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Inference::NewStub(InsecureChannel((*server)->address()));
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, LongSampledRequest(7));
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  (*server)->process().Signal(SIGTERM);
  ASSERT_TRUE((*server)->process().WaitForLine("SIGTERM: draining", absl::Seconds(10)));
  (*server)->process().Signal(SIGINT);
  ASSERT_TRUE((*server)->process().WaitForLine("SIGINT again: ending the grace period now",
                                               absl::Seconds(10)))
      << (*server)->process().Output();
  uint32_t tokens = msg.token_ids_size();
  while (reader->Read(&msg)) tokens += msg.token_ids_size();
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("shutting down"));
  EXPECT_LT(tokens, 16u * 240u) << "the request was cut short, not run to its end";
  EXPECT_EQ((*server)->process().Wait(absl::Seconds(30)), std::optional<int>(0))
      << (*server)->process().Output();
}

TEST_F(LifecycleTest, ShortGraceEndsTheRestWithUnavailable) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(model_, {"--kv-cache-bytes=8388608", "--shutdown-grace=0s",
                                    "--testing-step-delay=5ms"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Inference::NewStub(InsecureChannel((*server)->address()));
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, LongSampledRequest(6));
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  (*server)->process().Signal(SIGINT);
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ((*server)->process().Wait(absl::Seconds(30)), std::optional<int>(0))
      << (*server)->process().Output();
}

}  // namespace
}  // namespace prefixd::testing
