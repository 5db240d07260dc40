#include "server/malformed_request_interceptor.h"

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "server/metrics.h"

namespace prefixd {
namespace {

constexpr std::string_view kService = "/prefixd.v1.Inference/";

class MalformedRequestInterceptor : public grpc::experimental::Interceptor {
 public:
  MalformedRequestInterceptor(std::string_view method, ServerMetrics* metrics)
      : method_(method), metrics_(metrics) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED &&
          status.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("the request is not a valid prefixd.v1.", method_,
                         "Request: it did not parse (a string field holds invalid UTF-8, or the "
                         "bytes are not that protobuf message)")));
        if (method_ == "Generate" && metrics_ != nullptr) {
          metrics_->RecordRequest(Api::kGrpc, absl::StatusCode::kInvalidArgument);
        }
      }
    }
    methods->Proceed();
  }

 private:
  std::string method_;  // "Generate", "Tokenize", ...
  ServerMetrics* metrics_;
};

}  // namespace

grpc::experimental::Interceptor* MalformedRequestInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  const std::string_view method = info->method() != nullptr ? info->method() : "";
  if (method.substr(0, kService.size()) != kService) return nullptr;
  return new MalformedRequestInterceptor(method.substr(kService.size()), metrics_);
}

}  // namespace prefixd
