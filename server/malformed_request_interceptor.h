// Calls whose request message does not parse. gRPC 1.51's callback API answers them itself,
// before any handler runs, with UNIMPLEMENTED and no message (a generated handler's fallback
// for a failed deserialization), and the call never reaches the request path. This
// interceptor sees the status on its way out: on a method prefixd.v1.Inference has, UNIMPLEMENTED
// with no message can only be that (every method is implemented, and no handler of ours
// answers UNIMPLEMENTED), so it becomes INVALID_ARGUMENT saying what is wrong, and a
// Generate call is counted in prefixd_requests_total like every other refused one.
#ifndef PREFIXD_SERVER_MALFORMED_REQUEST_INTERCEPTOR_H_
#define PREFIXD_SERVER_MALFORMED_REQUEST_INTERCEPTOR_H_

#include "grpcpp/support/server_interceptor.h"
#include "server/api.h"

namespace prefixd {

class ServerMetrics;  // server/metrics.h

class MalformedRequestInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `metrics` (not owned, may be null) outlives the gRPC server.
  explicit MalformedRequestInterceptorFactory(ServerMetrics* metrics) : metrics_(metrics) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  ServerMetrics* metrics_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_MALFORMED_REQUEST_INTERCEPTOR_H_
