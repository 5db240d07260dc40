// RequestStream: the thread-safe handle between a caller and the engine thread for one
// request. The caller reads events (Poll, Wait, or a notify that schedules a reader) and may
// Cancel or StopSample; the engine's scheduler alone pushes events.
//
// Invariants: events come out in the order the engine pushed them; after the one kDone
// event nothing more is pushed (Push after kDone is a bug, checked). Cancel() and
// StopSample() only record the wish and wake the engine; the engine thread alone releases
// blocks and pushes kDone(CANCELLED), so no caller thread ever touches the pool.
//
// Threads: the notify callback runs on the engine thread and may only schedule work (see
// SetNotify); every other method may be called from any thread.
#ifndef PREFIXD_ENGINE_REQUEST_STREAM_H_
#define PREFIXD_ENGINE_REQUEST_STREAM_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/request.h"

namespace prefixd {

class RequestStream {
 public:
  // `wake_engine` is called (from the cancelling thread) after Cancel() or StopSample()
  // recorded the wish; null when nothing needs waking (a scheduler driven by a test).
  explicit RequestStream(std::function<void()> wake_engine);
  RequestStream(const RequestStream&) = delete;
  RequestStream& operator=(const RequestStream&) = delete;

  // Non-blocking: appends the pending events to *out; false if there were none.
  bool Poll(std::vector<RequestEvent>* out);
  // Blocks until an event is available (true) or `deadline` passes (false).
  bool Wait(RequestEvent* out, absl::Time deadline = absl::InfiniteFuture());
  // `notify` is called from the engine thread whenever events become available. It may only
  // schedule work (post to an executor or strand, raise a flag, signal a waiter): it runs
  // inside the engine's step loop, so anything slower, or any lock another thread may hold,
  // delays the next step of every request. Poll and the text work belong on the thread it
  // schedules. Set it before the first event can matter (right after Submit); it is called
  // at once when events are already waiting.
  void SetNotify(std::function<void()> notify);
  // Idempotent. The sequence's blocks are released before the engine's next step and the
  // stream ends with kDone(CANCELLED).
  void Cancel();
  // Ends one sample as if it had met a stop condition (a stop string the caller found in its
  // text): before its next step the engine releases the sample's blocks and emits its
  // kSampleFinished(kStop); the other samples go on. Idempotent; ignored for a sample that
  // has already finished. Tokens the engine emitted before it saw the call still arrive.
  void StopSample(uint32_t sample_index);

 private:
  friend class Scheduler;  // the engine side below

  bool cancel_requested() const { return cancelled_.load(std::memory_order_acquire); }
  // The samples StopSample asked to end since the last call.
  std::vector<uint32_t> TakeSampleStops();
  // Appends events; the last may be kDone, after which the stream is closed. Calls the
  // notify outside the stream's lock.
  void Push(std::vector<RequestEvent> events);

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
