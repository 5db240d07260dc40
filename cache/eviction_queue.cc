#include "cache/eviction_queue.h"

#include <optional>
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

void EvictionQueue::Insert(const Entry& e) {
  PREFIXD_CHECK(by_time_[e.cls].emplace(e.key, e.tenant).second);
  PREFIXD_CHECK(Get(e.tenant).leaves[e.cls].insert(e.key).second);
}

void EvictionQueue::Erase(const Entry& e) {
  PREFIXD_CHECK(by_time_[e.cls].erase(e.key) == 1);
  PREFIXD_CHECK(Get(e.tenant).leaves[e.cls].erase(e.key) == 1);
}

int32_t EvictionQueue::Pop() {
  PREFIXD_CHECK(!empty());
  for (Class cls : {kNormal, kRetained}) {
    // Few tenants can be over their share at once (their cached blocks sum to at most the
    // pool), so this scan is short.
    std::optional<Entry> victim;
    for (TenantId t : over_) {
      const std::set<Key>& leaves = tenants_.at(t).leaves[cls];
      if (!leaves.empty() && (!victim || *leaves.begin() < victim->key)) {
        victim = Entry{*leaves.begin(), t, cls};
      }
    }
    if (!victim && !by_time_[cls].empty()) {
      victim = Entry{by_time_[cls].begin()->first, by_time_[cls].begin()->second, cls};
    }
    if (victim) {
      Erase(*victim);
      return std::get<2>(victim->key);
    }
  }
  PREFIXD_CHECK(false);
  return -1;
}

void EvictionQueue::Check(const std::set<Entry>& leaves,
                          const absl::flat_hash_map<TenantId, int64_t>& cached) const {
  std::map<Key, TenantId> by_time[2];
  absl::flat_hash_map<TenantId, std::set<Key>> by_tenant[2];
  for (const Entry& e : leaves) {
    by_time[e.cls].emplace(e.key, e.tenant);
    by_tenant[e.cls][e.tenant].insert(e.key);
  }
  for (Class cls : {kNormal, kRetained}) {
    PREFIXD_CHECK_MSG(by_time[cls] == by_time_[cls],
                      "eviction queue is not exactly the cached leaves");
    for (const auto& [id, keys] : by_tenant[cls]) {
      PREFIXD_CHECK_MSG(tenants_.contains(id), "leaves of an unknown tenant");
    }
  }
  for (const auto& [id, t] : tenants_) {
    for (Class cls : {kNormal, kRetained}) {
      auto it = by_tenant[cls].find(id);
      PREFIXD_CHECK_MSG(
          t.leaves[cls] == (it == by_tenant[cls].end() ? std::set<Key>() : it->second),
          "a tenant's leaves are not its cached leaves");
    }
    auto c = cached.find(id);
    PREFIXD_CHECK_MSG(t.cached == (c == cached.end() ? 0 : c->second),
                      "a tenant's cached count is wrong");
    PREFIXD_CHECK_MSG((t.cached > t.share) == (over_.count(id) == 1), "over-share set out of date");
    PREFIXD_CHECK_MSG(
        t.cached <= t.share || !t.leaves[kNormal].empty() || !t.leaves[kRetained].empty(),
        "a tenant over its share has no evictable leaf");
  }
  for (const auto& [id, n] : cached) {
    PREFIXD_CHECK_MSG(n == 0 || tenants_.contains(id), "cached blocks of an unknown tenant");
  }
}

}  // namespace prefixd
