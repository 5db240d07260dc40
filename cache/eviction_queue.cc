#include "cache/eviction_queue.h"

#include <utility>

#include "base/check.h"

namespace prefixd {

EvictionQueue::EvictionQueue(int64_t default_share) : default_share_(default_share) {
  PREFIXD_CHECK(default_share >= 0);
}

EvictionQueue::Tenant& EvictionQueue::Get(TenantId tenant) {
  auto [it, inserted] = tenants_.try_emplace(tenant);
  if (inserted) it->second.share = default_share_;
  return it->second;
}

void EvictionQueue::UpdateOver(TenantId tenant, const Tenant& t) {
  if (t.cached > t.share) {
    over_.insert(tenant);
  } else {
    over_.erase(tenant);
  }
}

void EvictionQueue::SetShare(TenantId tenant, int64_t blocks) {
  PREFIXD_CHECK(blocks >= 0);
  Tenant& t = Get(tenant);
  t.share = blocks;
  UpdateOver(tenant, t);
}

int64_t EvictionQueue::Share(TenantId tenant) const {
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? default_share_ : it->second.share;
}

void EvictionQueue::AddCached(TenantId tenant) {
  Tenant& t = Get(tenant);
  ++t.cached;
  UpdateOver(tenant, t);
}

void EvictionQueue::RemoveCached(TenantId tenant) {
  Tenant& t = Get(tenant);
  PREFIXD_CHECK(t.cached > 0);
  --t.cached;
  UpdateOver(tenant, t);
}

int64_t EvictionQueue::Cached(TenantId tenant) const {
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.cached;
}

void EvictionQueue::Insert(const Key& key, TenantId tenant) {
  PREFIXD_CHECK(by_time_.emplace(key, tenant).second);
  PREFIXD_CHECK(Get(tenant).leaves.insert(key).second);
}

void EvictionQueue::Erase(const Key& key, TenantId tenant) {
  PREFIXD_CHECK(by_time_.erase(key) == 1);
  PREFIXD_CHECK(Get(tenant).leaves.erase(key) == 1);
}

int32_t EvictionQueue::Pop() {
  PREFIXD_CHECK(!by_time_.empty());
  Key victim = by_time_.begin()->first;
  TenantId owner = by_time_.begin()->second;
  bool over_share = false;
  // Few tenants can be over their share at once (their cached blocks sum to at most the
  // pool), so this scan is short.
  for (TenantId t : over_) {
    const Tenant& state = tenants_.at(t);
    PREFIXD_CHECK_MSG(!state.leaves.empty(), "a tenant over its share has no evictable leaf");
    if (!over_share || *state.leaves.begin() < victim) {
      victim = *state.leaves.begin();
      owner = t;
      over_share = true;
    }
  }
  Erase(victim, owner);
  return std::get<2>(victim);
}

void EvictionQueue::Check(const std::set<std::pair<Key, TenantId>>& leaves,
                          const absl::flat_hash_map<TenantId, int64_t>& cached) const {
  absl::flat_hash_map<TenantId, std::set<Key>> by_tenant;
  for (const auto& [key, tenant] : leaves) by_tenant[tenant].insert(key);
  std::map<Key, TenantId> expected(leaves.begin(), leaves.end());
  PREFIXD_CHECK_MSG(expected == by_time_, "eviction queue is not exactly the cached leaves");
  for (const auto& [id, t] : tenants_) {
    auto it = by_tenant.find(id);
    PREFIXD_CHECK_MSG(t.leaves == (it == by_tenant.end() ? std::set<Key>() : it->second),
                      "a tenant's leaves are not its cached leaves");
    auto c = cached.find(id);
    PREFIXD_CHECK_MSG(t.cached == (c == cached.end() ? 0 : c->second),
                      "a tenant's cached count is wrong");
    PREFIXD_CHECK_MSG((t.cached > t.share) == (over_.count(id) == 1), "over-share set out of date");
  }
  for (const auto& [id, keys] : by_tenant) {
    PREFIXD_CHECK_MSG(tenants_.contains(id), "leaves of an unknown tenant");
  }
  for (const auto& [id, n] : cached) {
    PREFIXD_CHECK_MSG(n == 0 || tenants_.contains(id), "cached blocks of an unknown tenant");
  }
}

}  // namespace prefixd
