// GPT-2's own tokenizer for the fuzz targets that encode text, loaded once per process from
// PREFIXD_TOKENIZER_DIR (set by CMake, or overridden by the environment variable of that name).
#ifndef PREFIXD_FUZZ_GPT2_TOKENIZER_H_
#define PREFIXD_FUZZ_GPT2_TOKENIZER_H_

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "engine/tokenizer.h"

namespace prefixd::fuzz {

inline const Tokenizer& Gpt2Tokenizer() {
  static const Tokenizer* const tokenizer = [] {
    const char* env = std::getenv("PREFIXD_TOKENIZER_DIR");
    const std::string dir = env != nullptr ? env : PREFIXD_TOKENIZER_DIR;
    absl::StatusOr<std::unique_ptr<Tokenizer>> t =
        Tokenizer::Load(dir + "/vocab.json", dir + "/merges.txt");
    if (!t.ok()) {
      std::fprintf(stderr, "fuzz: %s\n", std::string(t.status().message()).c_str());
      std::abort();
    }
    return t->release();
  }();
  return *tokenizer;
}

}  // namespace prefixd::fuzz

#endif  // PREFIXD_FUZZ_GPT2_TOKENIZER_H_
