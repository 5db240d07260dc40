#include "server/request_path.h"

#include <random>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/escape.h"
#include "cache/block_key.h"
#include "engine/engine.h"
#include "engine/request_validation.h"
#include "engine/tokenizer.h"
#include "openssl/rand.h"
#include "server/metrics.h"

namespace prefixd {
namespace {

// "prefixd-" and 128 random bits in hex: unguessable, and unlike a counter it does not tell
// a tenant how many requests others sent.
absl::StatusOr<std::string> RandomRequestId() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("could not draw a random request id (OpenSSL RAND_bytes)");
  }
  return absl::StrCat("prefixd-", absl::BytesToHexString(absl::string_view(
                                      reinterpret_cast<const char*>(bytes), sizeof(bytes))));
}

}  // namespace

uint64_t RandomSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

RequestPath::RequestPath(RequestPathOptions options) : options_(std::move(options)) {}

absl::StatusOr<Caller> RequestPath::Identify(
    const std::optional<std::string>& authorization) const {
  if (draining_.load()) return absl::UnavailableError("prefixd is shutting down");
  std::optional<std::string_view> header;
  if (authorization.has_value()) header = *authorization;
  std::shared_ptr<const Authenticator> auth;
  {
    absl::MutexLock lock(&auth_mu_);
    auth = options_.auth;
  }
  return auth->Identify(header);
}

absl::StatusOr<std::string> RequestPath::Authorize(
    const std::optional<std::string>& authorization) const {
  absl::StatusOr<Caller> caller = Identify(authorization);
  if (!caller.ok()) return caller.status();
  return std::move(caller->tenant);
}

void RequestPath::SetAuthenticator(std::shared_ptr<const Authenticator> auth) {
  absl::MutexLock lock(&auth_mu_);
  options_.auth = std::move(auth);
}

absl::StatusOr<EngineRequest> RequestPath::BuildEngineRequest(const GenerateCall& call,
                                                              const std::string& tenant) const {
  EngineRequest req = call.request;
  const ModelConfig& config = options_.model.config;
  if (call.text.has_value()) {
    if (absl::Status s = ValidatePromptText(*call.text, config.n_positions,
                                            options_.tokenizer->max_token_bytes());
        !s.ok()) {
      return s;
    }
    // Stops tokenizing once the prompt alone passes the context: the engine's rules refuse
    // it anyway.
    req.prompt =
        options_.tokenizer->EncodeAtMost(*call.text, static_cast<size_t>(config.n_positions));
  }
  if (absl::Status s = ValidateStopStrings(call.stop); !s.ok()) return s;
  if (req.request_id.empty()) {
    absl::StatusOr<std::string> id = RandomRequestId();
    if (!id.ok()) return id.status();
    req.request_id = *std::move(id);
  }
  req.cache_namespace = CacheNamespace(tenant, call.cache_salt);
  req.tenant = tenant;
  absl::StatusOr<absl::Duration> retention = ParseCacheRetention(call.cache_retention);
  if (!retention.ok()) return retention.status();
  req.cache_retention = *retention;
  // The adapter is held by the request from here on (unloading its name lets it finish);
  // its digest, not its name, keys the cache (cache/block_key.h); the name labels its counts.
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> adapter = ResolveAdapter(call.adapter);
  if (!adapter.ok()) return adapter.status();
  req.adapter = *std::move(adapter);
  req.adapter_name = req.adapter != nullptr ? call.adapter : std::string();
  return req;
}

absl::StatusOr<std::shared_ptr<const LoraAdapter>> RequestPath::ResolveAdapter(
    std::string_view name) const {
  if (name.empty()) return std::shared_ptr<const LoraAdapter>();
  if (options_.adapters == nullptr) {
    return WithField(absl::NotFoundError(absl::StrCat("`", EscapeBytes(name),
                                                      "` is not loaded: this server serves the "
                                                      "base model `",
                                                      options_.model.name, "` and no adapter")),
                     RequestField::kAdapter);
  }
  return options_.adapters->Find(name);
}

std::string RequestPath::AdapterLabel(std::string_view adapter) const {
  if (adapter.empty()) return options_.model.name;
  if (options_.adapters != nullptr && options_.adapters->Find(adapter).ok()) {
    return std::string(adapter);
  }
  return std::string(kUnresolvedAdapter);
}

absl::StatusOr<StartedGenerate> RequestPath::StartGenerate(const GenerateCall& call) {
  absl::StatusOr<std::string> tenant = Authorize(call.authorization);
  if (!tenant.ok()) {
    Count(call.api, tenant.status().code(), AdapterLabel(call.adapter));
    return tenant.status();
  }
  absl::StatusOr<EngineRequest> req = BuildEngineRequest(call, *tenant);
  if (!req.ok()) {
    Count(call.api, req.status().code(), AdapterLabel(call.adapter));
    return req.status();
  }
  StartedGenerate started;
  // Resolved: the name stays its label even if it is unloaded while the request runs.
  started.adapter_label = call.adapter.empty() ? options_.model.name : call.adapter;
  started.request_id = req->request_id;
  started.num_samples = req->num_samples;
  started.top_logprobs = req->top_logprobs;
  started.stop = call.stop;
  // Submit validates against the engine's limits (engine/request_validation.h): the one set
  // of rules, so nothing is checked twice with different words.
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = options_.engine->Submit(*std::move(req));
  if (!stream.ok()) {
    Count(call.api, stream.status().code(), started.adapter_label);
    return stream.status();
  }
  started.stream = *std::move(stream);
  accepted_generates_.fetch_add(1);
  return started;
}

void RequestPath::FinishGenerate(Api api, std::string_view adapter_label, absl::StatusCode code) {
  Count(api, code, adapter_label);
}

void RequestPath::Count(Api api, absl::StatusCode code, std::string_view adapter_label) {
  if (options_.metrics != nullptr) options_.metrics->RecordRequest(api, code, adapter_label);
}

absl::StatusOr<std::vector<uint32_t>> RequestPath::Tokenize(
    const std::optional<std::string>& authorization, std::string_view text,
    std::string_view adapter) const {
  if (absl::StatusOr<std::string> tenant = Authorize(authorization); !tenant.ok()) {
    return tenant.status();
  }
  // An adapter changes weights only: its tokens are the base's.
  if (absl::StatusOr<std::shared_ptr<const LoraAdapter>> a = ResolveAdapter(adapter); !a.ok()) {
    return a.status();
  }
  if (absl::Status s = ValidatePromptText(text, options_.model.config.n_positions,
                                          options_.tokenizer->max_token_bytes());
      !s.ok()) {
    return s;
  }
  return options_.tokenizer->Encode(text);
}

absl::StatusOr<std::string> RequestPath::Detokenize(const std::optional<std::string>& authorization,
                                                    const std::vector<uint32_t>& ids,
                                                    std::string_view adapter) const {
  if (absl::StatusOr<std::string> tenant = Authorize(authorization); !tenant.ok()) {
    return tenant.status();
  }
  if (absl::StatusOr<std::shared_ptr<const LoraAdapter>> a = ResolveAdapter(adapter); !a.ok()) {
    return a.status();
  }
  if (absl::Status s =
          ValidateTokenIds(ids, options_.model.config.vocab_size, RequestField::kPrompt);
      !s.ok()) {
    return s;
  }
  Utf8StreamDecoder decoder;
  std::string text;
  for (uint32_t id : ids) text += decoder.Push(options_.tokenizer->TokenBytes(id));
  return text + decoder.Flush();
}

absl::StatusOr<ServedModel> RequestPath::ModelInfo(
    const std::optional<std::string>& authorization) const {
  if (absl::StatusOr<std::string> tenant = Authorize(authorization); !tenant.ok()) {
    return tenant.status();
  }
  ServedModel model = options_.model;
  if (options_.adapters != nullptr) {
    model.adapters = options_.adapters->List();
    model.max_adapters = options_.adapters->max_adapters();
  }
  return model;
}

absl::StatusOr<AdapterInfo> RequestPath::LoadAdapter(
    const std::optional<std::string>& authorization, const std::string& name,
    const std::string& dir) {
  absl::StatusOr<Caller> caller = Identify(authorization);
  if (!caller.ok()) return caller.status();
  if (!caller->admin) {
    return absl::PermissionDeniedError(
        absl::StrCat("loading adapters changes what every tenant is served: tenant \"",
                     caller->tenant, "\" is not marked admin in the --auth-tokens file"));
  }
  if (options_.adapters == nullptr) {
    return absl::FailedPreconditionError("this server has no adapter registry");
  }
  return options_.adapters->Load(name, dir);
}

absl::Status RequestPath::UnloadAdapter(const std::optional<std::string>& authorization,
                                        const std::string& name) {
  absl::StatusOr<Caller> caller = Identify(authorization);
  if (!caller.ok()) return caller.status();
  if (!caller->admin) {
    return absl::PermissionDeniedError(
        absl::StrCat("unloading adapters changes what every tenant is served: tenant \"",
                     caller->tenant, "\" is not marked admin in the --auth-tokens file"));
  }
  if (options_.adapters == nullptr) return absl::NotFoundError("no adapter is loaded");
  return options_.adapters->Unload(name);
}

absl::StatusOr<EngineStats> RequestPath::CacheStats(
    const std::optional<std::string>& authorization) const {
  absl::StatusOr<Caller> caller = Identify(authorization);
  if (!caller.ok()) return caller.status();
  if (!caller->admin) {
    return absl::PermissionDeniedError(
        absl::StrCat("cache statistics are pool-wide (they show every tenant's traffic): tenant \"",
                     caller->tenant, "\" is not marked admin in the --auth-tokens file"));
  }
  return options_.engine->Stats();
}

}  // namespace prefixd
