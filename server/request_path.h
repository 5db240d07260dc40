// The one request path that every front end calls: authenticate → tenant namespace →
// tokenize → validate → submit → stream → finish and count. A front end (gRPC, HTTP) only
// parses its protocol into a GenerateCall, turns the results back into its messages, and a
// Status into its protocol's status, naming a refused field in its own vocabulary
// (server/wire_field.h); it adds no rule of its own, so every front end refuses the same
// requests for the same reasons.
//
// The rules themselves live with what they protect: every request rule in
// engine/request_validation.h (the engine applies them on Submit; this path those on the
// text and the stop strings, which the engine never sees), tokens in server/auth.h, the
// namespace encoding in cache/block_key.h. This class puts them in one order.
#ifndef PREFIXD_SERVER_REQUEST_PATH_H_
#define PREFIXD_SERVER_REQUEST_PATH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache/kv_pool.h"
#include "engine/model_config.h"
#include "engine/request.h"
#include "server/adapter_registry.h"
#include "server/api.h"
#include "server/auth.h"

namespace prefixd {

// Forward declarations keep this header (and the front ends that include it) free of the
// engine's and the tiers' headers: engine/engine.h, engine/engine_stats.h,
// engine/request_stream.h, engine/tokenizer.h, server/metrics.h.
class Engine;
struct EngineStats;
class RequestStream;
class ServerMetrics;
class Tokenizer;

// A generate request as a front end hands it over: the engine's request, as its parser
// filled it in, plus what only the front end holds. Every rule is checked after (the request
// path's, then the engine's, all in engine/request_validation.h), never by the parser.
struct GenerateCall {
  Api api = Api::kGrpc;  // the front end it came through (counted by it)
  // The `authorization` header or metadata value, absent when the call carried none.
  std::optional<std::string> authorization;
  // What the engine runs. The request path fills in what the client cannot: request_id
  // when empty (the server names the request), cache_namespace (from the tenant and
  // cache_salt), adapter and adapter_name (from `adapter`), and, with `text`, prompt.
  EngineRequest request;
  // The prompt as text, tokenized by the request path into request.prompt; unset when the
  // client gave token ids (request.prompt).
  std::optional<std::string> text;
  std::vector<std::string> stop;  // stop strings (server/generate_output.h matches them)
  std::string cache_salt;         // narrows the caller's cache namespace
  // OpenAI's prompt_cache_retention as sent ("", "in_memory" or "24h"): the request path
  // reads it into request.cache_retention (ParseCacheRetention).
  std::string cache_retention;
  // OpenAI's prompt_cache_key: echoed in the usage; proxies route by it (deploy/haproxy).
  std::string prompt_cache_key;
  std::string adapter;  // a LoRA adapter's name (server/adapter_registry.h); "": the base
};

// The seed of a request whose client gave none: drawn per request, so that identical
// prompts without a seed sample differently. Each front end's parser calls it.
uint64_t RandomSeed();

// A generate call that passed every rule and is queued in the engine.
struct StartedGenerate {
  std::string request_id;
  uint32_t num_samples = 1;
  uint32_t top_logprobs = 0;
  std::vector<std::string> stop;
  std::shared_ptr<RequestStream> stream;
  // Its `adapter` label (AdapterLabel), for FinishGenerate.
  std::string adapter_label;
};

// What is served, fixed at start-up (GetModelInfo, and the HTTP API's model list).
struct ServedModel {
  std::string name;  // the model directory's base name
  std::string manifest_sha256;
  ModelConfig config;
  std::string dtype;    // "f32" | "f16" | "bf16"
  std::string device;   // "cpu" | "cuda:0" | ...
  KvPoolShape kv_pool;  // Backend::kv_pool()
  // The adapters loaded when ModelInfo was asked (they come and go at run time).
  std::vector<AdapterInfo> adapters;
  int32_t max_adapters = 0;
};

struct RequestPathOptions {
  Engine* engine = nullptr;                   // not owned
  const Tokenizer* tokenizer = nullptr;       // not owned
  std::shared_ptr<const Authenticator> auth;  // replaced by SetAuthenticator
  ServerMetrics* metrics = nullptr;           // not owned; may be null
  ServedModel model;
  // The adapters requests may name; null: none can be (every name is NOT_FOUND).
  std::shared_ptr<AdapterRegistry> adapters;
};

class RequestPath {
 public:
  explicit RequestPath(RequestPathOptions options);

  // From now on every new call is refused with UNAVAILABLE; calls already started go on.
  void StartDraining() { draining_.store(true); }
  bool draining() const { return draining_.load(); }

  // The gate every call passes first: UNAVAILABLE while draining, else the caller's tenant
  // (UNAUTHENTICATED without a known token when tokens are required).
  absl::StatusOr<std::string> Authorize(const std::optional<std::string>& authorization) const;

  // Tokens from now on (a reload of --auth-tokens); calls already authorized go on.
  void SetAuthenticator(std::shared_ptr<const Authenticator> auth);

  // Generate up to submission. A refusal ends the call, and is counted here; a started call
  // must be ended with FinishGenerate exactly once.
  absl::StatusOr<StartedGenerate> StartGenerate(const GenerateCall& call);
  // A started generate call ended with `code` (OK after its last message, CANCELLED,
  // DEADLINE_EXCEEDED, or the engine's error): counted in prefixd_requests_total under
  // `started.adapter_label`.
  void FinishGenerate(Api api, std::string_view adapter_label, absl::StatusCode code);
  // A generate request the front end refused before it could become a GenerateCall
  // (malformed JSON, an unknown field): counted like any other refusal, with no adapter.
  void CountRefused(Api api, absl::StatusCode code) { Count(api, code, kUnresolvedAdapter); }

  // The `adapter` label value of a call naming `adapter` (GenerateCall::adapter): the base
  // model's name for "", the name itself while it is loaded, else "" (so a client's unknown
  // names never become metric series).
  std::string AdapterLabel(std::string_view adapter) const;

  // `adapter` names a loaded adapter ("" the base), which shares the base's tokenizer: an
  // unknown name is NOT_FOUND as for a generate request. A text longer than any prompt can
  // be is refused as a Generate prompt's (RequestField::kPrompt).
  absl::StatusOr<std::vector<uint32_t>> Tokenize(const std::optional<std::string>& authorization,
                                                 std::string_view text,
                                                 std::string_view adapter = "") const;
  // The text of `ids` (invalid UTF-8 as U+FFFD); INVALID_ARGUMENT for an id past the
  // vocabulary (RequestField::kPrompt, the prompt's rule), NOT_FOUND for an unknown
  // `adapter` as Tokenize.
  absl::StatusOr<std::string> Detokenize(const std::optional<std::string>& authorization,
                                         const std::vector<uint32_t>& ids,
                                         std::string_view adapter = "") const;
  absl::StatusOr<ServedModel> ModelInfo(const std::optional<std::string>& authorization) const;
  // Loads a LoRA adapter under `name` from `dir` (a path on the server), or unloads one, at
  // run time: PERMISSION_DENIED unless the caller is admin (every caller is without
  // --auth-tokens); then AdapterRegistry's errors. Requests in flight on an unloaded adapter
  // finish with it.
  absl::StatusOr<AdapterInfo> LoadAdapter(const std::optional<std::string>& authorization,
                                          const std::string& name, const std::string& dir);
  absl::Status UnloadAdapter(const std::optional<std::string>& authorization,
                             const std::string& name);
  // Pool-wide counters: PERMISSION_DENIED unless the caller is admin.
  absl::StatusOr<EngineStats> CacheStats(const std::optional<std::string>& authorization) const;

  // The engine request for a call whose caller is `tenant`, before the engine validates it
  // (engine/request_validation.h): the rules on the text and the stop strings applied, the
  // text tokenized, the request named, its namespace derived and its adapter resolved.
  // Public for the request fuzz targets (fuzz/), which run this and the rules without an
  // engine; uses only the tokenizer, the model's config and the adapters.
  absl::StatusOr<EngineRequest> BuildEngineRequest(const GenerateCall& call,
                                                   const std::string& tenant) const;

  const Tokenizer& tokenizer() const { return *options_.tokenizer; }
  const ServedModel& model() const { return options_.model; }
  AdapterRegistry* adapters() const { return options_.adapters.get(); }

 private:
  friend class ServerTestPeer;  // tests/server/server_test_peer.h
  // Generate calls that passed every rule and were queued, since start-up.
  uint64_t accepted_generates() const { return accepted_generates_.load(); }

  void Count(Api api, absl::StatusCode code, std::string_view adapter_label);
  // The adapter loaded under `name` (null for ""); NOT_FOUND (RequestField::kAdapter)
  // otherwise.
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> ResolveAdapter(std::string_view name) const;
  // Authorize's gate, returning the whole caller.
  absl::StatusOr<Caller> Identify(const std::optional<std::string>& authorization) const;

  RequestPathOptions options_;  // options_.auth is guarded by auth_mu_
  mutable absl::Mutex auth_mu_;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> accepted_generates_{0};
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_REQUEST_PATH_H_
