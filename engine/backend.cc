#include "engine/backend.h"

#include "absl/strings/str_cat.h"

namespace prefixd {

absl::Status Backend::CheckAdapter(const LoraAdapter& /*adapter*/) const {
  return absl::UnimplementedError(
      absl::StrCat("the ", device_name(), " backend applies no LoRA adapters"));
}

absl::Status Backend::CheckSteps(absl::Span<const SequenceStep> steps) const {
  const StepLimits limits = step_limits();
  const int64_t bs = block_size();
  const int64_t blocks_in_pool = num_blocks();
  for (size_t s = 0; s < steps.size(); ++s) {
    const SequenceStep& step = steps[s];
    const int64_t end = int64_t{step.start_pos} + static_cast<int64_t>(step.token_ids.size());
    if (step.token_ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("step ", s, " has no tokens"));
    }
    if (step.start_pos < 0 || end > limits.context) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", s, " covers positions [", step.start_pos, ", ", end,
                       ") outside the model's context of ", limits.context));
    }
    const int64_t blocks_needed = (end + bs - 1) / bs;
    if (static_cast<int64_t>(step.block_table.size()) < blocks_needed) {
      return absl::InvalidArgumentError(absl::StrCat("step ", s, " needs ", blocks_needed,
                                                     " blocks, its table has ",
                                                     step.block_table.size()));
    }
    for (int64_t b = 0; b < blocks_needed; ++b) {
      if (step.block_table[b] < 0 || step.block_table[b] >= blocks_in_pool) {
        return absl::InvalidArgumentError(absl::StrCat(
            "step ", s, " block id ", step.block_table[b], " outside [0, ", blocks_in_pool, ")"));
      }
    }
    for (uint32_t t : step.token_ids) {
      if (t >= static_cast<uint32_t>(limits.vocab_size)) {
        return absl::InvalidArgumentError(
            absl::StrCat("step ", s, " token id ", t, " >= vocab size ", limits.vocab_size));
      }
    }
    if (step.adapter != nullptr) {
      // The code is the backend's (INVALID_ARGUMENT for another model's adapter,
      // UNIMPLEMENTED for one it cannot apply); the message names the step.
      if (absl::Status fits = CheckAdapter(*step.adapter); !fits.ok()) {
        return absl::Status(fits.code(), absl::StrCat("step ", s, ": ", fits.message()));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Backend::Forward(absl::Span<const SequenceStep> steps, std::vector<float>* logits) {
  if (absl::Status s = CheckSteps(steps); !s.ok()) return s;
  if (steps.empty()) return absl::OkStatus();
  return RunForward(steps, logits);
}

absl::Status Backend::CopyBlocks(absl::Span<const BlockCopy> copies) {
  const int64_t n = num_blocks();
  for (const BlockCopy& c : copies) {
    if (c.src < 0 || c.src >= n || c.dst < 0 || c.dst >= n || c.src == c.dst || c.num_rows < 0 ||
        c.num_rows > block_size()) {
      return absl::InvalidArgumentError(absl::StrCat("bad block copy ", c.src, " -> ", c.dst, " (",
                                                     c.num_rows, " rows) in a pool of ", n,
                                                     " blocks of ", block_size(), " rows"));
    }
  }
  if (copies.empty()) return absl::OkStatus();
  return RunCopyBlocks(copies);
}

absl::Status Backend::CheckBlockBytes(int32_t block, size_t size) const {
  if (block < 0 || block >= num_blocks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV block ", block, " is outside the pool of ", num_blocks(), " blocks"));
  }
  if (static_cast<int64_t>(size) != KvBlockBytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV block is ", KvBlockBytes(), " bytes, not ", size));
  }
  return absl::OkStatus();
}

absl::Status Backend::ReadKvBlock(int32_t block, absl::Span<uint8_t> out) {
  if (absl::Status s = CheckBlockBytes(block, out.size()); !s.ok()) return s;
  return RunReadKvBlock(block, out);
}

absl::Status Backend::WriteKvBlock(int32_t block, absl::Span<const uint8_t> data) {
  if (absl::Status s = CheckBlockBytes(block, data.size()); !s.ok()) return s;
  return RunWriteKvBlock(block, data);
}

}  // namespace prefixd
