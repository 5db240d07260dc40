#include "cache/sha256.h"

#include <openssl/evp.h>

#include "base/check.h"

namespace prefixd {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  PREFIXD_CHECK(ctx_ != nullptr);
  PREFIXD_CHECK(EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) == 1);
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::Update(const void* data, size_t size) {
  PREFIXD_CHECK(EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, size) == 1);
}

void Sha256::UpdateLengthPrefixed(std::string_view bytes) {
  uint8_t len[8];
  uint64_t n = bytes.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  Update(len, sizeof(len));
  Update(bytes);
}

Digest Sha256::Final() {
  Digest out;
  unsigned int n = 0;
  PREFIXD_CHECK(EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out.data(), &n) == 1);
  PREFIXD_CHECK(n == out.size());
  return out;
}

Digest Sha256Of(std::string_view bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.Final();
}

std::string DigestHex(const Digest& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < digest.size(); ++i) {
    s[2 * i] = kHex[digest[i] >> 4];
    s[2 * i + 1] = kHex[digest[i] & 15];
  }
  return s;
}

}  // namespace prefixd
