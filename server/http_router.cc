#include "server/http_router.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model_config.h"
#include "nlohmann/json.hpp"
#include "server/openai_api.h"
#include "server/wire_field.h"

namespace prefixd {
namespace {

// `allowed`: the one method to use; `allow`: the Allow header (HEAD too where GET is).
HttpReply MethodNotAllowed(const char* allowed, const char* allow) {
  return HttpReply{
      .status = 405,
      .body = ErrorJson(absl::InvalidArgumentError(absl::StrCat("use ", allowed, " here"))),
      .allow = allow};
}

}  // namespace

HttpRouted HttpRouter::Route(const HttpRequestView& request) {
  const std::string_view path = request.target.substr(0, request.target.find('?'));
  if (path == "/health") {
    if (request.method != "GET" && request.method != "HEAD") {
      return MethodNotAllowed("GET", "GET, HEAD");
    }
    if (path_.draining()) return ErrorReply(absl::UnavailableError("prefixd is shutting down"));
    return HttpReply{200, "{\"status\":\"ok\"}"};
  }
  if (absl::StatusOr<std::string> tenant = path_.Authorize(request.authorization); !tenant.ok()) {
    if (path == "/v1/completions") path_.CountRefused(Api::kHttp, tenant.status().code());
    return ErrorReply(tenant.status());
  }
  if (path == "/v1/models") {
    if (request.method != "GET") return MethodNotAllowed("GET", "GET");
    return Models(request);
  }
  if (path == "/v1/completions") {
    if (request.method != "POST") return MethodNotAllowed("POST", "POST");
    return Completions(request);
  }
  if (path == "/v1/chat/completions") {
    if (request.method != "POST") return MethodNotAllowed("POST", "POST");
    return ErrorReply(WireFieldError(
        "model", "model has no chat template: GPT-2 is a base model; use POST /v1/completions"));
  }
  if (path == "/v1/load_lora_adapter") {
    if (request.method != "POST") return MethodNotAllowed("POST", "POST");
    return LoadLoraAdapter(request);
  }
  if (path == "/v1/unload_lora_adapter") {
    if (request.method != "POST") return MethodNotAllowed("POST", "POST");
    return UnloadLoraAdapter(request);
  }
  if (path == "/tokenize") {
    if (request.method != "POST") return MethodNotAllowed("POST", "POST");
    return Tokenize(request);
  }
  if (path == "/detokenize") {
    if (request.method != "POST") return MethodNotAllowed("POST", "POST");
    return Detokenize(request);
  }
  return ErrorReply(absl::NotFoundError(absl::StrCat(
      "no such endpoint: ", absl::string_view(path.data(), path.size()),
      " (prefixd serves POST /v1/completions, GET /v1/models, GET /health, POST /tokenize, "
      "POST /detokenize, POST /v1/load_lora_adapter, POST /v1/unload_lora_adapter)")));
}

HttpRouted HttpRouter::Completions(const HttpRequestView& request) {
  absl::StatusOr<CompletionRequest> parsed =
      ParseCompletionRequest(*request.body, path_.model().name);
  if (!parsed.ok()) {
    path_.CountRefused(Api::kHttp, parsed.status().code());
    return ErrorReply(parsed.status());
  }
  absl::StatusOr<std::unique_ptr<HttpCompletion>> started =
      HttpCompletion::Start(path_, *std::move(parsed), request.authorization);
  if (!started.ok()) return ErrorReply(started.status());
  return *std::move(started);
}

HttpReply HttpRouter::Models(const HttpRequestView& request) {
  absl::StatusOr<ServedModel> model = path_.ModelInfo(request.authorization);
  if (!model.ok()) return ErrorReply(model.status());
  nlohmann::json data = nlohmann::json::array();
  data.push_back({{"id", model->name},
                  {"object", "model"},
                  {"created", created_},
                  {"owned_by", "prefixd"},
                  {"max_model_len", model->config.n_positions},
                  {"manifest_sha256", model->manifest_sha256}});
  // Each LoRA adapter as vLLM lists one: its own id, "parent" the base.
  for (const AdapterInfo& a : model->adapters) {
    data.push_back({{"id", a.name},
                    {"object", "model"},
                    {"created", created_},
                    {"owned_by", "prefixd"},
                    {"max_model_len", model->config.n_positions},
                    {"parent", model->name},
                    {"adapter_sha256", a.digest}});
  }
  nlohmann::json body{{"object", "list"}, {"data", std::move(data)}};
  return HttpReply{200, body.dump()};
}

HttpRouted HttpRouter::LoadLoraAdapter(const HttpRequestView& request) {
  absl::StatusOr<std::pair<std::string, std::string>> parsed =
      ParseLoadLoraAdapterRequest(*request.body);
  if (!parsed.ok()) return ErrorReply(parsed.status());
  // Reading and checking an adapter's files takes a while: not on an I/O thread, which
  // serves every other connection (/health among them).
  return HttpDeferred{
      [this, authorization = request.authorization, parsed = *std::move(parsed)]() -> HttpReply {
        absl::StatusOr<AdapterInfo> info =
            path_.LoadAdapter(authorization, parsed.first, parsed.second);
        if (!info.ok()) return ErrorReply(info.status());
        nlohmann::json body{{"lora_name", info->name},
                            {"adapter_sha256", info->digest},
                            {"rank", info->rank},
                            {"parent", path_.model().name}};
        return HttpReply{200, body.dump()};
      }};
}

HttpReply HttpRouter::UnloadLoraAdapter(const HttpRequestView& request) {
  absl::StatusOr<std::string> name = ParseUnloadLoraAdapterRequest(*request.body);
  if (!name.ok()) return ErrorReply(name.status());
  if (absl::Status s = path_.UnloadAdapter(request.authorization, *name); !s.ok()) {
    return ErrorReply(s);
  }
  return HttpReply{200, nlohmann::json({{"lora_name", *name}}).dump()};
}

HttpReply HttpRouter::Tokenize(const HttpRequestView& request) {
  absl::StatusOr<TokenizeBody> parsed = ParseTokenizeRequest(*request.body, path_.model().name);
  if (!parsed.ok()) return ErrorReply(parsed.status());
  absl::StatusOr<std::vector<uint32_t>> ids =
      path_.Tokenize(request.authorization, parsed->prompt, parsed->adapter);
  if (!ids.ok()) return ErrorReply(ToOpenAiError(ids.status()));
  nlohmann::json body{{"tokens", *ids},
                      {"count", ids->size()},
                      {"max_model_len", path_.model().config.n_positions}};
  return HttpReply{200, body.dump()};
}

HttpReply HttpRouter::Detokenize(const HttpRequestView& request) {
  absl::StatusOr<DetokenizeBody> parsed = ParseDetokenizeRequest(*request.body, path_.model().name);
  if (!parsed.ok()) return ErrorReply(parsed.status());
  absl::StatusOr<std::string> text =
      path_.Detokenize(request.authorization, parsed->tokens, parsed->adapter);
  // The ids to detokenize are this endpoint's `tokens`.
  if (!text.ok()) {
    return ErrorReply(NameRequestField(text.status(), [](RequestField f) {
      return f == RequestField::kPrompt ? std::string_view("tokens") : OpenAiFieldName(f);
    }));
  }
  nlohmann::json body{{"prompt", *text}};
  return HttpReply{200, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

}  // namespace prefixd
