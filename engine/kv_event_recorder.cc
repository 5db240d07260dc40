#include "engine/kv_event_recorder.h"

#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "cache/sha256.h"

namespace prefixd {

const char* KvMediumName(KvMedium medium) {
  switch (medium) {
    case KvMedium::kCpu:
      return "CPU";
    case KvMedium::kGpu:
      return "GPU";
    case KvMedium::kDisk:
      return "DISK";
  }
  return "CPU";
}

KvMedium PoolMediumOfNumerics(std::string_view kv_numerics) {
  return kv_numerics.substr(0, 5) == "cuda " || kv_numerics == "cuda" ? KvMedium::kGpu
                                                                     : KvMedium::kCpu;
}

uint64_t KvEventBlockHash(const Digest& chain_key) {
  uint64_t h = 0;
  for (int i = 0; i < 8; ++i) h = (h << 8) | chain_key[i];
  return h;
}

KvEventRecorder::KvEventRecorder(Options options) : options_(std::move(options)) {
  PREFIXD_CHECK(options_.sink != nullptr);
}

void KvEventRecorder::NoteRoot(const Digest& root, const std::string& adapter_name,
                               const std::string& adapter_digest,
                               const std::string& cache_namespace) {
  if (roots_.contains(root)) return;
  if (roots_.size() >= kMaxIdleRoots) {
    absl::erase_if(roots_, [](const auto& r) { return r.second.pool_blocks == 0; });
  }
  RootInfo info;
  info.extra_keys.push_back(absl::StrCat("ns:", DigestHex(Sha256Of(cache_namespace))));
  if (!adapter_digest.empty()) {
    info.lora_name = adapter_name;
    // 63 bits of the digest: a non-negative int64 that names the adapter's content.
    uint64_t id = 0;
    for (int i = 0; i < 16 && i < static_cast<int>(adapter_digest.size()); ++i) {
      const char c = adapter_digest[i];
      id = (id << 4) | static_cast<uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    info.lora_id = static_cast<int64_t>(id >> 1);
    info.extra_keys.push_back(absl::StrCat("adapter:", adapter_digest));
  }
  roots_.emplace(root, std::move(info));
}

KvBlockStored KvEventRecorder::Stored(const RootInfo* info, const Digest& key,
                                      const Digest* parent_key,
                                      absl::Span<const uint32_t> tokens, KvMedium medium) const {
  KvBlockStored s;
  s.block_hash = KvEventBlockHash(key);
  if (parent_key != nullptr) s.parent_block_hash = KvEventBlockHash(*parent_key);
  s.token_ids.assign(tokens.begin(), tokens.end());
  s.block_size = options_.block_size;
  s.medium = medium;
  if (info != nullptr) {
    s.lora_name = info->lora_name;
    s.lora_id = info->lora_id;
    s.extra_keys = info->extra_keys;
  }
  return s;
}

void KvEventRecorder::OnIndexed(const IndexedBlock& b) {
  auto it = roots_.find(*b.root);
  RootInfo* info = it == roots_.end() ? nullptr : &it->second;
  if (info != nullptr) ++info->pool_blocks;
  pending_.push_back(Stored(info, *b.key, b.parent_key, b.tokens, options_.pool_medium));
}

void KvEventRecorder::OnEvicted(const EvictedBlock& e) {
  pending_.push_back(KvBlockRemoved{.block_hash = KvEventBlockHash(*e.key),
                                    .medium = options_.pool_medium});
  auto it = roots_.find(*e.root);
  // A block indexed while its root was swept was never counted: the count stops at zero, so
  // that the root is swept again once it looks empty (a negative count would keep it forever).
  if (it != roots_.end() && it->second.pool_blocks > 0) --it->second.pool_blocks;
}

void KvEventRecorder::OnDiskStored(const BlockRecordHead& head) {
  auto it = roots_.find(head.root);
  // A record's parent key is the root for a first block.
  const Digest* parent = head.parent_key == head.root ? nullptr : &head.parent_key;
  pending_.push_back(Stored(it == roots_.end() ? nullptr : &it->second, head.key, parent,
                            head.tokens, KvMedium::kDisk));
}

void KvEventRecorder::OnDiskDeleted(const Digest& key) {
  pending_.push_back(
      KvBlockRemoved{.block_hash = KvEventBlockHash(key), .medium = KvMedium::kDisk});
}

void KvEventRecorder::Flush() {
  if (options_.disk_events != nullptr) {
    for (TierEventInbox::Event& e : options_.disk_events->Take()) {
      if (const auto* head = std::get_if<BlockRecordHead>(&e)) {
        OnDiskStored(*head);
      } else {
        OnDiskDeleted(std::get<Digest>(e));
      }
    }
  }
  if (pending_.empty()) return;
  options_.sink->Publish(std::move(pending_));
  pending_.clear();
}

}  // namespace prefixd
