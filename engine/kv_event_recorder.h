// KvEventRecorder: the engine thread's side of the KV events (engine/kv_events.h). The pool's
// index and eviction hooks report each block here, and the disk tier's files written, found
// at start-up and deleted arrive through its inbox (engine/tier_event_inbox.h); the engine
// loop hands the events collected during one step to the sink as one batch (Flush).
//
// Invariants:
//  1. Every event of a step is in the batch Flush publishes after that step: the pool's in
//     the order the pool reported them, then the disk tier's in the order its index changed;
//     a step without events publishes nothing.
//  2. roots_ names the identity (adapter, namespace) of every root with a block in the pool
//     and of the roots of requests taken since, so that a block indexed under it can be
//     described. Roots without pool blocks are swept when a new root would make more than
//     kMaxIdleRoots (so the map is bounded whatever clients put in cache_salt); a request
//     taken before such a sweep whose root had no block then reports its blocks without
//     lora_name and extra_keys, and so does a block the disk tier writes after its root was
//     swept. A disk file found at start-up has a root no request named yet: its block has
//     neither.
// Engine thread only (or before the engine thread starts: the start-up Flush).
#ifndef PREFIXD_ENGINE_KV_EVENT_RECORDER_H_
#define PREFIXD_ENGINE_KV_EVENT_RECORDER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cache/block_record.h"
#include "cache/digest_hash.h"
#include "cache/kv_cache.h"
#include "engine/kv_events.h"
#include "engine/tier_event_inbox.h"

namespace prefixd {

class KvEventRecorder {
 public:
  struct Options {
    std::shared_ptr<KvEventSink> sink;  // not null
    KvMedium pool_medium = KvMedium::kCpu;
    int32_t block_size = 0;
    // The disk tier's block events, drained at each Flush; null: no disk tier.
    std::shared_ptr<TierEventInbox> disk_events = nullptr;
  };
  explicit KvEventRecorder(Options options);

  // A request was taken by the engine: its root's identity, for the blocks indexed under it.
  // `adapter_digest` is empty for the base model.
  void NoteRoot(const Digest& root, const std::string& adapter_name,
                const std::string& adapter_digest, const std::string& cache_namespace);
  void OnIndexed(const IndexedBlock& b);
  // A block left the pool. A spill to the disk tier is reported stored on DISK when its file
  // is written (OnDiskStored), not here: a spill may still be dropped or fail.
  void OnEvicted(const EvictedBlock& e);
  // The disk tier indexed a file (written, or found at start-up) or deleted one.
  void OnDiskStored(const BlockRecordHead& head);
  void OnDiskDeleted(const Digest& key);
  // Takes the disk tier's events from its inbox, then publishes the events since the last
  // call, if any.
  void Flush();

  static constexpr size_t kMaxIdleRoots = 4096;

 private:
  struct RootInfo {
    std::optional<std::string> lora_name;
    std::optional<int64_t> lora_id;
    std::vector<std::string> extra_keys;
    int64_t pool_blocks = 0;
  };
  KvBlockStored Stored(const RootInfo* info, const Digest& key, const Digest* parent_key,
                       absl::Span<const uint32_t> tokens, KvMedium medium) const;

  const Options options_;
  absl::flat_hash_map<Digest, RootInfo, DigestHash> roots_;
  std::vector<KvEvent> pending_;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_KV_EVENT_RECORDER_H_
