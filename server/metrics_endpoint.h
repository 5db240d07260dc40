// What the metrics listener (--metrics-listen) answers, without any networking: GET or HEAD
// /metrics is the text exposition of ServerMetrics (server/metrics.h), in the content type
// Prometheus scrapes; any other path is 404, another method on /metrics 405. The listener
// is an HttpFrontEnd (server/http_front_end.h) of its own, beside the API's.
#ifndef PREFIXD_SERVER_METRICS_ENDPOINT_H_
#define PREFIXD_SERVER_METRICS_ENDPOINT_H_

#include "server/http_handler.h"
#include "server/metrics.h"

namespace prefixd {

// Prometheus' text format, version 0.0.4.
inline constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

class MetricsEndpoint : public HttpHandler {
 public:
  // `metrics` is not owned and outlives the endpoint.
  explicit MetricsEndpoint(const ServerMetrics* metrics) : metrics_(*metrics) {}

  HttpRouted Route(const HttpRequestView& request) override;

 private:
  const ServerMetrics& metrics_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_METRICS_ENDPOINT_H_
