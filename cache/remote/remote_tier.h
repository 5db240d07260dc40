// The shared cache tier: KV blocks published to a Redis (or Valkey) server that every replica
// of a fleet reads, so that a prefix one replica computed is a hit on the others.
//
// A KvTier (cache/tier.h): the engine offers it every full block it computes (publishes),
// matches and fetches are answered on the tier's threads.
//
// Identity and proof are every tier's: a value is exactly a block record's bytes
// (cache/block_record.h: header with format version, layout, manifest, root key, parent
// and chain key; tokens; K/V data; SHA-256 over all of it) and is checked in full before its
// rows may enter the pool. The key is KEY_PREFIX + the layout id + ":" + the hex chain key;
// the chain key already covers manifest, tenant namespace and every token before the block,
// and the layout id (dtype, geometry, the backend's kv_numerics) keeps replicas whose K/V
// differ in bits apart, instead of overwriting each other's values. A value that fails any
// check is never used: it is counted, deleted, and the engine computes the block.
//
// Memory is bounded by Redis itself (maxmemory + an LRU policy; docs/SCALING.md): this tier
// never scans keys.
//
// Faults never stall the engine or fail a request. Every command has a timeout (options
// .timeout); a failure (connect, AUTH, I/O, timeout, an error reply) closes that connection,
// is counted by operation, and the tier is skipped (matches 0, publishes dropped) until a
// backoff has passed (doubling from backoff_min to backoff_max, reset by one success).
// Connecting again happens on the next use after the backoff.
//
// Threads: the engine thread is the only caller of StartMatch, Fetch and
// WantsPublish/Publish, and it never waits on the server: a matcher thread answers matches
// (pipelined EXISTS) on a connection of its own, a fetcher thread runs Fetches (for every
// block STRLEN and a GETRANGE of at most one record, then verify: a value of another length
// is refused without being read, and no buffer grows past one record) on a second, and a
// publisher thread takes blocks from a bounded queue and SETs them on a third. A fetch's
// commands go out as soon as it is queued, also while the fetcher waits for earlier
// replies (pipelined on the same connection), so that requests arriving together wait for a
// slow server once, not one after another; each fetch is bounded as a whole, its wait in the
// queue included, by options.fetch_timeout.
#ifndef PREFIXD_CACHE_REMOTE_REMOTE_TIER_H_
#define PREFIXD_CACHE_REMOTE_REMOTE_TIER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cache/block_record.h"
#include "cache/digest_hash.h"
#include "cache/remote/remote_tier_options.h"
#include "cache/remote/remote_tier_stats.h"
#include "cache/tier.h"

namespace prefixd {

// Where a remote tier's server is: a TCP host and port (with a logical database) or a unix
// socket.
struct RemoteEndpoint {
  std::string host;         // empty for a unix socket
  int port = 0;
  std::string unix_path;    // empty for TCP
  int db = 0;
  std::string ToString() const;
};

// Parses redis://HOST:PORT[/DB] (HOST may be [IPv6]) or unix:///absolute/path. INVALID_ARGUMENT
// naming what is wrong: another scheme, a missing or bad port, a password or user in the URL
// (use a password file), a bad database number.
absl::StatusOr<RemoteEndpoint> ParseRemoteUrl(const std::string& url);

class RedisConnection;  // remote_tier.cc

class RemoteTier final : public KvTier {
 public:
  // Checks the options (INVALID_ARGUMENT naming the option) and starts its threads. Does
  // not need the server to be up: a tier that cannot connect is down, counted, and tried
  // again after the backoff.
  static absl::StatusOr<std::unique_ptr<RemoteTier>> Open(const RemoteTierOptions& options,
                                                          const BlockLayout& layout);
  // Stops the publisher: a SET in progress completes (or times out); queued blocks are dropped
  // (counted).
  ~RemoteTier() override;
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  // Asks, on the matcher thread, how many of `keys` (chain keys of consecutive blocks) the
  // server holds, counted from the first to the first it does not hold, at most
  // max_match_blocks; with `scored_only`, only values that carry a score section (told by
  // their length, as the disk tier tells its files). The matches queued when the matcher
  // turns to them go in one pipelined round trip (EXISTS, or STRLEN); `on_done` runs on the
  // matcher thread once this one is answered (to wake the engine), at the latest by its
  // deadline (MatchTimeout(options) from now, its wait in the queue included: a match not
  // answered by then is answered 0 and counted in match_timeouts). Starts nothing and
  // returns UNAVAILABLE while the tier is down or backing off (the caller computes).
  absl::StatusOr<std::shared_ptr<const TierMatch>> StartMatch(
      absl::Span<const Digest> keys, const MatchOptions& match,
      std::function<void()> on_done) override;
  // A waiting request is matched again every step; one round trip per 50 ms is enough to see
  // blocks another replica published meanwhile.
  absl::Duration match_reuse() const override { return absl::Milliseconds(50); }
  // StartMatch and wait for its answer (0 when it could not start), for callers that may
  // block: tests and tools. The engine thread uses StartMatch.
  size_t MatchFrom(absl::Span<const Digest> keys, const MatchOptions& match);
  size_t MatchFrom(absl::Span<const Digest> keys) { return MatchFrom(keys, MatchOptions{}); }

  // Starts fetching blocks `keys` (of root `root`, with their `tokens`) on the fetcher thread;
  // `on_done` runs there once the fetch is done (to wake the engine), at the latest about
  // FetchTimeout(options) (by default twice options.timeout) from now, with the blocks
  // verified by then. The fetch's blocks count
  // against max_fetch_blocks until the returned object is destroyed (its K/V are held in
  // memory until then); at most max_fetch_blocks() keys. Starts nothing and returns
  // UNAVAILABLE while the tier is down or backing off (the caller computes those blocks), or
  // RESOURCE_EXHAUSTED while that budget has no room (the caller may ask again later: fetches
  // in flight end and return theirs).
  absl::StatusOr<std::shared_ptr<const TierFetch>> Fetch(const Digest& root,
                                                         std::vector<Digest> keys,
                                                         std::vector<uint32_t> tokens,
                                                         std::function<void()> on_done);
  int32_t max_fetch_blocks() const override { return options_.max_fetch_blocks; }
  bool wait_capped_at_compute() const override { return options_.cap_wait_at_compute; }
  // KvTier: Fetch (request.scored_only is the engine's to check: values are read whole).
  absl::StatusOr<std::shared_ptr<const TierFetch>> StartFetch(
      FetchRequest request, std::function<void()> on_done) override {
    return Fetch(request.root, std::move(request.keys), std::move(request.tokens),
                 std::move(on_done));
  }

  // Whether a block (with a score section when `publish.scored`) should be built and queued
  // for publishing now: false while the tier is down, when `key` was published, queued or
  // fetched lately (unless only without scores, and this one has them), or (counted as
  // dropped) when the queue is full.
  struct PublishIntent {
    bool scored = false;
  };
  bool WantsPublish(const Digest& key, const PublishIntent& publish);
  bool WantsPublish(const Digest& key) { return WantsPublish(key, PublishIntent{}); }
  // A buffer for the K/V of a block to publish (layout().data_bytes() long, its contents
  // unspecified): one that a published record or a finished fetch gave back when there is
  // one, so that building a record costs no fresh pages (on a virtual machine a 1.2 MB
  // buffer's first-touch page faults cost more than its SHA-256).
  std::vector<uint8_t> PublishBuffer();
  // Queues a block WantsPublish accepted (PREFIXD_CHECKs its sizes).
  void Publish(BlockRecord record);
  // Waits until the publish queue is empty (true) or `deadline` passes (false).
  bool Flush(absl::Time deadline) override;
  // How many keys WantsPublish remembers (the last ones published, queued or fetched).
  static constexpr size_t kRememberedKeys = size_t{1} << 16;

  // KvTier: the engine offers it every full block it computes (publishes); WantsOffer never
  // waits.
  TierMedium medium() const override { return TierMedium::kRemote; }
  TierOffers offers() const override { return TierOffers::kComputed; }
  bool WantsOffer(const Digest& key, const OfferIntent& offer) override {
    return WantsPublish(key, {.scored = offer.scored});
  }
  std::vector<uint8_t> OfferBuffer() override { return PublishBuffer(); }
  void Offer(BlockRecord record) override { Publish(std::move(record)); }

  RemoteTierStats Stats() const;
  const BlockLayout& layout() const override { return layout_; }
  const RemoteEndpoint& endpoint() const { return endpoint_; }
  // The Redis key of `key`: prefix + layout id + ":" + 64 hex digits.
  std::string KeyOf(const Digest& key) const;

 private:
  RemoteTier(const RemoteTierOptions& options, const RemoteEndpoint& endpoint,
             const BlockLayout& layout);
  void PublisherLoop();
  void FetcherLoop();
  void MatcherLoop();
  struct PendingMatch;
  // Answers the matches of `batch` in one pipelined round trip on the matcher's connection.
  void AnswerMatches(absl::Span<const PendingMatch> batch);
  struct PendingFetch;
  // Takes every fetch queued (waiting for one when `wait`; false when stopping with none
  // left) and sends the commands of each onto the fetcher's connection, appending it to
  // *sent; a fetch that cannot be sent, or whose deadline passed while it waited, ends with
  // nothing.
  bool TakeAndSend(std::deque<PendingFetch>* sent, bool wait);
  // Queues f's commands on the fetcher's connection (connected); false when that failed.
  bool SendFetch(const TierFetch& f);
  // Reads f's replies (the connection's next ones), counting the blocks loaded in *loads and
  // the values that fail verification in *corrupt (their keys appended to *corrupt_names, to
  // be deleted once the pipeline is empty). False when the connection failed (closed).
  bool ReceiveFetch(TierFetch& f, uint64_t* loads, uint64_t* corrupt,
                    std::vector<std::string>* corrupt_names);
  // Counts f's outcome, marks it done and wakes its caller; p is emptied.
  void EndFetch(PendingFetch& p, uint64_t loads, uint64_t corrupt);
  void CountError(uint64_t RemoteTierStats::*counter, const std::string& what);
  void RememberLocked(const Digest& key, bool scored) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A spare buffer (empty when there is none), and one given back (kept while there are
  // fewer than max_fetch_blocks: the memory a full fetch budget holds).
  std::vector<uint8_t> TakeBufferLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void GiveBackLocked(std::vector<uint8_t> buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RemoteTierOptions options_;
  const RemoteEndpoint endpoint_;
  const BlockLayout layout_;
  const std::string layout_id_;

  std::unique_ptr<RedisConnection> matcher_conn_;    // matcher thread only
  std::unique_ptr<RedisConnection> publisher_conn_;  // publisher thread only
  std::unique_ptr<RedisConnection> fetcher_conn_;    // fetcher thread only

  mutable absl::Mutex mu_;
  std::deque<BlockRecord> queue_ ABSL_GUARDED_BY(mu_);
  // Keys queued, published or fetched lately, each with whether its value carries scores
  // (bounded: the oldest are forgotten first), so that a prefix computed again is not sent
  // again. recent_order_ holds each key with the number it was remembered under: a key
  // forgotten after a failed store leaves its old entry there, which must not make the key
  // forgotten again once it is remembered anew.
  struct Remembered {
    bool scored = false;
    uint64_t number = 0;
  };
  absl::flat_hash_map<Digest, Remembered, DigestHash> recent_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<Digest, uint64_t>> recent_order_ ABSL_GUARDED_BY(mu_);
  uint64_t remembered_ ABSL_GUARDED_BY(mu_) = 0;
  bool publishing_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  RemoteTierStats stats_ ABSL_GUARDED_BY(mu_);
  struct PendingFetch {
    std::shared_ptr<TierFetch> fetch;
    std::function<void()> on_done;
  };
  std::deque<PendingFetch> fetches_ ABSL_GUARDED_BY(mu_);
  struct PendingMatch {
    std::shared_ptr<TierMatch> match;
    std::function<void()> on_done;
  };
  std::deque<PendingMatch> matches_ ABSL_GUARDED_BY(mu_);
  int64_t fetch_blocks_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Buffers of finished fetches and published records, reused for the next GETs and
  // records (at most max_fetch_blocks).
  std::vector<std::vector<uint8_t>> spare_buffers_ ABSL_GUARDED_BY(mu_);
  std::thread publisher_;
  // Written by Fetch, so that the fetcher, while it waits for replies, sends the fetches
  // queued meanwhile at once (their replies follow on the same connection).
  int fetch_wake_fd_ = -1;
  std::thread fetcher_;
  std::thread matcher_;
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_REMOTE_REMOTE_TIER_H_
