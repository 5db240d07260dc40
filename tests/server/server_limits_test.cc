// Limits a hostile or careless client can reach, against the real prefixd binary: the log
// a client can make the server write, and the descriptors its connections take.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
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

class LimitsTest : public TinyModelSuite {};

// A raw connection to a unix socket, or -1.
int ConnectUnix(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// One GetModelInfo on a fresh channel with a short deadline: does the port serve?
bool Serves(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = v1::Inference::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1000));
  v1::ModelInfo info;
  return stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok();
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// prefixd with a descriptor limit of 256 (soft and hard) takes 300 idle connections, more
// than the limit, on plaintext TCP, TLS and a unix socket; once they close it serves again
// within 5 s. (gRPC 1.51's own accept loop stopped for good at the first EMFILE.)
TEST_F(LimitsTest, ThePortRecoversAfterMoreConnectionsThanDescriptors) {
  TempDir dir;
  const std::string cert = dir.path() + "/cert.pem", key = dir.path() + "/key.pem";
  CommandResult gen = RunCommand({"/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                                  "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out",
                                  cert, "-days", "1", "-subj", "/CN=localhost", "-addext",
                                  "subjectAltName=DNS:localhost,IP:127.0.0.1"});
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  for (const std::string kind : {"tcp", "tls", "unix"}) {
    SCOPED_TRACE(kind);
    const std::string sock = dir.path() + "/prefixd.sock";
    std::vector<std::string> argv = {"/usr/bin/prlimit",
                                     "--nofile=256:256",
                                     BuiltBinary("server/prefixd"),
                                     "--model",
                                     model_,
                                     "--device",
                                     "cpu",
                                     "--threads",
                                     "1",
                                     "--metrics-listen",
                                     "off",
                                     "--http-listen",
                                     "off",
                                     "--listen",
                                     kind == "unix" ? "unix:" + sock : "127.0.0.1:0"};
    if (kind == "tls") argv.insert(argv.end(), {"--tls-cert", cert, "--tls-key", key});
    absl::StatusOr<std::unique_ptr<Process>> proc = Process::Start(argv);
    ASSERT_TRUE(proc.ok()) << proc.status();
    std::optional<std::string> line = (*proc)->WaitForLine("listening on ", absl::Seconds(30));
    ASSERT_TRUE(line.has_value()) << (*proc)->Output();
    // 256 descriptors, 128 set aside for the rest of the server.
    EXPECT_TRUE((*proc)->WaitForLine("at most 128 gRPC connections", absl::Seconds(30)));
    int port = 0;
    std::string target = "unix:" + sock;
    if (kind != "unix") {
      const size_t at = line->find("127.0.0.1:") + 10;
      port = std::stoi(line->substr(at));
      target = "127.0.0.1:" + std::to_string(port);
    }
    auto channel = [&] {
      if (kind != "tls") return InsecureChannel(target);
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = ReadAll(cert);
      return grpc::CreateChannel(target, grpc::SslCredentials(ssl));
    };
    ASSERT_TRUE(Serves(channel()));

    std::vector<int> idle;
    for (int i = 0; i < 300; ++i) {
      const int fd = kind == "unix" ? ConnectUnix(sock) : ConnectLoopback(port);
      if (fd >= 0) idle.push_back(fd);
    }
    EXPECT_EQ(idle.size(), 300u);
    EXPECT_TRUE((*proc)->WaitForLine("connection limit reached (128, --max-connections)",
                                     absl::Seconds(10)))
        << (*proc)->Output();
    for (int fd : idle) close(fd);
    const absl::Time closed = absl::Now();
    EXPECT_TRUE(PollUntil([&] { return Serves(channel()); }, absl::Seconds(30)))
        << (*proc)->Output();
    EXPECT_LT(absl::Now() - closed, absl::Seconds(5));
    EXPECT_EQ((*proc)->Wait(absl::ZeroDuration()), std::nullopt) << "still running";
  }
}

// A connection that never sends a byte is closed after --connection-idle-timeout (here
// shorter than gRPC's handshake timeout, which then follows it).
TEST_F(LimitsTest, IdleConnectionsAreClosed) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(model_, {"--connection-idle-timeout=1s"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = ConnectLoopback((*server)->port());
  ASSERT_GE(fd, 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const absl::Time start = absl::Now();
  char buf[256];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) {
  }
  EXPECT_EQ(n, 0) << "closed by the server, not timed out";
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  close(fd);

  // An HTTP/2 connection whose calls have ended gets a GOAWAY after the idle timeout: the
  // client's channel leaves READY (to IDLE) without the client doing anything.
  auto channel = InsecureChannel((*server)->address());
  auto stub = v1::Inference::NewStub(channel);
  ASSERT_TRUE(Generate(*stub, IdsRequest({1, 2, 3}, 2)).status.ok());
  EXPECT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  EXPECT_TRUE(channel->WaitForStateChange(
      GRPC_CHANNEL_READY, std::chrono::system_clock::now() + std::chrono::seconds(5)));
  EXPECT_NE(channel->GetState(false), GRPC_CHANNEL_READY);
}

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
  EXPECT_TRUE(proc.WaitForLine("similar lines suppressed)", absl::Seconds(30))) << proc.Output();
  const size_t added = proc.Output().size() - log_before;
  EXPECT_LT(added, 50u * 1024) << proc.Output().substr(log_before, 2000);
  RecordProperty("log_bytes_for_1001_requests", static_cast<int>(added));
}

}  // namespace
}  // namespace prefixd::testing
