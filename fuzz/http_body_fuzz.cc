// Fuzz target: one HTTP request body, given to the body parser of every endpoint
// (server/openai_api.h): ParseCompletionRequest, ParseTokenizeRequest and
// ParseDetokenizeRequest, served model "gpt2".
//
// Whatever the bytes, no parser may throw (an exception here is what aborted the server on
// `"max_tokens": 1e400`), and:
// - every refusal is INVALID_ARGUMENT with a message, or NOT_FOUND naming `model`; its
//   error body (ErrorJson) is JSON in OpenAI's shape and its HTTP status is 400 or 404;
// - /tokenize and /detokenize agree with an oracle that reads the body with nlohmann's
//   non-throwing parse: they accept exactly the objects with only their fields, a string or
//   null model (or none), and a string prompt (tokenize) or an array of uint32 ids
//   (detokenize), and return that prompt or those ids, and as adapter "" for the served
//   model or none, else the model's name (which the request path resolves);
// - an accepted completion has at least one prompt, each a text or ids, logprobs ≤ 5 and
//   usage only when streamed; each prompt then goes through the request path's translation
//   and the engine's rules as generate_request_fuzz does, whose refusals the API reports
//   naming their field, and what they accept has what the engine relies on
//   (fuzz/engine_request_checks.h);
// - parsing is deterministic: the same body parses to the same answer twice.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/request_validation.h"
#include "fuzz/engine_request_checks.h"
#include "fuzz/fuzz_target.h"
#include "fuzz/gpt2_tokenizer.h"
#include "nlohmann/json.hpp"
#include "server/openai_api.h"
#include "server/request_path.h"
#include "server/wire_field.h"

namespace prefixd::fuzz {
namespace {

using nlohmann::json;

constexpr char kModel[] = "gpt2";

void CheckRefusal(const absl::Status& s) {
  PREFIXD_CHECK(!s.ok());
  PREFIXD_CHECK(s.code() == absl::StatusCode::kInvalidArgument ||
                (s.code() == absl::StatusCode::kNotFound && InvalidField(s) == "model"));
  PREFIXD_CHECK(!s.message().empty());
  const int http = HttpStatusFor(s.code());
  PREFIXD_CHECK(http == 400 || http == 404);
  const json error = json::parse(ErrorJson(s), nullptr, /*allow_exceptions=*/false);
  PREFIXD_CHECK(error.is_object() && error.contains("error"));
  PREFIXD_CHECK(error["error"]["message"].is_string());
  PREFIXD_CHECK(error["error"]["type"] == "invalid_request_error");
}

// The oracle's first steps: an object whose keys are all in `fields` and whose model, if
// any, is a string (null counts as absent); `adapter` is "" for the served model or none,
// else the model's name.
bool OracleObject(const json& j, std::initializer_list<const char*> fields, std::string* adapter) {
  adapter->clear();
  if (!j.is_object()) return false;
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (const char* f : fields) known = known || key == f;
    if (!known) return false;
  }
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return false;
    if (it->get<std::string>() != kModel) *adapter = it->get<std::string>();
  }
  return true;
}

void CheckTokenize(const std::string& body, const json& oracle) {
  const absl::StatusOr<TokenizeBody> got = ParseTokenizeRequest(body, kModel);
  std::string adapter;
  bool accept = OracleObject(oracle, {"model", "prompt", "add_special_tokens"}, &adapter);
  const json* prompt = nullptr;
  if (accept) {
    auto it = oracle.find("prompt");
    accept = it != oracle.end() && it->is_string();
    if (accept) prompt = &*it;
  }
  if (!got.ok()) {
    PREFIXD_CHECK(!accept);
    return CheckRefusal(got.status());
  }
  PREFIXD_CHECK(accept);
  PREFIXD_CHECK(got->prompt == prompt->get<std::string>());
  PREFIXD_CHECK(got->adapter == adapter);
}

void CheckDetokenize(const std::string& body, const json& oracle) {
  const absl::StatusOr<DetokenizeBody> got = ParseDetokenizeRequest(body, kModel);
  std::string adapter;
  bool accept = OracleObject(oracle, {"model", "tokens"}, &adapter);
  std::vector<uint32_t> want;
  if (accept) {
    auto it = oracle.find("tokens");
    accept = it != oracle.end() && it->is_array();
    for (size_t i = 0; accept && i < it->size(); ++i) {
      const json& v = (*it)[i];
      accept = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
      accept = accept && v.get<uint64_t>() <= std::numeric_limits<uint32_t>::max();
      if (accept) want.push_back(static_cast<uint32_t>(v.get<uint64_t>()));
    }
  }
  if (!got.ok()) {
    PREFIXD_CHECK(!accept);
    return CheckRefusal(got.status());
  }
  PREFIXD_CHECK(accept);
  PREFIXD_CHECK(got->tokens == want);
  PREFIXD_CHECK(got->adapter == adapter);
}

void CheckCompletion(const std::string& body, RequestPath& path, const RequestLimits& limits) {
  const absl::StatusOr<CompletionRequest> got = ParseCompletionRequest(body, kModel);
  const absl::StatusOr<CompletionRequest> again = ParseCompletionRequest(body, kModel);
  PREFIXD_CHECK(got.ok() == again.ok());
  if (!got.ok()) {
    PREFIXD_CHECK(got.status() == again.status());
    return CheckRefusal(got.status());
  }
  PREFIXD_CHECK(got->prompts.size() == again->prompts.size());
  PREFIXD_CHECK(!got->prompts.empty());
  PREFIXD_CHECK(!got->include_usage || got->stream);
  if (got->logprobs.has_value()) PREFIXD_CHECK(*got->logprobs <= kMaxOpenAiLogprobs);
  for (const GenerateCall& call : got->prompts) {
    PREFIXD_CHECK(call.api == Api::kHttp);
    // A text prompt, or token ids.
    PREFIXD_CHECK(!call.text.has_value() || call.request.prompt.empty());
    PREFIXD_CHECK(call.request.top_logprobs == got->logprobs.value_or(0));
    absl::StatusOr<EngineRequest> built = path.BuildEngineRequest(call, "tenant");
    absl::Status valid = built.ok() ? ValidateEngineRequest(*built, limits) : built.status();
    if (!valid.ok()) {
      // Another "model" than the base names a LoRA adapter; none is loaded here, so it is
      // NOT_FOUND (404), and only then.
      PREFIXD_CHECK(valid.code() == absl::StatusCode::kInvalidArgument ||
                    (valid.code() == absl::StatusCode::kNotFound && !call.adapter.empty()));
      PREFIXD_CHECK(!valid.message().empty());
      // What the front end sends: the same refusal, naming the field as the API does.
      const absl::Status http = ToOpenAiError(valid);
      PREFIXD_CHECK(http.code() == valid.code() && !http.message().empty());
      PREFIXD_CHECK(!InvalidField(http).empty());
      CheckRefusal(http);
      continue;
    }
    CheckAccepted(*built, limits);
  }
}

}  // namespace
}  // namespace prefixd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prefixd;
  static const RequestLimits limits = fuzz::Gpt2SmallLimits();
  static RequestPath* const path = [] {
    RequestPathOptions o;
    o.tokenizer = &fuzz::Gpt2Tokenizer();  // BuildEngineRequest uses nothing else
    o.model.config = limits.model_config;
    return new RequestPath(std::move(o));
  }();
  const std::string body(fuzz::AsText(data, size));
  // The oracle's reading of the body: discarded (not JSON) where a parser must refuse.
  const nlohmann::json oracle = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  fuzz::CheckTokenize(body, oracle);
  fuzz::CheckDetokenize(body, oracle);
  fuzz::CheckCompletion(body, *path, limits);
  return 0;
}
