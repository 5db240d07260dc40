// KvCache's state. Internal: include only from cache/*.cc.
//
// Data structures (invariants in cache/kv_cache.h):
//  - blocks_[b]: reference count, index membership, chain key, parent block, and LRU stamp.
//  - block_tokens_[b * block_size ...]: the token ids stored with an indexed block, compared
//    on every hit so that a key collision can never serve another prefix.
//  - free_: a ring of free block ids (FIFO: freed blocks are reused last, which keeps tests'
//    block ids predictable).
//  - index_: chain key -> indexed block; children_: parent key (root or block key) -> the
//    indexed blocks one level below it, for token-granular partial matches.
//  - lru_: the evictable leaves (cached and without indexed children), oldest first.
//  - pending_: chain key -> number of running sequences whose block of that key has all its
//    tokens but is not computed yet (admissions may wait for them).
#ifndef PREFIXD_CACHE_INTERNAL_KV_CACHE_IMPL_H_
#define PREFIXD_CACHE_INTERNAL_KV_CACHE_IMPL_H_

#include <cstdint>
#include <cstring>
#include <set>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cache/internal/digest_hash.h"
#include "cache/kv_cache.h"

namespace prefixd {

struct AdmissionPlan::Internal {
  uint64_t generation = 0;
  Digest root;
  std::vector<uint32_t> prompt;
  std::vector<Digest> keys;     // chain keys of the prompt's first keys.size() blocks
  std::vector<int32_t> shared;  // indexed blocks shared by reference
  int32_t partial_src = -1;     // block whose first partial_rows rows are copied
  int32_t partial_rows = 0;
  int32_t capacity_blocks = 0;
  int32_t allocate = 0;
  int32_t evict = 0;
  bool readmission = false;
};

class KvCache::Impl {
 public:
  struct Block {
    int32_t ref = 0;
    bool indexed = false;
    int32_t parent = -1;       // indexed: parent block, -1 when the parent is the root
    int32_t num_children = 0;  // indexed blocks whose parent this is
    Digest key{};              // indexed: chain key
    Digest root{};             // indexed: root key of the chain
    int64_t stamp_time = 0;    // cached: LRU time of the last release
    uint64_t stamp_seq = 0;    // cached: tie-break (increases on every release)
  };

  struct Sequence {
    Digest root;
    std::vector<uint32_t> tokens;
    int32_t num_computed = 0;
    std::vector<int32_t> table;
    // Prefix-cache mode: chain keys of every block whose tokens are all known
    // (tokens.size() / block_size of them).
    std::vector<Digest> keys;
  };

  using LruKey = std::tuple<int64_t, uint64_t, int32_t>;  // (time, seq, block)

  explicit Impl(const KvCacheOptions& options);

  // Mutations (kv_cache.cc).
  absl::StatusOr<AdmissionPlan> PlanAdmission(const AdmissionRequest& request) const;
  Admission Commit(const AdmissionPlan& plan);
  void AppendTokens(SequenceId seq, absl::Span<const uint32_t> tokens);
  absl::StatusOr<std::vector<BlockCopy>> Reserve(SequenceId seq, int32_t total_tokens);
  void MarkComputed(SequenceId seq, int32_t num_computed);
  std::vector<SequenceId> Fork(SequenceId seq, int32_t n);
  void Truncate(SequenceId seq, int32_t num_tokens);
  void Release(SequenceId seq);
  int32_t Evict(int32_t max_blocks);

  // Verification (kv_cache_check.cc).
  void CheckInvariants() const;
  std::string DebugState() const;
  std::vector<IndexedBlockInfo> IndexedBlocks() const;
  std::vector<int32_t> EvictionOrder() const;

  const Sequence& Seq(SequenceId id) const;
  Sequence& Seq(SequenceId id);
  KvCacheStats Stats() const;
  int64_t NumAvailable() const { return free_count_ + num_cached_; }
  BlockState StateOf(int32_t b) const;
  std::vector<int32_t> FreeList() const;

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
  std::set<LruKey> lru_;
  absl::flat_hash_map<Digest, int32_t, DigestHash> pending_;
  absl::flat_hash_map<SequenceId, Sequence> seqs_;

  int64_t num_cached_ = 0;  // ref 0 and indexed
  int64_t num_active_ = 0;  // ref >= 1
  SequenceId next_seq_ = 0;
  uint64_t generation_ = 0;
  uint64_t stamp_counter_ = 0;
  KvCacheStats stats_;  // the counters; block counts are filled in by Stats()

 private:
  int32_t PopFree();
  void PushFree(int32_t b);
  void Acquire(int32_t b);
  void Unref(int32_t b);
  void EvictOne();
  bool Private(int32_t b) const { return blocks_[b].ref == 1 && !blocks_[b].indexed; }
  const uint32_t* StoredTokens(int32_t b) const { return &block_tokens_[int64_t{b} * bs_]; }
  void IndexOrDedup(Sequence& s, int32_t i);
  // Moves the pending registration of `s` from block range [old_lo, old_hi) to
  // [new_lo, new_hi); s.keys must cover both.
  void UpdatePending(const Sequence& s, int32_t old_lo, int32_t old_hi, int32_t new_lo,
                     int32_t new_hi);
  void ExtendKeys(Sequence& s);
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_INTERNAL_KV_CACHE_IMPL_H_
