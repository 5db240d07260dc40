// GPT-2's pre-tokenizer: splits text into the pieces that byte-level BPE encodes one by one.
//
// Invariant: the pieces, concatenated in order, are exactly the input bytes (nothing is
// dropped, reordered or rewritten), so BPE over them round-trips ANY byte string.
//
// Valid UTF-8 is split as OpenAI's encoder.py splits the decoded text with Python's
// `regex` module and the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// where `\s` is the Unicode White_Space property, as in `regex`. Two neighbours differ:
// JavaScript's `\s` (the gpt-3-encoder port) adds U+FEFF and lacks U+0085, and Python's
// str.isspace (the stdlib `re`) adds U+001C..U+001F; we follow `regex`.
//
// Invalid UTF-8 (which encoder.py never sees, since it takes a str): each maximal run of
// bytes that cannot start a pattern match becomes a piece of its own, and counts as
// non-space for the `(?!\S)` rule. BPE then encodes those raw bytes like any others.
#ifndef PREFIXD_ENGINE_INTERNAL_BPE_PRETOKENIZER_H_
#define PREFIXD_ENGINE_INTERNAL_BPE_PRETOKENIZER_H_

#include <string_view>

#include "absl/functional/function_ref.h"

namespace prefixd::internal {

// Calls `emit` once per piece of `text`, in order; every piece is non-empty.
// Pieces made of ASCII are found by a fast path; RE2 decides wherever a non-ASCII byte
// could change the split.
void PreTokenize(std::string_view text, absl::FunctionRef<void(std::string_view)> emit);
// The same, stopping after the first piece for which `emit` returns false.
void PreTokenizeWhile(std::string_view text, absl::FunctionRef<bool(std::string_view)> emit);

// The same pieces, found by RE2 at every position: the reference for PreTokenize's fast
// path in tests.
void PreTokenizeWithRe2Only(std::string_view text, absl::FunctionRef<void(std::string_view)> emit);

}  // namespace prefixd::internal

#endif  // PREFIXD_ENGINE_INTERNAL_BPE_PRETOKENIZER_H_
