#include "server/adapter_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/escape.h"
#include "engine/lora_adapter.h"
#include "engine/request_validation.h"
#include "server/wire_field.h"

namespace prefixd {
namespace {

absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool NameByte(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == ':' || c == '/';
}

}  // namespace

absl::StatusOr<std::pair<std::string, std::string>> ParseAdapterFlag(std::string_view value) {
  const size_t eq = value.find('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == value.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--adapter must be NAME=DIR (a name, then the adapter's directory), got \"",
                     EscapeBytes(value), "\""));
  }
  return std::make_pair(std::string(value.substr(0, eq)), std::string(value.substr(eq + 1)));
}

absl::Status ValidateAdapterName(std::string_view name, std::string_view base_name) {
  if (name.empty() || name.size() > kMaxAdapterNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("an adapter name is 1 to ", kMaxAdapterNameBytes,
                                                   " bytes, got ", name.size()));
  }
  for (char c : name) {
    if (!NameByte(c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adapter name \"", EscapeBytes(name),
          "\" may hold only letters, digits and . _ - : / (it appears in URLs and metrics)"));
    }
  }
  if (name == base_name) {
    return absl::InvalidArgumentError(absl::StrCat("adapter name \"", ToAbsl(name),
                                                   "\" is the base model's name: choose another"));
  }
  return absl::OkStatus();
}

absl::Status ValidateAdapterOptions(const AdapterOptions& o) {
  if (o.max_adapters < 0 || o.max_adapters > kMaxAdaptersLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-adapters must be 0 to ", kMaxAdaptersLimit, ", got ", o.max_adapters));
  }
  if (static_cast<int64_t>(o.adapters.size()) > o.max_adapters) {
    return absl::InvalidArgumentError(absl::StrCat(o.adapters.size(),
                                                   " --adapter flags but --max-adapters is ",
                                                   o.max_adapters, ": raise it"));
  }
  for (const std::string& a : o.adapters) {
    absl::StatusOr<std::pair<std::string, std::string>> parsed = ParseAdapterFlag(a);
    if (!parsed.ok()) return parsed.status();
    if (absl::Status s = ValidateAdapterName(parsed->first, ""); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--adapter ", a, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

namespace {

AdapterInfo InfoOf(const std::string& name, const LoraAdapter& a) {
  return {name, a.dir, a.digest, a.rank, a.lora_alpha, a.memory_bytes()};
}

}  // namespace

AdapterRegistry::AdapterRegistry(AdapterRegistryOptions options) : options_(std::move(options)) {}

absl::StatusOr<AdapterInfo> AdapterRegistry::Load(const std::string& name, const std::string& dir) {
  if (!options_.backend_applies_lora) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", options_.backend_name,
                     " backend cannot apply LoRA adapters (the CPU backend can: --device cpu)"));
  }
  if (absl::Status s = ValidateAdapterName(name, options_.base_name); !s.ok()) return s;
  // The file calls would read the path only up to its first NUL, and load another directory.
  if (const size_t nul = dir.find('\0'); nul != std::string::npos) {
    return WireFieldError("lora_path", absl::StrCat("lora_path holds a NUL byte (at byte ", nul,
                                                    "): give a directory's path without one"));
  }
  auto check_room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    if (loaded_.contains(name)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "adapter \"", name, "\" is already loaded: unload it first to load other files"));
    }
    if (static_cast<int64_t>(loaded_.size()) >= options_.max_adapters) {
      return absl::ResourceExhaustedError(
          absl::StrCat("already ", loaded_.size(), " adapters loaded (--max-adapters ",
                       options_.max_adapters, "): unload one first"));
    }
    return absl::OkStatus();
  };
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = check_room(); !s.ok()) return s;
  }
  absl::StatusOr<std::shared_ptr<const LoraAdapter>> adapter;
  {
    absl::MutexLock loading(&load_mu_);
    if (options_.load_hook) options_.load_hook();
    adapter = LoadLoraAdapter(dir, options_.base);
  }
  if (!adapter.ok()) return adapter.status();
  absl::MutexLock lock(&mu_);
  if (absl::Status s = check_room(); !s.ok()) return s;  // another load may have come first
  const AdapterInfo info = InfoOf(name, **adapter);
  loaded_.emplace(name, *std::move(adapter));
  return info;
}

absl::Status AdapterRegistry::Unload(std::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it = loaded_.find(name);
  if (it == loaded_.end()) {
    return absl::NotFoundError(absl::StrCat("adapter \"", EscapeBytes(name), "\" is not loaded"));
  }
  loaded_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const LoraAdapter>> AdapterRegistry::Find(
    std::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = loaded_.find(name);
  if (it != loaded_.end()) return it->second;
  std::vector<std::string> names;
  for (const auto& [n, a] : loaded_) names.push_back(n);
  return WithField(
      absl::NotFoundError(absl::StrCat(
          "`", EscapeBytes(name), "` is not loaded: this server serves the base model `",
          options_.base_name, "`",
          names.empty() ? " and no adapter"
                        : absl::StrCat(" and the adapters ", absl::StrJoin(names, ", ")),
          " (GET /v1/models and GetModelInfo list them)")),
      RequestField::kAdapter);
}

std::vector<AdapterInfo> AdapterRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<AdapterInfo> out;
  for (const auto& [name, a] : loaded_) out.push_back(InfoOf(name, *a));
  return out;
}

int64_t AdapterRegistry::memory_bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [name, a] : loaded_) n += a->memory_bytes();
  return n;
}

}  // namespace prefixd
