// Test hooks into a running Engine. Not for production code.
#ifndef PREFIXD_ENGINE_ENGINE_TESTING_H_
#define PREFIXD_ENGINE_ENGINE_TESTING_H_

#include <functional>

#include "absl/time/time.h"
#include "cache/kv_cache.h"
#include "engine/engine.h"

namespace prefixd {

// Runs `fn` with the engine's KvCache between two steps on the engine thread (the cache's
// only user), or on the calling thread once the engine has stopped; returns after it ran.
// `engine` must come from Engine::Create.
void RunWithKvCacheForTest(Engine& engine, std::function<void(const KvCache&)> fn);

// Waits until the engine's disk tier has written every queued spill (true) or `deadline`
// passes (false). CHECKs that the engine has a disk tier.
bool FlushDiskTierForTest(Engine& engine, absl::Time deadline);

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_ENGINE_TESTING_H_
