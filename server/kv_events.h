// KvEventPublisher: the engine's KV events (engine/kv_events.h) on the wire of vLLM's
// ZmqEventPublisher (vllm/distributed/kv_events.py), so that cache-aware routers (NVIDIA
// Dynamo's KV router, llm-d's KV-cache indexer) read a prefixd replica as they read vLLM.
//
// Wire (docs/SERVER.md, "KV events"):
//  - PUB (--kv-events): multipart [topic, seq as 8-byte big-endian, payload] per batch.
//  - ROUTER (--kv-events-replay): a request [start seq, 8-byte big-endian] (after an empty
//    delimiter frame when the client sends one) is answered with [seq, payload] for every
//    buffered batch from start seq on, then [-1, empty].
//  - payload: msgpack [ts, [event...], data_parallel_rank]. Each event, by
//    --kv-events-encoding: `map` (the default, vLLM's wire since it switched its event structs
//    from array-like to tagged maps) {"type": "BlockStored", "block_hashes": [hash],
//    "parent_block_hash": hash | nil, "token_ids": [...], "block_size", "lora_id": id | nil,
//    "medium", "lora_name": name | nil, "extra_keys": [[extra key...]]}, {"type":
//    "BlockRemoved", "block_hashes": [hash], "medium"}, {"type": "AllBlocksCleared"}; or
//    `array` (vLLM's earlier array-like wire, for routers that read only it) the same fields
//    in that order without their names, the type first: ["BlockStored", [hash], parent hash |
//    nil, [token ids], block_size, lora_id | nil, medium, lora_name | nil, [[extra key...]]],
//    ["BlockRemoved", [hash], medium], ["AllBlocksCleared"].
//
// Threads: Publish (the engine thread) only queues, under mu_; the publisher thread owns
// both sockets and the replay buffer, encodes and sends.
//
// Invariants:
//  1. Sequence numbers are given at Publish, consecutive from 0 (the start-up
//     AllBlocksCleared): a batch dropped because the queue is full still takes its number,
//     so a subscriber sees the gap.
//  2. resident_ is the set of (medium, block) that every batch published so far, dropped
//     ones included, leaves resident. After a drop, the next batch queued (by Publish, or by
//     the publisher thread once the queue has room, if no batch came) is AllBlocksCleared +
//     BlockStored for each of them, parents first (by chain depth among them, whatever order
//     they became resident in).
//  3. The replay buffer holds the last `buffer_batches` batches sent, in sequence order,
//     byte for byte as sent.
#ifndef PREFIXD_SERVER_KV_EVENTS_H_
#define PREFIXD_SERVER_KV_EVENTS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/kv_events.h"

namespace prefixd {

struct KvEventsOptions {
  std::string endpoint;         // --kv-events: the PUB socket's ZMQ endpoint; empty: off
  std::string replay_endpoint;  // --kv-events-replay: the ROUTER's; empty: no replay
  std::string topic;            // --kv-events-topic: the first frame of every message
  int64_t buffer_batches = 10000;  // --kv-events-buffer: batches kept for replay (>= 1)
  std::string encoding = "map";    // --kv-events-encoding: "map" or "array" (above)
  // Batches waiting for the publisher thread; more are dropped (not a flag: the thread sends
  // far faster than an engine steps).
  int64_t queue_batches = 4096;
};

// INVALID_ARGUMENT naming the flag: an endpoint without a ZMQ transport ("tcp://",
// "ipc://", "inproc://"), a replay or topic without --kv-events, a buffer below 1, an
// encoding other than map or array.
absl::Status ValidateKvEventsOptions(const KvEventsOptions& options);

// How each event of a batch is written (the batch itself is an array either way).
enum class KvEventEncoding { kMap, kArray };

// One batch's payload (msgpack bytes).
std::string EncodeKvEventBatch(double ts, const std::vector<KvEvent>& events,
                               int32_t data_parallel_rank,
                               KvEventEncoding encoding = KvEventEncoding::kMap);

class KvEventPublisher : public KvEventSink {
 public:
  // Validates, binds both sockets (an error names the flag and the endpoint), queues the
  // start-up AllBlocksCleared (seq 0) and starts the publisher thread.
  static absl::StatusOr<std::shared_ptr<KvEventPublisher>> Start(const KvEventsOptions& options);
  // Sends what is queued, then stops the thread and closes the sockets.
  ~KvEventPublisher() override;
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  void Publish(std::vector<KvEvent> batch) override;

  // The endpoints as bound (a wildcard port resolved, e.g. "tcp://127.0.0.1:41234").
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }
  // prefixd_kv_events_published_total: batches sent on the PUB socket.
  uint64_t published() const { return published_.load(std::memory_order_relaxed); }
  // prefixd_kv_events_dropped_total: batches dropped because the queue was full.
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

  // Test seam: while paused the publisher thread takes nothing from the queue (so a test can
  // fill it and see drops); replay requests are still answered.
  void PauseForTest(bool paused);

 private:
  struct Sockets;
  struct Resident {
    KvBlockStored stored;
    uint64_t order = 0;  // when it became resident, for a stable resync order
  };
  KvEventPublisher(const KvEventsOptions& options, std::unique_ptr<Sockets> sockets);
  void Apply(const std::vector<KvEvent>& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<KvEvent> ResyncBatch() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();

  const KvEventsOptions options_;
  std::unique_ptr<Sockets> sockets_;  // the publisher thread's
  std::string endpoint_;
  std::string replay_endpoint_;
  std::atomic<uint64_t> published_{0};
  std::atomic<uint64_t> dropped_{0};

  absl::Mutex mu_;
  struct Queued {
    uint64_t seq;
    double ts;
    std::vector<KvEvent> events;
  };
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool resync_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t resident_order_ ABSL_GUARDED_BY(mu_) = 0;
  // (medium, block hash) -> the block.
  absl::flat_hash_map<std::pair<int, uint64_t>, Resident> resident_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_KV_EVENTS_H_
