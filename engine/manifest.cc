#include "engine/manifest.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace prefixd {
namespace {

// Debian's absl has its own string_view type; StrCat takes only that one.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

std::string ManifestSha256(const std::array<Digest, 4>& file_digests) {
  Sha256 h;
  for (size_t i = 0; i < kManifestFiles.size(); ++i) {
    h.UpdateLengthPrefixed(kManifestFiles[i]);
    h.Update(file_digests[i].data(), file_digests[i].size());
  }
  return DigestHex(h.Final());
}

absl::StatusOr<Digest> FileSha256(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (f == nullptr) {
    const int err = errno;
    const std::string msg = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InvalidArgumentError(msg);
  }
  Sha256 h;
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) h.Update(buf.data(), n);
  if (std::ferror(f.get())) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": read error"));
  }
  return h.Final();
}

absl::StatusOr<std::string> ComputeManifestSha256(const std::string& dir) {
  std::array<Digest, 4> digests;
  for (size_t i = 0; i < kManifestFiles.size(); ++i) {
    absl::StatusOr<Digest> d = FileSha256(absl::StrCat(dir, "/", ToAbsl(kManifestFiles[i])));
    if (!d.ok()) return d.status();
    digests[i] = *d;
  }
  return ManifestSha256(digests);
}

}  // namespace prefixd
