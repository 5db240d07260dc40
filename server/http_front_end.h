// An HTTP/1.1 server on Boost.Beast (asio), twice in prefixd: the API's front end
// (--http-listen: OpenAI's completions API and a few vLLM-style endpoints, its handler the
// router of server/http_router.h) and the metrics listener (--metrics-listen, its handler
// server/metrics_endpoint.h). This class listens and owns the I/O threads; a connection is
// a session (server/http_session.h), what a request gets is the handler's
// (server/http_handler.h), a running completion is server/http_completion.h.
//
// Concurrency: a few I/O threads serve every connection asynchronously (no thread per
// connection or stream). Each connection runs on its own strand; engine events reach it
// through the request stream's notify, posted onto that strand.
#ifndef PREFIXD_SERVER_HTTP_FRONT_END_H_
#define PREFIXD_SERVER_HTTP_FRONT_END_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/http_handler.h"
#include "server/listen_address.h"

namespace prefixd {

struct HttpFrontEndOptions {
  ListenAddress listen;  // TCP only; every address the host resolves to; port 0 picks one
  std::unique_ptr<HttpHandler> handler;  // required
  std::string name = "http";             // names the listener in its log lines and errors
  int threads = 2;
  // A request body past this is refused with 413 before it is read.
  size_t max_body_bytes = size_t{8} << 20;
  // A connection with no request in progress is closed after this.
  absl::Duration idle_timeout = absl::Seconds(300);
  // Once a request's first byte has arrived, its request line and header fields must be in
  // within this; a connection that trickles them (slowloris) gets 408 and is closed.
  absl::Duration header_timeout = absl::Seconds(5);
  // Once the header is in, the body must be in within this; a client that stalls mid-body
  // gets 408 and is closed.
  absl::Duration body_timeout = absl::Seconds(60);
  // A client that takes none of a response's bytes for this long is cut off (its completion
  // cancelled, the connection closed).
  absl::Duration write_timeout = absl::Seconds(60);
  // Open connections at once; more wait in the kernel's listen queue until one closes.
  // 0: no limit. Past it, ReservedConnections(max_connections) more are accepted that serve
  // only `reserved_path` (anything else is 503 naming `limit_name`) and close after one
  // answer, so that connections held open by clients that send nothing cannot keep a load
  // balancer's probe (or a scrape) out.
  int max_connections = 0;
  std::string reserved_path = "/health";
  std::string limit_name;  // empty: "--max-connections N"
  std::function<void(std::string_view)> log;
};

// The connections kept for the reserved path past `max_connections`: a tenth, at least 1, at
// most 64.
int ReservedConnections(int max_connections);

class HttpFrontEnd {
 public:
  // Listening when it returns; UNAVAILABLE naming the address if it cannot bind.
  static absl::StatusOr<std::unique_ptr<HttpFrontEnd>> Start(HttpFrontEndOptions options);
  ~HttpFrontEnd();  // Stop()

  int port() const;
  int64_t open_connections() const;
  // Completions whose response is not finished yet.
  int64_t live_completions() const;
  bool WaitForNoCompletions(absl::Duration timeout);
  // Closes the listener and every connection (requests still running are cancelled), and
  // joins the I/O threads. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit HttpFrontEnd(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_FRONT_END_H_
