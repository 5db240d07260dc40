// Limits a hostile or careless client can reach, against the real prefixd binary: the log
// a client can make the server write, and the descriptors its connections take.
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/process.h"

namespace prefixd::testing {
namespace {

using ::testing::HasSubstr;

class LimitsTest : public ::testing::Test {
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

// Every request with invalid UTF-8 in a string field makes libprotobuf log an ERROR line;
// they go through a rate limit of one line per second.
TEST_F(LimitsTest, InvalidUtf8RequestsCannotFloodTheLog) {
  TempDir dir;
  const std::string tokens = dir.path() + "/tokens";
  std::ofstream(tokens) << "tok-a alice\n";
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(model_, {"--auth-tokens", tokens});
  ASSERT_TRUE(server.ok()) << server.status();
  Process& proc = (*server)->process();
  const size_t log_before = proc.Output().size();

  grpc::GenericStub generic(InsecureChannel((*server)->address()));
  const std::string raw("\x0A\x02\xC3\x28", 4);  // TokenizeRequest{text = "\xC3\x28"}
  int invalid_argument = 0;
  for (int i = 0; i < 1000; ++i) {
    grpc::Slice slice(raw.data(), raw.size());
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::ClientContext ctx;
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(&ctx, "/prefixd.v1.Inference/Tokenize", grpc::StubOptions(), &request,
                      &response, [&](grpc::Status s) {
                        status = std::move(s);
                        done.Notify();
                      });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) ++invalid_argument;
  }
  EXPECT_EQ(invalid_argument, 1000);
  // One more after the interval carries the count of those left out.
  absl::SleepFor(absl::Milliseconds(1100));
  {
    grpc::Slice slice(raw.data(), raw.size());
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::ClientContext ctx;
    absl::Notification done;
    generic.UnaryCall(&ctx, "/prefixd.v1.Inference/Tokenize", grpc::StubOptions(), &request,
                      &response, [&](grpc::Status) { done.Notify(); });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  EXPECT_TRUE(proc.WaitForLine("similar lines suppressed)", absl::Seconds(5))) << proc.Output();
  const size_t added = proc.Output().size() - log_before;
  EXPECT_LT(added, 50u * 1024) << proc.Output().substr(log_before, 2000);
  RecordProperty("log_bytes_for_1001_requests", static_cast<int>(added));
}

}  // namespace
}  // namespace prefixd::testing
