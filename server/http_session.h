// One HTTP/1.1 connection on Boost.Beast: reads requests one after another (keep-alive,
// pipelined requests wait in the buffer), hands each to the front end's handler
// (server/http_handler.h) and writes what it returns; a completion is pumped on the connection's
// strand, engine events posted onto it.
//
// Backpressure: at most one write is in flight; tokens that arrive meanwhile are coalesced
// (server/generate_output.h) into the next write.
// Disconnects: while a completion runs, the connection is watched for readability, so a
// client that goes away is noticed (and its requests cancelled, their blocks released) even
// while no token is being written to it. Bytes that arrive meanwhile are a pipelined request:
// they are buffered (64 KiB at most) and answered after the completion, in order.
// Deadlines: the idle timeout until a request's first byte, then the header timeout until its
// header is in (a client trickling it gets 408, then the connection closes), then 60 s for
// the body; a refusal's write gets 2 s.
// Streams: chunked, except to an HTTP/1.0 request (RFC 9112 6.1), whose stream the close ends.
// Framing: a request whose framing can be read more than one way (Content-Length with
// Transfer-Encoding, two Content-Lengths) or that is malformed is answered 400, one over the
// header limit 414 (a long request line) or 431, a body over the limit 413; each then closes.
// Faults: a handler that throws answers 500, logs a line and closes the connection; nothing
// a client sends raises through an I/O thread.
#ifndef PREFIXD_SERVER_HTTP_SESSION_H_
#define PREFIXD_SERVER_HTTP_SESSION_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "boost/asio/ip/tcp.hpp"
#include "server/executor.h"
#include "server/http_handler.h"

namespace prefixd {

// What a front end's connections are doing, for its accept loop and its shutdown.
class HttpLiveCounts {
 public:
  void ConnectionOpened() { Add(&open_connections_, 1); }
  void ConnectionClosed() { Add(&open_connections_, -1); }
  void CompletionStarted() { Add(&live_completions_, 1); }
  void CompletionEnded() { Add(&live_completions_, -1); }
  int64_t open_connections() const;
  int64_t live_completions() const;
  bool WaitForNoCompletions(absl::Duration timeout) const;

 private:
  void Add(int64_t* counter, int64_t delta);
  mutable absl::Mutex mu_;
  int64_t open_connections_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t live_completions_ ABSL_GUARDED_BY(mu_) = 0;
};

// Shared by every session of a front end, and outlives them.
struct HttpSessionContext {
  HttpHandler* handler = nullptr;
  HttpLiveCounts* counts = nullptr;
  size_t max_body_bytes = 0;      // a larger body is refused with 413 before it is read
  absl::Duration idle_timeout;    // between requests, until a request's first byte
  absl::Duration header_timeout;  // from a request's first byte to the end of its header
  absl::Duration body_timeout;    // from the end of a request's header to the end of its body
  absl::Duration write_timeout;   // a response write that makes no progress this long fails
  // What a session past the front end's connection limit serves ("/health", "/metrics"), and
  // the limit as its 503 names it ("--max-connections 20").
  std::string reserved_path;
  std::string limit_name;
  Executor* background = nullptr;  // runs deferred replies (HttpDeferred)
  std::function<void(std::string_view)> log;
};

// A session accepted past the front end's connection limit serves the context's
// reserved_path only (anything else is 503) and closes after its one answer.
enum class HttpSessionKind { kAll, kReserved };

// Serves `socket` until the client closes it, an error, or the io_context stops.
void StartHttpSession(boost::asio::ip::tcp::socket socket, const HttpSessionContext* context,
                      HttpSessionKind kind = HttpSessionKind::kAll);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_SESSION_H_
