#include "engine/request_stream.h"

#include <utility>

#include "base/check.h"

namespace prefixd {

RequestStream::RequestStream(std::function<void()> wake_engine)
    : wake_engine_(std::move(wake_engine)) {}

bool RequestStream::Poll(std::vector<RequestEvent>* out) {
  absl::MutexLock lock(&mu_);
  if (events_.empty()) return false;
  for (RequestEvent& e : events_) out->push_back(std::move(e));
  events_.clear();
  return true;
}

bool RequestStream::Wait(RequestEvent* out, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !events_.empty(); };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) return false;
  *out = std::move(events_.front());
  events_.pop_front();
  return true;
}

void RequestStream::SetNotify(std::function<void()> notify) {
  bool fire;
  std::function<void()> copy;
  {
    absl::MutexLock lock(&mu_);
    notify_ = std::move(notify);
    fire = !events_.empty() && notify_;
    if (fire) copy = notify_;
  }
  if (fire) copy();
}

void RequestStream::Cancel() {
  if (cancelled_.exchange(true, std::memory_order_acq_rel)) return;
  if (wake_engine_) wake_engine_();
}

void RequestStream::StopSample(uint32_t sample_index) {
  {
    absl::MutexLock lock(&mu_);
    sample_stops_.push_back(sample_index);
    has_sample_stops_.store(true, std::memory_order_release);
  }
  if (wake_engine_) wake_engine_();
}

std::vector<uint32_t> RequestStream::TakeSampleStops() {
  if (!has_sample_stops_.load(std::memory_order_acquire)) return {};
  absl::MutexLock lock(&mu_);
  has_sample_stops_.store(false, std::memory_order_relaxed);
  return std::exchange(sample_stops_, {});
}

void RequestStream::Push(std::vector<RequestEvent> events) {
  if (events.empty()) return;
  std::function<void()> notify;
  {
    absl::MutexLock lock(&mu_);
    PREFIXD_CHECK_MSG(!done_, "event pushed after kDone");
    for (RequestEvent& e : events) {
      PREFIXD_CHECK(!done_);
      if (e.kind == RequestEvent::Kind::kDone) done_ = true;
      events_.push_back(std::move(e));
    }
    notify = notify_;
  }
  // Outside the lock: the callback may Poll() this stream.
  if (notify) notify();
}

}  // namespace prefixd
