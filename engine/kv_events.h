// KV events: what the engine reports about the blocks it holds, for cache-aware routers
// (vLLM's KV event stream; the wire format is server/kv_events.h's). The engine describes
// each change of its prefix index as an event and hands each step's events, as one batch,
// to a KvEventSink. The engine room knows nothing of the transport.
//
// What the events describe: a block is "stored" in a medium when it becomes a full, indexed
// block of the pool (medium kCpu for the CPU backend's pool, kGpu for the CUDA backend's), or
// when the disk tier indexes its file (kDisk): once the file of a spill is written (a spill
// dropped or failed is never stored), and, in the engine's first batch, every file found in
// the directory at start-up, parents first. It is "removed" from the pool when it leaves the
// pool's index (an eviction, a spill included) and from kDisk when the tier deletes its file
// (its byte cap, a failed verification, a file found gone). Replaying every batch in order
// from an AllBlocksCleared gives the set of (medium, block) a replica holds.
//
// Identity: a block's root (adapter, namespace) is known from the request that computed it.
// A disk file found at start-up holds only its root's key, a hash, and no request has named
// that root yet: its event has no lora_name or lora_id and empty extra_keys (hash, parent and
// tokens are exact). The remote (Redis) tier reports nothing: it is shared by every replica,
// so what it holds is no reason to route to one of them (docs/SCALING.md).
#ifndef PREFIXD_ENGINE_KV_EVENTS_H_
#define PREFIXD_ENGINE_KV_EVENTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cache/sha256.h"

namespace prefixd {

enum class KvMedium { kCpu, kGpu, kDisk };
// vLLM's names: "CPU", "GPU", "DISK".
const char* KvMediumName(KvMedium medium);
// The pool's medium for a backend's kv_numerics() (engine/backend.h): kGpu for the CUDA
// backend's ("cuda ..."), kCpu otherwise.
KvMedium PoolMediumOfNumerics(std::string_view kv_numerics);

// A block's hash on the wire: the first 8 bytes of its chain key, big-endian. The chain key
// covers manifest, namespace, adapter and every token up to the block's end, so two tenants'
// or adapters' identical prompts never share one.
uint64_t KvEventBlockHash(const Digest& chain_key);

struct KvBlockStored {
  uint64_t block_hash = 0;
  std::optional<uint64_t> parent_block_hash = std::nullopt;  // none for a chain's first block
  std::vector<uint32_t> token_ids = {};                      // the block's block_size tokens
  int32_t block_size = 0;
  KvMedium medium = KvMedium::kCpu;
  // The adapter's served name and a 63-bit id from its digest; none for the base model.
  std::optional<std::string> lora_name = std::nullopt;
  std::optional<int64_t> lora_id = std::nullopt;
  // What else went into the block's identity, as text: "ns:" + hex SHA-256 of the cache
  // namespace, and "adapter:" + the adapter's digest for an adapter's block.
  std::vector<std::string> extra_keys = {};
  bool operator==(const KvBlockStored&) const = default;
};
struct KvBlockRemoved {
  uint64_t block_hash = 0;
  KvMedium medium = KvMedium::kCpu;
  bool operator==(const KvBlockRemoved&) const = default;
};
struct KvAllBlocksCleared {
  bool operator==(const KvAllBlocksCleared&) const = default;
};
using KvEvent = std::variant<KvBlockStored, KvBlockRemoved, KvAllBlocksCleared>;

// Where the engine's batches go. Publish is called from the engine thread once per step that
// changed the index and must not block: an implementation queues or drops.
class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  virtual void Publish(std::vector<KvEvent> batch) = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_KV_EVENTS_H_
