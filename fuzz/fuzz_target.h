// What every fuzz target in this folder shares: the libFuzzer entry point's signature, and
// the checks that turn a broken promise into a crash the fuzzer reports.
//
// Each target is built twice: with clang's libFuzzer (scripts/fuzz, PREFIXD_FUZZ=ON) to
// search for inputs, and with replay_main.cc (any compiler) to feed the committed corpus
// through the same function as a ctest test.
#ifndef PREFIXD_FUZZ_FUZZ_TARGET_H_
#define PREFIXD_FUZZ_FUZZ_TARGET_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace prefixd::fuzz {

inline std::string_view AsText(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

}  // namespace prefixd::fuzz

#endif  // PREFIXD_FUZZ_FUZZ_TARGET_H_
