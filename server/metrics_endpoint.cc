#include "server/metrics_endpoint.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace prefixd {

HttpRouted MetricsEndpoint::Route(const HttpRequestView& request) {
  const std::string_view path = request.target.substr(0, request.target.find('?'));
  if (path != "/metrics") {
    return ErrorReply(absl::NotFoundError(
        absl::StrCat("no such endpoint: ", absl::string_view(path.data(), path.size()),
                     " (the metrics listener serves GET /metrics only)")));
  }
  if (request.method != "GET" && request.method != "HEAD") {
    return HttpReply{.status = 405,
                     .body = ErrorJson(absl::InvalidArgumentError("use GET /metrics")),
                     .allow = "GET, HEAD"};
  }
  return HttpReply{200, metrics_.ExpositionText(), kMetricsContentType};
}

}  // namespace prefixd
