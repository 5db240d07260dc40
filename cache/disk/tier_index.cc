#include "cache/disk/tier_index.h"

#include "base/check.h"

namespace prefixd {

void TierIndex::Add(const Digest& key, int64_t bytes, int64_t stamp) {
  Erase(key);
  const Own e{.bytes = bytes, .stamp = stamp, .seq = next_seq_++};
  own_.emplace(key, e);
  own_lru_.insert(OwnLru{e.stamp, e.seq, key});
  bytes_ += bytes;
}

void TierIndex::AddForeign(const std::string& name, int64_t bytes, int64_t stamp) {
  if (auto it = foreign_.find(name); it != foreign_.end()) {
    foreign_lru_.erase(ForeignLru{it->second.second, name});
    bytes_ -= it->second.first;
    foreign_.erase(it);
  }
  foreign_.emplace(name, std::make_pair(bytes, stamp));
  foreign_lru_.insert(ForeignLru{stamp, name});
  bytes_ += bytes;
}

bool TierIndex::Touch(const Digest& key, int64_t stamp) {
  auto it = own_.find(key);
  if (it == own_.end()) return false;
  PREFIXD_CHECK(own_lru_.erase(OwnLru{it->second.stamp, it->second.seq, key}) == 1);
  it->second.stamp = stamp;
  it->second.seq = next_seq_++;
  own_lru_.insert(OwnLru{it->second.stamp, it->second.seq, key});
  return true;
}

bool TierIndex::Erase(const Digest& key) {
  auto it = own_.find(key);
  if (it == own_.end()) return false;
  PREFIXD_CHECK(own_lru_.erase(OwnLru{it->second.stamp, it->second.seq, key}) == 1);
  bytes_ -= it->second.bytes;
  own_.erase(it);
  return true;
}

std::optional<TierIndex::Victim> TierIndex::PopVictim(int64_t cap, int64_t incoming) {
  if (bytes_ + incoming <= cap) return std::nullopt;
  Victim v;
  if (!foreign_lru_.empty()) {
    v.foreign = true;
    v.name = std::get<1>(*foreign_lru_.begin());
    foreign_lru_.erase(foreign_lru_.begin());
    auto it = foreign_.find(v.name);
    PREFIXD_CHECK(it != foreign_.end());
    v.bytes = it->second.first;
    foreign_.erase(it);
  } else if (!own_lru_.empty()) {
    v.key = std::get<2>(*own_lru_.begin());
    own_lru_.erase(own_lru_.begin());
    auto it = own_.find(v.key);
    PREFIXD_CHECK(it != own_.end());
    v.bytes = it->second.bytes;
    own_.erase(it);
  } else {
    return std::nullopt;
  }
  bytes_ -= v.bytes;
  return v;
}

std::vector<Digest> TierIndex::OwnKeys() const {
  std::vector<Digest> out;
  out.reserve(own_lru_.size());
  for (const OwnLru& o : own_lru_) out.push_back(std::get<2>(o));
  return out;
}

std::vector<std::string> TierIndex::EvictionOrder() const {
  std::vector<std::string> out;
  for (const ForeignLru& f : foreign_lru_) out.push_back(std::get<1>(f));
  for (const OwnLru& o : own_lru_) out.push_back(DigestHex(std::get<2>(o)));
  return out;
}

void TierIndex::CheckInvariants() const {
  int64_t sum = 0;
  PREFIXD_CHECK(own_.size() == own_lru_.size());
  for (const OwnLru& o : own_lru_) {
    auto it = own_.find(std::get<2>(o));
    PREFIXD_CHECK(it != own_.end() && it->second.stamp == std::get<0>(o) &&
                  it->second.seq == std::get<1>(o));
    sum += it->second.bytes;
  }
  PREFIXD_CHECK(foreign_.size() == foreign_lru_.size());
  for (const ForeignLru& f : foreign_lru_) {
    auto it = foreign_.find(std::get<1>(f));
    PREFIXD_CHECK(it != foreign_.end() && it->second.second == std::get<0>(f));
    sum += it->second.first;
  }
  PREFIXD_CHECK(sum == bytes_);
}

}  // namespace prefixd
