// Prompt logprobs: what a request with prompt_logprobs has scored of its prompt so far, and
// the ScoreStore's records (engine/score_store.h) it reads and writes. The scheduler only
// says which rows of a step's logits belong to which request's prompt, and which blocks an
// admission took from the pool or a tier; the scorer fills the entries and records blocks.
//
// Invariants:
// - A request is scoring from Begin until Finish or Forget; entry 0 is always scored
//   (nothing comes before it), entry p > 0 once a row or a record gave its log-probability.
// - `cached` counts the entries first scored from a record rather than a row.
// - A block is recorded in the store only once the pool indexes it and every position in it
//   is scored; the scorer never records a block it does not hold every entry for.
// Engine-thread only.
#ifndef PREFIXD_ENGINE_PROMPT_SCORER_H_
#define PREFIXD_ENGINE_PROMPT_SCORER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "cache/sha256.h"
#include "engine/request.h"
#include "engine/score_store.h"

namespace prefixd {

struct RequestState;  // engine/sequence.h: only its address is used, as the request's handle

class PromptScorer {
 public:
  struct Options {
    ScoreStore* scores = nullptr;  // not owned; null: no records (prompts always computed)
    int32_t block_size = 0;
    int32_t vocab_size = 0;
  };
  explicit PromptScorer(const Options& options);

  // The finished scores of a prompt (Finish): one entry per position, `cached` of them taken
  // from records rather than computed.
  struct Scores {
    std::vector<PromptToken> positions;
    uint32_t cached = 0;
  };

  // Starts scoring `prompt` for `request`, which must not be scoring already.
  void Begin(const RequestState* request, absl::Span<const uint32_t> prompt);
  // Whether `request` is scoring: between Begin and Finish or Forget.
  bool Scoring(const RequestState* request) const { return requests_.contains(request); }

  // The leading blocks of `keys` that have records in the store (0 without a store): what
  // a scoring admission may take from the pool.
  int32_t RecordedPrefixBlocks(absl::Span<const Digest> keys) const;
  // Entries 1..num_cached are scored by rows the request does not compute: takes them from
  // the records of their blocks in `keys`, each of which must be in the store.
  void TakeRecorded(const RequestState* request, absl::Span<const Digest> keys, int32_t num_cached);
  // Blocks first_block .. first_block + records.size() - 1 of `keys` were loaded from a tier
  // with `records` (null where a block had none), and rows up to `cached` are now computed:
  // the records of the blocks now full (indexed) go back into the store. For a scoring
  // `request` (null: none) every record must be present and scores its positions.
  void RestoreLoaded(const RequestState* request, absl::Span<const Digest> keys,
                     int32_t first_block,
                     absl::Span<const std::shared_ptr<const BlockScores>> records, int32_t cached);
  // Rows [start, start + count) of the scoring `request`'s chain were computed and `rows`
  // holds their logits (count x vocab_size): row q scores position q + 1. Then records every
  // block now full (`computed` = start + count rows, indexed by the pool) and fully scored.
  void ScoreRows(const RequestState* request, absl::Span<const Digest> keys, int32_t start,
                 int32_t count, absl::Span<const float> rows);
  // Ends the scoring of `request`, every entry scored, with each entry's top list cut to
  // `top_n` (the request's prompt_logprobs).
  Scores Finish(const RequestState* request, uint32_t top_n);
  // Drops whatever `request` had scored (an ended request).
  void Forget(const RequestState* request) { requests_.erase(request); }

 private:
  struct Entry {
    std::vector<PromptToken> positions;  // kScoreTopK top entries each until Finish
    std::vector<bool> scored;
    int32_t recorded_blocks = 0;  // leading full blocks recorded in or taken from the store
    uint32_t cached = 0;          // entries taken from records
  };
  Entry& Find(const RequestState* request);

  const Options options_;
  absl::flat_hash_map<const RequestState*, Entry> requests_;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_PROMPT_SCORER_H_
