// Fuzz target: vocab.json + merges.txt → Tokenizer::FromText, then encoding with the result.
//
// Input: the vocab.json bytes, a NUL byte, then the merges.txt bytes (no NUL: all of it is
// vocab.json and merges.txt is empty). A tokenizer that is accepted must encode any bytes
// (here: the input itself and a fixed text) into ids below its vocabulary size that decode
// back to those bytes, whatever its merge table; every id's bytes must be readable.
#include <string>
#include <vector>

#include "engine/tokenizer.h"
#include "fuzz/fuzz_target.h"

namespace {

void CheckRoundTrip(const prefixd::Tokenizer& tok, std::string_view text) {
  const std::vector<uint32_t> ids = tok.Encode(text);
  for (uint32_t id : ids) PREFIXD_CHECK(id < tok.vocab_size());
  absl::StatusOr<std::string> decoded = tok.Decode(ids);
  PREFIXD_CHECK(decoded.ok() && *decoded == text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = prefixd::fuzz::AsText(data, size);
  const size_t nul = input.find('\0');
  const std::string_view vocab = input.substr(0, nul);
  const std::string_view merges =
      nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);
  absl::StatusOr<std::unique_ptr<prefixd::Tokenizer>> tok =
      prefixd::Tokenizer::FromText(vocab, merges, "vocab.json", "merges.txt");
  if (!tok.ok()) {
    PREFIXD_CHECK(tok.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  for (uint32_t id = 0; id < (*tok)->vocab_size(); ++id) {
    PREFIXD_CHECK(!(*tok)->TokenBytes(id).empty());
  }
  CheckRoundTrip(**tok, input);
  CheckRoundTrip(**tok, "Hello world, it's 2024: caf\xC3\xA9  \n\n\t\xFF\xFE end");
  return 0;
}
