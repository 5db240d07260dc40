#include "server/malformed_request_interceptor.h"

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "server/metrics.h"

namespace prefixd {
namespace {

constexpr std::string_view kServiceName = "prefixd.v1.Inference";
constexpr std::string_view kServicePath = "/prefixd.v1.Inference/";

class MalformedRequestInterceptor : public grpc::experimental::Interceptor {
 public:
  MalformedRequestInterceptor(const google::protobuf::MethodDescriptor* method,
                              ServerMetrics* metrics)
      : method_(method), metrics_(metrics) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED &&
          status.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("the request is not a valid ", method_->input_type()->full_name(),
                         ": it did not parse (a string field holds invalid UTF-8, or the "
                         "bytes are not that protobuf message)")));
        if (method_->name() == "Generate" && metrics_ != nullptr) {
          metrics_->RecordRequest(Api::kGrpc, absl::StatusCode::kInvalidArgument, kUnresolvedAdapter);
        }
      }
    }
    methods->Proceed();
  }

 private:
  const google::protobuf::MethodDescriptor* method_;  // a method of kService
  ServerMetrics* metrics_;
};

}  // namespace

grpc::experimental::Interceptor* MalformedRequestInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  const std::string_view path = info->method() != nullptr ? info->method() : "";
  if (path.substr(0, kServicePath.size()) != kServicePath) return nullptr;
  // Only a method the service has: gRPC's own UNIMPLEMENTED for a method that does not exist
  // ("/prefixd.v1.Inference/NoSuchMethod") must reach the client as it is.
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          std::string(kServiceName));
  if (service == nullptr) return nullptr;
  const google::protobuf::MethodDescriptor* method =
      service->FindMethodByName(std::string(path.substr(kServicePath.size())));
  if (method == nullptr) return nullptr;
  return new MalformedRequestInterceptor(method, metrics_);
}

}  // namespace prefixd
