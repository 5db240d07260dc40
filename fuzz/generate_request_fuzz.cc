// Fuzz target: GenerateRequest bytes → protobuf parse → the request path's translation
// (ToGenerateCall, RequestPath::BuildEngineRequest) → the engine's request rules
// (ValidateEngineRequest).
//
// Whatever the bytes, this must not crash; every refusal is INVALID_ARGUMENT (NOT_FOUND for
// an adapter's name) carrying a field the proto names; and a request the rules accept has
// what the engine relies on (fuzz/engine_request_checks.h).
#include <string>

#include "engine/request_validation.h"
#include "fuzz/engine_request_checks.h"
#include "fuzz/fuzz_target.h"
#include "fuzz/gpt2_tokenizer.h"
#include "google/protobuf/stubs/logging.h"
#include "prefixd/v1/inference.pb.h"
#include "server/inference_service.h"
#include "server/request_path.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prefixd;
  static const RequestLimits limits = fuzz::Gpt2SmallLimits();
  static RequestPath* const path = [] {
    // Text fields with invalid UTF-8 fail to parse with one log line each: noise here.
    google::protobuf::SetLogHandler(nullptr);
    RequestPathOptions o;
    o.tokenizer = &fuzz::Gpt2Tokenizer();  // BuildEngineRequest uses nothing else
    o.model.config = limits.model_config;  // ... but the context length
    return new RequestPath(std::move(o));
  }();
  v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const GenerateCall call = ToGenerateCall(request);
  absl::StatusOr<EngineRequest> built = path->BuildEngineRequest(call, "tenant");
  const absl::Status valid = built.ok() ? ValidateEngineRequest(*built, limits) : built.status();
  if (!valid.ok()) {
    // Every refusal carries its field, which the proto names (no adapter is loaded here: a
    // name is NOT_FOUND).
    PREFIXD_CHECK(valid.code() == absl::StatusCode::kInvalidArgument ||
                  (valid.code() == absl::StatusCode::kNotFound &&
                   ErrorField(valid) == RequestField::kAdapter));
    PREFIXD_CHECK(!valid.message().empty());
    PREFIXD_CHECK(ErrorField(valid) != RequestField::kNone);
    PREFIXD_CHECK(GrpcFieldName(ErrorField(valid), request) != "request");
    return 0;
  }
  fuzz::CheckAccepted(*built, limits);
  return 0;
}
