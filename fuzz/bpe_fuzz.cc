// Fuzz target: arbitrary bytes → GPT-2's pre-tokenizer and byte-level BPE.
//
// The pre-tokenizer's pieces are non-empty and concatenate to the input
// (internal/bpe_pretokenizer.h), and its ASCII fast path splits exactly as RE2 alone does.
// GPT-2's tokenizer then encodes the input into ids below its vocabulary size that decode
// to the input, and the same ids the second time (when pieces come from its cache).
#include <string>
#include <vector>

#include "engine/internal/bpe_pretokenizer.h"
#include "engine/tokenizer.h"
#include "fuzz/fuzz_target.h"
#include "fuzz/gpt2_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = prefixd::fuzz::AsText(data, size);
  std::vector<std::string_view> fast, re2_only;
  prefixd::internal::PreTokenize(text, [&](std::string_view p) { fast.push_back(p); });
  prefixd::internal::PreTokenizeWithRe2Only(text,
                                            [&](std::string_view p) { re2_only.push_back(p); });
  PREFIXD_CHECK(fast == re2_only);
  std::string joined;
  for (std::string_view p : fast) {
    PREFIXD_CHECK(!p.empty());
    joined.append(p);
  }
  PREFIXD_CHECK(joined == text);

  const prefixd::Tokenizer& tok = prefixd::fuzz::Gpt2Tokenizer();
  const std::vector<uint32_t> ids = tok.Encode(text);
  PREFIXD_CHECK(ids.empty() == text.empty());
  for (uint32_t id : ids) PREFIXD_CHECK(id < tok.vocab_size());
  absl::StatusOr<std::string> decoded = tok.Decode(ids);
  PREFIXD_CHECK(decoded.ok() && *decoded == text);
  PREFIXD_CHECK(tok.Encode(text) == ids);
  return 0;
}
