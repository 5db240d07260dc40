#include "client/connection.h"

#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace prefixd {

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const CliArgs& args) {
  auto conn = std::unique_ptr<Connection>(new Connection());
  conn->token_ = args.token;
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!args.tls_ca.empty()) {
    std::ifstream in(args.tls_ca, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read --tls-ca file ", args.tls_ca));
    std::stringstream ss;
    ss << in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ss.str();
    creds = grpc::SslCredentials(ssl);
  }
  conn->channel_ = grpc::CreateChannel(args.server, creds);
  const auto deadline =
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(args.connect_timeout_s * 1000));
  if (!conn->channel_->WaitForConnected(deadline)) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach prefixd at ", args.server, " within ", args.connect_timeout_s,
                     " s (is it running? wrong --server, or TLS without --tls-ca?)"));
  }
  conn->stub_ = v1::Inference::NewStub(conn->channel_);
  return conn;
}

std::unique_ptr<grpc::ClientContext> Connection::NewContext() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!token_.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
  return ctx;
}

std::string DescribeRpcError(const std::string& what, const grpc::Status& status) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  const int code = static_cast<int>(status.error_code());
  const char* name = code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
  return absl::StrCat("prefixctl: ", what, " failed: ", name, ": ", status.error_message());
}

}  // namespace prefixd
