// A hash functor for Digest keys in absl containers.
#ifndef PREFIXD_CACHE_DIGEST_HASH_H_
#define PREFIXD_CACHE_DIGEST_HASH_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cache/sha256.h"

namespace prefixd {

// SHA-256 output is uniform, so its first 8 bytes are as good a hash as any.
struct DigestHash {
  size_t operator()(const Digest& d) const {
    uint64_t x;
    std::memcpy(&x, d.data(), sizeof(x));
    return static_cast<size_t>(x);
  }
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_DIGEST_HASH_H_
