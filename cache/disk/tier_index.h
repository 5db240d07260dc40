// The disk tier's in-memory index: which block files the directory holds, their sizes, and
// the order in which they are deleted when the directory is over its byte cap.
//
// Invariants (CheckInvariants() verifies them; tests/cache/disk/tier_index_test.cc):
//  1. bytes() is the sum of the sizes of every entry, own and foreign.
//  2. Own entries (files of this process's layout, keyed by chain key) and foreign entries
//     (files of other layouts: another model, dtype or block size, keyed by file name) are
//     disjoint sets, each entry in exactly one eviction order.
//  3. Victims come out foreign first, oldest first; then own entries least recently used
//     first (ties by insertion order). Touch() makes an own entry the most recently used.
// Not thread-safe: DiskTier guards it with its mutex.
#ifndef PREFIXD_CACHE_DISK_TIER_INDEX_H_
#define PREFIXD_CACHE_DISK_TIER_INDEX_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cache/digest_hash.h"
#include "cache/sha256.h"

namespace prefixd {

class TierIndex {
 public:
  struct Victim {
    bool foreign = false;
    Digest key{};      // own entries
    std::string name;  // foreign entries: the file name
    int64_t bytes = 0;
  };

  // Adds (or replaces) an own entry used at time `stamp`.
  void Add(const Digest& key, int64_t bytes, int64_t stamp);
  void AddForeign(const std::string& name, int64_t bytes, int64_t stamp);
  bool Contains(const Digest& key) const { return own_.contains(key); }
  // The size of an own entry; 0 when absent.
  int64_t BytesOf(const Digest& key) const {
    auto it = own_.find(key);
    return it == own_.end() ? 0 : it->second.bytes;
  }
  // Marks a hit; false if absent.
  bool Touch(const Digest& key, int64_t stamp);
  bool Erase(const Digest& key);
  // The next file to delete so that bytes() + incoming <= cap; nullopt when it fits already
  // or nothing is left. The victim is removed from the index.
  std::optional<Victim> PopVictim(int64_t cap, int64_t incoming);

  int64_t bytes() const { return bytes_; }
  int64_t own_blocks() const { return static_cast<int64_t>(own_.size()); }
  int64_t foreign_files() const { return static_cast<int64_t>(foreign_.size()); }
  // The own entries' keys, least recently used first.
  std::vector<Digest> OwnKeys() const;
  // Every entry in the order PopVictim would take them (file names for foreign ones, then
  // hex chain keys).
  std::vector<std::string> EvictionOrder() const;
  void CheckInvariants() const;

 private:
  struct Own {
    int64_t bytes = 0;
    int64_t stamp = 0;
    uint64_t seq = 0;
  };
  using OwnLru = std::tuple<int64_t, uint64_t, Digest>;  // (stamp, seq, key)
  using ForeignLru = std::tuple<int64_t, std::string>;   // (stamp, name)

  absl::flat_hash_map<Digest, Own, DigestHash> own_;
  std::set<OwnLru> own_lru_;
  absl::flat_hash_map<std::string, std::pair<int64_t, int64_t>> foreign_;  // bytes, stamp
  std::set<ForeignLru> foreign_lru_;
  int64_t bytes_ = 0;
  uint64_t next_seq_ = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_DISK_TIER_INDEX_H_
