// KvCache's verification side: CheckInvariants() recomputes everything from scratch, and the
// debug views that tests compare.
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/check.h"
#include "cache/block_key.h"
#include "cache/kv_cache.h"

namespace prefixd {

void KvCache::CheckInvariants() const {
  const bool cache_mode = options_.enable_prefix_cache;
  // 1. Reference counts equal the block-table slots of all sequences.
  std::vector<int32_t> owners(num_blocks_, 0);
  absl::flat_hash_map<Digest, int32_t, DigestHash> pending;
  for (const auto& [id, s] : seqs_) {
    // 6. The chain is as this cache left it, and its keys recompute from its tokens.
    PREFIXD_CHECK(s.chain != nullptr && s.chain->size() == s.num_tokens);
    PREFIXD_CHECK(live_chains_.contains(s.chain.get()));
    s.chain->CheckInvariants();
    const absl::Span<const uint32_t> tokens = s.chain->tokens();
    const absl::Span<const Digest> keys = s.chain->keys();
    PREFIXD_CHECK(s.num_computed >= 0);
    PREFIXD_CHECK(s.num_computed <= static_cast<int32_t>(tokens.size()));
    PREFIXD_CHECK(s.num_computed <= static_cast<int32_t>(s.table.size()) * bs_);
    for (int32_t b : s.table) {
      PREFIXD_CHECK(b >= 0 && b < num_blocks_);
      ++owners[b];
    }
    if (!cache_mode) continue;
    // 4. Computed full blocks are the indexed blocks of the sequence's own keys (or, after a
    // key collision, a private block the index could not take).
    const int32_t full = s.num_computed / bs_;
    for (int32_t i = 0; i < full; ++i) {
      const int32_t b = s.table[i];
      auto it = index_.find(keys[i]);
      PREFIXD_CHECK(it != index_.end());
      if (it->second != b) {
        PREFIXD_CHECK(!blocks_[b].indexed);
        PREFIXD_CHECK(!std::ranges::equal(s.chain->block(i),
                                          absl::MakeConstSpan(StoredTokens(it->second), bs_)));
      }
    }
    for (size_t i = full; i < keys.size(); ++i) ++pending[keys[i]];
  }
  PREFIXD_CHECK(pending == pending_);
  PREFIXD_CHECK(live_chains_.size() == seqs_.size());

  // 1. Each block is exactly one of free, owned, cached; the free list has no duplicates.
  std::vector<char> on_free(num_blocks_, 0);
  PREFIXD_CHECK(free_count_ >= 0 && free_count_ <= num_blocks_);
  for (int32_t b : FreeList()) {
    PREFIXD_CHECK(b >= 0 && b < num_blocks_);
    PREFIXD_CHECK_MSG(!on_free[b], "block twice on the free list");
    on_free[b] = 1;
  }
  int64_t n_free = 0, n_active = 0, n_cached = 0;
  size_t n_indexed = 0;
  std::set<EvictionQueue::Entry> leaves;
  std::set<std::pair<int64_t, int32_t>> retained;
  absl::flat_hash_map<TenantId, int64_t> cached_by_tenant;
  std::vector<int32_t> children(num_blocks_, 0);
  for (int32_t b = 0; b < num_blocks_; ++b) {
    const Block& blk = blocks_[b];
    PREFIXD_CHECK(blk.ref == owners[b]);
    if (blk.ref > 0) {
      PREFIXD_CHECK(!on_free[b]);
      ++n_active;
    } else if (blk.indexed) {
      PREFIXD_CHECK(!on_free[b]);
      ++n_cached;
    } else {
      PREFIXD_CHECK_MSG(on_free[b], "unowned, unindexed block missing from the free list");
      ++n_free;
    }
    if (!blk.indexed) continue;
    // 2. and 3.: the index agrees with the block, the key recomputes, the parent is indexed
    // (and owned when this block is).
    PREFIXD_CHECK(cache_mode);
    ++n_indexed;
    auto it = index_.find(blk.key);
    PREFIXD_CHECK(it != index_.end() && it->second == b);
    Digest parent_key = blk.root;
    if (blk.parent >= 0) {
      const Block& p = blocks_[blk.parent];
      PREFIXD_CHECK(p.indexed && p.root == blk.root);
      if (blk.ref > 0) PREFIXD_CHECK_MSG(p.ref > 0, "owned block under a cached parent");
      parent_key = p.key;
      ++children[blk.parent];
    }
    PREFIXD_CHECK(blk.key == ChainKey(parent_key, absl::MakeConstSpan(StoredTokens(b), bs_)));
    auto c = children_.find(parent_key);
    PREFIXD_CHECK(c != children_.end());
    PREFIXD_CHECK(std::count(c->second.begin(), c->second.end(), b) == 1);
  }
  for (int32_t b = 0; b < num_blocks_; ++b) {
    const Block& blk = blocks_[b];
    if (!blk.indexed) continue;
    PREFIXD_CHECK(blk.num_children == children[b]);
    if (blk.ref == 0) ++cached_by_tenant[blk.tenant];
    if (blk.ref == 0 && blk.num_children == 0) leaves.insert(QueueEntry(b));
    if (blk.retain_until > 0) retained.insert({blk.retain_until, b});
    PREFIXD_CHECK_MSG(blk.retain_until > 0 || blk.retain_for == 0,
                      "a block not retained has a retention to renew");
  }
  PREFIXD_CHECK(index_.size() == n_indexed);
  size_t n_child_entries = 0;
  for (const auto& [key, list] : children_) {
    PREFIXD_CHECK(!list.empty());
    n_child_entries += list.size();
  }
  PREFIXD_CHECK(n_child_entries == n_indexed);
  evictable_.Check(leaves, cached_by_tenant);
  for (int32_t b = 0; b < num_blocks_; ++b) {
    PREFIXD_CHECK_MSG(blocks_[b].indexed || blocks_[b].retain_until == 0,
                      "a block outside the index is retained");
  }
  PREFIXD_CHECK_MSG(retained == retained_, "retained set is not the retained blocks");
  size_t retained_total = 0;
  for (const auto& [tenant, mine] : retained_by_tenant_) {
    for (const auto& [until, b] : mine) {
      PREFIXD_CHECK(blocks_[b].tenant == tenant && retained.count({until, b}) == 1);
    }
    retained_total += mine.size();
  }
  PREFIXD_CHECK(retained_total == retained_.size());
  PREFIXD_CHECK(n_free == free_count_);
  PREFIXD_CHECK(n_active == num_active_);
  PREFIXD_CHECK(n_cached == num_cached_);
  PREFIXD_CHECK(n_free + n_active + n_cached == num_blocks_);
}

std::vector<IndexedBlockInfo> KvCache::IndexedBlocks() const {
  std::vector<IndexedBlockInfo> out;
  for (int32_t b = 0; b < num_blocks_; ++b) {
    const Block& blk = blocks_[b];
    if (!blk.indexed) continue;
    IndexedBlockInfo info;
    info.block = b;
    info.ref = blk.ref;
    info.root = blk.root;
    std::vector<int32_t> path;
    for (int32_t x = b; x >= 0; x = blocks_[x].parent) path.push_back(x);
    for (auto x = path.rbegin(); x != path.rend(); ++x) {
      info.tokens.insert(info.tokens.end(), StoredTokens(*x), StoredTokens(*x) + bs_);
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<int32_t> KvCache::EvictionOrder() const {
  EvictionQueue queue = evictable_;
  std::vector<int32_t> children(num_blocks_);
  for (int32_t b = 0; b < num_blocks_; ++b) children[b] = blocks_[b].num_children;
  std::vector<int32_t> out;
  while (!queue.empty()) {
    const int32_t b = queue.Pop();
    queue.RemoveCached(blocks_[b].tenant);
    out.push_back(b);
    const int32_t p = blocks_[b].parent;
    if (p >= 0 && --children[p] == 0 && blocks_[p].ref == 0) {
      queue.Insert(QueueEntry(p));
    }
  }
  return out;
}

std::string KvCache::DebugState() const {
  std::string out = absl::StrFormat("generation=%d next_seq=%d stamp=%d\n", generation_, next_seq_,
                                    stamp_counter_);
  absl::StrAppend(&out, "free=[", absl::StrJoin(FreeList(), ","), "]\n");
  for (int32_t b = 0; b < num_blocks_; ++b) {
    const Block& blk = blocks_[b];
    absl::StrAppend(&out, "block ", b, " ref=", blk.ref);
    if (blk.indexed) {
      absl::StrAppend(&out, " key=", DigestHex(blk.key).substr(0, 16), " parent=", blk.parent,
                      " children=", blk.num_children, " stamp=", blk.stamp_time, "/", blk.stamp_seq,
                      " tenant=", blk.tenant, " retain=", blk.retain_until, " tokens=[",
                      absl::StrJoin(StoredTokens(b), StoredTokens(b) + bs_, ","), "]");
    }
    absl::StrAppend(&out, "\n");
  }
  std::map<SequenceId, const SeqBlocks*> seqs;
  for (const auto& [id, s] : seqs_) seqs[id] = &s;
  for (const auto& [id, s] : seqs) {
    absl::StrAppend(&out, "seq ", id, " root=", DigestHex(s->chain->root()).substr(0, 16),
                    " computed=", s->num_computed, " tokens=[",
                    absl::StrJoin(s->chain->tokens(), ","), "] table=[",
                    absl::StrJoin(s->table, ","), "] keys=", KnownKeys(*s->chain), "\n");
  }
  std::map<std::string, int32_t> pending;
  for (const auto& [k, n] : pending_) pending[DigestHex(k)] = n;
  for (const auto& [k, n] : pending)
    absl::StrAppend(&out, "pending ", k.substr(0, 16), "=", n, "\n");
  const KvCacheStats st = Stats();
  absl::StrAppend(
      &out, absl::StrFormat(
                "stats queried=%d hit=%d free=%d active=%d cached=%d evictions=%d cow=%d/%d\n",
                st.queried_tokens, st.hit_tokens, st.blocks_free, st.blocks_active,
                st.blocks_cached, st.evictions, st.cow_copies, st.cow_rows));
  const absl::flat_hash_map<TenantId, TenantCacheStats> tenants = TenantStats();
  for (const auto& [id, t] : std::map<TenantId, TenantCacheStats>(tenants.begin(), tenants.end())) {
    absl::StrAppend(
        &out, absl::StrFormat("tenant %d share=%d cached=%d hit=%d evictions=%d\n", id,
                              evictable_.Share(id), t.cached_blocks, t.hit_tokens, t.evictions));
  }
  return out;
}

}  // namespace prefixd
