// The prefixd binary end to end: start-up refusals and exit codes, the listening port, and
// signals. (Requests held in flight through a drain, cancels, deadlines and a full queue are
// tested in-process: server_flow_test.cc.)
#include <signal.h>

#include <fstream>
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

class LifecycleTest : public TinyModelSuite {};

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
  // Numeric flags are each checked once, by the layer that reads them (the backend and the
  // engine after the model loads), each error naming its flag and value.
  const std::vector<std::pair<std::string, std::string>> bad_flags = {
      {"--kv-cache-bytes=-1",
       "--kv-cache-bytes must be 0 (the default budget) or positive, got -1"},
      {"--block-size=3", "--block-size must be a power of two from 1 to 1024, got 3"},
      {"--block-size=0", "--block-size must be a power of two from 1 to 1024, got 0"},
      {"--max-batch-tokens=0", "--max-batch-tokens must be at least 1, got 0"},
      {"--max-queue=-5", "--max-queue must be at least 1, got -5"},
      {"--max-samples=0", "--max-samples must be at least 1, got 0"},
      {"--tenant-cache-share=0",
       "--tenant-cache-share must be a fraction of the pool in (0, 1], got 0"},
      {"--tenant-cache-share=1.5",
       "--tenant-cache-share must be a fraction of the pool in (0, 1], got 1.5"},
      {"--tenant-max-waiting=-1", "--tenant-max-waiting must be >= 0 (0: no cap), got -1"},
      {"--max-cache-retention=-1h", "--max-cache-retention must not be negative, got -1h"},
      {"--metrics-tenants=-2", "--metrics-tenants must be >= 0, got -2"},
      {"--threads=-1", "--threads must be 0 (all cores) or 1 to 1024, got -1"},
      {"--threads=1025", "--threads must be 0 (all cores) or 1 to 1024, got 1025"},
      {"--threads=100000", "--threads must be 0 (all cores) or 1 to 1024, got 100000"},
      {"--shutdown-grace=-1s", "--shutdown-grace must not be negative, got -1s"},
      {"--max-connections=-1",
       "--max-connections must be 0 (derived from the descriptor limit) or positive, got -1"},
      {"--max-connections=2147483647",
       "--max-connections 2147483647 is more than the descriptor limit (RLIMIT_NOFILE"},
      {"--connection-idle-timeout=0s", "--connection-idle-timeout must be positive, got 0"},
      {"--request-header-timeout=0s", "--request-header-timeout must be above 0 and at most 10m"},
      {"--request-body-timeout=11m", "--request-body-timeout must be above 0 and at most 10m"},
      {"--response-write-timeout=0s", "--response-write-timeout must be above 0 and at most 10m"},
      {"--reflection=maybe", "--reflection must be on or off, got maybe"},
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
                  "--listen", (*first)->address(), "--metrics-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"},
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
                      "--listen", address, "--metrics-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->WaitForLine("listening on " + address, absl::Seconds(30)))
      << (*server)->Output();
  auto stub = v1::Inference::NewStub(InsecureChannel(address));
  GenerateResult r = Generate(*stub, IdsRequest({1, 2, 3}, 2));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  (*server)->Signal(SIGTERM);
  EXPECT_EQ((*server)->Wait(absl::Seconds(30)), std::optional<int>(0)) << (*server)->Output();
}

// The signal watcher turns SIGTERM and SIGINT into a drain: the server finishes, says so,
// and exits 0; the request served before is unaffected.
TEST_F(LifecycleTest, SigtermAndSigintDrainAndExitZero) {
  for (int sig : {SIGTERM, SIGINT}) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start(model_, {"--shutdown-grace=60s"});
    ASSERT_TRUE(server.ok()) << server.status();
    auto stub = v1::Inference::NewStub(InsecureChannel((*server)->address()));
    EXPECT_TRUE(Generate(*stub, IdsRequest({1, 2, 3}, 4)).status.ok());
    (*server)->process().Signal(sig);
    EXPECT_EQ((*server)->process().Wait(absl::Seconds(30)), std::optional<int>(0))
        << (*server)->process().Output();
    const std::string name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    EXPECT_THAT((*server)->process().Output(),
                HasSubstr(name + ": draining for up to 1m (a second signal ends it now)"));
    EXPECT_THAT((*server)->process().Output(), HasSubstr("prefixd: stopped"));
  }
}

// A model directory that would serve wrong answers stops start-up (exit 1) with a message
// naming the file, or the tensor: merges.txt without merges, NaN weights.
TEST_F(LifecycleTest, ABadModelDirectoryExitsOneNamingTheFile) {
  const std::string prefixd = BuiltBinary("server/prefixd");
  for (const char* name : {"no_merges", "nan"}) {
    const std::string dir = dir_->path() + "/" + name;
    ASSERT_TRUE(WriteTinyModel(dir).ok());
  }
  std::ofstream(dir_->path() + "/no_merges/merges.txt", std::ios::trunc).flush();
  {
    // The weights file ends with the last tensor's last element (f32): make it NaN.
    std::fstream w(dir_->path() + "/nan/model.safetensors",
                   std::ios::binary | std::ios::in | std::ios::out);
    w.seekp(-4, std::ios::end);
    const unsigned char nan[4] = {0x00, 0x00, 0xc0, 0x7f};
    w.write(reinterpret_cast<const char*>(nan), 4);
  }
  CommandResult r =
      RunCommand({prefixd, "--model", dir_->path() + "/no_merges", "--device", "cpu"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("no_merges/merges.txt: holds no merges")) << r.output;
  r = RunCommand({prefixd, "--model", dir_->path() + "/nan", "--device", "cpu"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("nan/model.safetensors: tensor \"")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("holds NaN at element")) << r.output;
}

}  // namespace
}  // namespace prefixd::testing
