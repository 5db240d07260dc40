// What tests may see inside a KvCache beyond its API (the friend KvCacheTestPeer): each
// block's state, reference count and index membership, the free list, the eviction order, the
// indexed blocks, and the whole state as text, so that tiny-pool scenario tests assert exact
// state after each step and plan-then-commit tests compare states before and after a call.
#ifndef PREFIXD_TESTS_CACHE_KV_CACHE_TEST_PEER_H_
#define PREFIXD_TESTS_CACHE_KV_CACHE_TEST_PEER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cache/kv_cache.h"

namespace prefixd {

class KvCacheTestPeer {
 public:
  static BlockState StateOf(const KvCache& c, int32_t block) { return c.StateOf(block); }
  static int32_t RefCount(const KvCache& c, int32_t block) { return c.RefCount(block); }
  static bool IsIndexed(const KvCache& c, int32_t block) { return c.IsIndexed(block); }
  // Ordered by block id.
  static std::vector<IndexedBlockInfo> IndexedBlocks(const KvCache& c) {
    return c.IndexedBlocks();
  }
  // Front (allocated next) first.
  static std::vector<int32_t> FreeList(const KvCache& c) { return c.FreeList(); }
  // The next evicted first, as Evict() would take them.
  static std::vector<int32_t> EvictionOrder(const KvCache& c) { return c.EvictionOrder(); }
  // Equal strings mean equal states.
  static std::string DebugState(const KvCache& c) { return c.DebugState(); }
};

}  // namespace prefixd

#endif  // PREFIXD_TESTS_CACHE_KV_CACHE_TEST_PEER_H_
