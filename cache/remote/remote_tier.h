// The shared cache tier: KV blocks published to a Redis (or Valkey) server that every replica
// of a fleet reads, so that a prefix one replica computed is a hit on the others.
//
// Identity and proof are the disk tier's: a value is exactly a block file's bytes
// (cache/disk/block_file.h: header with format version, layout, manifest, root key, parent
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
// Threads: the engine thread is the only caller of MatchFrom, Load and WantsPublish/Publish,
// on a connection of its own; one publisher thread takes blocks from a bounded queue and SETs
// them on a second connection.
#ifndef PREFIXD_CACHE_REMOTE_REMOTE_TIER_H_
#define PREFIXD_CACHE_REMOTE_REMOTE_TIER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "cache/digest_hash.h"
#include "cache/disk/block_file.h"
#include "cache/remote/remote_tier_options.h"
#include "cache/remote/remote_tier_stats.h"

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

class RemoteTier {
 public:
  // Checks the options (INVALID_ARGUMENT naming the option) and starts the publisher. Does
  // not need the server to be up: a tier that cannot connect is down, counted, and tried
  // again after the backoff.
  static absl::StatusOr<std::unique_ptr<RemoteTier>> Open(const RemoteTierOptions& options,
                                                          const DiskLayout& layout);
  // Stops the publisher: a SET in progress completes (or times out); queued blocks are dropped
  // (counted).
  ~RemoteTier();
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  // How many of `keys` (chain keys of consecutive blocks) the server holds, counted from the
  // first to the first it does not hold, at most max_match_blocks. One pipelined round trip of
  // EXISTS; 0 while the tier is down or backing off.
  size_t MatchFrom(absl::Span<const Digest> keys);

  // Reads the block `expect.key` and verifies it (block_file.h) into `out`
  // (layout().data_bytes() bytes). NOT_FOUND when absent (Redis evicted it since the match);
  // DATA_LOSS when it failed verification (deleted, counted); UNAVAILABLE on a fault.
  absl::Status Load(const BlockExpectation& expect, absl::Span<uint8_t> out);

  // Whether a block should be built and queued for publishing now: false while the tier is
  // down, when `key` was published or queued lately, or (counted as dropped) when the queue
  // is full.
  bool WantsPublish(const Digest& key);
  // Queues a block WantsPublish accepted (PREFIXD_CHECKs its sizes).
  void Publish(BlockRecord record);
  // Waits until the publish queue is empty (true) or `deadline` passes (false).
  bool Flush(absl::Time deadline);

  RemoteTierStats Stats() const;
  const DiskLayout& layout() const { return layout_; }
  const RemoteEndpoint& endpoint() const { return endpoint_; }
  // The Redis key of `key`: prefix + layout id + ":" + 64 hex digits.
  std::string KeyOf(const Digest& key) const;

 private:
  RemoteTier(const RemoteTierOptions& options, const RemoteEndpoint& endpoint,
             const DiskLayout& layout);
  void PublisherLoop();
  void CountError(uint64_t RemoteTierStats::*counter, const std::string& what);
  void RememberLocked(const Digest& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RemoteTierOptions options_;
  const RemoteEndpoint endpoint_;
  const DiskLayout layout_;
  const std::string layout_id_;

  std::unique_ptr<RedisConnection> engine_conn_;     // engine thread only
  std::unique_ptr<RedisConnection> publisher_conn_;  // publisher thread only
  std::string load_buffer_;                          // engine thread only

  mutable absl::Mutex mu_;
  std::deque<BlockRecord> queue_ ABSL_GUARDED_BY(mu_);
  // Keys queued or published lately (bounded: the oldest are forgotten first), so that a
  // prefix computed again is not sent again.
  absl::flat_hash_set<Digest, DigestHash> recent_ ABSL_GUARDED_BY(mu_);
  std::deque<Digest> recent_order_ ABSL_GUARDED_BY(mu_);
  bool publishing_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  RemoteTierStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread publisher_;
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_REMOTE_REMOTE_TIER_H_
