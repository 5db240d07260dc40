// A channel to prefixd from prefixctl's global flags, and per-call contexts that carry the
// bearer token.
#ifndef PREFIXD_CLIENT_CONNECTION_H_
#define PREFIXD_CLIENT_CONNECTION_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/cli_args.h"
#include "grpcpp/grpcpp.h"
#include "prefixd/v1/inference.grpc.pb.h"

namespace prefixd {

class Connection {
 public:
  // Creates the channel and waits up to --connect-timeout for it to connect. UNAVAILABLE
  // with the address when the server cannot be reached.
  static absl::StatusOr<std::unique_ptr<Connection>> Open(const CliArgs& args);

  v1::Inference::Stub& stub() { return *stub_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // A fresh context for one call, with "authorization: Bearer <token>" when --token is set.
  std::unique_ptr<grpc::ClientContext> NewContext() const;

 private:
  std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

// "prefixctl: <what> failed: CODE: message" for a failed call.
std::string DescribeRpcError(const std::string& what, const grpc::Status& status);

}  // namespace prefixd

#endif  // PREFIXD_CLIENT_CONNECTION_H_
