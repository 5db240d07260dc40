#include "cache/disk/block_file.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache/block_key.h"
#include "base/check.h"

namespace prefixd {
namespace {

constexpr char kMagic[8] = {'P', 'F', 'X', 'D', 'K', 'V', 'B', '\0'};

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
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

}  // namespace

int64_t DiskLayout::data_bytes() const {
  return int64_t{block_size} * 2 * n_layer * n_head * head_dim * element_bytes;
}

int64_t DiskLayout::file_bytes() const {
  return kBlockFileHeaderBytes + 4 * int64_t{block_size} + data_bytes() + kBlockFileChecksumBytes;
}

std::string DiskLayout::Id() const {
  std::string bytes;
  PutU32(&bytes, kBlockFileVersion);
  PutDigest(&bytes, manifest_key);
  PutDigest(&bytes, numerics_key);
  for (uint32_t v : {dtype, element_bytes, block_size, n_layer, n_head, head_dim}) {
    PutU32(&bytes, v);
  }
  return DigestHex(Sha256Of(bytes)).substr(0, 16);
}

absl::Status ValidateDiskLayout(const DiskLayout& l) {
  if (l.element_bytes == 0 || l.block_size == 0 || l.n_layer == 0 || l.n_head == 0 ||
      l.head_dim == 0) {
    return absl::InvalidArgumentError("disk tier layout: every geometry field must be positive");
  }
  if (l.data_bytes() >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "disk tier layout: a block of %d bytes is too large for one file", l.data_bytes()));
  }
  return absl::OkStatus();
}

std::string EncodeBlockFile(const DiskLayout& layout, const BlockRecord& r) {
  PREFIXD_CHECK(r.tokens.size() == layout.block_size);
  PREFIXD_CHECK(static_cast<int64_t>(r.data.size()) == layout.data_bytes());
  std::string out;
  out.reserve(static_cast<size_t>(layout.file_bytes()));
  out.append(kMagic, sizeof(kMagic));
  PutU32(&out, kBlockFileVersion);
  PutU32(&out, static_cast<uint32_t>(kBlockFileHeaderBytes));
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
  PREFIXD_CHECK(static_cast<int64_t>(out.size()) == kBlockFileHeaderBytes);
  for (uint32_t t : r.tokens) PutU32(&out, t);
  out.append(reinterpret_cast<const char*>(r.data.data()), r.data.size());
  PutDigest(&out, Sha256Of(out));
  PREFIXD_CHECK(static_cast<int64_t>(out.size()) == layout.file_bytes());
  return out;
}

absl::StatusOr<absl::Span<const uint8_t>> DecodeBlockFile(std::string_view bytes,
                                                          const DiskLayout& layout,
                                                          const BlockExpectation& expect) {
  if (static_cast<int64_t>(bytes.size()) < kBlockFileHeaderBytes) {
    return Lost(absl::StrFormat("size: %d bytes, shorter than the header", bytes.size()));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return Lost("magic");
  Reader in(bytes.data() + sizeof(kMagic));
  const uint32_t version = in.U32();
  if (version != kBlockFileVersion) {
    return Lost(
        absl::StrFormat("format version %d, this build reads %d", version, kBlockFileVersion));
  }
  if (in.U32() != kBlockFileHeaderBytes) return Lost("header size");
  DiskLayout got;
  got.manifest_key = in.D();
  got.dtype = in.U32();
  got.element_bytes = in.U32();
  got.block_size = in.U32();
  got.n_layer = in.U32();
  got.n_head = in.U32();
  got.head_dim = in.U32();
  const uint64_t data_bytes = in.U64();
  const Digest root = in.D();
  const Digest parent_key = in.D();
  const Digest stored_key = in.D();
  got.numerics_key = in.D();
  if (!(got == layout)) return Lost("layout (manifest, numerics, dtype or geometry) differs");
  if (data_bytes != static_cast<uint64_t>(layout.data_bytes())) return Lost("data size");
  if (static_cast<int64_t>(bytes.size()) != layout.file_bytes()) {
    return Lost(
        absl::StrFormat("size: %d bytes, the layout needs %d", bytes.size(), layout.file_bytes()));
  }
  const size_t body = bytes.size() - kBlockFileChecksumBytes;
  const Digest sum = Sha256Of(bytes.substr(0, body));
  if (std::memcmp(sum.data(), bytes.data() + body, sum.size()) != 0) return Lost("checksum");
  if (root != expect.root) return Lost("root key (model and namespace) differs");
  if (stored_key != expect.key) return Lost("chain key is not the one looked up");
  std::vector<uint32_t> stored_tokens(layout.block_size);
  Reader tok(bytes.data() + kBlockFileHeaderBytes);
  for (uint32_t& t : stored_tokens) t = tok.U32();
  if (ChainKey(parent_key, stored_tokens) != expect.key) {
    return Lost("tokens do not hash to the key");
  }
  if (!std::equal(expect.tokens.begin(), expect.tokens.end(), stored_tokens.begin(),
                  stored_tokens.end())) {
    return Lost("tokens differ from the prompt's");
  }
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data()) + kBlockFileHeaderBytes +
                     4 * int64_t{layout.block_size};
  return absl::MakeConstSpan(data, static_cast<size_t>(layout.data_bytes()));
}

}  // namespace prefixd
