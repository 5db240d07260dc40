// What tests may reach inside a running Engine (the friend EngineTestPeer): its KvCache and its
// tiers, each on the thread that owns it.
#ifndef PREFIXD_TESTS_ENGINE_ENGINE_TEST_PEER_H_
#define PREFIXD_TESTS_ENGINE_ENGINE_TEST_PEER_H_

#include <functional>

#include "absl/time/time.h"
#include "base/check.h"
#include "cache/kv_cache.h"
#include "cache/tier.h"
#include "engine/engine.h"
#include "engine/kv_event_recorder.h"
#include "engine/kv_tiers.h"

namespace prefixd {

class EngineTestPeer {
 public:
  // Runs `fn` with the engine's KvCache between two steps on the engine thread (the cache's
  // only user), or on the calling thread once the engine has stopped; returns after it ran.
  static void RunWithKvCache(Engine& engine, const std::function<void(const KvCache&)>& fn) {
    engine.RunBetweenSteps([&] { fn(*engine.cache_); });
  }

  // Publishes the KV events recorded so far, the disk tier's waiting in its inbox included
  // (between two steps, on the engine thread: the recorder's). Nothing without --kv-events.
  static void FlushKvEvents(Engine& engine) {
    engine.RunBetweenSteps([&] {
      if (engine.events_ != nullptr) engine.events_->Flush();
    });
  }

  // Waits until the engine's disk tier has written every queued spill (true) or `deadline`
  // passes (false). CHECKs that the engine has a disk tier.
  static bool FlushDiskTier(Engine& engine, absl::Time deadline) {
    return TierOf(engine, TierMedium::kDisk).Flush(deadline);
  }
  // The same for the remote tier's publish queue.
  static bool FlushRemoteTier(Engine& engine, absl::Time deadline) {
    return TierOf(engine, TierMedium::kRemote).Flush(deadline);
  }

 private:
  static KvTier& TierOf(Engine& engine, TierMedium medium) {
    for (EngineTier& t : engine.tiers_) {
      if (t.tier->medium() == medium) return *t.tier;
    }
    PREFIXD_CHECK_MSG(false, "the engine has no such tier");
    __builtin_unreachable();
  }
};

}  // namespace prefixd

#endif  // PREFIXD_TESTS_ENGINE_ENGINE_TEST_PEER_H_
