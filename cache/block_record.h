// The block record: the stored form of one KV block, what every tier behind the pool
// (cache/tier.h) keeps — a disk tier's file, a remote tier's value — and what it must prove
// before a block may enter the pool again. The encoding is bytes in, bytes out and knows
// nothing of files or sockets, so every tier stores the same bytes.
//
// A record is five sections, every integer little-endian:
//   header (kBlockRecordHeaderBytes):
//     0   magic "PFXDKVB\0"            8
//     8   format version (3)           u32
//     12  header bytes (216)           u32
//     16  manifest key                 32   SHA-256 of the model manifest string
//     48  dtype code                   u32  the backend's DType value (of its weights)
//     52  element bytes                u32  of a stored K/V element
//     56  block size (tokens)          u32
//     60  n_layer                      u32
//     64  n_head                       u32
//     68  head_dim                     u32
//     72  data bytes                   u64  = block size x KvBytesPerToken(...)
//     80  root key                     32   CacheRootKey(manifest, namespace): opaque
//     112 parent key                   32   the chain key before this block (root for the first)
//     144 chain key                    32   ChainKey(parent key, tokens)
//     176 numerics key                 32   SHA-256 of Backend::kv_numerics()
//     208 score top-K                  u32  top entries per position of a score section (layout)
//     212 score positions              u32  0: no score section; else block size
//   tokens: block size x u32
//   data:   data bytes of K/V in the backends' block layout (engine/backend.h ReadKvBlock)
//   scores (only when score positions != 0; layout.score_bytes()), per position in order:
//     u32 flags (bit 0: has a logprob; no other bit), f32 logprob of the position's own token,
//     u32 top count n <= top-K, then top-K slots of (u32 id, f32 logprob): n used, descending,
//     the rest zero. Position 0 of a chain's first block (parent key = root) has no logprob
//     (nothing comes before it), every other position has one; one without has logprob 0
//     and n 0. Floats are stored as their bits: a record read back is bit-identical.
//   checksum: SHA-256 over every section before it (32 bytes)
//
// A block is accepted only when all of these hold: the size is exactly what the header says,
// magic, version and layout equal the reader's, the checksum matches, the root and chain key
// are the ones asked for, ChainKey(parent key, tokens) reproduces it, the tokens are the
// prompt's own (a SHA-256 collision can never serve another prefix), and a score section
// keeps the rules above. Anything else is an error saying which check failed; the tier then
// drops the record and the engine computes the block instead.
//
// Versions: 1 had no numerics key, 2 no score section. Both are foreign to this build: the
// version is part of BlockLayout::Id, so their files carry another layout id in their names,
// are never read, count against the tier's cap and are the first it deletes (a version 2
// block costs one recomputation, and keeps no reader of two formats alive).
#ifndef PREFIXD_CACHE_BLOCK_RECORD_H_
#define PREFIXD_CACHE_BLOCK_RECORD_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache/sha256.h"

namespace prefixd {

// Version 2 added the numerics key (version 1 K/V, which any backend of the same dtype would
// have read, is dropped on sight); version 3 the score section.
inline constexpr uint32_t kBlockRecordVersion = 3;
inline constexpr int64_t kBlockRecordHeaderBytes = 216;
inline constexpr int64_t kBlockRecordChecksumBytes = 32;

// What must match between the process that wrote a block and the one that reads it.
struct BlockLayout {
  Digest manifest_key{};  // Sha256Of(manifest)
  Digest numerics_key{};  // Sha256Of(Backend::kv_numerics()): who computed the K/V, and how
  uint32_t dtype = 0;
  uint32_t element_bytes = 0;
  uint32_t block_size = 0;
  uint32_t n_layer = 0;
  uint32_t n_head = 0;
  uint32_t head_dim = 0;
  // Top entries per position in a score section (the engine's kScoreTopK); 0: records of
  // this layout carry no scores.
  uint32_t score_top_k = 0;

  // block_size x 2 x n_layer x n_head x head_dim x element_bytes.
  int64_t data_bytes() const;
  // block_size x (12 + 8 x score_top_k): the score section, when a record has one.
  int64_t score_bytes() const;
  // Total record size without a score section: header + tokens + data + checksum.
  int64_t record_bytes() const;
  // ... and with one (score_top_k > 0).
  int64_t scored_record_bytes() const;
  // 16 hex digits naming this layout in file names, so that start-up can tell the files of
  // this layout from others without opening them (the header is still checked on every load).
  std::string Id() const;
  bool operator==(const BlockLayout&) const = default;
};

// INVALID_ARGUMENT unless every geometry field is positive, the block is below 2 GiB and
// score_top_k is at most kMaxScoreTopK.
absl::Status ValidateBlockLayout(const BlockLayout& layout);

inline constexpr uint32_t kMaxScoreTopK = 256;

// One position's entry of a score section.
struct PositionScore {
  struct Entry {
    uint32_t id = 0;
    float logprob = 0.0f;
    friend bool operator==(const Entry&, const Entry&) = default;
  };
  bool has_logprob = false;
  float logprob = 0.0f;    // of the position's own token (the record's tokens[j])
  std::vector<Entry> top;  // at most layout.score_top_k, descending
  friend bool operator==(const PositionScore&, const PositionScore&) = default;
};

struct BlockRecord {
  Digest root{};
  Digest parent_key{};
  Digest key{};
  std::vector<uint32_t> tokens;  // layout.block_size of them
  std::vector<uint8_t> data;     // layout.data_bytes()
  // Empty: no score section. Else layout.block_size entries, following the rules above.
  std::vector<PositionScore> scores;
};

// The record's bytes. PREFIXD_CHECKs that tokens, data and scores have the layout's sizes and
// that scores keep the section's rules.
std::string EncodeBlockRecord(const BlockLayout& layout, const BlockRecord& record);

// What the reader expects of one block: its request's root, the chain key it looked up and
// the prompt's tokens of that block.
struct BlockExpectation {
  Digest root{};
  Digest key{};
  absl::Span<const uint32_t> tokens;
};

// Verifies `bytes` (see above) against the reader's layout and expectation. DATA_LOSS naming
// the failed check (size, magic, version, layout, checksum, root, key, chain, tokens); on
// success the data section, a view into `bytes`, and, when `scores` is given, the score
// section into it (cleared when the record has none). A damaged score section fails the whole
// record (DATA_LOSS "score section"), with or without `scores`.
absl::StatusOr<absl::Span<const uint8_t>> DecodeBlockRecord(
    std::string_view bytes, const BlockLayout& layout, const BlockExpectation& expect,
    std::vector<PositionScore>* scores = nullptr);

// A record's head: the block's identity (header and tokens) without its K/V, what a tier
// reports about a block it holds without loading it (cache/disk/disk_tier_options.h).
struct BlockRecordHead {
  Digest root{};
  Digest parent_key{};  // the root for a chain's first block
  Digest key{};
  std::vector<uint32_t> tokens = {};  // layout.block_size of them
  bool scored = false;                // the record has a score section
  bool operator==(const BlockRecordHead&) const = default;
};

// The bytes a head takes at the start of a record: the header and the tokens.
int64_t BlockRecordHeadBytes(const BlockLayout& layout);

// Decodes the first BlockRecordHeadBytes(layout) bytes of a record (more are ignored) with
// the checks they allow: magic, version, layout and sizes as DecodeBlockRecord's, and
// ChainKey(parent key, tokens) reproducing the chain key. DATA_LOSS naming the failed check.
// The checksum covers the whole record and is not checked: a head that passes is what the
// record claims to be, not yet a block that may enter the pool (DecodeBlockRecord decides).
absl::StatusOr<BlockRecordHead> DecodeBlockRecordHead(std::string_view bytes,
                                                      const BlockLayout& layout);

// Reorders `heads` so that each block whose parent is among them comes after its parent (by
// depth within the set: roots of the set first); ties keep their order.
void OrderParentsFirst(std::vector<BlockRecordHead>* heads);

}  // namespace prefixd

#endif  // PREFIXD_CACHE_BLOCK_RECORD_H_
