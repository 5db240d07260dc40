#include "engine/request_validation.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "engine/lora_adapter.h"
#include "engine/sampler.h"

namespace prefixd {

absl::Status FieldError(const std::string& field, const std::string& message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kInvalidFieldPayload, absl::Cord(field));
  return s;
}

std::string InvalidField(const absl::Status& status) {
  auto field = status.GetPayload(kInvalidFieldPayload);
  return field.has_value() ? std::string(*field) : std::string();
}

absl::Status ValidateEngineRequest(const EngineRequest& r, const RequestLimits& limits) {
  using absl::StrFormat;
  const ModelConfig& config = limits.model_config;
  const uint32_t vocab = static_cast<uint32_t>(config.vocab_size);
  if (r.adapter != nullptr) {
    if (!limits.applies_lora) {
      return absl::UnimplementedError(
          "this server's backend cannot apply LoRA adapters (the CPU backend can): leave "
          "adapter empty for the base model");
    }
    if (absl::Status fits = CheckLoraAdapterFits(*r.adapter, config); !fits.ok()) {
      return FieldError("adapter", std::string(fits.message()));
    }
  }
  if (r.request_id.size() > kMaxRequestIdBytes) {
    return FieldError("request_id",
        StrFormat("request_id is %d bytes: use at most %d (or leave it empty for the server to "
                  "name the request)",
                  r.request_id.size(), kMaxRequestIdBytes));
  }
  for (size_t i = 0; i < r.request_id.size(); ++i) {
    const auto c = static_cast<unsigned char>(r.request_id[i]);
    if (c < 0x20 || c > 0x7E) {
      return FieldError("request_id",
          StrFormat("request_id has byte 0x%02x at offset %d: use printable ASCII only "
                    "(0x20..0x7e)",
                    c, i));
    }
  }
  if (r.prompt.empty()) {
    return FieldError("token_ids", "empty prompt: give at least one token");
  }
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] >= vocab) {
      return FieldError("token_ids", 
          StrFormat("prompt token id %d at position %d is out of range: ids must be < "
                    "vocab_size %d",
                    r.prompt[i], i, vocab));
    }
  }
  const bool echo = r.echo_prompt || r.prompt_logprobs.has_value();
  if (r.max_new_tokens == 0 && !echo) {
    return FieldError("max_new_tokens",
                      "max_new_tokens is 0: ask for at least 1 token (0 is allowed only with "
                      "prompt_logprobs or echo)");
  }
  if (r.prompt_logprobs.has_value()) {
    if (*r.prompt_logprobs > kMaxTopLogprobs) {
      return FieldError("prompt_logprobs", StrFormat("prompt_logprobs %d is too large: use 0..%d",
                                                     *r.prompt_logprobs, kMaxTopLogprobs));
    }
    if (!limits.computes_all_logits) {
      absl::Status s = absl::UnimplementedError(
          "prompt_logprobs: this server's backend does not compute the logits of every prompt "
          "position (the CPU backend does); leave prompt_logprobs unset");
      s.SetPayload(kInvalidFieldPayload, absl::Cord("prompt_logprobs"));
      return s;
    }
  }
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
  if (total > config.n_positions) {
    return FieldError("max_new_tokens", 
        StrFormat("prompt (%d tokens) + max_new_tokens (%d) = %d exceeds the model's context "
                  "length %d: shorten the prompt or lower max_new_tokens",
                  r.prompt.size(), r.max_new_tokens, total, config.n_positions));
  }
  if (r.num_samples == 0) {
    return FieldError("num_samples", "num_samples is 0: ask for at least 1 sample");
  }
  if (static_cast<int64_t>(r.num_samples) > limits.max_samples) {
    return FieldError("num_samples", StrFormat("num_samples %d exceeds this server's limit %d "
                                          "(--max-samples)",
                                          r.num_samples, limits.max_samples));
  }
  const SamplingParams& s = r.sampling;
  // %.9g: enough digits that a float is printed as itself (1.0000001 is not "1").
  if (!std::isfinite(s.temperature) || s.temperature < 0.0f) {
    return FieldError("temperature", StrFormat(
        "temperature %.9g is invalid: use a finite value >= 0 (0 = greedy)", s.temperature));
  }
  if (!std::isfinite(s.top_p) || !(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return FieldError("top_p", StrFormat(
        "top_p %.9g is invalid: use a value in (0, 1], or leave it unset", s.top_p));
  }
  const std::pair<const char*, float> penalties[] = {{"presence_penalty", s.presence_penalty},
                                                      {"frequency_penalty", s.frequency_penalty}};
  for (const auto& [name, v] : penalties) {
    if (!std::isfinite(v) || !(v >= -kMaxAbsPenalty && v <= kMaxAbsPenalty)) {
      return FieldError(name, StrFormat("%s %.9g is invalid: use a value in [-2, 2] (0 = off)",
                                        name, v));
    }
  }
  if (!std::isfinite(s.repetition_penalty) || !(s.repetition_penalty >= kMinRepetitionPenalty &&
                                                  s.repetition_penalty <= kMaxRepetitionPenalty)) {
    return FieldError("repetition_penalty", StrFormat(
        "repetition_penalty %.9g is invalid: use a value in [0.01, 100] (1 = off; above 1 "
        "discourages repeats; outside the range a penalised logit can overflow)",
        s.repetition_penalty));
  }
  if (!std::isfinite(s.min_p) || !(s.min_p >= 0.0f && s.min_p <= 1.0f)) {
    return FieldError("min_p", StrFormat(
        "min_p %.9g is invalid: use a value in [0, 1] (0 = off)", s.min_p));
  }
  if (s.logit_bias.size() > kMaxLogitBias) {
    return FieldError("logit_bias", StrFormat(
        "logit_bias has %d entries: give at most %d", s.logit_bias.size(), kMaxLogitBias));
  }
  {
    absl::flat_hash_set<uint32_t> seen;
    for (const TokenBias& b : s.logit_bias) {
      if (b.token_id >= vocab) {
        return FieldError("logit_bias", StrFormat(
            "logit_bias token id %d is out of range: ids must be < vocab_size %d", b.token_id,
            vocab));
      }
      if (!std::isfinite(b.bias) || !(b.bias >= -kMaxAbsLogitBias && b.bias <= kMaxAbsLogitBias)) {
        return FieldError("logit_bias", StrFormat(
            "logit_bias for token %d is %.9g: use a value in [-100, 100]", b.token_id, b.bias));
      }
      if (!seen.insert(b.token_id).second) {
        return FieldError("logit_bias", StrFormat(
            "logit_bias gives token %d twice: give each token at most once", b.token_id));
      }
    }
  }
  if (r.top_logprobs > kMaxTopLogprobs) {
    return FieldError("top_logprobs", StrFormat("top_logprobs %d is too large: use 0..%d",
                                          r.top_logprobs, kMaxTopLogprobs));
  }
  if (r.stop_token_ids.size() > kMaxStopTokenIds) {
    return FieldError("stop_token_ids", StrFormat("%d stop_token_ids is too many: give at most %d",
                                          r.stop_token_ids.size(), kMaxStopTokenIds));
  }
  for (uint32_t id : r.stop_token_ids) {
    if (id >= vocab) {
      return FieldError("stop_token_ids", StrFormat(
          "stop token id %d is out of range: ids must be < vocab_size %d", id, vocab));
    }
  }
  const int64_t blocks = BlocksForTokens(total, limits.pool.block_size);
  if (blocks > limits.pool.num_blocks) {
    return FieldError("max_new_tokens", StrFormat(
        "the request needs %d KV blocks (%d prompt tokens + %d new tokens, %d tokens per "
        "block) but the whole pool holds %d blocks (%d tokens): shorten the prompt, lower "
        "max_new_tokens, or start the server with a larger --kv-cache-bytes",
        blocks, r.prompt.size(), r.max_new_tokens, limits.pool.block_size, limits.pool.num_blocks,
        limits.pool.num_blocks * limits.pool.block_size));
  }
  return absl::OkStatus();
}

}  // namespace prefixd
