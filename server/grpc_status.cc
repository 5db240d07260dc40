#include "server/grpc_status.h"

namespace prefixd {

static_assert(static_cast<int>(absl::StatusCode::kInvalidArgument) ==
              static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
static_assert(static_cast<int>(absl::StatusCode::kResourceExhausted) ==
              static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
static_assert(static_cast<int>(absl::StatusCode::kUnavailable) ==
              static_cast<int>(grpc::StatusCode::UNAVAILABLE));
static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
              static_cast<int>(grpc::StatusCode::UNAUTHENTICATED));
static_assert(static_cast<int>(absl::StatusCode::kCancelled) ==
              static_cast<int>(grpc::StatusCode::CANCELLED));
static_assert(static_cast<int>(absl::StatusCode::kDeadlineExceeded) ==
              static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED));
static_assert(static_cast<int>(absl::StatusCode::kPermissionDenied) ==
              static_cast<int>(grpc::StatusCode::PERMISSION_DENIED));
static_assert(static_cast<int>(absl::StatusCode::kInternal) ==
              static_cast<int>(grpc::StatusCode::INTERNAL));
static_assert(static_cast<int>(absl::StatusCode::kNotFound) ==
              static_cast<int>(grpc::StatusCode::NOT_FOUND));

}  // namespace prefixd
