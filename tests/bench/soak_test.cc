// The soak (bench/soak.cc) at 500 calls against the real prefixd with a small pool and three
// tenants: every check it makes must pass — each call ended once as its fate allows, no
// block left active and free + cached = the pool, prefixd_requests_total counted every call,
// RSS steady.
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/process.h"

namespace prefixd::testing {
namespace {

using ::testing::HasSubstr;

TEST(SoakTest, FiveHundredCallsOfEveryKindLeaveTheServerClean) {
  TempDir dir;
  const std::string model = dir.path() + "/model";
  ASSERT_TRUE(WriteTinyModel(model).ok());
  const std::string tokens = dir.path() + "/tokens";
  std::ofstream(tokens) << "soak-a alice\nsoak-b bob\nsoak-c carol\n";
  // 64 blocks of 16 tokens (1 KiB per token on the tiny model): 16 calls in flight, forks of
  // up to 8 samples and deadline calls of 150 new tokens overflow it, so cached blocks are
  // evicted and running sequences preempted.
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(model, {"--kv-cache-bytes=1048576", "--auth-tokens=" + tokens});
  ASSERT_TRUE(server.ok()) << server.status();
  const CommandResult r =
      RunCommand({BuiltBinary("bench/soak"), "--target=" + (*server)->address(),
                  "--metrics_port=" + std::to_string((*server)->metrics_port()),
                  "--server_pid=" + std::to_string((*server)->process().pid()), "--requests=500",
                  "--concurrency=16", "--auth_tokens=" + tokens, "--seed=7"},
                 absl::Seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("soak: all checks passed")) << r.output;
  // Every fate was exercised.
  for (const char* fate : {"complete", "cancel", "deadline", "invalid", "bad_token"}) {
    EXPECT_THAT(r.output, HasSubstr(std::string("  ") + fate)) << r.output;
  }
}

}  // namespace
}  // namespace prefixd::testing
