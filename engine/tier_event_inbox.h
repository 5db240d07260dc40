// TierEventInbox: the disk tier's block events (DiskTierOptions::on_store / on_delete,
// cache/disk/disk_tier_options.h) on their way from the tier's threads to the engine thread,
// which hands them to the KvEventRecorder (engine/kv_event_recorder.h) at each Flush. The
// recorder is engine-thread only; the tier writes, deletes and verifies files on its own
// threads (writer, loader), so its events wait here.
//
// Threads: Push* from any thread (the tier calls them under its own lock, so they arrive in
// the order its index changed), Take on the engine thread. Held by shared_ptr: the tier's
// callbacks hold it as well as the recorder, and the tier outlives the recorder (a write that
// completes while the engine shuts down pushes into an inbox nobody drains any more).
//
// Invariants:
//  1. Take returns every event pushed since the last Take, in push order, exactly once.
//  2. `wake` runs after each push, outside the inbox's lock (it takes the engine's), so the
//     engine steps and publishes a file written or deleted while no request runs.
#ifndef PREFIXD_ENGINE_TIER_EVENT_INBOX_H_
#define PREFIXD_ENGINE_TIER_EVENT_INBOX_H_

#include <functional>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cache/block_record.h"
#include "cache/sha256.h"

namespace prefixd {

class TierEventInbox {
 public:
  // A file entered the tier's index (its head), or left it (its chain key).
  using Event = std::variant<BlockRecordHead, Digest>;

  // `wake` may be empty (tests drain by hand).
  explicit TierEventInbox(std::function<void()> wake) : wake_(std::move(wake)) {}
  TierEventInbox(const TierEventInbox&) = delete;
  TierEventInbox& operator=(const TierEventInbox&) = delete;

  void PushStored(const BlockRecordHead& head) { Push(head); }
  void PushDeleted(const Digest& key) { Push(key); }
  std::vector<Event> Take();

 private:
  void Push(Event event);

  const std::function<void()> wake_;
  absl::Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_TIER_EVENT_INBOX_H_
