// How the CUDA backend cuts one Forward() into passes that fit its fixed activation buffers.
//
// Invariants of PlanPasses' result: pieces cover every token of every step exactly once, in
// step order then position order; a pass holds at most token_cap tokens and at most row_cap
// pieces with logits; a step split across passes has its pieces in consecutive passes, each
// pass at most one piece per step (so a later piece sees the K/V the earlier pass wrote), and
// only its last piece carries the step's want_logits. A step with want_all_logits has every
// token as a logit row (prompt logprobs): each of its pieces has all_logits, and a pass's
// rows (one per such token, one per piece with logits) stay within row_cap. Steps without
// tokens get no piece.
// Pure host code: tested without a device.
#ifndef PREFIXD_KERNELS_CUDA_STEP_PLAN_H_
#define PREFIXD_KERNELS_CUDA_STEP_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/backend.h"

namespace prefixd::cuda {

struct StepPiece {
  int32_t step = 0;   // index into the Forward() steps
  int32_t begin = 0;  // first token of the piece, relative to the step's token_ids
  int32_t length = 0;
  bool logits = false;      // the logits of the piece's last token are wanted
  bool all_logits = false;  // the logits of every token of the piece are wanted

  bool operator==(const StepPiece&) const = default;
};

std::vector<std::vector<StepPiece>> PlanPasses(absl::Span<const SequenceStep> steps,
                                               int32_t token_cap, int32_t row_cap);

}  // namespace prefixd::cuda

#endif  // PREFIXD_KERNELS_CUDA_STEP_PLAN_H_
