// Opening and reading the files prefixd is given: config.json, the tokenizer files, the
// weights, PEM certificates.
//
// Where a file should be, anything else is reported as what it is: a missing path, a
// dangling symbolic link, a symbolic-link loop, a directory, a FIFO, a socket or a device.
// A FIFO is never opened for a blocking read, so such a mistake cannot hang start-up.
#ifndef PREFIXD_ENGINE_READ_FILE_H_
#define PREFIXD_ENGINE_READ_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace prefixd {

// A descriptor open for reading on `path`, which (after following symbolic links) is a
// regular file; the caller closes it. Errors start with the path: NOT_FOUND when nothing is
// there ("missing"; a dangling link says so), INVALID_ARGUMENT for a path that is something
// else or cannot be opened (the reason from the system).
absl::StatusOr<int> OpenRegularFile(const std::string& path);

// OK when OpenRegularFile would succeed; its error otherwise.
absl::Status CheckRegularFile(const std::string& path);

// The file's bytes. Errors as OpenRegularFile's; DATA_LOSS on a read error.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_READ_FILE_H_
