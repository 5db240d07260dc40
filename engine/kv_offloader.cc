#include "engine/kv_offloader.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "base/check.h"

namespace prefixd {

void ComputeRate::Observe(int64_t prefill_tokens, int64_t tokens, absl::Duration took) {
  // Decode-only steps cost more per token (memory-bound) than the prefill a load replaces.
  if (prefill_tokens < kMinPrefillTokens || tokens <= 0) return;
  const absl::Duration now = took / tokens;
  per_token_ = per_token_ == absl::ZeroDuration() ? now : (3 * per_token_ + now) / 4;
}

KvOffloader::KvOffloader(const Options& options)
    : options_(options),
      backend_(options.backend),
      clock_(options.clock ? options.clock : [] { return absl::Now(); }) {
  PREFIXD_CHECK(backend_ != nullptr);
  for (KvTier* tier : options_.tiers) {
    PREFIXD_CHECK(tier != nullptr);
    (tier->offers() == TierOffers::kComputed ? computed_tiers_ : evicted_tiers_).push_back(tier);
  }
}

bool KvOffloader::WaitsOnTiers(const SequenceTiers* tiers) const {
  if (tiers == nullptr) return false;
  if (tiers->load == nullptr) {
    // A match answer still in flight parks it again (LookUpTiers waits only until the step's
    // match deadline); one that came since is used this step.
    return tiers->budget_refused || std::any_of(tiers->answers.begin(), tiers->answers.end(),
                                                [](const SequenceTiers::Answer& a) {
                                                  return a.match != nullptr && !a.match->done();
                                                });
  }
  const TierLoad& load = *tiers->load;
  return !load.resolved && !load.done() && clock_() < load.wait_until;
}

KvOffloader::TierLookup KvOffloader::LookUpTiers(const TokenChain& chain, int32_t from,
                                                 bool scoring, absl::Time match_deadline,
                                                 std::shared_ptr<SequenceTiers>* state) {
  const absl::Span<const Digest> keys = chain.keys();
  if (*state != nullptr) (*state)->budget_refused = false;
  if (!has_tiers() || from >= static_cast<int32_t>(keys.size())) return {};
  if (*state == nullptr) *state = std::make_shared<SequenceTiers>();
  SequenceTiers* tiers = state->get();
  if (TierLoad* load = tiers->load.get(); load != nullptr) {
    if (!load->resolved && !load->done()) {
      if (clock_() < load->wait_until) return {.parked = true};
      ++waits_cut_;  // computing the rest costs less than waiting longer
    }
    Resolve(chain, load);
    const int32_t end = load->from + static_cast<int32_t>(load->blocks.size());
    // The pool may have lost blocks since the load started (evicted): loaded blocks after a
    // gap are of no use, and the admission computes from the pool's end instead.
    if (from < load->from || from >= end || (scoring && !load->scoring)) return {};
    return {.ready_blocks = end - from, .load = tiers->load};
  }
  const size_t n = options_.tiers.size();
  tiers->answers.resize(n);
  std::vector<int32_t> found(n, 0);
  int32_t next = from;
  for (size_t i = 0; i < n; ++i) {
    const std::optional<int32_t> blocks =
        Match(i, chain, next, scoring, match_deadline, &tiers->answers[i]);
    if (!blocks.has_value()) return {.parked = true};  // the answer wakes the engine
    found[i] = *blocks;
    next += *blocks;
  }
  if (next == from) return {};
  const absl::Status started = StartLoad(chain, from, found, scoring, tiers);
  tiers->budget_refused = absl::IsResourceExhausted(started);
  // Parked until its blocks are here, or until a budget has room (reading a block is several
  // times cheaper than computing it: bench/disk_tier_bench, bench/remote_tier_bench).
  if (started.ok() || absl::IsResourceExhausted(started)) return {.parked = true};
  return {};
}

std::optional<int32_t> KvOffloader::Match(size_t i, const TokenChain& chain, int32_t from,
                                          bool scoring, absl::Time match_deadline,
                                          SequenceTiers::Answer* a) {
  KvTier& tier = *options_.tiers[i];
  const absl::Span<const Digest> keys = chain.keys();
  if (from >= static_cast<int32_t>(keys.size())) return 0;
  // The answer in flight, waited for until the step's deadline.
  auto answered = [&]() {
    const TierMatch& m = *a->match;
    if (!m.done()) {
      const absl::Duration left = match_deadline - absl::Now();
      if (left <= absl::ZeroDuration() || !m.WaitFor(left)) return false;
    }
    a->blocks = static_cast<int32_t>(m.blocks);
    a->answered = absl::Now();
    a->match.reset();
    return true;
  };
  if (a->match != nullptr && !answered()) return std::nullopt;
  // Fresh from its answer (not its question), so that a slow tier's answers are used.
  if (a->from == from && a->scored == scoring && absl::Now() - a->answered < tier.match_reuse()) {
    return a->blocks;
  }
  absl::StatusOr<std::shared_ptr<const TierMatch>> m =
      tier.StartMatch(keys.subspan(from), {.scored_only = scoring}, options_.wake);
  if (!m.ok()) return 0;  // down or backing off: computed
  a->match = *std::move(m);
  a->from = from;
  a->scored = scoring;
  if (!answered()) return std::nullopt;
  return a->blocks;
}

absl::Status KvOffloader::StartLoad(const TokenChain& chain, int32_t from,
                                    absl::Span<const int32_t> found, bool scoring,
                                    SequenceTiers* tiers) {
  auto load = std::make_shared<TierLoad>();
  load->from = from;
  load->scoring = scoring;
  const size_t bs = static_cast<size_t>(chain.block_size());
  int32_t first = from;
  bool capped = false;
  for (size_t i = 0; i < found.size(); ++i) {
    if (found[i] == 0) continue;
    KvTier& tier = *options_.tiers[i];
    const int32_t n = std::min(found[i], tier.max_fetch_blocks());
    const absl::Span<const Digest> keys = chain.keys().subspan(first, n);
    const absl::Span<const uint32_t> tokens = chain.tokens().subspan(first * bs, n * bs);
    absl::StatusOr<std::shared_ptr<const TierFetch>> f =
        tier.StartFetch({.root = chain.root(),
                         .keys = std::vector<Digest>(keys.begin(), keys.end()),
                         .tokens = std::vector<uint32_t>(tokens.begin(), tokens.end()),
                         .scored_only = scoring},
                        options_.wake);
    if (!f.ok()) {
      // RESOURCE_EXHAUSTED: ask again; UNAVAILABLE: compute. With earlier parts to load, this
      // tier's blocks are computed instead.
      if (load->parts.empty()) return f.status();
      break;
    }
    load->parts.push_back({.medium = tier.medium(), .blocks = n, .fetch = *std::move(f)});
    capped = capped || tier.wait_capped_at_compute();
    // A later tier's blocks continue the match only after every block of this one.
    if (n < found[i]) break;
    first += n;
  }
  // The wait is capped at what computing the load's tokens would cost, when a tier asks.
  const absl::Duration per_token =
      options_.compute_per_token ? options_.compute_per_token() : rate_.PerToken();
  if (capped && per_token > absl::ZeroDuration()) {
    int64_t tokens = 0;
    for (const TierLoad::Part& part : load->parts) tokens += int64_t{part.blocks} * bs;
    load->wait_until = clock_() + std::max(per_token * tokens, kMinCappedWait);
  }
  tiers->load = std::move(load);
  return absl::OkStatus();
}

void KvOffloader::Resolve(const TokenChain& chain, TierLoad* load) const {
  if (load->resolved) return;
  load->resolved = true;
  // A block's usable record, or null: a section that passed its checksum but names no token
  // of this model is not served.
  auto record_of = [&](int32_t b, const std::vector<PositionScore>& section) {
    std::shared_ptr<const BlockScores> record;
    if (section.empty()) return record;
    std::optional<BlockScores> r = FromPositionScores(chain.block(b), section, options_.vocab_size);
    if (r.has_value()) record = std::make_shared<const BlockScores>(*std::move(r));
    return record;
  };
  for (const TierLoad::Part& part : load->parts) {
    // A load past its wait cap takes the parts done by then, in order.
    if (!part.fetch->done()) return;
    const TierFetch& f = *part.fetch;
    for (size_t i = 0; i < f.data.size(); ++i) {
      const int32_t b = load->from + static_cast<int32_t>(load->blocks.size());
      std::shared_ptr<const BlockScores> record =
          i < f.scores.size() ? record_of(b, f.scores[i]) : nullptr;
      if (load->scoring && record == nullptr) return;
      load->blocks.push_back({f.data[i], std::move(record), part.medium, f.seconds[i]});
    }
    if (static_cast<int32_t>(f.data.size()) < part.blocks) return;
  }
}

absl::StatusOr<std::vector<KvOffloader::WrittenBlock>> KvOffloader::Write(
    const TierLoad& load, int32_t first_block, int32_t count, absl::Span<const int32_t> table) {
  PREFIXD_CHECK(load.resolved && first_block >= load.from && count > 0);
  const size_t offset = static_cast<size_t>(first_block - load.from);
  PREFIXD_CHECK(offset + count <= load.blocks.size());
  PREFIXD_CHECK(first_block + count <= static_cast<int32_t>(table.size()));
  std::vector<WrittenBlock> out;
  for (int32_t i = 0; i < count; ++i) {
    const TierLoad::Block& block = load.blocks[offset + i];
    const absl::Time t0 = absl::Now();
    if (absl::Status w = backend_->WriteKvBlock(table[first_block + i], block.data); !w.ok()) {
      return w;
    }
    out.push_back({.medium = block.medium,
                   .seconds = block.seconds + absl::ToDoubleSeconds(absl::Now() - t0),
                   .record = block.record});
  }
  return out;
}

void KvOffloader::OfferComputed(const TokenChain& chain, absl::Span<const int32_t> table,
                                int32_t start, int32_t count) {
  if (computed_tiers_.empty()) return;
  const int32_t bs = chain.block_size();
  const absl::Span<const Digest> keys = chain.keys();
  // The blocks whose last row this step computed: from the one `start` is in, to the last
  // one `start + count` fills.
  const int32_t last = std::min((start + count) / bs, static_cast<int32_t>(keys.size()));
  for (int32_t b = start / bs; b < last; ++b) {
    const BlockScores* scores =
        options_.scores != nullptr ? options_.scores->Find(keys[b]) : nullptr;
    for (KvTier* tier : computed_tiers_) {
      if (!tier->WantsOffer(keys[b], {.scored = scores != nullptr})) continue;
      BlockRecord record;
      record.root = chain.root();
      record.parent_key = b == 0 ? record.root : keys[b - 1];
      record.key = keys[b];
      const absl::Span<const uint32_t> tokens = chain.block(b);
      record.tokens.assign(tokens.begin(), tokens.end());
      record.data = tier->OfferBuffer();  // KvBlockBytes() long: the layout's data_bytes
      // A failed read is a backend failure that the next Forward reports; the block is
      // simply not offered.
      if (!backend_->ReadKvBlock(table[b], absl::MakeSpan(record.data)).ok()) return;
      if (scores != nullptr) record.scores = ToPositionScores(*scores);
      tier->Offer(std::move(record));
    }
  }
}

bool KvOffloader::OfferEvicted(const EvictedBlock& e, const BlockScores* scores) {
  bool taken = false;
  for (KvTier* tier : evicted_tiers_) {
    if (!tier->WantsOffer(*e.key, {.scored = scores != nullptr, .deadline = offer_wait_until_})) {
      continue;
    }
    BlockRecord r;
    r.root = *e.root;
    r.parent_key = *e.parent_key;
    r.key = *e.key;
    r.tokens.assign(e.tokens.begin(), e.tokens.end());
    r.data = tier->OfferBuffer();
    // A failed read is a backend failure that the next Forward reports; the block is simply
    // not written.
    if (!backend_->ReadKvBlock(e.block, absl::MakeSpan(r.data)).ok()) return taken;
    if (scores != nullptr) r.scores = ToPositionScores(*scores);
    tier->Offer(std::move(r));
    taken = true;
  }
  return taken;
}

void KvOffloader::SpillAtShutdown(KvCache* cache, absl::Time end) {
  if (absl::Now() >= end) return;
  // Blocks computed lately reach the fleet.
  for (KvTier* tier : computed_tiers_) tier->Flush(end);
  if (evicted_tiers_.empty()) return;
  // Evicting every cached block runs the pool's hook on each (least recently used first),
  // which waits for room in the tiers' queues from here on.
  offer_wait_until_ = end;
  cache->Evict(static_cast<int32_t>(cache->num_blocks()));
  for (KvTier* tier : evicted_tiers_) tier->Flush(end);
}

}  // namespace prefixd
