#include "engine/request_validation.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/lora_adapter.h"
#include "engine/sampler.h"

namespace prefixd {
namespace {

// The payload that carries a refusal's field: the RequestField's value in decimal.
constexpr char kRequestFieldPayload[] = "type.prefixd.dev/request-field";

}  // namespace

absl::Status FieldError(RequestField field, const std::string& message) {
  return WithField(absl::InvalidArgumentError(message), field);
}

absl::Status WithField(absl::Status status, RequestField field) {
  if (!status.ok() && field != RequestField::kNone) {
    status.SetPayload(kRequestFieldPayload, absl::Cord(absl::StrCat(static_cast<int>(field))));
  }
  return status;
}

RequestField ErrorField(const absl::Status& status) {
  const auto payload = status.GetPayload(kRequestFieldPayload);
  int value = 0;
  // Only WithField sets the payload, from a RequestField: any value it holds is one.
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &value)) {
    return RequestField::kNone;
  }
  return static_cast<RequestField>(value);
}

size_t MaxPromptTextBytes(int32_t context_length, size_t max_token_bytes) {
  return static_cast<size_t>(context_length) * max_token_bytes;
}

absl::Status ValidatePromptText(std::string_view text, int32_t context_length,
                                size_t max_token_bytes) {
  const size_t max_bytes = MaxPromptTextBytes(context_length, max_token_bytes);
  if (text.size() <= max_bytes) return absl::OkStatus();
  return FieldError(
      RequestField::kPrompt,
      absl::StrFormat(
          "is %d bytes, more than any text of at most %d tokens (the model's context length) can "
          "be: %d bytes (%d tokens x %d bytes, the longest token); shorten it",
          text.size(), context_length, max_bytes, context_length, max_token_bytes));
}

absl::Status ValidateStopStrings(const std::vector<std::string>& stop) {
  if (stop.size() > kMaxStopStrings) {
    return FieldError(RequestField::kStop,
                      absl::StrCat("has ", stop.size(), " strings: at most ", kMaxStopStrings));
  }
  for (const std::string& s : stop) {
    if (s.empty() || s.size() > kMaxStopStringBytes) {
      return FieldError(RequestField::kStop,
                        absl::StrCat("has a string of ", s.size(), " bytes: each must be 1 to ",
                                     kMaxStopStringBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTokenIds(absl::Span<const uint32_t> ids, int32_t vocab_size,
                              RequestField field) {
  const uint32_t vocab = static_cast<uint32_t>(vocab_size);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= vocab) {
      return FieldError(field, absl::StrFormat("has token id %d at position %d, out of range: "
                                               "ids must be < vocab_size %d",
                                               ids[i], i, vocab));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Duration> ParseCacheRetention(std::string_view value) {
  if (value.empty() || value == "in_memory") return absl::ZeroDuration();
  if (value == "24h") return kMaxCacheRetention;
  return FieldError(
      RequestField::kCacheRetention,
      absl::StrCat("must be \"in_memory\" or \"24h\", got \"",
                   absl::CHexEscape(absl::string_view(value.data(), value.size())), "\""));
}

absl::Status ValidateEngineRequest(const EngineRequest& r, const RequestLimits& limits) {
  using absl::StrFormat;
  using F = RequestField;
  const ModelConfig& config = limits.model_config;
  if (r.adapter != nullptr) {
    if (!limits.applies_lora) {
      return WithField(absl::UnimplementedError(
                           "names a LoRA adapter, which this server's backend cannot apply (the "
                           "CPU backend can): ask for the base model"),
                       F::kAdapter);
    }
    if (absl::Status fits = CheckLoraAdapterFits(*r.adapter, config); !fits.ok()) {
      return FieldError(F::kAdapter,
                        absl::StrCat("names an adapter that does not fit: ", fits.message()));
    }
  }
  if (r.request_id.size() > kMaxRequestIdBytes) {
    return FieldError(
        F::kRequestId,
        StrFormat("is %d bytes: use at most %d (or leave it empty for the server to name the "
                  "request)",
                  r.request_id.size(), kMaxRequestIdBytes));
  }
  for (size_t i = 0; i < r.request_id.size(); ++i) {
    const auto c = static_cast<unsigned char>(r.request_id[i]);
    if (c < 0x20 || c > 0x7E) {
      return FieldError(
          F::kRequestId,
          StrFormat("has byte 0x%02x at offset %d: use printable ASCII only (0x20..0x7e)", c, i));
    }
  }
  if (r.prompt.empty()) {
    return FieldError(F::kPrompt,
                      "is an empty prompt (or no prompt was given): give at least one token");
  }
  // A text prompt is tokenized only up to one token past the context (Tokenizer::
  // EncodeAtMost), so its count is not known here: the message needs none.
  if (r.prompt.size() > static_cast<size_t>(config.n_positions)) {
    return FieldError(F::kPrompt,
                      StrFormat("has more than %d tokens, the model's context length: shorten it",
                                config.n_positions));
  }
  if (absl::Status s = ValidateTokenIds(r.prompt, config.vocab_size, F::kPrompt); !s.ok()) {
    return s;
  }
  const bool echo = r.echo_prompt || r.prompt_logprobs.has_value();
  if (r.max_new_tokens == 0 && !echo) {
    return FieldError(F::kMaxNewTokens,
                      "is 0: ask for at least 1 token (0 is allowed only with prompt logprobs or "
                      "echo)");
  }
  if (r.prompt_logprobs.has_value()) {
    if (*r.prompt_logprobs > kMaxTopLogprobs) {
      return FieldError(F::kPromptLogprobs, StrFormat("%d is too large: use 0..%d",
                                                      *r.prompt_logprobs, kMaxTopLogprobs));
    }
    if (!limits.computes_all_logits) {
      return WithField(absl::UnimplementedError(
                           "needs the logits of every prompt position, which this server's "
                           "backend does not compute (the CPU backend does): leave it unset"),
                       F::kPromptLogprobs);
    }
  }
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
  if (total > config.n_positions) {
    return FieldError(
        F::kMaxNewTokens,
        StrFormat("%d + the prompt's %d tokens = %d, more than the model's context length %d: "
                  "lower it or shorten the prompt",
                  r.max_new_tokens, r.prompt.size(), total, config.n_positions));
  }
  if (r.num_samples == 0) {
    return FieldError(F::kNumSamples, "is 0: ask for at least 1 sample");
  }
  if (static_cast<int64_t>(r.num_samples) > limits.max_samples) {
    return FieldError(F::kNumSamples, StrFormat("%d exceeds this server's limit %d "
                                                "(--max-samples)",
                                                r.num_samples, limits.max_samples));
  }
  const SamplingParams& s = r.sampling;
  // %.9g: enough digits that a float is printed as itself (1.0000001 is not "1").
  if (!std::isfinite(s.temperature) || s.temperature < 0.0f) {
    return FieldError(
        F::kTemperature,
        StrFormat("%.9g is invalid: use a finite value >= 0 (0 = greedy)", s.temperature));
  }
  if (!std::isfinite(s.top_p) || !(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return FieldError(
        F::kTopP, StrFormat("%.9g is invalid: use a value in (0, 1], or leave it unset", s.top_p));
  }
  const std::pair<RequestField, float> penalties[] = {{F::kPresencePenalty, s.presence_penalty},
                                                      {F::kFrequencyPenalty, s.frequency_penalty}};
  for (const auto& [field, v] : penalties) {
    if (!std::isfinite(v) || !(v >= -kMaxAbsPenalty && v <= kMaxAbsPenalty)) {
      return FieldError(field, StrFormat("%.9g is invalid: use a value in [-2, 2] (0 = off)", v));
    }
  }
  if (!std::isfinite(s.repetition_penalty) || !(s.repetition_penalty >= kMinRepetitionPenalty &&
                                                s.repetition_penalty <= kMaxRepetitionPenalty)) {
    return FieldError(
        F::kRepetitionPenalty,
        StrFormat(
            "%.9g is invalid: use a value in [0.01, 100] (1 = off; above 1 discourages repeats; "
            "outside the range a penalised logit can overflow)",
            s.repetition_penalty));
  }
  if (!std::isfinite(s.min_p) || !(s.min_p >= 0.0f && s.min_p <= 1.0f)) {
    return FieldError(F::kMinP,
                      StrFormat("%.9g is invalid: use a value in [0, 1] (0 = off)", s.min_p));
  }
  if (s.logit_bias.size() > kMaxLogitBias) {
    return FieldError(F::kLogitBias, StrFormat("has %d entries: give at most %d",
                                               s.logit_bias.size(), kMaxLogitBias));
  }
  {
    absl::flat_hash_set<uint32_t> seen;
    for (const TokenBias& b : s.logit_bias) {
      if (b.token_id >= static_cast<uint32_t>(config.vocab_size)) {
        return FieldError(F::kLogitBias,
                          StrFormat("token id %d is out of range: ids must be < vocab_size %d",
                                    b.token_id, config.vocab_size));
      }
      if (!std::isfinite(b.bias) || !(b.bias >= -kMaxAbsLogitBias && b.bias <= kMaxAbsLogitBias)) {
        return FieldError(
            F::kLogitBias,
            StrFormat("for token %d is %.9g: use a value in [-100, 100]", b.token_id, b.bias));
      }
      if (!seen.insert(b.token_id).second) {
        return FieldError(
            F::kLogitBias,
            StrFormat("gives token %d twice: give each token at most once", b.token_id));
      }
    }
  }
  if (r.top_logprobs > kMaxTopLogprobs) {
    return FieldError(F::kTopLogprobs,
                      StrFormat("%d is too large: use 0..%d", r.top_logprobs, kMaxTopLogprobs));
  }
  if (r.stop_token_ids.size() > kMaxStopTokenIds) {
    return FieldError(F::kStopTokenIds, StrFormat("has %d ids: give at most %d",
                                                  r.stop_token_ids.size(), kMaxStopTokenIds));
  }
  if (absl::Status ids = ValidateTokenIds(r.stop_token_ids, config.vocab_size, F::kStopTokenIds);
      !ids.ok()) {
    return ids;
  }
  const int64_t blocks = BlocksForTokens(total, limits.pool.block_size);
  if (blocks > limits.pool.num_blocks) {
    return FieldError(
        F::kMaxNewTokens,
        StrFormat(
            "%d + the prompt's %d tokens need %d KV blocks of %d tokens, but the whole pool holds "
            "%d blocks (%d tokens): lower it, shorten the prompt, or start the server with a "
            "larger --kv-cache-bytes",
            r.max_new_tokens, r.prompt.size(), blocks, limits.pool.block_size,
            limits.pool.num_blocks, limits.pool.num_blocks * limits.pool.block_size));
  }
  return absl::OkStatus();
}

}  // namespace prefixd
