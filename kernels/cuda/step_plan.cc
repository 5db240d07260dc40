#include "kernels/cuda/step_plan.h"

#include <algorithm>

#include "base/check.h"

namespace prefixd::cuda {

std::vector<std::vector<StepPiece>> PlanPasses(absl::Span<const SequenceStep> steps,
                                               int32_t token_cap, int32_t row_cap) {
  PREFIXD_CHECK(token_cap >= 1 && row_cap >= 1);
  std::vector<std::vector<StepPiece>> passes;
  std::vector<StepPiece> current;
  int32_t tokens = 0, rows = 0;
  auto flush = [&] {
    if (!current.empty()) passes.push_back(std::move(current));
    current.clear();
    tokens = 0;
    rows = 0;
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const int32_t n = static_cast<int32_t>(steps[i].token_ids.size());
    int32_t begin = 0;
    const bool all = steps[i].want_all_logits;
    while (begin < n) {
      if (all) {
        const int32_t length = std::min({token_cap - tokens, row_cap - rows, n - begin});
        if (length == 0) {  // the pass has no row left for this step's next token
          flush();
          continue;
        }
        current.push_back({static_cast<int32_t>(i), begin, length, false, true});
        tokens += length;
        rows += length;
        begin += length;
        if (tokens == token_cap) flush();
        continue;
      }
      const int32_t length = std::min(token_cap - tokens, n - begin);
      const bool logits = begin + length == n && steps[i].want_logits;
      if (logits && rows == row_cap) {
        flush();
        continue;
      }
      current.push_back({static_cast<int32_t>(i), begin, length, logits});
      tokens += length;
      rows += logits ? 1 : 0;
      begin += length;
      if (tokens == token_cap) flush();
    }
  }
  flush();
  return passes;
}

}  // namespace prefixd::cuda
