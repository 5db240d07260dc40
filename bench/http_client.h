// A small blocking HTTP/1.1 client for the benchmarks: one keep-alive TCP connection, a POST
// with a JSON body, and a response read with Content-Length or chunked transfer coding.
// Server-Sent Events (`data: ...` blocks) are handed to a callback as they arrive, so a
// benchmark sees a streamed completion token batch by token batch, as an SDK would.
// Not a general client: no redirects, no TLS, no proxies.
#ifndef PREFIXD_BENCH_HTTP_CLIENT_H_
#define PREFIXD_BENCH_HTTP_CLIENT_H_

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace prefixd::bench {

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;  // empty when the events went to the callback
};

class HttpConnection {
 public:
  // "HOST:PORT". The connection is opened on the first request (and again after the server
  // closed it).
  explicit HttpConnection(std::string address);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // POSTs `body` (application/json) to `path`. When the response is text/event-stream and
  // `on_event` is set, each event's data (without "data: ") goes to it and the body stays
  // empty. UNAVAILABLE when the connection fails or closes mid-response.
  absl::StatusOr<HttpResponse> Post(const std::string& path, const std::string& body,
                                    const std::function<void(std::string_view)>& on_event = {});

 private:
  absl::Status Connect();
  void Close();
  // Reads more bytes into buffer_; false at end of stream or on an error.
  bool Fill();
  absl::StatusOr<std::string> ReadLine();

  std::string address_;
  int fd_ = -1;
  std::string buffer_;
  size_t pos_ = 0;  // first unread byte of buffer_
};

}  // namespace prefixd::bench

#endif  // PREFIXD_BENCH_HTTP_CLIENT_H_
