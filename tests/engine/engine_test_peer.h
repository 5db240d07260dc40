// What tests may reach inside a running Engine (the friend EngineTestPeer): its KvCache and its
// disk tier, each on the thread that owns it.
#ifndef PREFIXD_TESTS_ENGINE_ENGINE_TEST_PEER_H_
#define PREFIXD_TESTS_ENGINE_ENGINE_TEST_PEER_H_

#include <functional>

#include "absl/time/time.h"
#include "base/check.h"
#include "cache/disk/disk_tier.h"
#include "cache/remote/remote_tier.h"
#include "cache/kv_cache.h"
#include "engine/engine.h"

namespace prefixd {

class EngineTestPeer {
 public:
  // Runs `fn` with the engine's KvCache between two steps on the engine thread (the cache's
  // only user), or on the calling thread once the engine has stopped; returns after it ran.
  static void RunWithKvCache(Engine& engine, const std::function<void(const KvCache&)>& fn) {
    engine.RunBetweenSteps([&] { fn(*engine.cache_); });
  }

  // Waits until the engine's disk tier has written every queued spill (true) or `deadline`
  // passes (false). CHECKs that the engine has a disk tier.
  static bool FlushDiskTier(Engine& engine, absl::Time deadline) {
    PREFIXD_CHECK(engine.tier_ != nullptr);
    return engine.tier_->Flush(deadline);
  }
  static bool FlushRemoteTier(Engine& engine, absl::Time deadline) {
    PREFIXD_CHECK(engine.remote_ != nullptr);
    return engine.remote_->Flush(deadline);
  }
};

}  // namespace prefixd

#endif  // PREFIXD_TESTS_ENGINE_ENGINE_TEST_PEER_H_
