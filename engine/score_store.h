// Score records of full blocks in the KV pool, for prompt logprobs served from the cache.
//
// A block's record holds, for each of its block_size positions, the log-probability of the
// position's own token given every token before it and the kScoreTopK most likely ids there
// (log-softmax of the raw logits of the position before; position 0 of a chain has none).
// All of it depends only on the tokens up to the block's end, i.e. on its chain key, so a
// record is as reusable as the block's K/V — and on the CPU backend the same bits as a cold
// computation.
//
// Invariants: a key has a record only while the pool indexes a block under that key (the
// PromptScorer, engine/prompt_scorer.h, inserts right after MarkComputed indexed it; the
// pool's on_evict hook calls Forget), so a record never outlives its block and the store is
// bounded by the pool.
// Engine-thread only.
//
// Records follow their blocks into the disk tier: a spilled block that has one is written
// with a score section (cache/block_record.h), and a block loaded from such a file gets
// its record back once the pool indexes it.
#ifndef PREFIXD_ENGINE_SCORE_STORE_H_
#define PREFIXD_ENGINE_SCORE_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "cache/block_record.h"
#include "cache/sha256.h"
#include "engine/request.h"

namespace prefixd {

// Top entries kept per position: the API's largest prompt_logprobs, so a record serves any
// request (20 x 8 bytes per position: ~2.6 KB per 16-token block beside its 1.2 MB of K/V).
inline constexpr uint32_t kScoreTopK = 20;

struct BlockScores {
  std::vector<PromptToken> positions;  // block_size entries, kScoreTopK top entries each
};

// A record as a block file's score section, and back. FromPositionScores gives nullopt
// unless there is one entry per token and every id is below `vocab_size` (a section that
// passed its checksum but names no token of this model is not served).
std::vector<PositionScore> ToPositionScores(const BlockScores& scores);
std::optional<BlockScores> FromPositionScores(absl::Span<const uint32_t> tokens,
                                              const std::vector<PositionScore>& section,
                                              uint32_t vocab_size);

class ScoreStore {
 public:
  const BlockScores* Find(const Digest& key) const {
    auto it = records_.find(key);
    return it == records_.end() ? nullptr : it->second.get();
  }
  void Insert(const Digest& key, std::shared_ptr<const BlockScores> scores) {
    records_.insert_or_assign(key, std::move(scores));
  }
  void Forget(const Digest& key) { records_.erase(key); }
  size_t size() const { return records_.size(); }

 private:
  absl::flat_hash_map<Digest, std::shared_ptr<const BlockScores>> records_;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_SCORE_STORE_H_
