// One error vocabulary end to end: absl::StatusCode and grpc::StatusCode share
// their numeric values (both follow google.rpc.Code), so the mapping is the identity and no
// code is ever translated into another.
#ifndef PREFIXD_SERVER_GRPC_STATUS_H_
#define PREFIXD_SERVER_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace prefixd {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status ToAbslStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace prefixd

#endif  // PREFIXD_SERVER_GRPC_STATUS_H_
