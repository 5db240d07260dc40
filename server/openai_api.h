// The OpenAI-compatible HTTP API's wire format, without any networking: JSON bodies in,
// request-path terms (server/request_path.h) out, and response, stream-chunk and error
// bodies back. The HTTP front end (server/http_front_end.h) only moves bytes.
//
// Fields follow OpenAI's completions API as its SDKs send it (penalties and `logit_bias`
// included), plus vLLM's `top_k`, `min_p`, `repetition_penalty`, `ignore_eos`,
// `stop_token_ids` and prefixd's `cache_salt`. What OpenAI has and prefixd does not
// (`best_of` > 1, `suffix`) and unknown fields are refused naming the field. `echo` puts the
// prompt first in each choice, with its logprobs when `logprobs` is given (the first token's
// entries are null, as OpenAI's). Errors carry the one status vocabulary: the HTTP status is
// derived from the status code (HttpStatusFor).
#ifndef PREFIXD_SERVER_OPENAI_API_H_
#define PREFIXD_SERVER_OPENAI_API_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/request.h"
#include "nlohmann/json.hpp"
#include "server/generate_output.h"
#include "server/request_path.h"

namespace prefixd {

class Tokenizer;  // engine/tokenizer.h

// OpenAI's limit on `logprobs` for completions.
inline constexpr uint32_t kMaxOpenAiLogprobs = 5;

struct CompletionRequest {
  // One call per prompt; they differ only in the prompt.
  std::vector<GenerateCall> prompts;
  bool stream = false;
  bool include_usage = false;        // stream_options.include_usage
  std::optional<uint32_t> logprobs;  // unset: no logprobs object in the choices
  bool echo = false;                 // each choice starts with the prompt (and its logprobs)
};

// POST /v1/completions. `model` is `served_model` (or absent) for the base; any other name
// is taken as a LoRA adapter's (GenerateCall::adapter), which the request path resolves.
// INVALID_ARGUMENT names the offending JSON key (InvalidField, server/wire_field.h) and what
// to change. Values are checked only as far as their JSON types go: every other rule is the
// request path's and the engine's, reported through ToOpenAiError.
absl::StatusOr<CompletionRequest> ParseCompletionRequest(const std::string& body,
                                                         const std::string& served_model);

// The pieces of a completion response, as they accumulate.
struct ChoiceLogprobs {
  std::vector<std::string> tokens;
  std::vector<float> token_logprobs;  // NaN: none (the echoed prompt's first token): null
  std::vector<std::vector<std::pair<std::string, float>>> top_logprobs;
  std::vector<uint32_t> text_offset;
};
struct Choice {
  uint32_t index = 0;
  std::string text;
  std::optional<ChoiceLogprobs> logprobs;
  FinishReason finish_reason = FinishReason::kNone;
};

// How a token is named in `logprobs.tokens`: its text, or "bytes:\xNN..." for bytes that
// are not valid UTF-8 on their own (OpenAI's convention).
std::string TokenName(const Tokenizer& tokenizer, uint32_t token_id);

// Appends one SampleOutput to a choice: its text, and its logprobs when asked for (after
// them, the stop token that ended the choice, which has no text).
void AppendToChoice(const Tokenizer& tokenizer, const SampleOutput& out, Choice* choice);
// Appends the echoed prompt to a choice: its text (decoded as UTF-8; an incomplete character
// at its end becomes U+FFFD), and its logprobs when asked for, the first token's null.
void AppendPromptToChoice(const Tokenizer& tokenizer, const std::vector<PromptToken>& prompt,
                          Choice* choice);

struct ResponseHeader {
  std::string id;  // "cmpl-<request id>"
  int64_t created = 0;
  std::string model;
  std::string prompt_cache_key;  // the request's, echoed in the usage ("" : none)
};

// `prompt_cache_key` is echoed when not empty.
nlohmann::ordered_json UsageJson(const Usage& usage, const std::string& prompt_cache_key = "");
nlohmann::ordered_json ChoiceJson(const Choice& choice);
// The whole non-streamed response.
std::string CompletionJson(const ResponseHeader& header, const std::vector<Choice>& choices,
                           const Usage& usage);
// One Server-Sent Events chunk carrying one choice's new text ("data: {...}\n\n").
std::string CompletionChunk(const ResponseHeader& header, const Choice& delta);
// The last chunk when include_usage was asked for: no choices, the usage.
std::string UsageChunk(const ResponseHeader& header, const Usage& usage);
inline constexpr std::string_view kDoneEvent = "data: [DONE]\n\n";

// {"error": {"message", "type", "param", "code"}}, and the HTTP status it goes with.
int HttpStatusFor(absl::StatusCode code);
std::string ErrorJson(const absl::Status& status);
// The API's name for a request field (max_tokens, n, logprobs, prompt, model, ...).
std::string_view OpenAiFieldName(RequestField field);
// A refusal of the request rules (engine/request_validation.h) as this API reports it: the
// field's name first in the message and as the error's `param` (server/wire_field.h).
// Parse errors name their JSON key already and are returned as they are.
absl::Status ToOpenAiError(const absl::Status& status);

// vLLM's /v1/load_lora_adapter {"lora_name", "lora_path"} and /v1/unload_lora_adapter
// {"lora_name"} bodies: (name, path), and the name.
absl::StatusOr<std::pair<std::string, std::string>> ParseLoadLoraAdapterRequest(
    const std::string& body);
absl::StatusOr<std::string> ParseUnloadLoraAdapterRequest(const std::string& body);

// vLLM's /tokenize and /detokenize bodies. `model` is read as for completions: absent, null
// or `served_model` is the base (adapter ""), any other name an adapter's, which the request
// path resolves (an adapter shares the base's tokenizer; an unknown name is NOT_FOUND there).
struct TokenizeBody {
  std::string prompt;
  std::string adapter;  // "" = the base
};
struct DetokenizeBody {
  std::vector<uint32_t> tokens;
  std::string adapter;  // "" = the base
};
absl::StatusOr<TokenizeBody> ParseTokenizeRequest(const std::string& body,
                                                  const std::string& served_model);
absl::StatusOr<DetokenizeBody> ParseDetokenizeRequest(const std::string& body,
                                                      const std::string& served_model);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_OPENAI_API_H_
