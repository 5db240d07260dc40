// The on-disk form of one KV block: what the disk tier writes when the pool evicts a block and
// what it must prove before a block may enter the pool again.
//
// A file is four sections, every integer little-endian:
//   header (kBlockFileHeaderBytes):
//     0   magic "PFXDKVB\0"            8
//     8   format version (2)           u32
//     12  header bytes (208)           u32
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
//   tokens: block size x u32
//   data:   data bytes of K/V in the backends' block layout (engine/backend.h ReadKvBlock)
//   checksum: SHA-256 over the three sections before it (32 bytes)
//
// A block is accepted only when all of these hold: the size is exactly what the header says,
// magic, version and layout equal the reader's, the checksum matches, the root and chain key
// are the ones asked for, ChainKey(parent key, tokens) reproduces it, and the tokens are the
// prompt's own (a SHA-256 collision can never serve another prefix). Anything else is an error
// saying which check failed; the tier then drops the file and the engine computes the block
// instead.
#ifndef PREFIXD_CACHE_DISK_BLOCK_FILE_H_
#define PREFIXD_CACHE_DISK_BLOCK_FILE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache/sha256.h"

namespace prefixd {

// Version 2 added the numerics key: version 1 files, whose K/V any backend of the same dtype
// would have read, are dropped on sight.
inline constexpr uint32_t kBlockFileVersion = 2;
inline constexpr int64_t kBlockFileHeaderBytes = 208;
inline constexpr int64_t kBlockFileChecksumBytes = 32;

// What must match between the process that wrote a block and the one that reads it.
struct DiskLayout {
  Digest manifest_key{};  // Sha256Of(manifest)
  Digest numerics_key{};  // Sha256Of(Backend::kv_numerics()): who computed the K/V, and how
  uint32_t dtype = 0;
  uint32_t element_bytes = 0;
  uint32_t block_size = 0;
  uint32_t n_layer = 0;
  uint32_t n_head = 0;
  uint32_t head_dim = 0;

  // block_size x 2 x n_layer x n_head x head_dim x element_bytes.
  int64_t data_bytes() const;
  // Total file size: header + tokens + data + checksum.
  int64_t file_bytes() const;
  // 16 hex digits naming this layout in file names, so that start-up can tell the files of
  // this layout from others without opening them (the header is still checked on every load).
  std::string Id() const;
  bool operator==(const DiskLayout&) const = default;
};

// INVALID_ARGUMENT unless every geometry field is positive and the block is below 2 GiB.
absl::Status ValidateDiskLayout(const DiskLayout& layout);

struct BlockRecord {
  Digest root{};
  Digest parent_key{};
  Digest key{};
  std::vector<uint32_t> tokens;  // layout.block_size of them
  std::vector<uint8_t> data;     // layout.data_bytes()
};

// The file's bytes. PREFIXD_CHECKs that tokens and data have the layout's sizes.
std::string EncodeBlockFile(const DiskLayout& layout, const BlockRecord& record);

// What the reader expects of one block: its request's root, the chain key it looked up and
// the prompt's tokens of that block.
struct BlockExpectation {
  Digest root{};
  Digest key{};
  absl::Span<const uint32_t> tokens;
};

// Verifies `bytes` (see above) against the reader's layout and expectation. DATA_LOSS naming
// the failed check (size, magic, version, layout, checksum, root, key, chain, tokens); on
// success the data section, a view into `bytes`.
absl::StatusOr<absl::Span<const uint8_t>> DecodeBlockFile(std::string_view bytes,
                                                          const DiskLayout& layout,
                                                          const BlockExpectation& expect);

}  // namespace prefixd

#endif  // PREFIXD_CACHE_DISK_BLOCK_FILE_H_
