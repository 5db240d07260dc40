// TenantTable: the scheduler's view of the tenants (engine/tenant_policy.h). It names each
// tenant by a small id for the pool (cache/eviction_queue.h's TenantId, assigned on first
// sight and never reused, so blocks keep their owner across policy reloads), resolves the
// policy in force (the tenant's own fields, else the engine's defaults) and applies the
// cache share to the pool.
//
// Invariant: every known tenant's share in the pool is its policy's (SetPolicies re-applies
// them all). The map grows only with tenants that sent requests, which the request path
// bounds (authenticated tenants only). Engine thread only.
#ifndef PREFIXD_ENGINE_TENANT_TABLE_H_
#define PREFIXD_ENGINE_TENANT_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cache/eviction_queue.h"
#include "engine/tenant_policy.h"

namespace prefixd {

class KvCache;

class TenantTable {
 public:
  struct Options {
    KvCache* cache = nullptr;          // not owned
    double default_cache_share = 1.0;  // (0, 1]
  };
  TenantTable(const Options& options, const std::vector<TenantPolicy>& policies);

  // The tenant's id, registering it (and applying its share) on first sight.
  TenantId Id(const std::string& name);
  const std::string& Name(TenantId id) const;
  size_t size() const { return names_.size(); }
  // The policy in force, the default cache share filled in (the waiting caps are the
  // engine's, checked in Engine::Submit on caller threads).
  const TenantPolicy& Policy(TenantId id) const;
  // Replaces the policies; known tenants take theirs (or the defaults) at once.
  void SetPolicies(const std::vector<TenantPolicy>& policies);
  // floor(share x pool blocks): the cached blocks the tenant may keep before its own go first.
  int64_t ShareBlocks(TenantId id) const;

 private:
  TenantPolicy Resolve(const std::string& name) const;
  void Apply(TenantId id);

  Options options_;
  absl::flat_hash_map<std::string, TenantPolicy> given_;  // the file's, by name
  absl::flat_hash_map<std::string, TenantId> ids_;
  std::vector<std::string> names_;       // by id
  std::vector<TenantPolicy> effective_;  // by id
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_TENANT_TABLE_H_
