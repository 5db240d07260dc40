// Fuzz target: raw bytes into one HTTP/1.1 connection of the real HTTP front end
// (server/http_front_end.h: request line, headers, chunked bodies, pipelining, the router
// and the completion pipeline), started once on 127.0.0.1:0 over a real RequestPath and
// Engine on the fake backend (tests/engine/fake_backend.h; ungated, so requests run).
//
// Each input is written on a fresh loopback connection. Once it is written and the server
// has been quiet for a moment with no completion running, the client half-closes and reads
// until the server closes. Whatever the bytes:
// - the server closes the half-closed connection (within a deadline far past any request
//   the model's 128 positions allow): no session is left hanging;
// - it sends only well-formed HTTP responses, one per request the client's own parser
//   (Beast's, with the server's limits) reads from the input, in order; none is 5xx (a 500
//   is what the front end's last-resort guard sends when a handler threw); a JSON body
//   parses; an event stream is `data:` events of JSON ending with [DONE]; a response to
//   HEAD carries no body;
// - afterwards no connection stays open and no KV block, running or waiting request is
//   left in the engine (a completion whose client went away is cancelled and released).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "engine/engine.h"
#include "fuzz/fuzz_target.h"
#include "fuzz/gpt2_tokenizer.h"
#include "nlohmann/json.hpp"
#include "server/auth.h"
#include "server/http_front_end.h"
#include "server/http_router.h"
#include "server/request_path.h"
#include "tests/engine/fake_backend.h"

namespace prefixd::fuzz {
namespace {

namespace http = boost::beast::http;
namespace net = boost::asio;
using nlohmann::json;

// The front end's limits, small enough for fuzz inputs to reach them.
constexpr size_t kMaxBodyBytes = 4096;
constexpr size_t kHeaderLimit = 64 * 1024;  // the front end's own (server/http_front_end.cc)
constexpr absl::Duration kIdleTimeout = absl::Milliseconds(5);
constexpr absl::Duration kQuiet = absl::Milliseconds(100);
constexpr absl::Duration kDeadline = absl::Seconds(30);

struct Harness {
  FakeBackend backend{/*num_blocks=*/64, /*block_size=*/16, /*vocab=*/50257};
  std::unique_ptr<Engine> engine;
  std::unique_ptr<RequestPath> path;
  std::unique_ptr<HttpFrontEnd> http;
};

ModelConfig FuzzModelConfig() {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.n_positions = 128;   // keeps every accepted completion short
  c.vocab_size = 50257;  // GPT-2's tokenizer
  return c;
}

Harness& TheHarness() {
  static Harness* const h = [] {
    auto* h = new Harness;
    EngineOptions e;
    e.backend = &h->backend;
    e.model_config = FuzzModelConfig();
    e.manifest_sha256 = std::string(64, '0');
    e.max_samples = 4;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(e);
    PREFIXD_CHECK_MSG(engine.ok(), engine.status().ToString().c_str());
    h->engine = *std::move(engine);
    RequestPathOptions p;
    p.engine = h->engine.get();
    p.tokenizer = &Gpt2Tokenizer();
    p.auth = std::make_shared<Authenticator>(Authenticator::AllowAll());
    p.model = ServedModel{.name = "gpt2",
                          .manifest_sha256 = e.manifest_sha256,
                          .config = e.model_config,
                          .dtype = "f32",
                          .device = "fake",
                          .kv_pool = h->backend.kv_pool()};
    h->path = std::make_unique<RequestPath>(std::move(p));
    HttpFrontEndOptions o;
    o.listen.host = "127.0.0.1";  // port 0: a free one
    o.handler = std::make_unique<HttpRouter>(h->path.get(), 0);
    o.threads = 2;
    o.max_body_bytes = kMaxBodyBytes;
    o.idle_timeout = kIdleTimeout;
    o.log = [](std::string_view) {};
    absl::StatusOr<std::unique_ptr<HttpFrontEnd>> front = HttpFrontEnd::Start(std::move(o));
    PREFIXD_CHECK_MSG(front.ok(), front.status().ToString().c_str());
    h->http = *std::move(front);
    return h;
  }();
  return *h;
}

// Polls `done` every 100 µs until it holds or `timeout` passes.
template <typename F>
bool PollUntil(F done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Microseconds(100));
  }
  return true;
}

// How the client ends its side of a connection.
enum class Ending {
  // Half-closes as soon as the input is written: the server sees the client leave while
  // it parses, answers or generates.
  kAtOnce,
  // Waits for the server to close: it does, kIdleTimeout after its last response, when it
  // waits for a request that does not come. A server that waits on something else (the
  // rest of a body), quiet for kQuiet with no completion running, gets a half-close.
  kWhenServerIsDone,
};

// Writes `input` on a fresh connection, ends it as `ending` says, and returns everything
// the server sent until it closed.
std::string Exchange(Harness& h, std::string_view input, Ending ending) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  PREFIXD_CHECK(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(h.http->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  PREFIXD_CHECK(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);

  std::string received;
  size_t written = 0;
  bool write_closed = false;
  const absl::Time deadline = absl::Now() + kDeadline;
  for (;;) {
    PREFIXD_CHECK_MSG(absl::Now() < deadline, "the server kept a half-closed connection open");
    const bool writing = !write_closed && written < input.size();
    if (!writing && !write_closed && ending == Ending::kAtOnce) {
      ::shutdown(fd, SHUT_WR);
      write_closed = true;
    }
    pollfd p{fd, static_cast<short>(POLLIN | (writing ? POLLOUT : 0)), 0};
    const int ready = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(kQuiet)));
    if (ready == 0) {
      // Quiet: half-close, unless a completion is still running (it would be cancelled).
      if (!writing && !write_closed && h.http->live_completions() == 0) {
        ::shutdown(fd, SHUT_WR);
        write_closed = true;
      }
      continue;
    }
    if (p.revents & POLLOUT) {
      const ssize_t n = ::send(fd, input.data() + written, input.size() - written, MSG_NOSIGNAL);
      if (n > 0) {
        written += static_cast<size_t>(n);
      } else if (errno != EAGAIN && errno != EINTR) {
        write_closed = true;  // the server closed early (a malformed request)
      }
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[65536];
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n > 0) {
        received.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        break;  // closed (FIN, or a reset)
      }
    }
  }
  // A reset instead of TIME_WAIT: thousands of connections a second would exhaust the ports.
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  ::close(fd);
  return received;
}

// The requests the input holds, as a client parser with the server's limits reads them:
// their methods, up to the first that does not parse. One too large to read, one that is
// malformed, and one whose framing could be read two ways (Content-Length with
// Transfer-Encoding, two Content-Lengths) count as `unknown`: the server answers it 400, 413,
// 414 or 431 and reads no further. An input that ends mid-request expects no answer to it.
std::vector<http::verb> RequestMethods(std::string_view input) {
  std::vector<http::verb> methods;
  size_t off = 0;
  while (off < input.size()) {
    const size_t start = off;
    http::request_parser<http::string_body> p;
    p.header_limit(kHeaderLimit);
    p.body_limit(kMaxBodyBytes);
    p.eager(true);
    boost::beast::error_code ec;
    while (!p.is_done() && off < input.size()) {
      const size_t n = p.put(net::buffer(input.data() + off, input.size() - off), ec);
      off += n;
      // need_more after consuming some (a request line, say) asks for the rest again: only
      // then does the header limit count the fields after it.
      if (ec == http::error::need_more && n > 0) {
        ec = {};
        continue;
      }
      if (ec || n == 0) break;
    }
    if (ec && ec != http::error::need_more) {
      // The server answers 4xx (with a body, whatever the method) and reads no further.
      methods.push_back(http::verb::unknown);
      break;
    }
    // Framing that could be read two ways is refused on the header alone, whether or not
    // the body follows.
    if (p.is_header_done()) {
      const auto& req = p.get();
      const size_t lengths = req.count(http::field::content_length);
      if (lengths > 1 || (lengths > 0 && req.count(http::field::transfer_encoding) > 0)) {
        methods.push_back(http::verb::unknown);  // 400, as above
        break;
      }
    }
    if (!p.is_done()) {
      // The input ends in a header that no end could keep within the limit (its "\r\n\r\n"
      // would pass it): the server may refuse it (414 or 431) before seeing more. Whether
      // Beast does at exactly the limit depends on how the bytes arrive (one buffer counts
      // the request line apart from the fields), so an answer is allowed, not required.
      if (!p.is_header_done() && input.size() - start + 3 >= kHeaderLimit) {
        methods.push_back(http::verb::unknown);
      }
      break;
    }
    methods.push_back(p.get().method());
  }
  return methods;
}

void CheckEventStream(const std::string& body) {
  size_t pos = 0;
  bool done = false;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    PREFIXD_CHECK_MSG(end != std::string::npos, "an event without its blank line");
    const std::string_view event(body.data() + pos, end - pos);
    PREFIXD_CHECK_MSG(event.substr(0, 6) == "data: ", "an event that is not `data: `");
    PREFIXD_CHECK_MSG(!done, "an event after [DONE]");
    const std::string_view data = event.substr(6);
    if (data == "[DONE]") {
      done = true;
    } else {
      const json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
      PREFIXD_CHECK_MSG(j.is_object(), "an event that is not a JSON object");
    }
    pos = end + 2;
  }
  PREFIXD_CHECK_MSG(done, "a finished event stream without [DONE]");
}

// Checks each complete response in `received`, the i-th answering methods[i]; a response
// cut short at the end (the client half-closed while it was being sent) is not checked.
void CheckResponses(const std::string& received, const std::vector<http::verb>& methods) {
  size_t off = 0;
  size_t answered = 0;
  while (off < received.size()) {
    http::response_parser<http::string_body> p;
    p.body_limit(boost::none);
    p.eager(true);
    const bool head = answered < methods.size() && methods[answered] == http::verb::head;
    if (head) p.skip(true);
    boost::beast::error_code ec;
    while (!p.is_done() && off < received.size()) {
      const size_t n = p.put(net::buffer(received.data() + off, received.size() - off), ec);
      off += n;
      if (ec == http::error::need_more && n > 0) {
        ec = {};
        continue;  // took the status line, say: the rest is offered again
      }
      if (ec == http::error::need_more) break;
      PREFIXD_CHECK_MSG(!ec, ("a malformed response: " + ec.message()).c_str());
      if (n == 0) break;
    }
    if (!p.is_done()) return;  // cut short
    const http::response<http::string_body>& res = p.get();
    const unsigned status = res.result_int();
    if (status == 100) continue;  // the answer to `Expect: 100-continue`; the response follows
    // 501 is a refusal, not a fault: the fake backend computes no all-position logits, so
    // prompt logprobs (echo with logprobs) are UNIMPLEMENTED on it. Any other 5xx is a fault.
    PREFIXD_CHECK_MSG(
        (status >= 200 && status < 500) ||
            (status == 501 && res.body().find("\"UNIMPLEMENTED\"") != std::string::npos),
        ("status " + std::to_string(status) + ": " + res.body()).c_str());
    PREFIXD_CHECK_MSG(answered < methods.size(), "more responses than requests");
    ++answered;
    if (head) continue;
    const std::string type(res[http::field::content_type]);
    if (type == "application/json") {
      const json j = json::parse(res.body(), nullptr, /*allow_exceptions=*/false);
      PREFIXD_CHECK_MSG(j.is_object(),
                        ("a JSON body that is not an object: " + res.body()).c_str());
      if (status >= 400) PREFIXD_CHECK(j.contains("error") && j["error"]["message"].is_string());
    } else if (type == "text/event-stream") {
      PREFIXD_CHECK(status == 200);
      CheckEventStream(res.body());
    } else {
      PREFIXD_CHECK_MSG(false, "a response of an unexpected content type");
    }
  }
}

// After a connection closed: no connection counted open, no KV block, running or waiting
// request left in the engine.
void CheckReleased(Harness& h) {
  PREFIXD_CHECK_MSG(PollUntil([&] { return h.http->open_connections() == 0; }, kDeadline),
                    "a closed connection is still counted open");
  PREFIXD_CHECK_MSG(PollUntil(
                        [&] {
                          const EngineStats s = h.engine->Stats();
                          return s.cache.blocks_active == 0 && s.scheduler.running_requests == 0 &&
                                 s.scheduler.waiting_requests == 0;
                        },
                        kDeadline),
                    "a finished connection left KV blocks or requests in the engine");
}

}  // namespace
}  // namespace prefixd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prefixd;
  fuzz::Harness& h = fuzz::TheHarness();
  const std::string_view input = fuzz::AsText(data, size);
  const std::vector<boost::beast::http::verb> methods = fuzz::RequestMethods(input);
  for (fuzz::Ending ending : {fuzz::Ending::kAtOnce, fuzz::Ending::kWhenServerIsDone}) {
    const std::string received = fuzz::Exchange(h, input, ending);
    // To see what the server answered to one input: HTTP_SESSION_FUZZ_PRINT=1.
    static const bool print = std::getenv("HTTP_SESSION_FUZZ_PRINT") != nullptr;
    if (print) std::fwrite(received.data(), 1, received.size(), stderr);
    fuzz::CheckResponses(received, methods);
    fuzz::CheckReleased(h);
  }
  return 0;
}
