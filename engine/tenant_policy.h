// TenantPolicy: how the engine shares itself among tenants (issue-level design in
// docs/SERVER.md, "Tenants"). Tenants are named by the authenticated caller (server/auth.h);
// the engine keys its per-tenant state by name, so a policy reload never moves a block or
// a queued request to another tenant.
#ifndef PREFIXD_ENGINE_TENANT_POLICY_H_
#define PREFIXD_ENGINE_TENANT_POLICY_H_

#include <cstdint>
#include <optional>
#include <string>

namespace prefixd {

struct TenantPolicy {
  std::string name;
  // Share of admission and prefill, relative to the other tenants with work waiting
  // (deficit round robin over prompt tokens computed). >= 1.
  uint32_t weight = 1;
  // Fraction of the pool (0, 1] that the tenant's cached blocks may take before its own are
  // the first evicted; unset: the engine's default (EngineOptions::tenant_cache_share).
  std::optional<double> cache_share;
  // Requests the tenant may have waiting before more are refused with RESOURCE_EXHAUSTED;
  // unset: the engine's default (EngineOptions::tenant_max_waiting, 0 = no cap).
  std::optional<int32_t> max_waiting;
  friend bool operator==(const TenantPolicy&, const TenantPolicy&) = default;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_TENANT_POLICY_H_
