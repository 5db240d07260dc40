// The "stream" stage of the request path, shared by every front end: turns a request's
// engine events into what a client is sent per sample — token ids, log-probabilities, text —
// applying stop strings on the way.
//
// Text is the tokens' bytes decoded as UTF-8 (an incomplete character waits for the bytes
// that complete it; what is still incomplete at the end becomes U+FFFD). Stop strings:
//  - text that might be the start of a stop string is held back until it is decided, so no
//    client ever sees part of a stop string;
//  - at a match (of overlapping ones, the one that ends first, so the cut does not depend
//    on where tokens split the text), the sample ends with FinishReason::kStop: tokens
//    whose text lies wholly before the stop string are sent as usual; a token whose text
//    straddles the stop string's start is sent with its id and log-probability and only
//    the part of its text before the stop string; nothing after (the stop string is never
//    sent);
//  - the caller must then tell the engine to stop the sample (StoppedSamples()), and
//    completion_tokens counts the ids sent, not those the engine produced.
// Not thread-safe: one front end call owns one GenerateOutput.
#ifndef PREFIXD_SERVER_GENERATE_OUTPUT_H_
#define PREFIXD_SERVER_GENERATE_OUTPUT_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/request.h"
#include "engine/tokenizer.h"

namespace prefixd {

// One token as sent: its id and log-probabilities, and the text it contributes.
struct OutputToken {
  uint32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
  std::string text;  // may be empty (a character still incomplete) or cut at a stop string
};

// What is ready to send for one sample: tokens in order, then possibly its end.
struct SampleOutput {
  uint32_t sample_index = 0;
  std::vector<OutputToken> tokens;
  FinishReason finish_reason = FinishReason::kNone;  // set once, on the sample's last output
  // With the finish only: text after the last token's, when the sample ended inside an
  // incomplete character (U+FFFD) and that token had already been sent.
  std::string trailing_text;
  // With a finish by a stop token (EOS, a stop id): that token, with no text. It is not one
  // of the sample's tokens (nor counted in usage); OpenAI's API lists it in logprobs.
  std::optional<OutputToken> stop_token;
};

class GenerateOutput {
 public:
  GenerateOutput(const Tokenizer& tokenizer, uint32_t num_samples,
                 std::vector<std::string> stop_strings);

  // Takes the next engine events (in the stream's order).
  void Add(std::vector<RequestEvent> events);

  // Moves out what is ready for one sample (the one with the oldest ready output), or
  // returns false when nothing is ready. A sample's finish comes with its last tokens.
  bool Next(SampleOutput* out);

  // The prompt's entries (echo_prompt / prompt_logprobs), once the kPrompt event has come:
  // true once, with *out filled; they come before any sample's output. Stop strings apply to
  // generated text only.
  bool TakePrompt(std::vector<PromptToken>* out);

  // Samples ended by a stop string since the last call: tell the engine (StopSample).
  std::vector<uint32_t> StoppedSamples();

  // True once the request's kDone was added and every sample output taken: status() and
  // usage() are final.
  bool done() const;
  const absl::Status& status() const { return status_; }
  // The engine's usage, with completion_tokens = the ids sent (they differ only when a stop
  // string ended a sample before the engine's own stop).
  Usage usage() const;

 private:
  struct Pending {
    OutputToken token;
    size_t text_end = 0;  // end of this token's text in `text`
  };
  struct Sample {
    Utf8StreamDecoder decoder;
    std::string text;           // all decoded text so far
    size_t sent = 0;            // text[0, sent) has been handed out
    std::deque<Pending> held;   // tokens not handed out yet, in order
    std::vector<OutputToken> ready;
    FinishReason finish = FinishReason::kNone;  // decided
    bool finish_ready = false;  // decided and waiting in `ready`
    std::string trailing_text;
    std::optional<OutputToken> stop_token;  // SampleOutput::stop_token
    bool finish_taken = false;
    uint64_t sent_tokens = 0;
    uint64_t ready_order = 0;  // when its oldest ready output appeared
  };

  void AddToken(Sample& s, const RequestEvent& e);
  void EndSample(Sample& s, uint32_t index, FinishReason reason);
  // Moves decided tokens from held to ready; ends the sample at a stop string.
  void Release(Sample& s, uint32_t index, bool at_end);
  void MarkReady(Sample& s);

  const Tokenizer& tokenizer_;
  const std::vector<std::string> stops_;
  std::vector<Sample> samples_;
  std::vector<uint32_t> stopped_;
  uint64_t ready_counter_ = 0;
  bool done_event_ = false;
  bool has_prompt_ = false;
  std::vector<PromptToken> prompt_;
  absl::Status status_;
  Usage usage_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_GENERATE_OUTPUT_H_
