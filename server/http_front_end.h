// The HTTP front end: OpenAI's completions API (server/openai_api.h) and a few vLLM-style
// endpoints over HTTP/1.1, on Boost.Beast (asio). It translates and moves bytes; every
// request goes through the request path (server/request_path.h) like a gRPC call.
//
//   POST /v1/completions       streamed (Server-Sent Events) or not
//   GET  /v1/models            the served model
//   GET  /health               200 while serving, 503 while draining
//   POST /tokenize, /detokenize
//   POST /v1/chat/completions  400: GPT-2 is a base model without a chat template
//
// Concurrency: a few I/O threads serve every connection asynchronously (no thread per
// connection or stream). Each connection runs on its own strand. Engine events reach a
// connection through the request stream's notify, posted onto that strand.
// Backpressure: at most one write per connection is in flight; tokens that arrive meanwhile
// are coalesced (server/generate_output.h) into the next write.
// Disconnects: while a completion runs, the connection is watched for readability, so a
// client that goes away is noticed (and its requests cancelled, their blocks released) even
// while no token is being written to it.
#ifndef PREFIXD_SERVER_HTTP_FRONT_END_H_
#define PREFIXD_SERVER_HTTP_FRONT_END_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/request_path.h"

namespace prefixd {

struct HttpFrontEndOptions {
  std::string listen;  // "HOST:PORT"; port 0 picks a free one
  RequestPath* path = nullptr;  // not owned
  int threads = 2;
  // A request body past this is refused with 413 before it is read.
  size_t max_body_bytes = size_t{8} << 20;
  // A connection with no request in progress is closed after this.
  absl::Duration idle_timeout = absl::Seconds(300);
  // Open connections at once; more wait in the kernel's listen queue until one closes.
  // 0: no limit.
  int max_connections = 0;
  std::function<void(std::string_view)> log;
};

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
