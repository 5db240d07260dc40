// GPT-2 byte-level BPE (vocab.json + merges.txt), equal to OpenAI's encoder.
#ifndef PREFIXD_ENGINE_TOKENIZER_H_
#define PREFIXD_ENGINE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace prefixd {

class Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& vocab_json_path,
                                                         const std::string& merges_txt_path);
  // The same from the files' contents; the paths only name them in error messages.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromText(std::string_view vocab_json,
                                                             std::string_view merges_txt,
                                                             const std::string& vocab_json_path,
                                                             const std::string& merges_txt_path);
  virtual ~Tokenizer() = default;

  // Any bytes, including invalid UTF-8. "<|endoftext|>" in the text is ordinary text.
  virtual std::vector<uint32_t> Encode(std::string_view text) const = 0;
  // Encode, stopped once more than `max_tokens` ids are out: the result is the text's
  // encoding when it has at most `max_tokens` tokens, else longer than `max_tokens` (a
  // prefix of the encoding, or the encoding with the last piece's ids complete). For
  // callers that refuse texts over a token budget without paying for all of them.
  virtual std::vector<uint32_t> EncodeAtMost(std::string_view text, size_t max_tokens) const = 0;
  // The most bytes any one token stands for: a text longer than n × this has more than n
  // tokens.
  virtual size_t max_token_bytes() const = 0;
  // The tokens' bytes concatenated; may end inside a UTF-8 character. Ids >= vocab_size()
  // are an INVALID_ARGUMENT error.
  virtual absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids) const = 0;
  // The bytes of one token; empty for ids >= vocab_size().
  virtual std::string_view TokenBytes(uint32_t id) const = 0;
  virtual size_t vocab_size() const = 0;
};

// Turns a stream of token bytes into text that never splits a UTF-8 character: an
// incomplete sequence at the end is held back until it completes; invalid bytes become
// U+FFFD.
class Utf8StreamDecoder {
 public:
  // Returns the text that is complete after appending `bytes`.
  std::string Push(std::string_view bytes);
  // Returns what is still held back, as U+FFFD (empty if nothing is).
  std::string Flush();

 private:
  std::string pending_;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_TOKENIZER_H_
