// One HTTP/1.1 connection's framing (server/http_session.cc), spoken over raw sockets to
// prefixd::Server in-process: pipelined requests behind a running completion, the header
// deadline and the connections kept past the limit on both listeners (HTTP and metrics),
// and framing a server must refuse. The engine runs the gated fake backend
// (tests/server/gated_backend_server.h), so a completion is held in flight as long as needed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "bench/http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/http_front_end.h"
#include "server/server.h"
#include "tests/server/gated_backend_server.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/in_process_server.h"
#include "tests/server/process.h"

namespace prefixd::testing {
namespace {

using bench::HttpFetch;
using bench::HttpResponse;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A blocking client socket connected to 127.0.0.1:port (with a receive buffer of
// `receive_buffer` bytes when it is positive).
class RawConnection {
 public:
  explicit RawConnection(int port, int receive_buffer = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (receive_buffer > 0) {
      setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() { close(fd_); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return connected_; }

  bool Send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  // Everything the server sends until it closes the connection; *reset is set when it ended
  // with a reset (or another error) instead of an orderly close, *gave_up (when given) when
  // the server neither closed nor sent anything for 30 s.
  std::string ReadToEnd(bool* reset, bool* gave_up = nullptr) {
    std::string out;
    char buf[16384];
    *reset = false;
    if (gave_up != nullptr) *gave_up = false;
    const timeval patience{.tv_sec = 30, .tv_usec = 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
    for (;;) {
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          if (gave_up != nullptr) *gave_up = true;
        } else {
          *reset = true;
        }
        break;
      }
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

  // The status line and header fields of one response (a kept-alive connection's answer to
  // a request without a body in its response, such as /health: read to the blank line, then
  // Content-Length bytes).
  std::string ReadResponseHead() {
    std::string out;
    char c;
    while (out.find("\r\n\r\n") == std::string::npos && recv(fd_, &c, 1, 0) == 1) out += c;
    const size_t at = out.find("Content-Length: ");
    size_t body = at == std::string::npos ? 0 : std::stoul(out.substr(at + 16));
    while (body > 0 && recv(fd_, &c, 1, 0) == 1) --body;
    return out;
  }

  // Bytes the server's end of this connection has received and its session not yet read;
  // nullopt once the server has closed its end. Found among this process's descriptors (the
  // server runs in-process): the socket whose peer is this one's local address.
  std::optional<int> ServerSideUnreadBytes() const {
    sockaddr_in mine{}, peer{};
    socklen_t len = sizeof(mine);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&mine), &len);
    len = sizeof(peer);
    getpeername(fd_, reinterpret_cast<sockaddr*>(&peer), &len);
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      const int fd = std::atoi(entry.path().filename().c_str());
      struct stat st {};
      if (fd == fd_ || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
      sockaddr_in local{}, remote{};
      socklen_t l1 = sizeof(local), l2 = sizeof(remote);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &l1) != 0 ||
          getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &l2) != 0 ||
          local.sin_family != AF_INET || remote.sin_port != mine.sin_port ||
          local.sin_port != peer.sin_port) {
        continue;
      }
      int unread = 0;
      if (ioctl(fd, FIONREAD, &unread) != 0) return std::nullopt;
      return unread;
    }
    return std::nullopt;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

class HttpSessionTest : public GatedBackendServerTest {
 protected:
  static std::string Completion(bool stream) {
    const std::string body = json{
        {"prompt", json::array({1, 2, 3, 4})},
        {"max_tokens", 4},
        {"ignore_eos", true},
        {"stream", stream}}.dump();
    return absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
                        "Content-Type: application/json\r\nContent-Length: ", body.size(),
                        "\r\n\r\n", body);
  }
};

// (streamed, sent in the same write as the completion)
class PipeliningTest : public HttpSessionTest,
                       public ::testing::WithParamInterface<std::tuple<bool, bool>> {};

// A request that follows a completion on the same connection (RFC 9112 9.3 pipelining) is
// answered after it, in order; it neither cancels the completion nor resets the connection.
// Sent in one write with the completion, the completion fits the session's first 512-byte
// read and the rest of the second request stays in the socket, as when it comes later.
TEST_P(PipeliningTest, ARequestBehindACompletionIsAnsweredAfterIt) {
  const auto [stream, one_write] = GetParam();
  StartServer();
  const std::string first = Completion(stream);
  const std::string second =
      absl::StrCat("GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ", std::string(600, 'p'),
                   "\r\nConnection: close\r\n\r\n");
  ASSERT_LT(first.size(), 512u);
  RawConnection c(server_->http_port());
  ASSERT_TRUE(c.connected());
  if (one_write) {
    ASSERT_TRUE(c.Send(first + second));
    ASSERT_TRUE(backend_->entered().WaitForNotificationWithTimeout(absl::Seconds(30)));
  } else {
    ASSERT_TRUE(c.Send(first));
    ASSERT_TRUE(backend_->entered().WaitForNotificationWithTimeout(absl::Seconds(30)));
    ASSERT_TRUE(c.Send(second));
  }
  // The engine is held in its first step. Once the session has taken in the second request
  // (or, unfixed, dropped the connection), let the completion run.
  ASSERT_TRUE(PollUntil(
      [&] {
        const std::optional<int> unread = c.ServerSideUnreadBytes();
        return !unread.has_value() || *unread == 0;
      },
      absl::Seconds(30)));
  gate_.Notify();

  bool reset = false;
  const std::string got = c.ReadToEnd(&reset);
  EXPECT_FALSE(reset) << "the connection was reset";
  EXPECT_THAT(got, StartsWith("HTTP/1.1 200 OK\r\n"));
  const size_t second_head = got.find("HTTP/1.1", 1);
  ASSERT_NE(second_head, std::string::npos) << "no answer to the pipelined request:\n" << got;
  const std::string answer1 = got.substr(0, second_head);
  const std::string answer2 = got.substr(second_head);
  if (stream) {
    EXPECT_THAT(answer1, HasSubstr("data: [DONE]"));
    EXPECT_THAT(answer1, HasSubstr("\r\n0\r\n\r\n")) << "the last chunk";
  } else {
    EXPECT_THAT(answer1, HasSubstr("\"finish_reason\":\"length\""));
  }
  EXPECT_THAT(answer2, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(answer2, HasSubstr("\"status\""));
  EXPECT_EQ(Metric("prefixd_requests_total{api=\"http\",code=\"CANCELLED\"}"), 0);
  EXPECT_EQ(Metric("prefixd_requests_total{api=\"http\",code=\"OK\"}"), 1);
}

// RFC 9112 6.1: a server must not send Transfer-Encoding in answer to an HTTP/1.0 request
// (nginx proxies with HTTP/1.0 unless told otherwise), whose client cannot read chunks. A
// streamed completion's events then go out as they are, and the close ends the response.
TEST_F(HttpSessionTest, AStreamToAnHttp10ClientIsNotChunkedAndTheCloseEndsIt) {
  StartServer();
  gate_.Notify();
  std::string request = Completion(/*stream=*/true);
  request.replace(request.find("HTTP/1.1"), 8, "HTTP/1.0");
  RawConnection c(server_->http_port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Send(request));
  bool reset = false;
  const std::string got = c.ReadToEnd(&reset);
  EXPECT_FALSE(reset) << "the connection was reset";
  EXPECT_THAT(got, StartsWith("HTTP/1.0 200 OK\r\n"));
  const size_t body = got.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos) << got;
  EXPECT_THAT(absl::AsciiStrToLower(got.substr(0, body)),
              ::testing::Not(HasSubstr("transfer-encoding")));
  EXPECT_THAT(got.substr(body + 4), StartsWith("data: {"));
  EXPECT_THAT(got, ::testing::EndsWith("data: [DONE]\n\n"));
  EXPECT_EQ(Metric("prefixd_requests_total{api=\"http\",code=\"OK\"}"), 1);
}

// A pipelined request larger than the session takes in while a completion runs (64 KiB)
// waits partly in the socket, and is answered whole after the completion.
TEST_F(HttpSessionTest, ALargePipelinedRequestWaitsAndIsAnsweredAfterTheCompletion) {
  StartServer();
  // JSON's whitespace makes it large; the text stays short for the tiny model.
  const std::string body = absl::StrCat("{\"prompt\": \"hello\"", std::string(200000, ' '), "}");
  const std::string second = absl::StrCat(
      "POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\n",
      "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
  RawConnection c(server_->http_port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Send(Completion(/*stream=*/false)));
  ASSERT_TRUE(backend_->entered().WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(c.Send(second));
  // The session has taken in what it buffers; the rest stays in the socket.
  ASSERT_TRUE(PollUntil(
      [&] {
        const std::optional<int> unread = c.ServerSideUnreadBytes();
        return !unread.has_value() || *unread <= static_cast<int>(second.size() - 65536);
      },
      absl::Seconds(30)));
  gate_.Notify();
  bool reset = false;
  const std::string got = c.ReadToEnd(&reset);
  EXPECT_FALSE(reset) << "the connection was reset";
  const size_t second_head = got.find("HTTP/1.1", 1);
  ASSERT_NE(second_head, std::string::npos) << "no answer to the pipelined request:\n" << got;
  EXPECT_THAT(got.substr(0, second_head), HasSubstr("\"finish_reason\":\"length\""));
  EXPECT_THAT(got.substr(second_head), StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(got.substr(second_head), HasSubstr("\"count\":"));
  EXPECT_EQ(Metric("prefixd_requests_total{api=\"http\",code=\"CANCELLED\"}"), 0);
}

INSTANTIATE_TEST_SUITE_P(StreamedAndWhole, PipeliningTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param) ? "Streamed" : "Whole",
                                               std::get<1>(info.param) ? "OneWrite" : "Later");
                         });

// ---- slowloris: the header deadline and the connections kept for /health ----

// Once a request's first byte is in, its header has --request-header-timeout on both
// listeners, however long the idle timeout: a client that trickles it gets 408 (then the
// connection closes) instead of holding a connection. One that sends nothing keeps the idle
// timeout.
TEST_F(HttpSessionTest, AHeaderNotCompleteInTimeGets408ButAnIdleConnectionStays) {
  StartServer([](ServerOptions& o) {
    o.connection_idle_timeout = absl::Minutes(10);
    o.request_header_timeout = absl::Milliseconds(300);
  });
  gate_.Notify();
  for (const auto& [port, path] : {std::pair<int, std::string>{server_->http_port(), "/health"},
                                   {server_->metrics_port(), "/metrics"}}) {
    SCOPED_TRACE(path);
    RawConnection idle(port);
    ASSERT_TRUE(idle.connected());
    RawConnection slow(port);
    ASSERT_TRUE(slow.connected());
    ASSERT_TRUE(slow.Send(absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\nX-Trickle: a")));
    bool reset = false, gave_up = false;
    const std::string got = slow.ReadToEnd(&reset, &gave_up);
    EXPECT_FALSE(gave_up) << "a connection trickling its header was left open";
    EXPECT_FALSE(reset) << "the connection was reset";
    EXPECT_THAT(got, StartsWith("HTTP/1.1 408 "));
    EXPECT_THAT(got, HasSubstr("Connection: close\r\n"));
    EXPECT_THAT(got, HasSubstr("--request-header-timeout"));
    // `idle` has been open longer than the header deadline without a byte: still served.
    ASSERT_TRUE(idle.Send(
        absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\n", "Connection: close\r\n\r\n")));
    EXPECT_THAT(idle.ReadToEnd(&reset, &gave_up), StartsWith("HTTP/1.1 200 OK\r\n"));
  }
}

// A client that sends a header and then stalls mid-body (on either listener) gets 408 once
// --request-body-timeout has passed since the header, then the connection closes.
TEST_F(HttpSessionTest, ABodyNotCompleteInTimeGets408) {
  StartServer([](ServerOptions& o) {
    o.connection_idle_timeout = absl::Minutes(10);
    o.request_body_timeout = absl::Milliseconds(300);
  });
  gate_.Notify();
  for (const auto& [port, path] :
       {std::pair<int, std::string>{server_->http_port(), "/v1/completions"},
        {server_->metrics_port(), "/metrics"}}) {
    SCOPED_TRACE(path);
    RawConnection slow(port);
    ASSERT_TRUE(slow.connected());
    ASSERT_TRUE(slow.Send(absl::StrCat("POST ", path,
                                       " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                       "Content-Length: 40\r\n\r\n{\"prompt\": ")));
    bool reset = false, gave_up = false;
    const std::string got = slow.ReadToEnd(&reset, &gave_up);
    EXPECT_FALSE(gave_up) << "a connection stalled mid-body was left open";
    EXPECT_FALSE(reset) << "the connection was reset";
    EXPECT_THAT(got, StartsWith("HTTP/1.1 408 "));
    EXPECT_THAT(got, HasSubstr("Connection: close\r\n"));
    EXPECT_THAT(got, HasSubstr("--request-body-timeout"));
  }
}

// A client that stops reading its answers holds its connection only until
// --response-write-timeout passes with none of a response's bytes taken: the response ends
// and the connection closes, so that such clients cannot keep the connection limit's slots.
// Here one client pipelines answers of several MB (far more than the sockets' buffers) and
// never reads; the one slot of --max-connections 1 is free again once the timeout has cut it
// off (before, only /health was served past the limit, for as long as the client lived).
TEST_F(HttpSessionTest, AClientThatStopsReadingIsCutOffAfterTheWriteTimeout) {
  StartServer([](ServerOptions& o) {
    o.max_connections = 1;
    o.response_write_timeout = absl::Milliseconds(300);
  });
  gate_.Notify();
  // Each answer streams 16 samples of 24 tokens, with 5 alternatives for each token.
  const std::string body = json{{"prompt", {1, 2, 3}}, {"max_tokens", 24}, {"n", 16},
                                {"logprobs", 5},       {"stream", true},   {"seed", 1}}
                               .dump();
  const std::string request = absl::StrCat(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: ",
      body.size(), "\r\n\r\n", body);
  RawConnection stuck(server_->http_port(), /*receive_buffer=*/4096);
  ASSERT_TRUE(stuck.connected());
  std::string pipelined;
  for (int i = 0; i < 48; ++i) pipelined += request;
  ASSERT_TRUE(stuck.Send(pipelined));
  bool served = false;
  for (int attempt = 0; attempt < 300 && !served; ++attempt) {
    absl::SleepFor(absl::Milliseconds(100));
    RawConnection probe(server_->http_port());
    ASSERT_TRUE(probe.connected());
    ASSERT_TRUE(probe.Send("GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    bool reset = false;
    served = absl::StartsWith(probe.ReadToEnd(&reset), "HTTP/1.1 200 ");
  }
  EXPECT_TRUE(served) << "the client that stopped reading still holds the only connection";
}

// Connections trickling their headers on the metrics port (here under a header deadline
// longer than the test) do not keep a scrape out: it is answered.
TEST_F(HttpSessionTest, FortyTricklingConnectionsDoNotKeepAScrapeOut) {
  StartServer([](ServerOptions& o) { o.request_header_timeout = absl::Minutes(10); });
  gate_.Notify();
  std::vector<std::unique_ptr<RawConnection>> tricklers;
  for (int i = 0; i < 40; ++i) {
    tricklers.push_back(std::make_unique<RawConnection>(server_->metrics_port()));
    ASSERT_TRUE(tricklers.back()->connected());
    ASSERT_TRUE(tricklers.back()->Send("GET /metrics HTTP/1.1\r\nHost: x\r\n"));
  }
  for (int round = 0; round < 3; ++round) {
    for (const std::unique_ptr<RawConnection>& c : tricklers) ASSERT_TRUE(c->Send("X"));
    absl::StatusOr<std::string> text =
        HttpGet(server_->metrics_port(), "/metrics", absl::Seconds(30));
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_THAT(*text, HasSubstr("prefixd_kv_pool_bytes"));
  }
}

// The metrics listener serves /metrics (GET and HEAD) in the text format Prometheus scrapes,
// and nothing else.
TEST_F(HttpSessionTest, TheMetricsListenerServesMetricsOnly) {
  StartServer();
  gate_.Notify();
  const int port = server_->metrics_port();
  absl::StatusOr<HttpResponse> r = HttpFetch(port, "GET", "/metrics");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->headers["content-type"], StartsWith("text/plain; version=0.0.4"));
  EXPECT_THAT(r->body, HasSubstr("# TYPE prefixd_kv_pool_bytes gauge"));
  r = HttpFetch(port, "GET", "/metrics?x=1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  for (const auto& [method, path, status] :
       {std::tuple<std::string, std::string, int>{"GET", "/health", 404},
        {"GET", "/", 404},
        {"POST", "/v1/completions", 404},
        {"POST", "/metrics", 405}}) {
    r = HttpFetch(port, method, path, method == "POST" ? "{}" : "");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, status) << method << " " << path << ": " << r->body;
    if (status == 405) {
      EXPECT_EQ(r->headers["allow"], "GET, HEAD");
    }
  }
  RawConnection head(port);
  ASSERT_TRUE(head.connected());
  ASSERT_TRUE(head.Send("HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  bool reset = false;
  const std::string got = head.ReadToEnd(&reset);
  EXPECT_THAT(got, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_TRUE(absl::EndsWith(got, "\r\n\r\n")) << "a HEAD response has no body";
}

// Past its connection limit (kMetricsMaxConnections) the metrics listener accepts a few more
// (ReservedConnections) that serve /metrics only and close after one answer: connections
// held open cannot keep a scrape out.
TEST_F(HttpSessionTest, PastItsLimitTheMetricsListenerKeepsConnectionsForScrapes) {
  StartServer();
  gate_.Notify();
  const int port = server_->metrics_port();
  const std::string scrape = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  std::vector<std::unique_ptr<RawConnection>> held;
  for (int i = 0; i < kMetricsMaxConnections; ++i) {
    held.push_back(std::make_unique<RawConnection>(port));
    ASSERT_TRUE(held.back()->connected());
    ASSERT_TRUE(held.back()->Send(scrape));
    ASSERT_THAT(held.back()->ReadResponseHead(), StartsWith("HTTP/1.1 200 OK\r\n")) << i;
  }
  bool reset = false, gave_up = false;
  std::string got;
  {
    RawConnection other(port);
    ASSERT_TRUE(other.connected());
    ASSERT_TRUE(other.Send("GET /other HTTP/1.1\r\nHost: x\r\n\r\n"));
    got = other.ReadToEnd(&reset, &gave_up);
  }
  EXPECT_FALSE(gave_up) << "a connection past the limit was not served";
  EXPECT_THAT(got, StartsWith("HTTP/1.1 503 "));
  EXPECT_THAT(got, HasSubstr("connection limit"));
  EXPECT_THAT(got, HasSubstr("serve only /metrics"));
  for (int i = 0; i < ReservedConnections(kMetricsMaxConnections) + 1; ++i) {
    RawConnection probe(port);
    ASSERT_TRUE(probe.connected());
    ASSERT_TRUE(probe.Send(scrape));
    got = probe.ReadToEnd(&reset, &gave_up);
    EXPECT_FALSE(gave_up) << "a scrape past the limit was not served";
    EXPECT_THAT(got, StartsWith("HTTP/1.1 200 OK\r\n"));
    EXPECT_THAT(got, HasSubstr("Connection: close\r\n"));
    EXPECT_THAT(got, HasSubstr("prefixd_kv_pool_bytes"));
  }
}

// Past --max-connections (2 here) one more connection (ReservedConnections) is accepted that
// serves /health only: connections held open cannot keep a load balancer's probe out.
TEST_F(HttpSessionTest, PastTheConnectionLimitAReserveServesHealthOnly) {
  StartServer([](ServerOptions& o) { o.max_connections = 2; });
  gate_.Notify();
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  // Two kept-alive connections, each accepted (it was answered) and still open.
  RawConnection held1(server_->http_port()), held2(server_->http_port());
  for (RawConnection* c : {&held1, &held2}) {
    ASSERT_TRUE(c->connected());
    ASSERT_TRUE(c->Send(health));
    ASSERT_THAT(c->ReadResponseHead(), StartsWith("HTTP/1.1 200 OK\r\n"));
  }
  // A completion on the reserve is refused, saying why; the connection closes.
  bool reset = false, gave_up = false;
  std::string got;
  {
    RawConnection third(server_->http_port());
    ASSERT_TRUE(third.connected());
    ASSERT_TRUE(third.Send(Completion(/*stream=*/false)));
    got = third.ReadToEnd(&reset, &gave_up);
  }
  EXPECT_FALSE(gave_up) << "a connection past the limit was not served";
  EXPECT_THAT(got, StartsWith("HTTP/1.1 503 "));
  EXPECT_THAT(got, HasSubstr("connection limit (--max-connections 2)"));
  EXPECT_THAT(got, HasSubstr("Connection: close\r\n"));
  // /health is answered there, then that connection closes too (the reserve is free again).
  for (int i = 0; i < 2; ++i) {
    RawConnection probe(server_->http_port());
    ASSERT_TRUE(probe.connected());
    ASSERT_TRUE(probe.Send(health));
    got = probe.ReadToEnd(&reset, &gave_up);
    EXPECT_FALSE(gave_up) << "/health past the limit was not served";
    EXPECT_THAT(got, StartsWith("HTTP/1.1 200 OK\r\n"));
    EXPECT_THAT(got, HasSubstr("Connection: close\r\n"));
  }
  EXPECT_EQ(ReservedConnections(2), 1);
}

// ---- framing a server must refuse: a 4xx that says what to fix, then the connection closes ----

struct BadFraming {
  std::string name;
  std::string request;
  int status;
  std::string message;  // part of the error's message
  friend void PrintTo(const BadFraming& b, std::ostream* os) { *os << b.name; }
};

class BadFramingTest : public HttpSessionTest, public ::testing::WithParamInterface<BadFraming> {};

TEST_P(BadFramingTest, IsAnsweredWithA4xxThenClosed) {
  const BadFraming& bad = GetParam();
  StartServer();
  gate_.Notify();
  RawConnection c(server_->http_port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Send(bad.request));
  bool reset = false;
  const std::string got = c.ReadToEnd(&reset);
  EXPECT_FALSE(reset) << "the connection was reset before the answer was read";
  EXPECT_THAT(got, StartsWith(absl::StrCat("HTTP/1.1 ", bad.status, " ")));
  EXPECT_THAT(got, HasSubstr("Connection: close\r\n"));
  EXPECT_THAT(got, HasSubstr(bad.message));
  // Nothing of it reached the engine.
  EXPECT_EQ(Metric("prefixd_requests_total{api=\"http\"}"), 0);
}

std::string PostWith(const std::string& headers, const std::string& body) {
  return absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n", headers, "\r\n", body);
}

const std::string kBody = R"({"prompt": [1, 2], "max_tokens": 1})";

INSTANTIATE_TEST_SUITE_P(
    Framing, BadFramingTest,
    ::testing::Values(
        // Request smuggling: which length a proxy in front used is unknown (RFC 9112 6.1).
        BadFraming{"ContentLengthThenTransferEncoding",
                   PostWith(absl::StrCat("Content-Length: ", kBody.size(),
                                         "\r\nTransfer-Encoding: chunked\r\n"),
                            kBody),
                   400, "both Content-Length and Transfer-Encoding"},
        BadFraming{"TransferEncodingThenContentLength",
                   PostWith(absl::StrCat("Transfer-Encoding: chunked\r\nContent-Length: ",
                                         kBody.size(), "\r\n"),
                            "0\r\n\r\n"),
                   400, "both Content-Length and Transfer-Encoding"},
        BadFraming{"TwoEqualContentLengths",
                   PostWith(absl::StrCat("Content-Length: ", kBody.size(),
                                         "\r\nContent-Length: ", kBody.size(), "\r\n"),
                            kBody),
                   400, "more than one Content-Length"},
        BadFraming{
            "TwoDifferentContentLengths",
            PostWith(absl::StrCat("Content-Length: ", kBody.size(), "\r\nContent-Length: 3\r\n"),
                     kBody),
            400, "Content-Length"},
        BadFraming{"HeaderOver64KiB",
                   PostWith(absl::StrCat("X-Big: ", std::string(70000, 'b'), "\r\n"), kBody), 431,
                   "header fields are larger than 65536 bytes"},
        BadFraming{"ManyHeadersOver64KiB",
                   PostWith(
                       [] {
                         std::string h;
                         for (int i = 0; i < 200; ++i) {
                           absl::StrAppend(&h, "X-F", i, ": ", std::string(400, 'f'), "\r\n");
                         }
                         return h;
                       }(),
                       kBody),
                   431, "header fields are larger than 65536 bytes"},
        BadFraming{
            "UrlOf100KB",
            absl::StrCat("GET /health?", std::string(100000, 'u'), " HTTP/1.1\r\nHost: x\r\n\r\n"),
            414, "request line is longer than"},
        BadFraming{"MalformedChunkedBody",
                   PostWith("Transfer-Encoding: chunked\r\n", "zz\r\nabc\r\n0\r\n\r\n"), 400,
                   "malformed HTTP request"},
        BadFraming{"MalformedHeaderLine", "GET /health HTTP/1.1\r\nHost x\r\n\r\n", 400,
                   "malformed HTTP request"}),
    [](const ::testing::TestParamInfo<BadFraming>& info) { return info.param.name; });

}  // namespace
}  // namespace prefixd::testing
