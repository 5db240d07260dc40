#include "engine/kv_offloader.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "base/check.h"

namespace prefixd {

KvOffloader::KvOffloader(const Options& options)
    : options_(options),
      backend_(options.backend),
      disk_(options.disk),
      remote_(options.remote) {
  PREFIXD_CHECK(backend_ != nullptr && options_.max_disk_load_blocks > 0);
  if (disk_ != nullptr) loader_ = std::thread([this] { LoaderLoop(); });
}

KvOffloader::~KvOffloader() {
  std::deque<std::shared_ptr<TierLoad>> left;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    left.swap(queue_);
  }
  if (loader_.joinable()) loader_.join();
  // Outside mu_: a load's deleter returns its budget under it.
  left.clear();
}

KvOffloader::Continuation KvOffloader::Continue(const TokenChain& chain, int32_t from,
                                                bool scoring, absl::Time match_deadline,
                                                SequenceTiers* tiers) {
  const absl::Span<const Digest> keys = chain.keys();
  if (!has_tiers() || from >= static_cast<int32_t>(keys.size())) return {};
  if (TierLoad* load = tiers->load.get(); load != nullptr) {
    if (!load->done()) return {.parked = true};
    Resolve(chain, load);
    const int32_t end = load->from + static_cast<int32_t>(load->blocks.size());
    // The pool may have lost blocks since the load started (evicted): loaded blocks after a
    // gap are of no use, and the admission computes from the pool's end instead.
    if (from < load->from || from >= end || (scoring && !load->scoring)) return {};
    return {.blocks = end - from};
  }
  const int32_t on_disk =
      disk_ == nullptr ? 0
      : scoring        ? static_cast<int32_t>(disk_->MatchScoredFrom(keys.subspan(from)))
                       : static_cast<int32_t>(disk_->MatchFrom(keys.subspan(from)));
  int32_t remote = 0;
  if (remote_ != nullptr) {
    const std::optional<int32_t> r =
        MatchRemote(chain, from + on_disk, scoring, match_deadline, tiers);
    if (!r.has_value()) return {.parked = true};  // the answer wakes the engine
    remote = *r;
  }
  if (on_disk + remote == 0) return {};
  const absl::Status started = StartLoad(chain, from, on_disk, remote, scoring, tiers);
  // Parked until its blocks are here, or until a budget has room (reading a block is several
  // times cheaper than computing it: bench/disk_tier_bench, bench/remote_tier_bench).
  if (started.ok() || absl::IsResourceExhausted(started)) return {.parked = true};
  return {};
}

std::optional<int32_t> KvOffloader::MatchRemote(const TokenChain& chain, int32_t from,
                                                bool scoring, absl::Time match_deadline,
                                                SequenceTiers* tiers) {
  // A waiting request is planned again every step; one round trip per kRemoteMatchReuse is
  // enough to see blocks another replica published meanwhile.
  constexpr absl::Duration kRemoteMatchReuse = absl::Milliseconds(50);
  const absl::Span<const Digest> keys = chain.keys();
  if (from >= static_cast<int32_t>(keys.size())) return 0;
  // The answer in flight, waited for until the step's deadline.
  auto answered = [&]() {
    const RemoteMatch& m = *tiers->match;
    if (!m.done()) {
      const absl::Duration left = match_deadline - absl::Now();
      if (left <= absl::ZeroDuration() || !m.WaitFor(left)) return false;
    }
    tiers->remote_blocks = static_cast<int32_t>(m.blocks);
    tiers->remote_answered = absl::Now();
    tiers->match.reset();
    return true;
  };
  if (tiers->match != nullptr && !answered()) return std::nullopt;
  // Fresh from its answer (not its question), so that a slow tier's answers are used.
  if (tiers->remote_from == from && tiers->remote_scored == scoring &&
      absl::Now() - tiers->remote_answered < kRemoteMatchReuse) {
    return tiers->remote_blocks;
  }
  absl::StatusOr<std::shared_ptr<const RemoteMatch>> m =
      remote_->StartMatch(keys.subspan(from), {.scored_only = scoring}, options_.wake);
  if (!m.ok()) return 0;  // down or backing off: computed
  tiers->match = *std::move(m);
  tiers->remote_from = from;
  tiers->remote_scored = scoring;
  if (!answered()) return std::nullopt;
  return tiers->remote_blocks;
}

absl::Status KvOffloader::StartLoad(const TokenChain& chain, int32_t from, int32_t disk_blocks,
                                    int32_t remote_blocks, bool scoring, SequenceTiers* tiers) {
  const int32_t d = std::min(disk_blocks, options_.max_disk_load_blocks);
  if (d > 0) {
    absl::MutexLock lock(&mu_);
    if (disk_blocks_in_flight_ + d > options_.max_disk_load_blocks) {
      return absl::ResourceExhaustedError("the disk load budget is in use");
    }
    disk_blocks_in_flight_ += d;
  }
  // The budget comes back when the last holder (the sequence, or the loader) lets go.
  std::shared_ptr<TierLoad> load(new TierLoad, [this, d](TierLoad* done) {
    delete done;
    if (d == 0) return;
    absl::MutexLock lock(&mu_);
    disk_blocks_in_flight_ -= d;
  });
  const size_t bs = static_cast<size_t>(chain.block_size());
  load->from = from;
  load->disk_blocks = d;
  load->scoring = scoring;
  load->root = chain.root();
  const absl::Span<const Digest> keys = chain.keys().subspan(from, d);
  const absl::Span<const uint32_t> tokens = chain.tokens().subspan(from * bs, d * bs);
  load->disk_keys.assign(keys.begin(), keys.end());
  load->disk_tokens.assign(tokens.begin(), tokens.end());
  // Remote blocks continue the match only after every disk block.
  if (d == disk_blocks && remote_blocks > 0) {
    const int32_t r = std::min(remote_blocks, remote_->max_fetch_blocks());
    const int32_t first = from + d;
    const absl::Span<const Digest> rkeys = chain.keys().subspan(first, r);
    const absl::Span<const uint32_t> rtokens = chain.tokens().subspan(first * bs, r * bs);
    absl::StatusOr<std::shared_ptr<const RemoteFetch>> f = remote_->Fetch(
        chain.root(), std::vector<Digest>(rkeys.begin(), rkeys.end()),
        std::vector<uint32_t>(rtokens.begin(), rtokens.end()), options_.wake);
    if (f.ok()) {
      load->remote = *std::move(f);
    } else if (d == 0) {
      return f.status();  // RESOURCE_EXHAUSTED: ask again; UNAVAILABLE: compute
    }
    // With disk blocks to read, the remote ones are computed instead.
  }
  if (d > 0) {
    load->disk_done.store(false, std::memory_order_relaxed);
    absl::MutexLock lock(&mu_);
    queue_.push_back(load);
  }
  tiers->load = std::move(load);
  return absl::OkStatus();
}

void KvOffloader::LoaderLoop() {
  const DiskLayout& layout = disk_->layout();
  const size_t bs = layout.block_size;
  while (true) {
    std::shared_ptr<TierLoad> load;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stop_;
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      load = std::move(queue_.front());
      queue_.pop_front();
    }
    TierLoad& l = *load;
    // The kernel reads the files ahead while the first ones are verified.
    disk_->Prefetch(l.disk_keys);
    for (size_t i = 0; i < l.disk_keys.size(); ++i) {
      {
        absl::MutexLock lock(&mu_);
        if (stop_) break;
      }
      // Nobody waits for it any more (the request was cancelled or ended): stop reading.
      if (load.use_count() == 1) break;
      const absl::Time t0 = absl::Now();
      std::vector<uint8_t> data(static_cast<size_t>(layout.data_bytes()));
      std::vector<PositionScore> section;
      const BlockExpectation expect{
          .root = l.root,
          .key = l.disk_keys[i],
          .tokens = absl::MakeConstSpan(l.disk_tokens).subspan(i * bs, bs)};
      // Absent (deleted for the cap since the match) or corrupt (deleted and counted by the
      // tier): this block and every one after it are computed.
      if (!disk_->Load(expect, absl::MakeSpan(data), &section).ok()) break;
      // A scoring request matched scored files only; one that lost its section (replaced
      // meanwhile) ends its load.
      if (l.scoring && section.empty()) break;
      l.disk_data.push_back(std::move(data));
      l.disk_scores.push_back(std::move(section));
      l.disk_seconds.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    }
    l.disk_done.store(true, std::memory_order_release);
    // This thread lets go first, so that the sequence woken holds the only reference.
    load.reset();
    if (options_.wake) options_.wake();
  }
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
  // Appends one block; false when the load ends before it.
  auto add = [&](absl::Span<const uint8_t> data, const std::vector<PositionScore>* section,
                 bool from_disk, double seconds) {
    const int32_t b = load->from + static_cast<int32_t>(load->blocks.size());
    std::shared_ptr<const BlockScores> record =
        section != nullptr ? record_of(b, *section) : nullptr;
    if (load->scoring && record == nullptr) return false;
    load->blocks.push_back({data, std::move(record), from_disk, seconds});
    return true;
  };
  for (size_t i = 0; i < load->disk_data.size(); ++i) {
    if (!add(load->disk_data[i], &load->disk_scores[i], true, load->disk_seconds[i])) return;
  }
  if (static_cast<int32_t>(load->blocks.size()) < load->disk_blocks || load->remote == nullptr) {
    return;
  }
  const RemoteFetch& f = *load->remote;
  for (size_t i = 0; i < f.data.size(); ++i) {
    const std::vector<PositionScore>* section = i < f.scores.size() ? &f.scores[i] : nullptr;
    if (!add(f.data[i], section, false, f.seconds[i])) return;
  }
}

absl::StatusOr<KvOffloader::Written> KvOffloader::Write(const TierLoad& load,
                                                        int32_t first_block, int32_t count,
                                                        absl::Span<const int32_t> table,
                                                        std::vector<double>* disk_seconds,
                                                        std::vector<double>* remote_seconds) {
  PREFIXD_CHECK(load.resolved && first_block >= load.from && count > 0);
  const size_t offset = static_cast<size_t>(first_block - load.from);
  PREFIXD_CHECK(offset + count <= load.blocks.size());
  PREFIXD_CHECK(first_block + count <= static_cast<int32_t>(table.size()));
  Written out;
  for (int32_t i = 0; i < count; ++i) {
    const TierLoad::Block& block = load.blocks[offset + i];
    const absl::Time t0 = absl::Now();
    if (absl::Status w = backend_->WriteKvBlock(table[first_block + i], block.data); !w.ok()) {
      return w;
    }
    const double seconds = block.seconds + absl::ToDoubleSeconds(absl::Now() - t0);
    (block.from_disk ? disk_seconds : remote_seconds)->push_back(seconds);
    if (block.from_disk) ++out.disk_blocks;
    out.records.push_back(block.record);
  }
  return out;
}

void KvOffloader::PublishComputed(const TokenChain& chain, absl::Span<const int32_t> table,
                                  int32_t start, int32_t count) {
  if (remote_ == nullptr) return;
  const int32_t bs = chain.block_size();
  const absl::Span<const Digest> keys = chain.keys();
  // The blocks whose last row this step computed: from the one `start` is in, to the last
  // one `start + count` fills.
  const int32_t last = std::min((start + count) / bs, static_cast<int32_t>(keys.size()));
  for (int32_t b = start / bs; b < last; ++b) {
    const BlockScores* scores = options_.scores != nullptr ? options_.scores->Find(keys[b]) : nullptr;
    if (!remote_->WantsPublish(keys[b], {.scored = scores != nullptr})) continue;
    BlockRecord record;
    record.root = chain.root();
    record.parent_key = b == 0 ? record.root : keys[b - 1];
    record.key = keys[b];
    const absl::Span<const uint32_t> tokens = chain.block(b);
    record.tokens.assign(tokens.begin(), tokens.end());
    record.data = remote_->PublishBuffer();  // KvBlockBytes() long: the layout's data_bytes
    // A failed read is a backend failure that the next Forward reports; the block is simply
    // not published.
    if (!backend_->ReadKvBlock(table[b], absl::MakeSpan(record.data)).ok()) return;
    if (scores != nullptr) record.scores = ToPositionScores(*scores);
    remote_->Publish(std::move(record));
  }
}

bool KvOffloader::Spill(const EvictedBlock& e, const BlockScores* scores) {
  if (disk_ == nullptr) return false;
  if (!disk_->WantsSpill(*e.key, {.scored = scores != nullptr, .deadline = spill_wait_until_})) {
    return false;
  }
  BlockRecord r;
  r.root = *e.root;
  r.parent_key = *e.parent_key;
  r.key = *e.key;
  r.tokens.assign(e.tokens.begin(), e.tokens.end());
  r.data.resize(static_cast<size_t>(backend_->KvBlockBytes()));
  // A failed read is a backend failure that the next Forward reports; the block is simply
  // not written.
  if (!backend_->ReadKvBlock(e.block, absl::MakeSpan(r.data)).ok()) return false;
  if (scores != nullptr) r.scores = ToPositionScores(*scores);
  disk_->Spill(std::move(r));
  return true;
}

void KvOffloader::SpillAtShutdown(KvCache* cache, absl::Time end) {
  if (absl::Now() >= end) return;
  if (remote_ != nullptr) remote_->Flush(end);  // blocks computed lately reach the fleet
  if (disk_ == nullptr) return;
  // Evicting every cached block runs the pool's hook on each (least recently used first),
  // which waits for room in the write queue from here on.
  spill_wait_until_ = end;
  cache->Evict(static_cast<int32_t>(cache->num_blocks()));
  disk_->Flush(end);
}

}  // namespace prefixd
