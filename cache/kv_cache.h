// KvCache: the block pool, prefix index and per-sequence block tables of one model's KV cache.
//
// cache/ holds no device memory: it hands out block ids and asks the backend to execute
// BlockCopy operations (copy-on-write, partial prefix reuse). One thread (the scheduler) owns
// a KvCache; it is not thread-safe.
//
// Invariants (CheckInvariants() verifies all of them; each has a test):
//  1. Every block is exactly one of: free (ref 0, not indexed, on the free list once), owned
//     (ref >= 1: the number of sequence block-table slots that hold it), or cached (ref 0,
//     indexed, evictable). The pool never grows.
//  2. Only full blocks whose K/V rows are computed are indexed. An indexed block's key is the
//     chain key of its stored token ids (cache/block_key.h) and each key maps to one block.
//  3. An indexed block's parent (the block of the key before it) is indexed too; an owned
//     indexed block's parent is owned. So every cached block can be evicted, leaves first.
//  4. For every sequence and every block position i below num_computed / block_size, the
//     block-table entry is the indexed block of the sequence's own chain key k_i
//     (prefix-cache mode). Rows at or above num_computed are never read by anyone else.
//  5. A block is written in place only while it is private: ref 1 and not indexed. Every
//     other write first moves the sequence to a fresh block (copy-on-write, a BlockCopy).
//  6. A sequence's tokens and chain keys are its TokenChain (cache/token_chain.h), shared with
//     the caller and backing no other live sequence: while the sequence lives the chain
//     changes only through this cache (each call that takes the sequence CHECKs that), so its
//     keys are hashed once, where the chain grows.
//
// Protocol for the engine, per scheduler step:
//   PlanAdmission / Commit (or Admit)  -> execute the returned copies
//   AppendTokens (sampled ids)         -> Reserve(seq, tokens to write up to)
//                                      -> execute the returned copies
//   Forward over BlockTable(seq)       -> MarkComputed(seq, n)
// Copies must be executed in the order they were returned and before the next Forward: a
// block released or evicted by a later call may already be the destination of a later copy.
// MarkComputed may swap a just-completed block for an identical indexed one (deduplication),
// so read BlockTable() afresh before each step instead of keeping an old copy.
#ifndef PREFIXD_CACHE_KV_CACHE_H_
#define PREFIXD_CACHE_KV_CACHE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache/block_copy.h"
#include "cache/digest_hash.h"
#include "cache/eviction_queue.h"
#include "cache/kv_cache_stats.h"
#include "cache/kv_pool.h"
#include "cache/sha256.h"
#include "cache/token_chain.h"

namespace prefixd {

// Sequence ids are never reused within one KvCache.
using SequenceId = int64_t;

// A cached block on its way out of the pool (KvCacheOptions::on_evict). The spans and
// references are valid during the call only.
struct EvictedBlock {
  int32_t block = -1;
  const Digest* key = nullptr;         // its chain key
  const Digest* parent_key = nullptr;  // the key before it: the root for a first block
  const Digest* root = nullptr;        // CacheRootKey(manifest, namespace) of its chain
  absl::Span<const uint32_t> tokens;   // its block_size token ids
};

// A block that just became a full, indexed block (KvCacheOptions::on_index). The spans and
// references are valid during the call only.
struct IndexedBlock {
  int32_t block = -1;
  const Digest* key = nullptr;         // its chain key
  const Digest* parent_key = nullptr;  // the indexed block's key before it; null for a first block
  const Digest* root = nullptr;        // CacheRootKey(manifest, namespace) of its chain
  absl::Span<const uint32_t> tokens;   // its block_size token ids
};

struct KvCacheOptions {
  // The backend's pool (Backend::kv_pool()): num_blocks > 0 and below 2^31, block_size > 0;
  // fixed for the cache's lifetime. bytes_per_token is only used for stats.
  KvPoolShape pool;
  // false (--no-prefix-cache): nothing is matched or indexed; released blocks are freed.
  bool enable_prefix_cache = true;
  // LRU time of cached blocks. Ties (and the default, when unset) are broken by an internal
  // counter that increases on every use, so eviction is deterministic either way.
  std::function<int64_t()> clock;
  // Called for every cached block that is evicted (by an admission, Reserve or Evict), before
  // the block returns to the free list: its K/V rows are still intact during the call, and
  // any block id handed out afterwards may be this one. A disk tier copies the rows here.
  // Must not call back into the KvCache.
  std::function<void(const EvictedBlock&)> on_evict;
  // Called for every block that enters the index (MarkComputed), after it did: the block is
  // visible to admissions from now on. A block that joins an identical indexed one instead
  // (deduplication) is not reported. Must not call back into the KvCache. With on_evict it
  // describes the index exactly: every reported block is indexed until on_evict reports it.
  std::function<void(const IndexedBlock&)> on_index;
  // Called once per first admission (not a readmission) that reads indexed blocks: the blocks
  // it shares by reference, then the block a partial match copies from, all still indexed
  // during the call. Must not call back into the KvCache. For residency metrics (reuse gaps).
  std::function<void(absl::Span<const int32_t> blocks)> on_reuse;
  // Cached (unreferenced) blocks a tenant may hold before its own are evicted first
  // (cache/eviction_queue.h); -1: the pool's size, no share. SetTenantShare overrides it.
  int64_t tenant_share_blocks = -1;
};

struct AdmissionRequest {
  // The prompt (at least one token) under its root key, with its chain keys; block size the
  // cache's. The plan and then the sequence share it: from Commit until Release it changes
  // only through this cache (AppendTokens, Truncate), and the caller reads it.
  std::shared_ptr<TokenChain> chain;
  // Capacity (in tokens) the new sequence's block table must cover:
  //   max(reserve_tokens, num_cached + reserve_uncached_tokens, num_cached + 1).
  // reserve_tokens = prompt.size() reserves the whole prompt; reserve_uncached_tokens = C
  // reserves the first prefill chunk of C tokens after whatever the cache serves.
  int32_t reserve_tokens = 0;
  int32_t reserve_uncached_tokens = 0;
  // A request coming back after preemption: not counted in queried/hit stats.
  bool readmission = false;
  // Whose request this is, for the cache shares (cache/eviction_queue.h): the blocks the
  // sequence indexes are the tenant's. The chain's root already keeps tenants' blocks apart.
  TenantId tenant = 0;
  // Prompt cache retention: keep the prompt's full blocks (those shared now and those its
  // prefill indexes) until this time, in the unit of ExpireRetention's `now` (0: a normal
  // request). A retained block is evicted only after every normal one (eviction_queue.h)
  // and counts against its tenant's share; a tenant retains at most its share of blocks, the
  // retention that lapses soonest giving way. A later retention of a block extends it.
  int64_t retain_until = 0;
  // The present, in the same unit (0: unknown). With it, a first admission that reads a
  // retained block renews the block's retention for as long as it was asked for: retention
  // runs from a block's last use.
  int64_t now = 0;
  // Share whole matching blocks only, no token-granular partial copy after them: the caller
  // fills the following blocks itself (from a disk tier) before marking them computed.
  bool whole_blocks_only = false;
  // At most this many tokens are served from the cache (-1: no limit besides prompt - 1). A
  // cap inside a matched block copies that block's first rows (as a partial match does).
  int32_t max_cached_tokens = -1;
};

// The outcome of PlanAdmission: what Commit will do. Valid only until the next call that
// changes the cache (Commit CHECKs this).
struct AdmissionPlan {
  // Tokens served from the cache: min(matched_tokens, prompt length - 1). The sequence starts
  // with num_computed = num_cached; prefill resumes at that position.
  int32_t num_cached = 0;
  // Longest prefix of the prompt whose K/V the pool holds, before the cap above.
  int32_t matched_tokens = 0;
  // Further prompt tokens beyond num_cached (in whole blocks, capped at prompt - 1) that
  // running sequences are computing right now. A scheduler may defer this request until they
  // are indexed instead of computing them twice.
  int32_t pending_match_tokens = 0;
  int32_t capacity_tokens = 0;     // what the block table will cover
  int32_t blocks_to_allocate = 0;  // fresh blocks (including the partial-copy destination)
  int32_t blocks_to_evict = 0;     // cached blocks evicted to find them

  // Internal to KvCache (kv_cache.cc).
  struct Internal;
  std::shared_ptr<const Internal> internal;
};

struct Admission {
  SequenceId seq = -1;
  int32_t num_cached = 0;
  std::vector<BlockCopy> copies;  // execute before the first Forward of `seq`
  // Of num_cached, the tokens read from retained blocks (before this admission's retention,
  // if any, extended them).
  int32_t retained_tokens = 0;
};

// One indexed block (KvCacheTestPeer::IndexedBlocks).
struct IndexedBlockInfo {
  int32_t block = -1;
  int32_t ref = 0;
  Digest root;
  std::vector<uint32_t> tokens;  // all tokens from the root through this block
  bool operator==(const IndexedBlockInfo&) const = default;
};

enum class BlockState { kFree, kOwned, kCached };

class KvCache {
 public:
  // INVALID_ARGUMENT for a pool of no blocks, more than 2^31 blocks, or no block size. (The
  // operator's block size is checked where it is read: ValidateKvPoolOptions.)
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvCacheOptions& options);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // ---- Admission (plan, then commit) ------------------------------------------------------
  // Pure: matches the prompt and decides which blocks to share, copy, evict and allocate.
  // INVALID_ARGUMENT for an empty prompt; RESOURCE_EXHAUSTED when the blocks cannot be found
  // even after evicting every cached block that this admission does not itself reuse (a
  // request that needs more than num_blocks blocks can never fit: the message says so).
  absl::StatusOr<AdmissionPlan> PlanAdmission(const AdmissionRequest& request) const;
  // Executes a plan made against the current state (CHECKs that nothing changed since).
  Admission Commit(const AdmissionPlan& plan);
  // PlanAdmission + Commit. On error nothing changed.
  absl::StatusOr<Admission> Admit(const AdmissionRequest& request);

  // ---- Running sequences ------------------------------------------------------------------
  // Appends known token ids (e.g. the sampled one) to the sequence's chain, without
  // computing or reserving anything.
  void AppendTokens(SequenceId seq, absl::Span<const uint32_t> tokens);
  // Makes the block table cover `total_tokens` (at least the current capacity is kept) and
  // makes every block that holds rows in [num_computed, total_tokens) private, copying its
  // computed rows first when it is shared or indexed. RESOURCE_EXHAUSTED with nothing
  // changed when the blocks cannot be found even after evicting every cached block (the
  // engine then preempts a sequence). Returns the copies to execute before writing.
  absl::StatusOr<std::vector<BlockCopy>> Reserve(SequenceId seq, int32_t total_tokens);
  // The backend has written K/V rows [0, num_computed) (monotone; <= NumTokens and
  // <= Capacity). Every block that became full is indexed (visible to later admissions) or,
  // when an identical block is indexed already, replaced by it. CHECKs that rows written
  // since the last call lay in private blocks, i.e. that Reserve was called.
  void MarkComputed(SequenceId seq, int32_t num_computed);
  // One child per chain in `children` (each a copy of seq's chain, which the child then
  // shares as in AdmissionRequest), sharing every block of `seq` that holds its tokens (the
  // partly filled last one too), with the same computed count; blocks reserved past the
  // tokens stay the parent's. Allocates nothing; the first write into a shared block copies
  // it (Reserve). Fork after MarkComputed of the rows just written, never between Reserve
  // and it.
  std::vector<SequenceId> Fork(SequenceId seq,
                               absl::Span<const std::shared_ptr<TokenChain>> children);
  // Rolls the sequence back to its first `num_tokens` tokens (<= NumTokens): later blocks
  // are released; num_computed is clamped. Safe with shared and indexed blocks: a later
  // write into them copies first.
  void Truncate(SequenceId seq, int32_t num_tokens);
  // Drops the sequence: its blocks' references drop; indexed blocks left unowned stay cached
  // (evictable), the others return to the free list.
  void Release(SequenceId seq);
  // Evicts up to `max_blocks` cached blocks (LRU leaves first). Returns how many.
  int32_t Evict(int32_t max_blocks);
  // A tenant's share in cached blocks from now on (>= 0; the pool's size turns it off).
  // Retentions beyond a lowered share stay until they lapse or are replaced.
  void SetTenantShare(TenantId tenant, int64_t blocks);
  // Ends every retention with retain_until <= now (the blocks stay cached, as normal ones).
  // Returns how many ended.
  int32_t ExpireRetention(int64_t now);

  // ---- Queries ----------------------------------------------------------------------------
  bool HasSequence(SequenceId seq) const;
  absl::Span<const int32_t> BlockTable(SequenceId seq) const;  // valid until the next change
  absl::Span<const uint32_t> Tokens(SequenceId seq) const;
  // The sequence's tokens and keys (what Fork's chains copy).
  const TokenChain& Chain(SequenceId seq) const;
  int32_t NumTokens(SequenceId seq) const;
  int32_t NumComputed(SequenceId seq) const;
  int32_t Capacity(SequenceId seq) const;  // BlockTable size x block size
  // Blocks the pool can still hand out: free + cached.
  int64_t NumAvailableBlocks() const;
  int32_t block_size() const;
  int32_t num_blocks() const;
  KvCacheStats Stats() const;
  // Per tenant that has had a block or an admission: cached blocks now, hits, evictions.
  absl::flat_hash_map<TenantId, TenantCacheStats> TenantStats() const;

  // ---- Verification -----------------------------------------------------------------------
  // Verifies the invariants above from scratch (O(pool + sequences)); PREFIXD_CHECK fails on
  // any violation.
  void CheckInvariants() const;

 private:
  // The views tests assert exact state with, reached through the friend KvCacheTestPeer
  // (tests/cache/kv_cache_test_peer.h).
  friend class KvCacheTestPeer;
  BlockState StateOf(int32_t block) const;
  int32_t RefCount(int32_t block) const;
  bool IsIndexed(int32_t block) const;
  // Every indexed block, ordered by block id.
  std::vector<IndexedBlockInfo> IndexedBlocks() const;
  // The free list, front (allocated next) first.
  std::vector<int32_t> FreeList() const;
  // Cached blocks in eviction order (the next evicted first), as Evict() would take them.
  std::vector<int32_t> EvictionOrder() const;
  // The complete state (blocks, free list, index, LRU stamps, sequences, stats, counters) as
  // text: equal strings mean equal states. For plan-then-commit tests and failure messages.
  std::string DebugState() const;

  // Data structures (invariants above):
  //  - blocks_[b]: reference count, index membership, chain key, parent block, LRU stamp.
  //  - block_tokens_[b * block_size ...]: the token ids stored with an indexed block, compared
  //    on every hit so that a key collision can never serve another prefix.
  //  - free_ring_: the free block ids (FIFO: freed blocks are reused last, which keeps tests'
  //    block ids predictable).
  //  - index_: chain key -> indexed block; children_: parent key (root or block key) -> the
  //    indexed blocks one level below it, for token-granular partial matches.
  //  - evictable_: the evictable leaves (cached and without indexed children) in eviction
  //    order, with each tenant's cached-block count (cache/eviction_queue.h).
  //  - pending_: chain key -> number of running sequences whose block of that key has all its
  //    tokens but is not computed yet (admissions may wait for them).
  struct Block {
    int32_t ref = 0;
    bool indexed = false;
    int32_t parent = -1;       // indexed: parent block, -1 when the parent is the root
    int32_t num_children = 0;  // indexed blocks whose parent this is
    Digest key{};              // indexed: chain key
    Digest root{};             // indexed: root key of the chain
    int64_t stamp_time = 0;    // cached: LRU time of the last release
    uint64_t stamp_seq = 0;    // cached: tie-break (increases on every release)
    TenantId tenant = 0;       // indexed: the tenant of the sequence that indexed it
    int64_t retain_until = 0;  // indexed: retained until then (0: not retained)
    int64_t retain_for = 0;    // retained: the longest retention asked for it
  };
  struct SeqBlocks {  // one sequence as the cache holds it: its chain and block table
    std::shared_ptr<TokenChain> chain;  // tokens and (prefix-cache mode) keys
    size_t num_tokens = 0;  // chain->size() as this cache left it (a check on outside changes)
    int32_t num_computed = 0;
    std::vector<int32_t> table;
    TenantId tenant = 0;
    int64_t retain_until = 0;   // AdmissionRequest::retain_until
    int64_t now = 0;            // AdmissionRequest::now
    int32_t prompt_blocks = 0;  // full blocks of the prompt: those a retention covers
  };
  using LruKey = EvictionQueue::Key;  // (time, seq, block)

  explicit KvCache(const KvCacheOptions& options);

  const SeqBlocks& Seq(SequenceId id) const;
  SeqBlocks& Seq(SequenceId id);
  int32_t PopFree();
  void PushFree(int32_t b);
  void Acquire(int32_t b);
  void Unref(int32_t b);
  void EvictOne();
  EvictionQueue::Entry QueueEntry(int32_t b) const;
  // Sets a block's retention (0: none), keeping the queue and the retained sets in step.
  void SetRetention(int32_t b, int64_t until);
  // Retains an indexed block until `until` at least, within its tenant's share; `now`
  // (when known) makes until - now the retention a later use renews.
  void Retain(int32_t b, int64_t until, int64_t now);
  bool Private(int32_t b) const { return blocks_[b].ref == 1 && !blocks_[b].indexed; }
  const uint32_t* StoredTokens(int32_t b) const { return &block_tokens_[int64_t{b} * bs_]; }
  void IndexOrDedup(SeqBlocks& s, int32_t i);
  // Moves the pending registration of `s` from block range [old_lo, old_hi) to
  // [new_lo, new_hi); the chain's keys must cover both.
  void UpdatePending(const SeqBlocks& s, int32_t old_lo, int32_t old_hi, int32_t new_lo,
                     int32_t new_hi);
  // The number of the chain's keys this cache uses: all of them in prefix-cache mode, else 0.
  int32_t KnownKeys(const TokenChain& chain) const;

  const KvCacheOptions options_;
  const int32_t bs_;
  const int32_t num_blocks_;
  std::vector<Block> blocks_;
  std::vector<uint32_t> block_tokens_;

  std::vector<int32_t> free_ring_;
  int64_t free_head_ = 0;
  int64_t free_count_ = 0;

  absl::flat_hash_map<Digest, int32_t, DigestHash> index_;
  absl::flat_hash_map<Digest, std::vector<int32_t>, DigestHash> children_;
  EvictionQueue evictable_;
  // Retained blocks by (retain_until, block), all and per tenant: for expiry and the cap.
  std::set<std::pair<int64_t, int32_t>> retained_;
  absl::flat_hash_map<TenantId, std::set<std::pair<int64_t, int32_t>>> retained_by_tenant_;
  absl::flat_hash_map<TenantId, TenantCacheStats> tenant_stats_;
  absl::flat_hash_map<Digest, int32_t, DigestHash> pending_;
  absl::flat_hash_map<SequenceId, SeqBlocks> seqs_;
  absl::flat_hash_set<const TokenChain*> live_chains_;  // one per sequence (invariant 6)

  int64_t num_cached_ = 0;  // ref 0 and indexed
  int64_t num_active_ = 0;  // ref >= 1
  SequenceId next_seq_ = 0;
  uint64_t generation_ = 0;
  uint64_t stamp_counter_ = 0;
  KvCacheStats stats_;  // the counters; block counts are filled in by Stats()
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_KV_CACHE_H_
