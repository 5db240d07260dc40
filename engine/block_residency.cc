#include "engine/block_residency.h"

#include <utility>

#include "base/check.h"

namespace prefixd {

BlockResidency::BlockResidency(int32_t num_blocks, std::function<absl::Time()> clock)
    : clock_(std::move(clock)), blocks_(static_cast<size_t>(num_blocks)) {
  PREFIXD_CHECK(clock_ != nullptr && num_blocks > 0);
}

void BlockResidency::OnIndexed(int32_t block) {
  Times& t = blocks_.at(static_cast<size_t>(block));
  PREFIXD_CHECK_MSG(t.indexed == absl::InfinitePast(), "block indexed twice");
  t.indexed = t.last_use = clock_();
}

void BlockResidency::OnReused(absl::Span<const int32_t> blocks) {
  const absl::Time now = clock_();
  for (int32_t b : blocks) {
    Times& t = blocks_.at(static_cast<size_t>(b));
    PREFIXD_CHECK_MSG(t.indexed != absl::InfinitePast(), "reuse of a block not indexed");
    pending_.reuse_gap.push_back(absl::ToDoubleSeconds(now - t.last_use));
    t.last_use = now;
  }
  Bound(&pending_.reuse_gap);
}

void BlockResidency::OnEvicted(int32_t block) {
  Times& t = blocks_.at(static_cast<size_t>(block));
  PREFIXD_CHECK_MSG(t.indexed != absl::InfinitePast(), "eviction of a block not indexed");
  const absl::Time now = clock_();
  pending_.lifetime.push_back(absl::ToDoubleSeconds(now - t.indexed));
  pending_.idle_before_eviction.push_back(absl::ToDoubleSeconds(now - t.last_use));
  t = Times();
  Bound(&pending_.lifetime);
  Bound(&pending_.idle_before_eviction);
}

void BlockResidency::Bound(std::vector<double>* v) {
  // Nobody draining (no metrics scrape) must not grow the engine without bound: keep the
  // latest half once past the cap, as Engine::DrainLatencies does.
  if (v->size() > kMaxPending) v->erase(v->begin(), v->end() - kMaxPending / 2);
}

void BlockResidency::Drain(Observations* out) {
  for (auto [from, to] : {std::pair{&pending_.lifetime, &out->lifetime},
                          std::pair{&pending_.idle_before_eviction, &out->idle_before_eviction},
                          std::pair{&pending_.reuse_gap, &out->reuse_gap}}) {
    to->insert(to->end(), from->begin(), from->end());
    from->clear();
  }
}

}  // namespace prefixd
