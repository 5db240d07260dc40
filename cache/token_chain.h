// TokenChain: the token ids of one sequence and the chain keys (cache/block_key.h) of its full
// blocks, kept together and grown together. Each key is computed once, when its block fills,
// and every tier reads the same list: the pool matches and indexes by it (cache/kv_cache.h),
// the disk tier looks blocks up by it (cache/disk/disk_tier.h). A request keeps its chain
// while it waits, so planning its admission again (each step, or after a preemption) hashes
// nothing.
//
// Invariants (checked by CheckInvariants, kept by every method):
//  1. keys().size() == size() / block_size(): exactly the full blocks have a key.
//  2. keys()[i] == ChainKey(i == 0 ? root() : keys()[i - 1], tokens of block i).
// Not thread-safe; copyable (a fork copies its parent's chain, keys included).
#ifndef PREFIXD_CACHE_TOKEN_CHAIN_H_
#define PREFIXD_CACHE_TOKEN_CHAIN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "cache/sha256.h"

namespace prefixd {

class TokenChain {
 public:
  // `root` = CacheRootKey(manifest, namespace); `block_size` > 0, the pool's.
  TokenChain(const Digest& root, int32_t block_size, absl::Span<const uint32_t> tokens);

  // Appends tokens, computing the key of every block they fill.
  void Append(absl::Span<const uint32_t> tokens);
  // Keeps the first `num_tokens` (<= size()) tokens and the keys of their full blocks.
  void Truncate(size_t num_tokens);

  const Digest& root() const { return root_; }
  int32_t block_size() const { return block_size_; }
  size_t size() const { return tokens_.size(); }
  absl::Span<const uint32_t> tokens() const { return tokens_; }
  absl::Span<const Digest> keys() const { return keys_; }
  // The block_size() tokens of full block `i`.
  absl::Span<const uint32_t> block(size_t i) const;

  // Recomputes every key from scratch; PREFIXD_CHECK fails on a violation. O(size()).
  void CheckInvariants() const;

 private:
  void ExtendKeys();

  Digest root_;
  int32_t block_size_;
  std::vector<uint32_t> tokens_;
  std::vector<Digest> keys_;
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_TOKEN_CHAIN_H_
