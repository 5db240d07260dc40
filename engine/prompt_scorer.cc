#include "engine/prompt_scorer.h"

#include <algorithm>
#include <utility>

#include "base/check.h"
#include "engine/sampler.h"

namespace prefixd {

PromptScorer::PromptScorer(const Options& options) : options_(options) {
  PREFIXD_CHECK(options_.block_size > 0 && options_.vocab_size > 0);
}

void PromptScorer::Begin(const RequestState* request, absl::Span<const uint32_t> prompt) {
  PREFIXD_CHECK(!prompt.empty());
  auto [it, inserted] = requests_.try_emplace(request);
  PREFIXD_CHECK(inserted);
  Entry& e = it->second;
  e.positions.resize(prompt.size());
  for (size_t p = 0; p < prompt.size(); ++p) e.positions[p].token_id = prompt[p];
  e.scored.assign(prompt.size(), false);
  e.scored[0] = true;  // nothing comes before position 0
}

PromptScorer::Entry& PromptScorer::Find(const RequestState* request) {
  auto it = requests_.find(request);
  PREFIXD_CHECK_MSG(it != requests_.end(), "the request is not scoring its prompt");
  return it->second;
}

int32_t PromptScorer::RecordedPrefixBlocks(absl::Span<const Digest> keys) const {
  if (options_.scores == nullptr) return 0;
  int32_t m = 0;
  while (m < static_cast<int32_t>(keys.size()) && options_.scores->Find(keys[m]) != nullptr) ++m;
  return m;
}

void PromptScorer::TakeRecorded(const RequestState* request, absl::Span<const Digest> keys,
                                int32_t num_cached) {
  Entry& e = Find(request);
  const int32_t bs = options_.block_size;
  for (int32_t p = 1; p <= num_cached; ++p) {
    if (e.scored[p]) continue;
    const BlockScores* record = options_.scores->Find(keys[p / bs]);
    PREFIXD_CHECK(record != nullptr);
    const PromptToken& entry = record->positions[p % bs];
    PREFIXD_CHECK(entry.token_id == e.positions[p].token_id && entry.has_logprob);
    e.positions[p] = entry;
    e.scored[p] = true;
    ++e.cached;
  }
  e.recorded_blocks = std::max(e.recorded_blocks, (num_cached + 1) / bs);
}

void PromptScorer::RestoreLoaded(const RequestState* request, absl::Span<const Digest> keys,
                                 int32_t first_block,
                                 absl::Span<const std::shared_ptr<const BlockScores>> records,
                                 int32_t cached) {
  const int32_t bs = options_.block_size;
  // Records come back with their blocks once the pool indexes them (every block now full);
  // a last block still private gets its own from the rows (a scoring request) or stays in
  // its tier only.
  const int32_t full = cached / bs;
  if (options_.scores != nullptr) {
    for (int32_t b = first_block; b < full; ++b) {
      const std::shared_ptr<const BlockScores>& record = records[b - first_block];
      if (record != nullptr) options_.scores->Insert(keys[b], record);
    }
  }
  if (request == nullptr) return;
  // The loaded blocks' records score their positions; position `cached` + 1 on, the rows.
  Entry& e = Find(request);
  for (size_t i = 0; i < records.size(); ++i) {
    const BlockScores& record = *records[i];
    const int32_t b = first_block + static_cast<int32_t>(i);
    for (int32_t j = 0; j < bs; ++j) {
      const int32_t p = b * bs + j;
      if (e.scored[p]) continue;
      e.positions[p] = record.positions[j];
      e.scored[p] = true;
      ++e.cached;
    }
  }
  e.recorded_blocks = std::max(e.recorded_blocks, full);
}

void PromptScorer::ScoreRows(const RequestState* request, absl::Span<const Digest> keys,
                             int32_t start, int32_t count, absl::Span<const float> rows) {
  Entry& e = Find(request);
  const size_t vocab = static_cast<size_t>(options_.vocab_size);
  const int32_t prompt_size = static_cast<int32_t>(e.positions.size());
  PREFIXD_CHECK(rows.size() == static_cast<size_t>(count) * vocab);
  // Row q's logits score position q + 1.
  for (int32_t i = 0; i < count; ++i) {
    const int32_t p = start + i + 1;
    if (p >= prompt_size) break;
    const uint32_t token = e.positions[p].token_id;
    const SampledToken t =
        ScoreToken(rows.subspan(static_cast<size_t>(i) * vocab, vocab), token, kScoreTopK);
    e.positions[p] = {
        .token_id = token, .has_logprob = true, .logprob = t.token.logprob, .top = t.top};
    e.scored[p] = true;
  }
  if (options_.scores == nullptr) return;
  // Record every block now full, indexed (the caller marked the rows computed) and scored at
  // each position.
  const int32_t bs = options_.block_size;
  const int32_t computed = start + count;
  while ((e.recorded_blocks + 1) * bs <= computed &&
         e.recorded_blocks < static_cast<int32_t>(keys.size())) {
    const int32_t b = e.recorded_blocks;
    auto record = std::make_shared<BlockScores>();
    for (int32_t j = 0; j < bs; ++j) {
      PREFIXD_CHECK(e.scored[b * bs + j]);
      record->positions.push_back(e.positions[b * bs + j]);
    }
    options_.scores->Insert(keys[b], std::move(record));
    ++e.recorded_blocks;
  }
}

PromptScorer::Scores PromptScorer::Finish(const RequestState* request, uint32_t top_n) {
  auto it = requests_.find(request);
  PREFIXD_CHECK_MSG(it != requests_.end(), "the request is not scoring its prompt");
  Scores out;
  out.positions = std::move(it->second.positions);
  out.cached = it->second.cached;
  for (size_t p = 0; p < out.positions.size(); ++p) {
    PREFIXD_CHECK(it->second.scored[p]);
    if (out.positions[p].top.size() > top_n) out.positions[p].top.resize(top_n);
  }
  requests_.erase(it);
  return out;
}

}  // namespace prefixd
