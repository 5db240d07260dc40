#include "engine/tier_event_inbox.h"

namespace prefixd {

void TierEventInbox::Push(Event event) {
  {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(event));
  }
  if (wake_) wake_();
}

std::vector<TierEventInbox::Event> TierEventInbox::Take() {
  absl::MutexLock lock(&mu_);
  std::vector<Event> out = std::move(events_);
  events_.clear();
  return out;
}

}  // namespace prefixd
