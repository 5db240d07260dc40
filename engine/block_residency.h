// BlockResidency: how long the pool's indexed blocks live and how they are used, for the
// cache-residency histograms vLLM exports (block lifetime, idle time before eviction, reuse
// gap). The pool's index, reuse and eviction hooks (cache/kv_cache.h) report each block here.
//
// Definitions (seconds, on the engine's clock):
//  - lifetime: from the block entering the index to its eviction;
//  - idle before eviction: from the block's last use to its eviction, where a use is its
//    indexing or a first admission that reads it (shares it, or copies a partial match
//    from it);
//  - reuse gap: from one use of a block to the next, observed at the later use. Unlike vLLM,
//    which samples 1 % of blocks and keeps four accesses each, every block and every use is
//    counted: the state is two times per block of the fixed pool.
//
// Invariant: a block has state exactly while it is indexed (between OnIndexed and
// OnEvicted). Engine thread only.
#ifndef PREFIXD_ENGINE_BLOCK_RESIDENCY_H_
#define PREFIXD_ENGINE_BLOCK_RESIDENCY_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"

namespace prefixd {

class BlockResidency {
 public:
  struct Observations {
    std::vector<double> lifetime;
    std::vector<double> idle_before_eviction;
    std::vector<double> reuse_gap;
  };

  // `clock` is the engine's (EngineOptions::clock); blocks are the pool's ids [0, num_blocks).
  BlockResidency(int32_t num_blocks, std::function<absl::Time()> clock);

  void OnIndexed(int32_t block);
  void OnReused(absl::Span<const int32_t> blocks);
  void OnEvicted(int32_t block);

  // Appends the observations since the last call to `out`. Between calls at most kMaxPending
  // of each kind are kept (the latest).
  void Drain(Observations* out);

  static constexpr size_t kMaxPending = size_t{1} << 20;

 private:
  struct Times {
    absl::Time indexed = absl::InfinitePast();  // InfinitePast: not indexed
    absl::Time last_use = absl::InfinitePast();
  };
  static void Bound(std::vector<double>* v);

  std::function<absl::Time()> clock_;
  std::vector<Times> blocks_;
  Observations pending_;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_BLOCK_RESIDENCY_H_
