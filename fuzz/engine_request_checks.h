// What the request fuzz targets check of a request the rules accepted, for GPT-2 small's
// shape and a 1,024-block pool of 16 tokens: what the engine relies on (ids in the
// vocabulary, a context that fits, 1..max samples, sane sampling values).
#ifndef PREFIXD_FUZZ_ENGINE_REQUEST_CHECKS_H_
#define PREFIXD_FUZZ_ENGINE_REQUEST_CHECKS_H_

#include <cmath>
#include <cstdint>

#include "base/check.h"
#include "engine/engine.h"
#include "engine/request_validation.h"
#include "engine/sampler.h"

namespace prefixd::fuzz {

inline RequestLimits Gpt2SmallLimits() {
  RequestLimits limits;
  limits.model_config.n_layer = 12;
  limits.model_config.n_head = 12;
  limits.model_config.n_embd = 768;
  limits.model_config.n_positions = 1024;
  limits.model_config.vocab_size = 50257;
  limits.max_samples = 16;
  limits.pool = {.num_blocks = 1024, .block_size = 16};
  return limits;
}

inline void CheckAccepted(const EngineRequest& r, const RequestLimits& limits) {
  const ModelConfig& c = limits.model_config;
  PREFIXD_CHECK(!r.prompt.empty());
  for (uint32_t id : r.prompt) PREFIXD_CHECK(id < static_cast<uint32_t>(c.vocab_size));
  for (uint32_t id : r.stop_token_ids) PREFIXD_CHECK(id < static_cast<uint32_t>(c.vocab_size));
  PREFIXD_CHECK(r.max_new_tokens >= 1);
  PREFIXD_CHECK(static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens <= c.n_positions);
  PREFIXD_CHECK(r.num_samples >= 1 && static_cast<int64_t>(r.num_samples) <= limits.max_samples);
  PREFIXD_CHECK(std::isfinite(r.sampling.temperature) && r.sampling.temperature >= 0.0f);
  PREFIXD_CHECK(r.sampling.top_p > 0.0f && r.sampling.top_p <= 1.0f);
  PREFIXD_CHECK(r.top_logprobs <= kMaxTopLogprobs);
  PREFIXD_CHECK(!r.request_id.empty());
  PREFIXD_CHECK(!r.cache_namespace.empty());
}

}  // namespace prefixd::fuzz

#endif  // PREFIXD_FUZZ_ENGINE_REQUEST_CHECKS_H_
