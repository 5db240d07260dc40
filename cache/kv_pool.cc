#include "cache/kv_pool.h"

#include "absl/strings/str_cat.h"

namespace prefixd {

absl::Status ValidateKvPoolOptions(const KvPoolOptions& o) {
  if (o.budget_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-cache-bytes must be 0 (the default budget) or positive, got ", o.budget_bytes));
  }
  if (const int32_t v = o.block_size; v < 1 || v > kMaxKvBlockSize || (v & (v - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--block-size must be a power of two from 1 to ",
                                                   kMaxKvBlockSize, ", got ", v));
  }
  return absl::OkStatus();
}

}  // namespace prefixd
