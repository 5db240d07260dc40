#include "engine/tenant_table.h"

#include <cmath>

#include "base/check.h"
#include "cache/kv_cache.h"

namespace prefixd {

TenantTable::TenantTable(const Options& options, const std::vector<TenantPolicy>& policies)
    : options_(options) {
  PREFIXD_CHECK(options_.cache != nullptr);
  PREFIXD_CHECK(options_.default_cache_share > 0 && options_.default_cache_share <= 1);
  for (const TenantPolicy& p : policies) given_[p.name] = p;
}

TenantPolicy TenantTable::Resolve(const std::string& name) const {
  TenantPolicy p{.name = name};
  if (auto it = given_.find(name); it != given_.end()) p = it->second;
  if (!p.cache_share) p.cache_share = options_.default_cache_share;
  return p;
}

int64_t TenantTable::ShareBlocks(TenantId id) const {
  const double share = *effective_.at(static_cast<size_t>(id)).cache_share;
  const int64_t pool = options_.cache->num_blocks();
  // A share of 1 is no share at all: the whole pool.
  return share >= 1.0 ? pool : static_cast<int64_t>(std::floor(share * static_cast<double>(pool)));
}

void TenantTable::Apply(TenantId id) { options_.cache->SetTenantShare(id, ShareBlocks(id)); }

TenantId TenantTable::Id(const std::string& name) {
  if (auto it = ids_.find(name); it != ids_.end()) return it->second;
  const TenantId id = static_cast<TenantId>(names_.size());
  ids_.emplace(name, id);
  names_.push_back(name);
  effective_.push_back(Resolve(name));
  Apply(id);
  return id;
}

const std::string& TenantTable::Name(TenantId id) const {
  return names_.at(static_cast<size_t>(id));
}

const TenantPolicy& TenantTable::Policy(TenantId id) const {
  return effective_.at(static_cast<size_t>(id));
}

void TenantTable::SetPolicies(const std::vector<TenantPolicy>& policies) {
  given_.clear();
  for (const TenantPolicy& p : policies) given_[p.name] = p;
  for (size_t id = 0; id < names_.size(); ++id) {
    effective_[id] = Resolve(names_[id]);
    Apply(static_cast<TenantId>(id));
  }
}

}  // namespace prefixd
