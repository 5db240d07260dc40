// The LoRA adapters a server serves by name (`--adapter NAME=DIR`, up to `--max-adapters`;
// engine/lora_adapter.h for the format). A request names one (gRPC
// GenerateRequest.adapter, HTTP `model`); the request path resolves the name here into the
// loaded adapter, which the request then holds until it ends: unloading a name only stops new
// requests from finding it, and requests in flight finish with the adapter they started with.
// Loading a name again with other files gives another digest, so another cache identity.
//
// Invariants: at most max_adapters names are loaded; a name is never the base model's name;
// every loaded adapter fits the base (CheckLoraAdapterFits). Thread-safe; loading reads the
// files outside the lock, one load at a time (so concurrent loads hold at most one adapter's
// files in memory: each is bounded by MaxAdapterWeightsBytes).
#ifndef PREFIXD_SERVER_ADAPTER_REGISTRY_H_
#define PREFIXD_SERVER_ADAPTER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/model_config.h"

namespace prefixd {

struct LoraAdapter;  // engine/lora_adapter.h

// The adapter flags of `prefixd`, kept apart from the other server options.
struct AdapterOptions {
  std::vector<std::string> adapters;  // --adapter NAME=DIR, each as given, in order
  int32_t max_adapters = 8;           // --max-adapters
  // Tests: runs on the loading thread before an adapter's files are read.
  std::function<void()> load_hook;
};

inline constexpr int32_t kMaxAdaptersLimit = 1024;
inline constexpr size_t kMaxAdapterNameBytes = 128;

// "NAME=DIR" into its two parts; INVALID_ARGUMENT naming --adapter otherwise.
absl::StatusOr<std::pair<std::string, std::string>> ParseAdapterFlag(std::string_view value);

// A name is 1 to 128 bytes of letters, digits and . _ - : / (so it is safe in a URL path, a
// metric label and a log line), and is not the base model's name.
absl::Status ValidateAdapterName(std::string_view name, std::string_view base_name);

// Checks the flags alone (values and syntax), before anything is loaded.
absl::Status ValidateAdapterOptions(const AdapterOptions& options);

struct AdapterInfo {
  std::string name;
  std::string dir;
  std::string digest;
  int32_t rank = 0;
  float lora_alpha = 0.0f;
  int64_t memory_bytes = 0;
};

struct AdapterRegistryOptions {
  std::string base_name;  // the served model's name; no adapter may take it
  ModelConfig base;       // every adapter must fit it
  int32_t max_adapters = 8;
  bool backend_applies_lora = true;  // Backend::applies_lora()
  std::string backend_name;          // for the refusal when it does not
  std::function<void()> load_hook;   // AdapterOptions::load_hook
};

class AdapterRegistry {
 public:
  explicit AdapterRegistry(AdapterRegistryOptions options);

  // Loads `dir` under `name`. INVALID_ARGUMENT for a bad name or adapter (the loader's
  // message), NOT_FOUND for missing files, ALREADY_EXISTS for a name in use,
  // RESOURCE_EXHAUSTED when max_adapters are loaded, FAILED_PRECONDITION on a backend that
  // cannot apply adapters. Nothing changes on error. Returns what was loaded.
  absl::StatusOr<AdapterInfo> Load(const std::string& name, const std::string& dir);
  // NOT_FOUND when `name` is not loaded.
  absl::Status Unload(std::string_view name);
  // The adapter loaded under `name`; NOT_FOUND (RequestField::kAdapter) when there is none.
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> Find(std::string_view name) const;
  // Every loaded adapter, by name.
  std::vector<AdapterInfo> List() const;
  // Host bytes of every loaded adapter's tensors.
  int64_t memory_bytes() const;
  int32_t max_adapters() const { return options_.max_adapters; }
  const std::string& base_name() const { return options_.base_name; }

 private:
  const AdapterRegistryOptions options_;
  absl::Mutex load_mu_;  // held while a load reads files; taken before mu_, never inside it
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const LoraAdapter>, std::less<>> loaded_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_ADAPTER_REGISTRY_H_
