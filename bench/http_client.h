// The one small blocking HTTP/1.1 client of the benchmarks and the tests: a keep-alive TCP
// connection, any method with a body and headers, and a response read with Content-Length,
// chunked transfer coding, or to the end of the connection. Server-Sent Events (`data: ...`
// blocks) go to a callback as they arrive (a benchmark sees a streamed completion token batch
// by token batch, as an SDK would), or are read one at a time (HttpEventStream, for tests that
// act between events). Not a general client: no redirects, no TLS, no proxies.
#ifndef PREFIXD_BENCH_HTTP_CLIENT_H_
#define PREFIXD_BENCH_HTTP_CLIENT_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace prefixd::bench {

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;                            // empty when the events went to the callback
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
  // Any method; `headers` are sent as given (a body gets Content-Type: application/json
  // unless they name one). A server that answers before it has read the whole body (413)
  // is still heard: the response is read even when sending failed.
  absl::StatusOr<HttpResponse> Send(const std::string& method, const std::string& path,
                                    const std::string& body,
                                    const std::map<std::string, std::string>& headers,
                                    const std::function<void(std::string_view)>& on_event = {});

 private:
  friend class HttpEventStream;
  absl::Status Connect();
  void Close();
  // Reads more bytes into buffer_; false at end of stream or on an error.
  bool Fill();
  absl::StatusOr<std::string> ReadLine();
  // Sends the request and reads the status line and headers into *res. *retry is set when a
  // kept-alive connection turned out closed before any answer (the request may be re-sent).
  absl::Status SendAndReadHead(const std::string& method, const std::string& path,
                               const std::string& body,
                               const std::map<std::string, std::string>& headers, HttpResponse* res,
                               bool* retry);

  std::string address_;
  int fd_ = -1;
  std::string buffer_;
  size_t pos_ = 0;  // first unread byte of buffer_
};

// One request to 127.0.0.1:port on a connection of its own, read whole.
absl::StatusOr<HttpResponse> HttpFetch(int port, const std::string& method, const std::string& path,
                                       const std::string& body = "",
                                       const std::map<std::string, std::string>& headers = {});

// A POST whose response is read an event at a time: the status line and headers first, then
// the body's Server-Sent Events.
class HttpEventStream {
 public:
  static absl::StatusOr<std::unique_ptr<HttpEventStream>> Open(
      int port, const std::string& path, const std::string& body,
      const std::map<std::string, std::string>& headers = {});
  // Only sends the request: for a client that goes away before any answer (a non-streamed
  // response has no head until it is complete). status() stays 0; Next() is not for it.
  static absl::StatusOr<std::unique_ptr<HttpEventStream>> SendOnly(
      int port, const std::string& path, const std::string& body,
      const std::map<std::string, std::string>& headers = {});

  int status() const { return head_.status; }
  const std::map<std::string, std::string>& headers() const { return head_.headers; }
  // The next event's data (without "data: "), or nullopt at the end of the body (or when
  // the connection ends or fails).
  std::optional<std::string> Next();
  // Closes the connection at once, as a client that goes away does.
  void Abort() { connection_.Close(); }

 private:
  explicit HttpEventStream(int port);
  // Appends the next piece of body to body_; false at its end.
  bool ReadBody();

  HttpConnection connection_;
  HttpResponse head_;
  bool chunked_ = false;
  bool done_ = false;
  std::string body_;  // decoded body not yet returned as events
};

}  // namespace prefixd::bench

#endif  // PREFIXD_BENCH_HTTP_CLIENT_H_
