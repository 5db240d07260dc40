// A small blocking HTTP/1.1 client for the HTTP API tests: one request per connection
// (Connection: close), chunked or sized bodies, and Server-Sent Events read one at a time.
#ifndef PREFIXD_TESTS_SERVER_HTTP_CLIENT_H_
#define PREFIXD_TESTS_SERVER_HTTP_CLIENT_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace prefixd::testing {

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;                            // de-chunked
};

// Sends one request to 127.0.0.1:port and reads the whole response.
absl::StatusOr<HttpResponse> HttpFetch(int port, const std::string& method,
                                       const std::string& path, const std::string& body = "",
                                       const std::map<std::string, std::string>& headers = {});

// A streamed response: the status line and headers first, then the body's SSE events.
class HttpEventStream {
 public:
  static absl::StatusOr<std::unique_ptr<HttpEventStream>> Open(
      int port, const std::string& path, const std::string& body,
      const std::map<std::string, std::string>& headers = {}, bool read_head = true);
  ~HttpEventStream();

  int status() const { return status_; }
  // The next event's data (without "data: "), or nullopt at the end of the body.
  std::optional<std::string> Next();
  // Closes the connection at once, as a client that goes away does.
  void Abort();

 private:
  int fd_ = -1;
  int status_ = 0;
  bool chunked_ = false;
  bool body_done_ = false;
  std::string raw_;   // bytes read and not yet de-chunked
  std::string body_;  // de-chunked body not yet returned as events
};

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_SERVER_HTTP_CLIENT_H_
