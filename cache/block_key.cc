#include "cache/block_key.h"

#include <openssl/evp.h>

#include <cstring>
#include <vector>

#include "base/check.h"

namespace prefixd {

namespace {
// Tokens per block that fit the stack buffer; larger blocks use the heap.
constexpr size_t kStackTokens = 64;
}  // namespace

std::string CacheNamespace(std::string_view tenant, std::string_view salt) {
  std::string out;
  out.reserve(16 + tenant.size() + salt.size());
  for (std::string_view field : {tenant, salt}) {
    uint64_t n = field.size();
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
    out.append(field);
  }
  return out;
}

Digest CacheRootKey(std::string_view manifest, std::string_view cache_namespace) {
  return CacheRootKey(manifest, cache_namespace, "");
}

Digest CacheRootKey(std::string_view manifest, std::string_view cache_namespace,
                    std::string_view adapter_digest) {
  Sha256 h;
  h.Update("prefixd-v1");
  h.UpdateLengthPrefixed(manifest);
  h.UpdateLengthPrefixed(cache_namespace);
  if (!adapter_digest.empty()) {
    h.Update("A");  // the adapter field's type byte
    h.UpdateLengthPrefixed(adapter_digest);
  }
  return h.Final();
}

Digest ChainKey(const Digest& parent, absl::Span<const uint32_t> block_tokens) {
  // One buffer, one update.
  const size_t size = parent.size() + 4 * block_tokens.size();
  uint8_t stack[32 + 4 * kStackTokens];
  std::vector<uint8_t> heap;
  uint8_t* buf = stack;
  if (block_tokens.size() > kStackTokens) {
    heap.resize(size);
    buf = heap.data();
  }
  std::memcpy(buf, parent.data(), parent.size());
  uint8_t* p = buf + parent.size();
  for (uint32_t t : block_tokens) {  // little-endian whatever the host
    p[0] = static_cast<uint8_t>(t);
    p[1] = static_cast<uint8_t>(t >> 8);
    p[2] = static_cast<uint8_t>(t >> 16);
    p[3] = static_cast<uint8_t>(t >> 24);
    p += 4;
  }
  // One context per thread, reused: OpenSSL 3's one-shot SHA256() looks the algorithm up on
  // every call, which costs more than hashing ~100 bytes.
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);  // fetched once
  struct Ctx {
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    ~Ctx() { EVP_MD_CTX_free(ctx); }
  };
  thread_local Ctx ctx;
  Digest out;
  unsigned int n = 0;
  PREFIXD_CHECK(md != nullptr && ctx.ctx != nullptr &&
                EVP_DigestInit_ex(ctx.ctx, md, nullptr) == 1 &&
                EVP_DigestUpdate(ctx.ctx, buf, size) == 1 &&
                EVP_DigestFinal_ex(ctx.ctx, out.data(), &n) == 1 && n == out.size());
  return out;
}

}  // namespace prefixd
