// A copy that cache/ asks the backend to execute (copy-on-write, partial prefix reuse).
#ifndef PREFIXD_CACHE_BLOCK_COPY_H_
#define PREFIXD_CACHE_BLOCK_COPY_H_

#include <cstdint>

namespace prefixd {

// Copy token rows [0, num_rows) of every layer's K and V from block `src` to block `dst`.
struct BlockCopy {
  int32_t src = -1;
  int32_t dst = -1;
  int32_t num_rows = 0;

  bool operator==(const BlockCopy&) const = default;
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_BLOCK_COPY_H_
