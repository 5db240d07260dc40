// EvictionQueue: the order in which KvCache evicts its cached blocks, with per-tenant shares
// and retained blocks.
//
// Its entries are the evictable leaves of the pool's index (cached: ref 0, indexed, no
// indexed children), each under the tenant whose request indexed it, with its LRU stamp and
// its class: kNormal, or kRetained for a block a request asked to keep (prompt cache
// retention). Separately it counts each tenant's cached blocks (leaves or not). A tenant
// holding more cached blocks than its share is "over its share"; Pop takes the first of
//   1. the least recently used normal leaf among the tenants over their share,
//   2. the least recently used normal leaf of all,
//   3. the least recently used retained leaf among the tenants over their share,
//   4. the least recently used retained leaf of all,
// so a tenant that floods the pool evicts its own old blocks before anyone else's, and a
// retained block goes only after every normal one. Blocks in use (ref >= 1) are not cached:
// they neither count against a share nor are victims. Ties in time are broken by the
// stamp's sequence number: the order is deterministic.
//
// Invariants (Check() verifies them):
//  1. Every entry is in by_time_[class] once (with its tenant) and in its tenant's
//     leaves[class] once, nowhere else.
//  2. over_ is exactly the set of tenants with cached > share.
//  3. A tenant over its share has at least one leaf (KvCache keeps cached blocks closed
//     under children, so a tenant's cached blocks have leaves), checked by Pop.
// Copyable: KvCacheTestPeer previews the order by popping a copy. Not thread-safe.
#ifndef PREFIXD_CACHE_EVICTION_QUEUE_H_
#define PREFIXD_CACHE_EVICTION_QUEUE_H_

#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace prefixd {

// A pool's tenants as small integers the engine assigns (0: requests without a tenant).
using TenantId = int32_t;

class EvictionQueue {
 public:
  // (time, sequence number, block): the LRU stamp of a block's last release, and its id.
  using Key = std::tuple<int64_t, uint64_t, int32_t>;
  enum Class { kNormal = 0, kRetained = 1 };
  struct Entry {
    Key key;
    TenantId tenant = 0;
    Class cls = kNormal;
    auto operator<=>(const Entry&) const = default;
  };

  // `default_share` cached blocks per tenant (the pool's size: no share applies).
  explicit EvictionQueue(int64_t default_share);

  // A tenant's share in blocks, from now on (>= 0).
  void SetShare(TenantId tenant, int64_t blocks);
  int64_t Share(TenantId tenant) const;

  // A block of `tenant` became cached (released by its last owner) or stopped being cached
  // (acquired again, or evicted).
  void AddCached(TenantId tenant);
  void RemoveCached(TenantId tenant);
  int64_t Cached(TenantId tenant) const;

  void Insert(const Entry& e);
  // CHECKs that the entry was there.
  void Erase(const Entry& e);
  bool empty() const { return size() == 0; }
  size_t size() const { return by_time_[kNormal].size() + by_time_[kRetained].size(); }
  // The next victim (see the top), removed. CHECKs !empty().
  int32_t Pop();

  // Verifies the invariants; `leaves` are the pool's evictable leaves and `cached` the
  // cached blocks per tenant, recomputed from scratch by the caller.
  void Check(const std::set<Entry>& leaves,
             const absl::flat_hash_map<TenantId, int64_t>& cached) const;

 private:
  struct Tenant {
    int64_t cached = 0;
    int64_t share = 0;
    std::set<Key> leaves[2];  // by class
  };
  Tenant& Get(TenantId tenant);
  void UpdateOver(TenantId tenant, const Tenant& t);

  int64_t default_share_;
  std::map<Key, TenantId> by_time_[2];  // by class
  absl::flat_hash_map<TenantId, Tenant> tenants_;
  std::set<TenantId> over_;
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_EVICTION_QUEUE_H_
