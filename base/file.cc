#include "base/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/escape.h"

namespace prefixd {
namespace {

// What a non-regular file is, for the message.
const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// The message for an open() that failed with `err`.
absl::Status OpenError(const std::string& path, int err) {
  const std::string where = EscapeBytes(path);
  if (err == ENOENT) {
    // The target is not named: the path may come over the network (an adapter's lora_path),
    // and a client is told only about what it named.
    struct stat link;
    if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      return absl::NotFoundError(
          absl::StrCat(where, ": missing (a symbolic link whose target does not exist)"));
    }
    return absl::NotFoundError(absl::StrCat(where, ": missing"));
  }
  if (err == ELOOP) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a symbolic link loop (too many levels of symbolic links)"));
  }
  return absl::InvalidArgumentError(absl::StrCat(where, ": cannot open: ", std::strerror(err)));
}

}  // namespace

absl::StatusOr<int> OpenRegularFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. It has no
  // effect on regular files.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return OpenError(path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(EscapeBytes(path), ": cannot stat: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(EscapeBytes(path), ": is ", KindOf(st.st_mode), ", not a regular file"));
  }
  return fd;
}

absl::Status CheckRegularFile(const std::string& path) {
  absl::StatusOr<int> fd = OpenRegularFile(path);
  if (!fd.ok()) return fd.status();
  ::close(*fd);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  absl::StatusOr<int> fd = OpenRegularFile(path);
  if (!fd.ok()) return fd.status();
  std::string out;
  struct stat st;
  if (::fstat(*fd, &st) == 0 && st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(*fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(*fd);
      return absl::DataLossError(
          absl::StrCat(EscapeBytes(path), ": read error: ", std::strerror(err)));
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(*fd);
  return out;
}

int ReadFileInto(const std::string& path, std::string* out) {
  return ReadFilePrefixInto(path, SIZE_MAX, out);
}

int ReadFilePrefixInto(const std::string& path, size_t max_bytes, std::string* out) {
  // O_NOFOLLOW | O_NONBLOCK: a symbolic link (ELOOP) or a FIFO put where a file of ours
  // should be is neither followed nor waited on.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return errno;
  struct stat st;
  const int stat_err = ::fstat(fd, &st) != 0 ? errno : (S_ISREG(st.st_mode) ? 0 : EINVAL);
  if (stat_err != 0) {
    ::close(fd);
    return stat_err;
  }
  out->resize(std::min(static_cast<size_t>(st.st_size), max_bytes));
  size_t done = 0;
  while (done < out->size()) {
    const ssize_t n = ::pread(fd, out->data() + done, out->size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      return err;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return 0;
}

int WriteFileAtomically(const std::string& tmp, const std::string& path, std::string_view bytes,
                        mode_t mode) {
  // O_EXCL | O_NOFOLLOW: the temporary is always a new file of ours, never a file or a
  // link planted at its name. One left by a write that died is removed (unlink removes a
  // link itself, not what it points to) and the create tried once more.
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(tmp.c_str(), kFlags, mode);
  if (fd < 0 && errno == EEXIST && ::unlink(tmp.c_str()) == 0)
    fd = ::open(tmp.c_str(), kFlags, mode);
  if (fd < 0) return errno;
  size_t done = 0;
  int err = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) ::unlink(tmp.c_str());
  return err;
}

}  // namespace prefixd
