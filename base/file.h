// Whole files, for every layer: opening and reading the files prefixd is given
// (config.json, the tokenizer files, the weights, PEM certificates, token lists), and the
// files it writes itself (disk tier blocks, the served TLS copy) written atomically.
//
// Reads: where a file should be, anything else is reported as what it is: a missing path, a
// dangling symbolic link, a symbolic-link loop, a directory, a FIFO, a socket or a device.
// A FIFO is never opened for a blocking read, so such a mistake cannot hang start-up.
//
// Atomic writes: the bytes go to a temporary name next to the file, which is created anew
// (never through a symbolic link or into a file that is already there), then renamed over
// the file: a reader sees the old file or the new one, never a part, and a symbolic link at
// either name is replaced, never followed.
#ifndef PREFIXD_BASE_FILE_H_
#define PREFIXD_BASE_FILE_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <string_view>

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

// The same for files prefixd itself keeps (no messages built on a hot path), which are
// read only when they are regular files reached without a symbolic link: 0, or the errno of
// the first call that failed (ENOENT when absent, ELOOP for a link, EINVAL for a FIFO,
// directory or device, EIO for a file that shrank while it was read).
int ReadFileInto(const std::string& path, std::string* out);
// The same, reading at most the first `max_bytes` bytes (fewer when the file is shorter): a
// record's head without its body.
int ReadFilePrefixInto(const std::string& path, size_t max_bytes, std::string* out);

// Writes `bytes` to `tmp` (created with `mode`), then renames it to `path`. 0, or the errno
// of the first call that failed; `tmp` is gone either way. A `tmp` left by a process that
// died mid-write is removed first.
int WriteFileAtomically(const std::string& tmp, const std::string& path, std::string_view bytes,
                        mode_t mode);

}  // namespace prefixd

#endif  // PREFIXD_BASE_FILE_H_
