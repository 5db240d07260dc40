// Reading a whole (small) file: config.json, the tokenizer files, PEM certificates.
#ifndef PREFIXD_ENGINE_READ_FILE_H_
#define PREFIXD_ENGINE_READ_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace prefixd {

// The file's bytes. Errors name the path: NOT_FOUND when it does not exist, INVALID_ARGUMENT
// when it cannot be opened otherwise, DATA_LOSS on a read error.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_READ_FILE_H_
