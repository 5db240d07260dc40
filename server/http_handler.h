// What a front end's HTTP connections (server/http_session.h) hand their requests to, without
// any networking: the OpenAI API's router (server/http_router.h) on --http-listen, the
// metrics endpoint (server/metrics_endpoint.h) on --metrics-listen.
#ifndef PREFIXD_SERVER_HTTP_HANDLER_H_
#define PREFIXD_SERVER_HTTP_HANDLER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "server/http_completion.h"

namespace prefixd {

struct HttpRequestView {
  std::string_view method;  // "GET", "POST", ...
  std::string_view target;  // path and query
  std::optional<std::string> authorization;
  const std::string* body = nullptr;  // never null
};

// A reply that takes long to compute (reading an adapter's files): `work` runs on a
// background thread, never on an I/O thread, and its reply is then sent.
struct HttpDeferred {
  std::function<HttpReply()> work;
};

using HttpRouted = std::variant<HttpReply, std::unique_ptr<HttpCompletion>, HttpDeferred>;

class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // Called on an I/O thread, one request at a time per connection, concurrently for
  // different connections.
  virtual HttpRouted Route(const HttpRequestView& request) = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_HANDLER_H_
