#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>


#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file.h"

namespace prefixd {
namespace {

std::array<unsigned char, 32> Digest(std::string_view s) {
  std::array<unsigned char, 32> d;
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
  return d;
}

}  // namespace

Authenticator Authenticator::AllowAll() { return Authenticator(); }

absl::StatusOr<Authenticator> Authenticator::FromText(std::string_view text) {
  Authenticator auth;
  auth.enabled_ = true;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2 && fields.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth tokens line ", line_no,
                       ": expected \"token tenant\" or \"token tenant admin\", got ",
                       fields.size(), " fields"));
    }
    if (fields.size() == 3 && fields[2] != "admin") {
      return absl::InvalidArgumentError(
          absl::StrCat("auth tokens line ", line_no,
                       ": the third field may only be \"admin\" (a tenant that may read "
                       "pool-wide statistics)"));
    }
    Entry e{Digest(std::string_view(fields[0].data(), fields[0].size())), std::string(fields[1]),
            fields.size() == 3};
    for (const Entry& other : auth.entries_) {
      if (other.digest == e.digest) {
        return absl::InvalidArgumentError(
            absl::StrCat("auth tokens line ", line_no, ": duplicate token"));
      }
    }
    auth.entries_.push_back(std::move(e));
  }
  if (auth.entries_.empty()) {
    return absl::InvalidArgumentError("auth tokens file has no \"token tenant\" lines");
  }
  return auth;
}

absl::StatusOr<Authenticator> Authenticator::FromFile(const std::string& path) {
  // ReadWholeFile refuses a FIFO, a directory or a symlink loop saying which, instead of
  // blocking start-up (or a SIGHUP reload) on a FIFO nobody writes.
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("auth tokens file: ", text.status().message()));
  }
  absl::StatusOr<Authenticator> auth = FromText(*text);
  if (!auth.ok()) {
    return absl::Status(auth.status().code(), absl::StrCat(path, ": ", auth.status().message()));
  }
  return auth;
}

absl::StatusOr<std::string> Authenticator::Authenticate(
    std::optional<std::string_view> authorization) const {
  absl::StatusOr<Caller> caller = Identify(authorization);
  if (!caller.ok()) return caller.status();
  return std::move(caller->tenant);
}

absl::StatusOr<Caller> Authenticator::Identify(
    std::optional<std::string_view> authorization) const {
  if (!enabled_) return Caller{std::string(kDefaultTenant), true};
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError("missing \"authorization: Bearer <token>\" metadata");
  }
  constexpr std::string_view kBearer = "Bearer ";
  if (!absl::StartsWithIgnoreCase(absl::string_view(authorization->data(), authorization->size()),
                                  absl::string_view(kBearer.data(), kBearer.size()))) {
    return absl::UnauthenticatedError("authorization metadata must be \"Bearer <token>\"");
  }
  const auto presented = Digest(authorization->substr(kBearer.size()));
  const Entry* match = nullptr;
  for (const Entry& e : entries_) {  // no early exit: constant time in the position
    if (CRYPTO_memcmp(e.digest.data(), presented.data(), presented.size()) == 0) match = &e;
  }
  if (match == nullptr) return absl::UnauthenticatedError("unknown bearer token");
  return Caller{match->tenant, match->admin};
}

}  // namespace prefixd
