// The thread-safe handle between a caller and the engine thread for one request.
//
// Invariants: events come out in the order the engine pushed them; after the one kDone
// event nothing more is pushed (Push after Finish is a bug, checked). Cancel() only raises
// a flag and wakes the engine; the engine thread alone releases blocks and pushes
// kDone(CANCELLED), so no caller thread ever touches the pool.
#ifndef PREFIXD_ENGINE_REQUEST_STREAM_H_
#define PREFIXD_ENGINE_REQUEST_STREAM_H_

#include <atomic>
#include <deque>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/engine.h"

namespace prefixd {

class RequestStreamImpl final : public RequestStream {
 public:
  // `wake_engine` is called (from the cancelling thread) after Cancel() raises the flag.
  explicit RequestStreamImpl(std::function<void()> wake_engine);

  bool Poll(std::vector<RequestEvent>* out) override;
  bool Wait(RequestEvent* out, absl::Time deadline) override;
  void SetNotify(std::function<void()> notify) override;
  void Cancel() override;
  void StopSample(uint32_t sample_index) override;

  // Engine side.
  bool cancel_requested() const { return cancelled_.load(std::memory_order_acquire); }
  // The samples StopSample asked to end since the last call.
  std::vector<uint32_t> TakeSampleStops();
  // Appends events; the last may be kDone, after which the stream is closed.
  void Push(std::vector<RequestEvent> events);
  bool done() const;

 private:
  const std::function<void()> wake_engine_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> has_sample_stops_{false};  // a cheap check for the engine's every step
  mutable absl::Mutex mu_;
  std::deque<RequestEvent> events_ ABSL_GUARDED_BY(mu_);
  std::function<void()> notify_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<uint32_t> sample_stops_ ABSL_GUARDED_BY(mu_);
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_REQUEST_STREAM_H_
