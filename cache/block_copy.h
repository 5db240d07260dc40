// A copy that cache/ asks the backend to execute (copy-on-write, partial prefix reuse).
#ifndef PREFIXD_CACHE_BLOCK_COPY_H_
#define PREFIXD_CACHE_BLOCK_COPY_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace prefixd {

// Copy token rows [0, num_rows) of every layer's K and V from block `src` to block `dst`.
struct BlockCopy {
  int32_t src = -1;
  int32_t dst = -1;
  int32_t num_rows = 0;

  bool operator==(const BlockCopy&) const = default;
};

// A step's copies must run in order: a later copy may read a block that an earlier one
// writes, or write one that an earlier one reads. A backend that runs copies in parallel
// (one CUDA launch for many) runs them in batches of consecutive copies that touch no common
// block as a writer; this returns where each batch ends (exclusive), at most `max_batch`
// copies each. Example: {A->B, C->A} is two batches, {A->B, A->C} one.
inline std::vector<size_t> IndependentCopyBatchEnds(absl::Span<const BlockCopy> copies,
                                                    size_t max_batch) {
  std::vector<size_t> ends;
  std::vector<int32_t> read, written;  // the blocks of the batch being built
  auto contains = [](const std::vector<int32_t>& v, int32_t b) {
    return std::find(v.begin(), v.end(), b) != v.end();
  };
  size_t begin = 0;
  for (size_t i = 0; i < copies.size(); ++i) {
    const BlockCopy& c = copies[i];
    const bool conflict =
        contains(written, c.src) || contains(written, c.dst) || contains(read, c.dst);
    if (i > begin && (conflict || i - begin == max_batch)) {
      ends.push_back(i);
      begin = i;
      read.clear();
      written.clear();
    }
    read.push_back(c.src);
    written.push_back(c.dst);
  }
  if (begin < copies.size()) ends.push_back(copies.size());
  return ends;
}

}  // namespace prefixd

#endif  // PREFIXD_CACHE_BLOCK_COPY_H_
