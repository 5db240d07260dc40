#include "server/request_path.h"

#include <random>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/escape.h"
#include "engine/request_validation.h"
#include "server/cache_namespace.h"
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

uint64_t RandomSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

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

size_t RequestPath::max_text_bytes() const {
  return static_cast<size_t>(options_.model.config.n_positions) *
         options_.tokenizer->max_token_bytes();
}

absl::Status RequestPath::CheckTextBytes(std::string_view text) const {
  if (text.size() <= max_text_bytes()) return absl::OkStatus();
  return FieldError("text", absl::StrFormat(
      "text is %d bytes, more than any text of at most %d tokens (the model's context "
      "length) can be: %d bytes (%d tokens x %d bytes, the longest token); shorten it",
      text.size(), options_.model.config.n_positions, max_text_bytes(),
      options_.model.config.n_positions, options_.tokenizer->max_token_bytes()));
}

absl::StatusOr<EngineRequest> RequestPath::BuildEngineRequest(const GenerateCall& call,
                                                              const std::string& tenant) {
  EngineRequest req;
  switch (call.prompt_kind) {
    case GenerateCall::PromptKind::kNone:
      return FieldError("text", "no prompt: set `text` or `token_ids`");
    case GenerateCall::PromptKind::kText: {
      if (absl::Status s = CheckTextBytes(call.text); !s.ok()) return s;
      // Stops tokenizing once the prompt alone passes the context: it is refused anyway.
      const size_t context = static_cast<size_t>(options_.model.config.n_positions);
      req.prompt = options_.tokenizer->EncodeAtMost(call.text, context);
      if (req.prompt.empty()) {
        return FieldError("text", "empty prompt: `text` must produce at least one token");
      }
      if (req.prompt.size() > context) {
        return FieldError("text", absl::StrFormat(
            "text has more than %d tokens, the model's context length: shorten the prompt",
            context));
      }
      break;
    }
    case GenerateCall::PromptKind::kTokenIds:
      req.prompt = call.token_ids;
      break;
  }
  if (call.stop.size() > kMaxStopStrings) {
    return FieldError("stop", absl::StrCat("stop has ", call.stop.size(),
                                           " strings: at most ", kMaxStopStrings));
  }
  for (const std::string& s : call.stop) {
    if (s.empty() || s.size() > kMaxStopStringBytes) {
      return FieldError("stop", absl::StrCat("a stop string of ", s.size(),
                                             " bytes: each must be 1 to ", kMaxStopStringBytes,
                                             " bytes"));
    }
  }
  if (call.request_id.empty()) {
    absl::StatusOr<std::string> id = RandomRequestId();
    if (!id.ok()) return id.status();
    req.request_id = *std::move(id);
  } else {
    req.request_id = call.request_id;
  }
  req.cache_namespace = DeriveCacheNamespace(tenant, call.cache_salt);
  // The adapter is held by the request from here on (unloading its name lets it finish);
  // its digest, not its name, keys the cache (cache/block_key.h); the name labels its counts.
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> adapter = ResolveAdapter(call.adapter);
  if (!adapter.ok()) return adapter.status();
  req.adapter = *std::move(adapter);
  if (req.adapter != nullptr) req.adapter_name = call.adapter;
  req.max_new_tokens = call.max_new_tokens;
  req.sampling.temperature = call.temperature;
  req.sampling.top_k = call.top_k;
  req.sampling.top_p = call.top_p.value_or(1.0f);
  req.sampling.seed = call.seed.has_value() ? *call.seed : RandomSeed();
  req.sampling.presence_penalty = call.presence_penalty;
  req.sampling.frequency_penalty = call.frequency_penalty;
  req.sampling.repetition_penalty = call.repetition_penalty.value_or(1.0f);
  req.sampling.min_p = call.min_p;
  req.sampling.logit_bias = call.logit_bias;
  req.echo_prompt = call.echo_prompt;
  req.prompt_logprobs = call.prompt_logprobs;
  req.stop_token_ids = call.stop_token_ids;
  req.ignore_eos = call.ignore_eos;
  req.num_samples = call.num_samples == 0 ? 1 : call.num_samples;
  req.top_logprobs = call.top_logprobs;
  return req;
}

absl::StatusOr<std::shared_ptr<const LoraAdapter>> RequestPath::ResolveAdapter(
    std::string_view name) const {
  if (name.empty()) return std::shared_ptr<const LoraAdapter>();
  if (options_.adapters == nullptr) {
    absl::Status s = absl::NotFoundError(absl::StrCat(
        "no adapter named `", EscapeBytes(name), "`: this server serves the base model `",
        options_.model.name, "` and no adapter"));
    s.SetPayload(kInvalidFieldPayload, absl::Cord("adapter"));
    return s;
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

void RequestPath::FinishGenerate(Api api, std::string_view adapter_label,
                                 absl::StatusCode code) {
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
  if (absl::Status s = CheckTextBytes(text); !s.ok()) return s;
  return options_.tokenizer->Encode(text);
}

absl::StatusOr<std::string> RequestPath::Detokenize(
    const std::optional<std::string>& authorization, const std::vector<uint32_t>& ids,
    std::string_view adapter) const {
  if (absl::StatusOr<std::string> tenant = Authorize(authorization); !tenant.ok()) {
    return tenant.status();
  }
  if (absl::StatusOr<std::shared_ptr<const LoraAdapter>> a = ResolveAdapter(adapter); !a.ok()) {
    return a.status();
  }
  const uint32_t vocab = static_cast<uint32_t>(options_.model.config.vocab_size);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= vocab) {
      return FieldError("tokens", absl::StrCat("token id ", ids[i], " at position ", i,
                                               " is out of range: ids must be < vocab_size ",
                                               vocab));
    }
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
    return absl::PermissionDeniedError(absl::StrCat(
        "loading adapters changes what every tenant is served: tenant \"", caller->tenant,
        "\" is not marked admin in the --auth-tokens file"));
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
    return absl::PermissionDeniedError(absl::StrCat(
        "unloading adapters changes what every tenant is served: tenant \"", caller->tenant,
        "\" is not marked admin in the --auth-tokens file"));
  }
  if (options_.adapters == nullptr) return absl::NotFoundError("no adapter is loaded");
  return options_.adapters->Unload(name);
}

absl::StatusOr<EngineStats> RequestPath::CacheStats(
    const std::optional<std::string>& authorization) const {
  absl::StatusOr<Caller> caller = Identify(authorization);
  if (!caller.ok()) return caller.status();
  if (!caller->admin) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cache statistics are pool-wide (they show every tenant's traffic): tenant \"",
        caller->tenant, "\" is not marked admin in the --auth-tokens file"));
  }
  return options_.engine->Stats();
}

}  // namespace prefixd
