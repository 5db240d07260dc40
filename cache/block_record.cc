#include "cache/block_record.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/check.h"
#include "cache/block_key.h"
#include "cache/digest_hash.h"

namespace prefixd {
namespace {

constexpr char kMagic[8] = {'P', 'F', 'X', 'D', 'K', 'V', 'B', '\0'};

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutF32(std::string* out, float v) { PutU32(out, std::bit_cast<uint32_t>(v)); }
void PutDigest(std::string* out, const Digest& d) {
  out->append(reinterpret_cast<const char*>(d.data()), d.size());
}

// Reads fields in order from a byte range whose size was checked before.
class Reader {
 public:
  explicit Reader(const char* p) : p_(reinterpret_cast<const uint8_t*>(p)) {}
  uint32_t U32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{p_[i]} << (8 * i);
    p_ += 4;
    return v;
  }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{p_[i]} << (8 * i);
    p_ += 8;
    return v;
  }
  float F32() { return std::bit_cast<float>(U32()); }
  Digest D() {
    Digest d;
    std::memcpy(d.data(), p_, d.size());
    p_ += d.size();
    return d;
  }

 private:
  const uint8_t* p_;
};

absl::Status Lost(std::string_view what) {
  return absl::DataLossError(absl::StrCat("disk tier block rejected: ", std::string(what)));
}

// The score section's rules (block_record.h) for position `j` of a block whose parent key is
// `first_block` the root: empty when they hold, else what broke.
std::string ScoreRuleBroken(const PositionScore& p, uint32_t j, bool first_block, uint32_t top_k) {
  if (p.has_logprob == (first_block && j == 0)) {
    return absl::StrFormat("position %d %s a logprob", j, p.has_logprob ? "has" : "lacks");
  }
  if (!p.has_logprob && (p.logprob != 0.0f || !p.top.empty())) {
    return absl::StrFormat("position %d has entries without a logprob", j);
  }
  if (p.top.size() > top_k) {
    return absl::StrFormat("position %d has %d top entries, above %d", j, p.top.size(), top_k);
  }
  for (size_t i = 1; i < p.top.size(); ++i) {
    if (p.top[i - 1].logprob < p.top[i].logprob) {
      return absl::StrFormat("position %d's top entries are not descending", j);
    }
  }
  return "";
}

// The header's fields a reader needs after the checks that need nothing past the header.
struct Header {
  Digest root{};
  Digest parent_key{};
  Digest key{};
  bool scored = false;
};

// Checks the header of `bytes` against `layout` (size at least the header, magic, version,
// header size, layout, data size, score section): what DecodeBlockRecord checks first, in
// its order, and all DecodeBlockRecordHead can check without the body.
absl::StatusOr<Header> ParseHeader(std::string_view bytes, const BlockLayout& layout) {
  if (static_cast<int64_t>(bytes.size()) < kBlockRecordHeaderBytes) {
    return Lost(absl::StrFormat("size: %d bytes, shorter than the header", bytes.size()));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return Lost("magic");
  Reader in(bytes.data() + sizeof(kMagic));
  const uint32_t version = in.U32();
  if (version != kBlockRecordVersion) {
    return Lost(
        absl::StrFormat("format version %d, this build reads %d", version, kBlockRecordVersion));
  }
  if (in.U32() != kBlockRecordHeaderBytes) return Lost("header size");
  BlockLayout got;
  got.manifest_key = in.D();
  got.dtype = in.U32();
  got.element_bytes = in.U32();
  got.block_size = in.U32();
  got.n_layer = in.U32();
  got.n_head = in.U32();
  got.head_dim = in.U32();
  const uint64_t data_bytes = in.U64();
  Header h;
  h.root = in.D();
  h.parent_key = in.D();
  h.key = in.D();
  got.numerics_key = in.D();
  got.score_top_k = in.U32();
  const uint32_t score_positions = in.U32();
  if (!(got == layout)) return Lost("layout (manifest, numerics, dtype or geometry) differs");
  if (data_bytes != static_cast<uint64_t>(layout.data_bytes())) return Lost("data size");
  h.scored = score_positions != 0;
  if (h.scored && (score_positions != layout.block_size || layout.score_top_k == 0)) {
    return Lost(absl::StrFormat("score section of %d positions", score_positions));
  }
  return h;
}

}  // namespace

int64_t BlockLayout::data_bytes() const {
  return int64_t{block_size} * 2 * n_layer * n_head * head_dim * element_bytes;
}

int64_t BlockLayout::score_bytes() const {
  return int64_t{block_size} * (12 + 8 * int64_t{score_top_k});
}

int64_t BlockLayout::record_bytes() const {
  return kBlockRecordHeaderBytes + 4 * int64_t{block_size} + data_bytes() +
         kBlockRecordChecksumBytes;
}

int64_t BlockLayout::scored_record_bytes() const { return record_bytes() + score_bytes(); }

std::string BlockLayout::Id() const {
  std::string bytes;
  PutU32(&bytes, kBlockRecordVersion);
  PutDigest(&bytes, manifest_key);
  PutDigest(&bytes, numerics_key);
  for (uint32_t v : {dtype, element_bytes, block_size, n_layer, n_head, head_dim, score_top_k}) {
    PutU32(&bytes, v);
  }
  return DigestHex(Sha256Of(bytes)).substr(0, 16);
}

absl::Status ValidateBlockLayout(const BlockLayout& l) {
  if (l.element_bytes == 0 || l.block_size == 0 || l.n_layer == 0 || l.n_head == 0 ||
      l.head_dim == 0) {
    return absl::InvalidArgumentError("disk tier layout: every geometry field must be positive");
  }
  if (l.data_bytes() >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "disk tier layout: a block of %d bytes is too large for one file", l.data_bytes()));
  }
  if (l.score_top_k > kMaxScoreTopK) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "disk tier layout: score_top_k %d is above %d", l.score_top_k, kMaxScoreTopK));
  }
  return absl::OkStatus();
}

std::string EncodeBlockRecord(const BlockLayout& layout, const BlockRecord& r) {
  PREFIXD_CHECK(r.tokens.size() == layout.block_size);
  PREFIXD_CHECK(static_cast<int64_t>(r.data.size()) == layout.data_bytes());
  const bool scored = !r.scores.empty();
  PREFIXD_CHECK(!scored || (layout.score_top_k > 0 && r.scores.size() == layout.block_size));
  const int64_t total = scored ? layout.scored_record_bytes() : layout.record_bytes();
  std::string out;
  out.reserve(static_cast<size_t>(total));
  out.append(kMagic, sizeof(kMagic));
  PutU32(&out, kBlockRecordVersion);
  PutU32(&out, static_cast<uint32_t>(kBlockRecordHeaderBytes));
  PutDigest(&out, layout.manifest_key);
  for (uint32_t v : {layout.dtype, layout.element_bytes, layout.block_size, layout.n_layer,
                     layout.n_head, layout.head_dim}) {
    PutU32(&out, v);
  }
  PutU64(&out, static_cast<uint64_t>(layout.data_bytes()));
  PutDigest(&out, r.root);
  PutDigest(&out, r.parent_key);
  PutDigest(&out, r.key);
  PutDigest(&out, layout.numerics_key);
  PutU32(&out, layout.score_top_k);
  PutU32(&out, scored ? layout.block_size : 0);
  PREFIXD_CHECK(static_cast<int64_t>(out.size()) == kBlockRecordHeaderBytes);
  for (uint32_t t : r.tokens) PutU32(&out, t);
  out.append(reinterpret_cast<const char*>(r.data.data()), r.data.size());
  const bool first_block = r.parent_key == r.root;
  for (uint32_t j = 0; j < r.scores.size(); ++j) {
    const PositionScore& p = r.scores[j];
    PREFIXD_CHECK_MSG(ScoreRuleBroken(p, j, first_block, layout.score_top_k).empty(),
                      ScoreRuleBroken(p, j, first_block, layout.score_top_k).c_str());
    PutU32(&out, p.has_logprob ? 1 : 0);
    PutF32(&out, p.logprob);
    PutU32(&out, static_cast<uint32_t>(p.top.size()));
    for (uint32_t i = 0; i < layout.score_top_k; ++i) {
      PutU32(&out, i < p.top.size() ? p.top[i].id : 0);
      PutF32(&out, i < p.top.size() ? p.top[i].logprob : 0.0f);
    }
  }
  PutDigest(&out, Sha256Of(out));
  PREFIXD_CHECK(static_cast<int64_t>(out.size()) == total);
  return out;
}

absl::StatusOr<absl::Span<const uint8_t>> DecodeBlockRecord(std::string_view bytes,
                                                            const BlockLayout& layout,
                                                            const BlockExpectation& expect,
                                                            std::vector<PositionScore>* scores) {
  absl::StatusOr<Header> header = ParseHeader(bytes, layout);
  if (!header.ok()) return header.status();
  const Digest& root = header->root;
  const Digest& parent_key = header->parent_key;
  const Digest& stored_key = header->key;
  const bool scored = header->scored;
  const int64_t total = scored ? layout.scored_record_bytes() : layout.record_bytes();
  if (static_cast<int64_t>(bytes.size()) != total) {
    return Lost(absl::StrFormat("size: %d bytes, the header needs %d", bytes.size(), total));
  }
  const size_t body = bytes.size() - kBlockRecordChecksumBytes;
  const Digest sum = Sha256Of(bytes.substr(0, body));
  if (std::memcmp(sum.data(), bytes.data() + body, sum.size()) != 0) return Lost("checksum");
  if (root != expect.root) return Lost("root key (model and namespace) differs");
  if (stored_key != expect.key) return Lost("chain key is not the one looked up");
  std::vector<uint32_t> stored_tokens(layout.block_size);
  Reader tok(bytes.data() + kBlockRecordHeaderBytes);
  for (uint32_t& t : stored_tokens) t = tok.U32();
  if (ChainKey(parent_key, stored_tokens) != expect.key) {
    return Lost("tokens do not hash to the key");
  }
  if (!std::equal(expect.tokens.begin(), expect.tokens.end(), stored_tokens.begin(),
                  stored_tokens.end())) {
    return Lost("tokens differ from the prompt's");
  }
  const int64_t data_at = kBlockRecordHeaderBytes + 4 * int64_t{layout.block_size};
  std::vector<PositionScore> decoded;
  if (scored) {
    // After the checksum: what is read here is what the writer wrote, so a broken rule is
    // a writer's fault or a forged record, and either way the record is not used.
    Reader sc(bytes.data() + data_at + layout.data_bytes());
    const bool first_block = parent_key == root;
    decoded.resize(layout.block_size);
    for (uint32_t j = 0; j < layout.block_size; ++j) {
      PositionScore& p = decoded[j];
      const uint32_t flags = sc.U32();
      p.logprob = sc.F32();
      const uint32_t n = sc.U32();
      if (flags > 1) return Lost(absl::StrFormat("score section: position %d flags %d", j, flags));
      if (n > layout.score_top_k) {
        return Lost(absl::StrFormat("score section: position %d has %d top entries, above %d", j, n,
                                    layout.score_top_k));
      }
      p.has_logprob = flags == 1;
      for (uint32_t i = 0; i < layout.score_top_k; ++i) {
        const uint32_t id = sc.U32();
        const uint32_t lp = sc.U32();
        if (i < n) {
          p.top.push_back({id, std::bit_cast<float>(lp)});
        } else if (id != 0 || lp != 0) {
          return Lost(absl::StrFormat("score section: position %d has bytes past its entries", j));
        }
      }
      if (std::string broken = ScoreRuleBroken(p, j, first_block, layout.score_top_k);
          !broken.empty()) {
        return Lost(absl::StrCat("score section: ", broken));
      }
    }
  }
  if (scores != nullptr) *scores = std::move(decoded);
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data()) + data_at;
  return absl::MakeConstSpan(data, static_cast<size_t>(layout.data_bytes()));
}

int64_t BlockRecordHeadBytes(const BlockLayout& layout) {
  return kBlockRecordHeaderBytes + 4 * int64_t{layout.block_size};
}

absl::StatusOr<BlockRecordHead> DecodeBlockRecordHead(std::string_view bytes,
                                                      const BlockLayout& layout) {
  absl::StatusOr<Header> header = ParseHeader(bytes, layout);
  if (!header.ok()) return header.status();
  if (static_cast<int64_t>(bytes.size()) < BlockRecordHeadBytes(layout)) {
    return Lost(absl::StrFormat("size: %d bytes, shorter than the head", bytes.size()));
  }
  BlockRecordHead head{.root = header->root,
                       .parent_key = header->parent_key,
                       .key = header->key,
                       .tokens = std::vector<uint32_t>(layout.block_size),
                       .scored = header->scored};
  Reader tok(bytes.data() + kBlockRecordHeaderBytes);
  for (uint32_t& t : head.tokens) t = tok.U32();
  if (ChainKey(head.parent_key, head.tokens) != head.key) {
    return Lost("tokens do not hash to the key");
  }
  return head;
}

void OrderParentsFirst(std::vector<BlockRecordHead>* heads) {
  absl::flat_hash_map<Digest, size_t, DigestHash> at;
  for (size_t i = 0; i < heads->size(); ++i) at.emplace((*heads)[i].key, i);
  // depth[i]: how many of i's ancestors are in the set; -1 until known. A chain is followed
  // up to its first known depth, then filled in on the way back.
  std::vector<int64_t> depth(heads->size(), -1);
  std::vector<size_t> path;
  for (size_t i = 0; i < heads->size(); ++i) {
    size_t j = i;
    path.clear();
    while (depth[j] < 0) {
      path.push_back(j);
      auto p = at.find((*heads)[j].parent_key);
      // A parent outside the set, or a cycle (a forged set: chain keys cannot form one).
      if (p == at.end() || path.size() > heads->size()) break;
      j = p->second;
    }
    int64_t d = depth[j] < 0 ? -1 : depth[j];
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      if (depth[*it] < 0) depth[*it] = ++d;
      d = depth[*it];
    }
  }
  std::vector<size_t> order(heads->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return depth[a] < depth[b]; });
  std::vector<BlockRecordHead> sorted;
  sorted.reserve(heads->size());
  for (size_t i : order) sorted.push_back(std::move((*heads)[i]));
  *heads = std::move(sorted);
}

}  // namespace prefixd
