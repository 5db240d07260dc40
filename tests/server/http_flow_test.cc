// HTTP requests held in flight (tests/server/gated_backend_server.h: the engine waits in its
// first step until the test opens the gate): a client that disconnects while nothing is
// written, a full queue and a drain, bearer tokens, and connections past the limit.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "bench/http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/server.h"
#include "tests/server/gated_backend_server.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/process.h"
#include "tests/server/server_test_peer.h"

namespace prefixd::testing {
namespace {

using bench::HttpEventStream;
using bench::HttpFetch;
using bench::HttpResponse;
using nlohmann::json;
using ::testing::HasSubstr;

class HttpFlowTest : public GatedBackendServerTest {
 protected:
  static void SetUpTestSuite() {
    GatedBackendServerTest::SetUpTestSuite();
    std::ofstream(dir_->path() + "/tokens") << "secret-a alice\n";
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
};

TEST_F(HttpFlowTest, AClientThatDisconnectsIsNoticedWhileNoTokenIsWritten) {
  StartServer();
  for (bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "streamed" : "not streamed");
    // A non-streamed response has no head until it is complete: do not wait for it.
    absl::StatusOr<std::unique_ptr<HttpEventStream>> s =
        stream
            ? HttpEventStream::Open(server_->http_port(), "/v1/completions", LongBody(stream))
            : HttpEventStream::SendOnly(server_->http_port(), "/v1/completions", LongBody(stream));
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
  StartServer([](ServerOptions& o) { o.engine.max_queue = 1; });
  absl::StatusOr<std::unique_ptr<HttpEventStream>> a =
      HttpEventStream::Open(server_->http_port(), "/v1/completions", LongBody(true));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(backend_->entered().WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::StatusOr<std::unique_ptr<HttpEventStream>> b =
      HttpEventStream::Open(server_->http_port(), "/v1/completions", LongBody(true));
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(PollUntil([&] { return ServerTestPeer::accepted_generates(*server_) == 2; },
                        absl::Seconds(10)));
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
  StartServer([](ServerOptions& o) { o.auth_tokens_file = dir_->path() + "/tokens"; });
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

// Past --max-connections and the one connection kept for /health (ReservedConnections(2)), a
// connection waits in the listen queue, and is served once another closes.
TEST_F(HttpFlowTest, ConnectionsPastTheLimitAndTheReserveWaitForOneToClose) {
  StartServer([](ServerOptions& o) { o.max_connections = 2; });
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
  const int reserve = connect_to();
  const int third = connect_to();
  const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(send(third, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  pollfd p{.fd = third, .events = POLLIN, .revents = 0};
  EXPECT_EQ(poll(&p, 1, 500), 0) << "served although the limit and the reserve were taken";
  close(idle1);
  ASSERT_EQ(poll(&p, 1, 5000), 1) << "not served after a connection closed";
  char buf[64] = {};
  ASSERT_GT(recv(third, buf, sizeof(buf) - 1, 0), 0);
  EXPECT_THAT(std::string(buf), HasSubstr("HTTP/1.1 200"));
  close(idle2);
  close(reserve);
  close(third);
}

}  // namespace
}  // namespace prefixd::testing
