// SHA-256 through OpenSSL's EVP interface: the one hash behind model manifests and
// cache block keys.
#ifndef PREFIXD_CACHE_SHA256_H_
#define PREFIXD_CACHE_SHA256_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace prefixd {

using Digest = std::array<uint8_t, 32>;

// Incremental hasher. Update() any number of times, then Final() once.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t size);
  void Update(std::string_view bytes) { Update(bytes.data(), bytes.size()); }
  // Appends the length as uint64 little-endian, then the bytes: variable-length fields
  // hashed this way can never run into each other ("ab"+"c" != "a"+"bc").
  void UpdateLengthPrefixed(std::string_view bytes);
  Digest Final();

 private:
  void* ctx_;  // EVP_MD_CTX*
};

Digest Sha256Of(std::string_view bytes);
std::string DigestHex(const Digest& digest);

}  // namespace prefixd

#endif  // PREFIXD_CACHE_SHA256_H_
