// Fuzz target: GenerateRequest bytes → protobuf parse → the request path's translation
// (ToGenerateCall, RequestPath::BuildEngineRequest) → the engine's request rules
// (ValidateEngineRequest), for GPT-2 small's shape and a 1,024-block pool of 16 tokens.
//
// Whatever the bytes, this must not crash; every refusal is INVALID_ARGUMENT; and a request
// the rules accept has what the engine relies on (ids in the vocabulary, a context that
// fits, 1..max samples, sane sampling values).
#include <cmath>
#include <string>

#include "engine/request_validation.h"
#include "engine/sampler.h"
#include "fuzz/fuzz_target.h"
#include "fuzz/gpt2_tokenizer.h"
#include "google/protobuf/stubs/logging.h"
#include "prefixd/v1/inference.pb.h"
#include "server/inference_service.h"
#include "server/request_path.h"

namespace prefixd::fuzz {
namespace {

RequestLimits Gpt2SmallLimits() {
  RequestLimits limits;
  limits.model_config.n_layer = 12;
  limits.model_config.n_head = 12;
  limits.model_config.n_embd = 768;
  limits.model_config.n_positions = 1024;
  limits.model_config.vocab_size = 50257;
  limits.max_samples = 16;
  limits.pool_blocks = 1024;
  limits.block_size = 16;
  return limits;
}

void CheckAccepted(const EngineRequest& r, const RequestLimits& limits) {
  const ModelConfig& c = limits.model_config;
  PREFIXD_CHECK(!r.prompt.empty());
  for (uint32_t id : r.prompt) PREFIXD_CHECK(id < static_cast<uint32_t>(c.vocab_size));
  for (uint32_t id : r.stop_token_ids) PREFIXD_CHECK(id < static_cast<uint32_t>(c.vocab_size));
  PREFIXD_CHECK(r.max_new_tokens >= 1);
  PREFIXD_CHECK(static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens <= c.n_positions);
  PREFIXD_CHECK(r.num_samples >= 1 && static_cast<int64_t>(r.num_samples) <= limits.max_samples);
  PREFIXD_CHECK(std::isfinite(r.sampling.temperature) && r.sampling.temperature >= 0.0f);
  PREFIXD_CHECK(r.sampling.top_p > 0.0f && r.sampling.top_p <= 1.0f);
  PREFIXD_CHECK(r.top_logprobs <= kMaxTopLogprobs);
  PREFIXD_CHECK(!r.request_id.empty());
  PREFIXD_CHECK(!r.cache_namespace.empty());
}

}  // namespace
}  // namespace prefixd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prefixd;
  static const RequestLimits limits = fuzz::Gpt2SmallLimits();
  static RequestPath* const path = [] {
    // Text fields with invalid UTF-8 fail to parse with one log line each: noise here.
    google::protobuf::SetLogHandler(nullptr);
    RequestPathOptions o;
    o.tokenizer = &fuzz::Gpt2Tokenizer();  // BuildEngineRequest uses nothing else
    return new RequestPath(std::move(o));
  }();
  v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const GenerateCall call = ToGenerateCall(request);
  absl::StatusOr<EngineRequest> built = path->BuildEngineRequest(call, "tenant");
  if (!built.ok()) {
    PREFIXD_CHECK(built.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  const absl::Status valid = ValidateEngineRequest(*built, limits);
  if (!valid.ok()) {
    PREFIXD_CHECK(valid.code() == absl::StatusCode::kInvalidArgument);
    PREFIXD_CHECK(!valid.message().empty());
    return 0;
  }
  fuzz::CheckAccepted(*built, limits);
  return 0;
}
