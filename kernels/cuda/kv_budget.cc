#include "kernels/cuda/kv_budget.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_format.h"
#include "base/check.h"

namespace prefixd::cuda {

absl::StatusOr<KvPoolPlan> PlanKvPool(const KvPoolRequest& r) {
  PREFIXD_CHECK(r.block_bytes > 0 && r.block_size > 0 && r.budget_bytes >= 0);
  const int64_t available = std::max<int64_t>(r.free_bytes - kDeviceHeadroomBytes, 0);
  int64_t budget = r.budget_bytes;
  if (budget == 0) {
    budget =
        std::min(static_cast<int64_t>(static_cast<double>(r.free_bytes) * r.fraction), available);
  } else if (budget > available) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV budget of %d bytes does not fit: the device has %d bytes free after the weights "
        "and buffers, of which %d stay free for cuBLAS and CUDA graphs (at most %d bytes)",
        budget, r.free_bytes, kDeviceHeadroomBytes, available));
  }
  // One block of the budget is the scratch block.
  int64_t blocks = budget / r.block_bytes - 1;
  // Slots (block * block_size + row, scratch block included) are int32 in the kernels.
  blocks = std::min<int64_t>(blocks, INT32_MAX / r.block_size - 2);
  if (blocks < 1) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV budget of %d bytes holds no block of %d bytes beside the scratch block (needs %d)",
        budget, r.block_bytes, 2 * r.block_bytes));
  }
  KvPoolPlan plan;
  plan.num_blocks = blocks;
  plan.pool_bytes = (blocks + 1) * r.block_bytes;
  plan.budget_bytes = budget;
  return plan;
}

}  // namespace prefixd::cuda
