#include "cache/kv_cache.h"

#include <algorithm>
#include <climits>
#include <memory>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/check.h"
#include "cache/block_key.h"

namespace prefixd {

namespace {

int32_t CeilDiv(int64_t a, int32_t b) { return static_cast<int32_t>((a + b - 1) / b); }

// Whether two chains hold the same tokens, in O(block size): the last chain key stands for
// every full block before it (a chain key is collision-resistant over its whole prefix), so
// only the root, the length, that key and the partial block's tokens are compared.
bool SameChain(const TokenChain& a, const TokenChain& b) {
  if (a.size() != b.size() || a.block_size() != b.block_size() || a.root() != b.root()) {
    return false;
  }
  if (!a.keys().empty() && a.keys().back() != b.keys().back()) return false;
  const size_t tail = a.keys().size() * a.block_size();
  return std::ranges::equal(a.tokens().subspan(tail), b.tokens().subspan(tail));
}

}  // namespace

struct AdmissionPlan::Internal {
  uint64_t generation = 0;
  std::shared_ptr<TokenChain> chain;  // the prompt
  std::vector<int32_t> shared;        // indexed blocks shared by reference
  int32_t partial_src = -1;           // block whose first partial_rows rows are copied
  int32_t partial_rows = 0;
  int32_t capacity_blocks = 0;
  int32_t allocate = 0;
  int32_t evict = 0;
  bool readmission = false;
  TenantId tenant = 0;
  int64_t retain_until = 0;
  int64_t now = 0;
};

KvCache::KvCache(const KvCacheOptions& options)
    : options_(options),
      bs_(options.pool.block_size),
      num_blocks_(static_cast<int32_t>(options.pool.num_blocks)),
      blocks_(num_blocks_),
      block_tokens_(static_cast<size_t>(num_blocks_) * bs_),
      free_ring_(num_blocks_),
      evictable_(options.tenant_share_blocks >= 0 ? options.tenant_share_blocks
                                                  : options.pool.num_blocks) {
  for (int32_t b = 0; b < num_blocks_; ++b) free_ring_[b] = b;
  free_count_ = num_blocks_;
  stats_.block_size = bs_;
  stats_.bytes_per_token = options.pool.bytes_per_token;
}

// ---- Block primitives ---------------------------------------------------------------------

int32_t KvCache::PopFree() {
  PREFIXD_CHECK(free_count_ > 0);
  int32_t b = free_ring_[free_head_];
  free_head_ = (free_head_ + 1) % num_blocks_;
  --free_count_;
  Block& blk = blocks_[b];
  PREFIXD_CHECK(blk.ref == 0 && !blk.indexed);
  blk.ref = 1;
  ++num_active_;
  return b;
}

void KvCache::PushFree(int32_t b) {
  PREFIXD_CHECK(free_count_ < num_blocks_);
  free_ring_[(free_head_ + free_count_) % num_blocks_] = b;
  ++free_count_;
}

void KvCache::Acquire(int32_t b) {
  Block& blk = blocks_[b];
  if (blk.ref == 0) {
    PREFIXD_CHECK(blk.indexed);  // a free block is handed out only by PopFree
    if (blk.num_children == 0) evictable_.Erase(QueueEntry(b));
    evictable_.RemoveCached(blk.tenant);
    --num_cached_;
    ++num_active_;
  }
  ++blk.ref;
}

void KvCache::Unref(int32_t b) {
  Block& blk = blocks_[b];
  PREFIXD_CHECK(blk.ref > 0);
  if (--blk.ref > 0) return;
  --num_active_;
  if (!blk.indexed) {
    PushFree(b);
    return;
  }
  ++num_cached_;
  blk.stamp_time = options_.clock ? options_.clock() : 0;
  blk.stamp_seq = ++stamp_counter_;
  evictable_.AddCached(blk.tenant);
  if (blk.num_children == 0) evictable_.Insert(QueueEntry(b));
}

EvictionQueue::Entry KvCache::QueueEntry(int32_t b) const {
  const Block& blk = blocks_[b];
  return {.key = LruKey{blk.stamp_time, blk.stamp_seq, b},
          .tenant = blk.tenant,
          .cls = blk.retain_until > 0 ? EvictionQueue::kRetained : EvictionQueue::kNormal};
}

void KvCache::SetRetention(int32_t b, int64_t until) {
  Block& blk = blocks_[b];
  if (blk.retain_until == until) return;
  if (until == 0) blk.retain_for = 0;
  const bool queued = blk.ref == 0 && blk.indexed && blk.num_children == 0;
  if (queued) evictable_.Erase(QueueEntry(b));
  if (blk.retain_until > 0) {
    PREFIXD_CHECK(retained_.erase({blk.retain_until, b}) == 1);
    PREFIXD_CHECK(retained_by_tenant_[blk.tenant].erase({blk.retain_until, b}) == 1);
  }
  blk.retain_until = until;
  if (until > 0) {
    retained_.insert({until, b});
    retained_by_tenant_[blk.tenant].insert({until, b});
  }
  if (queued) evictable_.Insert(QueueEntry(b));
}

void KvCache::Retain(int32_t b, int64_t until, int64_t now) {
  Block& blk = blocks_[b];
  if (blk.retain_until == 0) {
    // A tenant retains at most its share: the retention that lapses soonest goes first.
    const int64_t share = evictable_.Share(blk.tenant);
    if (share == 0) return;
    std::set<std::pair<int64_t, int32_t>>& mine = retained_by_tenant_[blk.tenant];
    if (static_cast<int64_t>(mine.size()) >= share) {
      if (mine.begin()->first >= until) return;  // every one of them lasts longer
      SetRetention(mine.begin()->second, 0);
    }
  }
  if (until > blk.retain_until) SetRetention(b, until);  // a retention only ever extends
  if (now > 0 && until > now) blk.retain_for = std::max(blk.retain_for, until - now);
}

int32_t KvCache::ExpireRetention(int64_t now) {
  int32_t n = 0;
  while (!retained_.empty() && retained_.begin()->first <= now) {
    SetRetention(retained_.begin()->second, 0);
    ++n;
  }
  if (n > 0) ++generation_;
  return n;
}

void KvCache::EvictOne() {
  const int32_t b = evictable_.Pop();
  Block& blk = blocks_[b];
  PREFIXD_CHECK(blk.ref == 0 && blk.indexed && blk.num_children == 0);
  const Digest& parent_key = blk.parent >= 0 ? blocks_[blk.parent].key : blk.root;
  if (options_.on_evict) {
    options_.on_evict(EvictedBlock{.block = b,
                                   .key = &blk.key,
                                   .parent_key = &parent_key,
                                   .root = &blk.root,
                                   .tokens = absl::MakeConstSpan(StoredTokens(b), bs_)});
  }
  PREFIXD_CHECK(index_.erase(blk.key) == 1);
  auto it = children_.find(parent_key);
  PREFIXD_CHECK(it != children_.end());
  auto& siblings = it->second;
  auto pos = std::find(siblings.begin(), siblings.end(), b);
  PREFIXD_CHECK(pos != siblings.end());
  siblings.erase(pos);
  if (siblings.empty()) children_.erase(it);
  if (blk.parent >= 0) {
    Block& p = blocks_[blk.parent];
    // Leaves before parents: the parent becomes evictable only with its last child gone.
    if (--p.num_children == 0 && p.ref == 0) {
      evictable_.Insert(QueueEntry(blk.parent));
    }
  }
  if (blk.retain_until > 0) {  // out of the queue already: only the retained sets
    PREFIXD_CHECK(retained_.erase({blk.retain_until, b}) == 1);
    PREFIXD_CHECK(retained_by_tenant_[blk.tenant].erase({blk.retain_until, b}) == 1);
    blk.retain_until = 0;
    blk.retain_for = 0;
  }
  blk.indexed = false;
  blk.parent = -1;
  --num_cached_;
  ++stats_.evictions;
  evictable_.RemoveCached(blk.tenant);
  ++tenant_stats_[blk.tenant].evictions;
  PushFree(b);
}

// ---- Sequences' keys and pending blocks -----------------------------------------------------

int32_t KvCache::KnownKeys(const TokenChain& chain) const {
  return options_.enable_prefix_cache ? static_cast<int32_t>(chain.keys().size()) : 0;
}

void KvCache::UpdatePending(const SeqBlocks& s, int32_t old_lo, int32_t old_hi, int32_t new_lo,
                            int32_t new_hi) {
  if (!options_.enable_prefix_cache) return;
  const int32_t lo = std::min(old_lo, new_lo);
  const int32_t hi = std::max(old_hi, new_hi);
  for (int32_t i = lo; i < hi; ++i) {
    const bool was = i >= old_lo && i < old_hi;
    const bool now = i >= new_lo && i < new_hi;
    if (was == now) continue;
    const Digest& key = s.chain->keys()[i];
    if (now) {
      ++pending_[key];
    } else {
      auto it = pending_.find(key);
      PREFIXD_CHECK(it != pending_.end() && it->second > 0);
      if (--it->second == 0) pending_.erase(it);
    }
  }
}

// ---- Admission ------------------------------------------------------------------------------

absl::StatusOr<AdmissionPlan> KvCache::PlanAdmission(const AdmissionRequest& request) const {
  if (request.chain == nullptr) return absl::InvalidArgumentError("no prompt chain");
  const TokenChain& chain_in = *request.chain;
  if (chain_in.block_size() != bs_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prompt chain of block size %d for a pool of %d", chain_in.block_size(), bs_));
  }
  const int64_t prompt_len = static_cast<int64_t>(chain_in.size());
  if (prompt_len == 0) return absl::InvalidArgumentError("empty prompt");
  if (request.reserve_tokens < 0 || request.reserve_uncached_tokens < 0) {
    return absl::InvalidArgumentError("negative reservation");
  }
  auto in = std::make_shared<AdmissionPlan::Internal>();
  in->generation = generation_;
  in->chain = request.chain;
  in->readmission = request.readmission;
  in->tenant = request.tenant;
  in->retain_until = request.retain_until;
  in->now = request.now;
  const uint32_t* prompt = chain_in.tokens().data();
  const absl::Span<const Digest> keys = chain_in.keys();

  // Whole blocks first: walk the chain while each key is indexed with the same tokens.
  int32_t matched_blocks = 0;
  int32_t partial_block = -1;
  int32_t partial_rows = 0;
  std::vector<int32_t> chain;
  const int32_t full_blocks = static_cast<int32_t>(prompt_len / bs_);
  if (options_.enable_prefix_cache) {
    const Digest* parent = &chain_in.root();
    while (matched_blocks < full_blocks) {
      const uint32_t* toks = prompt + int64_t{matched_blocks} * bs_;
      const Digest& key = keys[matched_blocks];
      auto it = index_.find(key);
      if (it == index_.end()) break;
      if (!std::equal(toks, toks + bs_, StoredTokens(it->second))) break;  // collision
      chain.push_back(it->second);
      parent = &key;
      ++matched_blocks;
    }
    // Then token granularity: the child of the last matched key sharing the most leading
    // tokens with the rest of the prompt (first such child on ties).
    const int64_t start = int64_t{matched_blocks} * bs_;
    const int64_t rest = std::min<int64_t>(bs_, prompt_len - start);
    if (rest > 0 && !request.whole_blocks_only) {
      auto it = children_.find(*parent);
      if (it != children_.end()) {
        for (int32_t child : it->second) {
          const uint32_t* stored = StoredTokens(child);
          int32_t m = 0;
          while (m < rest && stored[m] == prompt[start + m]) ++m;
          if (m > partial_rows) {
            partial_rows = m;
            partial_block = child;
          }
        }
      }
    }
  }
  AdmissionPlan plan;
  plan.matched_tokens = matched_blocks * bs_ + partial_rows;
  plan.num_cached = static_cast<int32_t>(std::min<int64_t>(plan.matched_tokens, prompt_len - 1));
  if (request.max_cached_tokens >= 0) {
    plan.num_cached = std::min(plan.num_cached, request.max_cached_tokens);
  }
  const int32_t shared_blocks = plan.num_cached / bs_;
  in->partial_rows = plan.num_cached % bs_;
  if (in->partial_rows > 0) {
    // Capped at prompt - 1 inside a fully matched block: copy from that block.
    in->partial_src = shared_blocks < matched_blocks ? chain[shared_blocks] : partial_block;
  }
  in->shared.assign(chain.begin(), chain.begin() + shared_blocks);

  // Blocks that running sequences are computing right after the match.
  int64_t pending_upto = 0;  // the prompt is computed up to here once they are done
  if (options_.enable_prefix_cache && !pending_.empty() && matched_blocks < full_blocks) {
    int32_t p = 0;
    for (int32_t i = matched_blocks; i < full_blocks; ++i) {
      if (!pending_.contains(keys[i])) break;
      ++p;
    }
    if (p > 0) pending_upto = std::min<int64_t>(int64_t{matched_blocks + p} * bs_, prompt_len - 1);
  }

  // Cached blocks this admission reuses cannot also be evicted for it.
  int64_t reused_cached = 0;
  for (int32_t b : in->shared) reused_cached += blocks_[b].ref == 0;
  const int64_t available = free_count_ + num_cached_ - reused_cached;
  auto capacity_blocks_for = [&](int64_t num_cached) {
    const int64_t capacity =
        std::max<int64_t>({int64_t{request.reserve_tokens},
                           num_cached + request.reserve_uncached_tokens, num_cached + 1});
    return (capacity + bs_ - 1) / bs_;
  };
  int64_t capacity_blocks = capacity_blocks_for(plan.num_cached);
  // A cached copy source that only this admission would hold takes one more block.
  int64_t source_cost = in->partial_src >= 0 && blocks_[in->partial_src].ref == 0 ? 1 : 0;
  if (in->partial_src >= 0 && (capacity_blocks > num_blocks_ ||
                               capacity_blocks - shared_blocks > available - source_cost)) {
    // It does not fit with the partial copy: compute those rows instead. Otherwise a request
    // that needs the whole pool would wait forever behind its own copy source.
    plan.num_cached -= in->partial_rows;
    in->partial_rows = 0;
    in->partial_src = -1;
    source_cost = 0;
    capacity_blocks = capacity_blocks_for(plan.num_cached);
  }
  if (capacity_blocks > num_blocks_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "request needs %d KV blocks of %d tokens but the pool has only %d; it can never fit",
        capacity_blocks, bs_, num_blocks_));
  }
  const int64_t usable = available - source_cost;
  plan.pending_match_tokens =
      static_cast<int32_t>(std::max<int64_t>(0, pending_upto - plan.num_cached));
  in->capacity_blocks = static_cast<int32_t>(capacity_blocks);
  in->allocate = in->capacity_blocks - shared_blocks;
  if (in->allocate > usable) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV pool full: admission needs %d blocks, %d can be freed", in->allocate, usable));
  }
  in->evict = static_cast<int32_t>(std::max<int64_t>(0, in->allocate - free_count_));
  plan.capacity_tokens = in->capacity_blocks * bs_;
  plan.blocks_to_allocate = in->allocate;
  plan.blocks_to_evict = in->evict;
  plan.internal = std::move(in);
  return plan;
}

Admission KvCache::Commit(const AdmissionPlan& plan) {
  PREFIXD_CHECK(plan.internal != nullptr);
  const AdmissionPlan::Internal& in = *plan.internal;
  PREFIXD_CHECK_MSG(in.generation == generation_, "plan is stale: the cache changed since");
  ++generation_;
  Admission out;
  out.seq = next_seq_++;
  out.num_cached = plan.num_cached;
  PREFIXD_CHECK_MSG(live_chains_.insert(in.chain.get()).second,
                    "the chain already backs a live sequence");
  SeqBlocks& s = seqs_[out.seq];
  s.chain = in.chain;
  s.tenant = in.tenant;
  s.retain_until = in.retain_until;
  s.now = in.now;
  s.prompt_blocks = static_cast<int32_t>(s.chain->size() / bs_);
  s.num_tokens = s.chain->size();
  s.num_computed = plan.num_cached;
  s.table.reserve(in.capacity_blocks);
  // Counted before any retention changes: a retention taken below may, at the tenant's
  // share, end that of a block this admission reads.
  for (int32_t b : in.shared) {
    if (blocks_[b].retain_until > 0) out.retained_tokens += bs_;
  }
  if (in.partial_src >= 0 && blocks_[in.partial_src].retain_until > 0) {
    out.retained_tokens += in.partial_rows;
  }
  out.retained_tokens = std::min(out.retained_tokens, plan.num_cached);
  for (int32_t b : in.shared) {
    // A use renews the retention (for as long as it was asked for).
    if (blocks_[b].retain_until > 0 && in.now > 0 && blocks_[b].retain_for > 0) {
      Retain(b, in.now + blocks_[b].retain_for, in.now);
    }
    Acquire(b);
    s.table.push_back(b);
    if (s.retain_until > 0) Retain(b, s.retain_until, s.now);
  }
  // Hold the copy source so that the evictions below cannot take it.
  if (in.partial_src >= 0) Acquire(in.partial_src);
  for (int32_t i = 0; i < in.evict; ++i) EvictOne();
  for (int32_t i = 0; i < in.allocate; ++i) s.table.push_back(PopFree());
  if (in.partial_src >= 0) {
    out.copies.push_back(BlockCopy{in.partial_src, s.table[in.shared.size()], in.partial_rows});
    ++stats_.cow_copies;
    stats_.cow_rows += in.partial_rows;
    Unref(in.partial_src);
  }
  const int32_t lo = s.num_computed / bs_;
  UpdatePending(s, lo, lo, lo, KnownKeys(*s.chain));
  if (!in.readmission) {
    stats_.queried_tokens += s.num_tokens;
    stats_.hit_tokens += plan.num_cached;
    tenant_stats_[in.tenant].hit_tokens += static_cast<uint64_t>(plan.num_cached);
    if (options_.on_reuse && (!in.shared.empty() || in.partial_src >= 0)) {
      std::vector<int32_t> read = in.shared;
      if (in.partial_src >= 0) read.push_back(in.partial_src);
      options_.on_reuse(read);
    }
  }
  return out;
}

// ---- Running sequences ----------------------------------------------------------------------

void KvCache::AppendTokens(SequenceId id, absl::Span<const uint32_t> tokens) {
  SeqBlocks& s = Seq(id);
  ++generation_;
  const int32_t old_hi = KnownKeys(*s.chain);
  s.chain->Append(tokens);
  s.num_tokens = s.chain->size();
  const int32_t lo = s.num_computed / bs_;
  UpdatePending(s, lo, old_hi, lo, KnownKeys(*s.chain));
}

absl::StatusOr<std::vector<BlockCopy>> KvCache::Reserve(SequenceId id, int32_t total_tokens) {
  SeqBlocks& s = Seq(id);
  PREFIXD_CHECK(total_tokens >= 0);
  const int32_t old_blocks = static_cast<int32_t>(s.table.size());
  const int32_t want_blocks = std::max(old_blocks, CeilDiv(total_tokens, bs_));
  if (want_blocks > num_blocks_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "sequence needs %d KV blocks but the pool has only %d", want_blocks, num_blocks_));
  }
  // Blocks that will receive rows [num_computed, total_tokens) and are not private.
  std::vector<int32_t> cow;
  if (total_tokens > s.num_computed) {
    const int32_t end = std::min(old_blocks, CeilDiv(total_tokens, bs_));
    for (int32_t i = s.num_computed / bs_; i < end; ++i) {
      if (!Private(s.table[i])) cow.push_back(i);
    }
  }
  const int64_t need = int64_t{want_blocks - old_blocks} + static_cast<int64_t>(cow.size());
  if (need > NumAvailableBlocks()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV pool full: sequence needs %d more blocks, %d can be freed", need,
                        NumAvailableBlocks()));
  }
  std::vector<BlockCopy> copies;
  if (need == 0) return copies;
  ++generation_;
  const int64_t evict = std::max<int64_t>(0, need - free_count_);
  for (int64_t i = 0; i < evict; ++i) EvictOne();
  std::vector<int32_t> old;
  for (int32_t i : cow) {
    const int32_t src = s.table[i];
    const int32_t dst = PopFree();
    const int32_t rows = std::clamp(s.num_computed - i * bs_, 0, bs_);
    if (rows > 0) {
      copies.push_back(BlockCopy{src, dst, rows});
      ++stats_.cow_copies;
      stats_.cow_rows += rows;
    }
    s.table[i] = dst;
    old.push_back(src);
  }
  while (static_cast<int32_t>(s.table.size()) < want_blocks) s.table.push_back(PopFree());
  // Dropped last: a source that becomes cached stays intact until a later call evicts it,
  // and the copies above come before anything that call hands out.
  for (int32_t b : old) Unref(b);
  return copies;
}

void KvCache::IndexOrDedup(SeqBlocks& s, int32_t i) {
  const absl::Span<const Digest> keys = s.chain->keys();
  const Digest& key = keys[i];
  const uint32_t* toks = s.chain->block(i).data();
  const int32_t b = s.table[i];
  auto it = index_.find(key);
  if (it != index_.end()) {
    const int32_t other = it->second;
    if (other != b && std::equal(toks, toks + bs_, StoredTokens(other))) {
      // Same prefix computed twice (e.g. two identical prompts at once): keep the indexed
      // block so that one chain serves both, and free ours.
      Acquire(other);
      s.table[i] = other;
      Unref(b);
      if (s.retain_until > 0 && i < s.prompt_blocks) Retain(other, s.retain_until, s.now);
    }
    // A different block under the same key is a SHA-256 collision: ours stays unindexed.
    return;
  }
  Block& blk = blocks_[b];
  PREFIXD_CHECK(Private(b));
  const int32_t parent = i == 0 ? -1 : s.table[i - 1];
  if (parent >= 0) {
    PREFIXD_CHECK(blocks_[parent].indexed && blocks_[parent].key == keys[i - 1]);
    ++blocks_[parent].num_children;
  }
  blk.indexed = true;
  blk.key = key;
  blk.root = s.chain->root();
  blk.tenant = s.tenant;
  blk.parent = parent;
  blk.num_children = 0;
  std::copy(toks, toks + bs_, &block_tokens_[int64_t{b} * bs_]);
  index_.emplace(key, b);
  children_[i == 0 ? s.chain->root() : keys[i - 1]].push_back(b);
  if (s.retain_until > 0 && i < s.prompt_blocks) Retain(b, s.retain_until, s.now);
  if (options_.on_index) {
    options_.on_index(IndexedBlock{.block = b,
                                   .key = &blk.key,
                                   .parent_key = i == 0 ? nullptr : &keys[i - 1],
                                   .root = &blk.root,
                                   .tokens = absl::MakeConstSpan(StoredTokens(b), bs_)});
  }
}

void KvCache::MarkComputed(SequenceId id, int32_t num_computed) {
  SeqBlocks& s = Seq(id);
  PREFIXD_CHECK(num_computed >= s.num_computed);
  PREFIXD_CHECK(num_computed <= static_cast<int32_t>(s.num_tokens));
  PREFIXD_CHECK(num_computed <= static_cast<int32_t>(s.table.size()) * bs_);
  if (num_computed == s.num_computed) return;
  ++generation_;
  for (int32_t i = s.num_computed / bs_; i < CeilDiv(num_computed, bs_); ++i) {
    PREFIXD_CHECK_MSG(Private(s.table[i]), "rows written into a shared block: call Reserve");
  }
  const int32_t old_full = s.num_computed / bs_;
  const int32_t new_full = num_computed / bs_;
  s.num_computed = num_computed;
  if (!options_.enable_prefix_cache) return;
  const int32_t hi = KnownKeys(*s.chain);
  UpdatePending(s, old_full, hi, new_full, hi);
  for (int32_t i = old_full; i < new_full; ++i) IndexOrDedup(s, i);
}

std::vector<SequenceId> KvCache::Fork(SequenceId id,
                                      absl::Span<const std::shared_ptr<TokenChain>> children) {
  Seq(id);  // CHECKs that it exists before the map may rehash
  ++generation_;
  std::vector<SequenceId> out;
  for (const std::shared_ptr<TokenChain>& chain : children) {
    const SequenceId child_id = next_seq_++;
    SeqBlocks child;
    {
      const SeqBlocks& p = Seq(id);
      PREFIXD_CHECK_MSG(chain != nullptr && chain != p.chain && SameChain(*chain, *p.chain),
                        "a fork's chain must be a copy of its parent's");
      PREFIXD_CHECK_MSG(live_chains_.insert(chain.get()).second,
                        "the chain already backs a live sequence");
      child.chain = chain;
      child.tenant = p.tenant;
      child.retain_until = p.retain_until;
      child.now = p.now;
      child.prompt_blocks = p.prompt_blocks;
      child.num_tokens = p.num_tokens;
      child.num_computed = p.num_computed;
      const size_t shared =
          std::min(p.table.size(), static_cast<size_t>(CeilDiv(p.num_tokens, bs_)));
      child.table.assign(p.table.begin(), p.table.begin() + shared);
    }
    for (int32_t b : child.table) Acquire(b);
    const int32_t lo = child.num_computed / bs_;
    UpdatePending(child, lo, lo, lo, KnownKeys(*child.chain));
    seqs_.emplace(child_id, std::move(child));
    out.push_back(child_id);
  }
  return out;
}

void KvCache::Truncate(SequenceId id, int32_t num_tokens) {
  SeqBlocks& s = Seq(id);
  PREFIXD_CHECK(num_tokens >= 0 && num_tokens <= static_cast<int32_t>(s.num_tokens));
  ++generation_;
  const int32_t old_lo = s.num_computed / bs_;
  const int32_t old_hi = KnownKeys(*s.chain);
  s.num_computed = std::min(s.num_computed, num_tokens);
  const int32_t new_lo = s.num_computed / bs_;
  const int32_t new_hi = options_.enable_prefix_cache ? num_tokens / bs_ : 0;
  UpdatePending(s, old_lo, old_hi, new_lo, new_hi);
  s.chain->Truncate(static_cast<size_t>(num_tokens));
  s.num_tokens = s.chain->size();
  const size_t keep = static_cast<size_t>(CeilDiv(num_tokens, bs_));
  while (s.table.size() > keep) {
    Unref(s.table.back());
    s.table.pop_back();
  }
}

void KvCache::Release(SequenceId id) {
  auto it = seqs_.find(id);
  PREFIXD_CHECK_MSG(it != seqs_.end(), "unknown sequence");
  ++generation_;
  SeqBlocks& s = it->second;
  PREFIXD_CHECK_MSG(s.chain->size() == s.num_tokens, "sequence chain changed outside the cache");
  const int32_t lo = s.num_computed / bs_;
  const int32_t hi = KnownKeys(*s.chain);
  UpdatePending(s, lo, hi, lo, lo);
  // Deepest first, so that among blocks released together the leaves are the older ones.
  for (auto b = s.table.rbegin(); b != s.table.rend(); ++b) Unref(*b);
  live_chains_.erase(s.chain.get());
  seqs_.erase(it);
}

int32_t KvCache::Evict(int32_t max_blocks) {
  int32_t n = 0;
  if (max_blocks > 0 && !evictable_.empty()) ++generation_;
  while (n < max_blocks && !evictable_.empty()) {
    EvictOne();
    ++n;
  }
  return n;
}

// ---- Queries --------------------------------------------------------------------------------

const KvCache::SeqBlocks& KvCache::Seq(SequenceId id) const {
  auto it = seqs_.find(id);
  PREFIXD_CHECK_MSG(it != seqs_.end(), "unknown sequence");
  PREFIXD_CHECK_MSG(it->second.chain->size() == it->second.num_tokens,
                    "sequence chain changed outside the cache");
  return it->second;
}

KvCache::SeqBlocks& KvCache::Seq(SequenceId id) {
  return const_cast<SeqBlocks&>(std::as_const(*this).Seq(id));
}

void KvCache::SetTenantShare(TenantId tenant, int64_t blocks) {
  PREFIXD_CHECK(blocks >= 0);
  evictable_.SetShare(tenant, blocks);
}

absl::flat_hash_map<TenantId, TenantCacheStats> KvCache::TenantStats() const {
  absl::flat_hash_map<TenantId, TenantCacheStats> out = tenant_stats_;
  for (auto& [tenant, stats] : out) {
    stats.cached_blocks = evictable_.Cached(tenant);
    auto it = retained_by_tenant_.find(tenant);
    stats.retained_blocks =
        it == retained_by_tenant_.end() ? 0 : static_cast<int64_t>(it->second.size());
  }
  return out;
}

KvCacheStats KvCache::Stats() const {
  KvCacheStats s = stats_;
  s.blocks_total = num_blocks_;
  s.blocks_free = free_count_;
  s.blocks_active = num_active_;
  s.blocks_cached = num_cached_;
  s.pool_bytes = options_.pool.pool_bytes();
  s.num_sequences = static_cast<int64_t>(seqs_.size());
  return s;
}

BlockState KvCache::StateOf(int32_t b) const {
  PREFIXD_CHECK(b >= 0 && b < num_blocks_);
  if (blocks_[b].ref > 0) return BlockState::kOwned;
  return blocks_[b].indexed ? BlockState::kCached : BlockState::kFree;
}

std::vector<int32_t> KvCache::FreeList() const {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < free_count_; ++i) {
    out.push_back(free_ring_[(free_head_ + i) % num_blocks_]);
  }
  return out;
}

// ---- KvCache --------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheOptions& options) {
  const KvPoolShape& pool = options.pool;
  if (pool.num_blocks <= 0 || pool.num_blocks > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a KV pool of %d blocks: need 1 to 2^31 - 1", pool.num_blocks));
  }
  if (pool.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a KV pool of block size %d: need at least 1", pool.block_size));
  }
  if (pool.bytes_per_token < 0) return absl::InvalidArgumentError("bytes_per_token < 0");
  return std::unique_ptr<KvCache>(new KvCache(options));
}

KvCache::~KvCache() = default;

absl::StatusOr<Admission> KvCache::Admit(const AdmissionRequest& request) {
  absl::StatusOr<AdmissionPlan> plan = PlanAdmission(request);
  if (!plan.ok()) return plan.status();
  return Commit(*plan);
}

bool KvCache::HasSequence(SequenceId seq) const { return seqs_.contains(seq); }
absl::Span<const int32_t> KvCache::BlockTable(SequenceId seq) const { return Seq(seq).table; }
absl::Span<const uint32_t> KvCache::Tokens(SequenceId seq) const {
  return Seq(seq).chain->tokens();
}
const TokenChain& KvCache::Chain(SequenceId seq) const { return *Seq(seq).chain; }
int32_t KvCache::NumTokens(SequenceId seq) const {
  return static_cast<int32_t>(Seq(seq).num_tokens);
}
int32_t KvCache::NumComputed(SequenceId seq) const { return Seq(seq).num_computed; }
int32_t KvCache::Capacity(SequenceId seq) const {
  return static_cast<int32_t>(Seq(seq).table.size()) * bs_;
}
int64_t KvCache::NumAvailableBlocks() const { return free_count_ + num_cached_; }
int32_t KvCache::block_size() const { return bs_; }
int32_t KvCache::num_blocks() const { return num_blocks_; }
int32_t KvCache::RefCount(int32_t block) const {
  PREFIXD_CHECK(block >= 0 && block < num_blocks_);
  return blocks_[block].ref;
}
bool KvCache::IsIndexed(int32_t block) const {
  PREFIXD_CHECK(block >= 0 && block < num_blocks_);
  return blocks_[block].indexed;
}

}  // namespace prefixd
