#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
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
  absl::flat_hash_map<std::string, bool> weight_given;  // by tenant: a line gave weight=
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("auth tokens line ", line_no, ": ", why));
    };
    if (fields.size() < 2) {
      return bad(absl::StrCat(
          "expected \"token tenant [admin] [weight=N] [share=F] [max_waiting=N]\", got ",
          fields.size(), " field", fields.size() == 1 ? "" : "s"));
    }
    Entry e{Digest(std::string_view(fields[0].data(), fields[0].size())), std::string(fields[1]),
            false};
    TenantPolicy p{.name = e.tenant};
    bool has_weight = false;
    for (size_t i = 2; i < fields.size(); ++i) {
      const absl::string_view f = fields[i];
      if (f == "admin") {
        e.admin = true;
      } else if (absl::ConsumePrefix(&fields[i], "weight=")) {
        if (!absl::SimpleAtoi(fields[i], &p.weight) || p.weight < 1 || p.weight > 1000) {
          return bad(
              absl::StrCat("weight must be an integer in [1, 1000], got \"", fields[i], "\""));
        }
        has_weight = true;
      } else if (absl::ConsumePrefix(&fields[i], "share=")) {
        double share = 0;
        if (!absl::SimpleAtod(fields[i], &share) || !(share > 0 && share <= 1)) {
          return bad(absl::StrCat("share must be a fraction of the pool in (0, 1], got \"",
                                  fields[i], "\""));
        }
        p.cache_share = share;
      } else if (absl::ConsumePrefix(&fields[i], "max_waiting=")) {
        int32_t n = 0;
        if (!absl::SimpleAtoi(fields[i], &n) || n < 0) {
          return bad(absl::StrCat(
              "max_waiting must be a count of requests >= 0 (0: no cap), got \"", fields[i], "\""));
        }
        p.max_waiting = n;
      } else {
        return bad(absl::StrCat("unknown field \"", f,
                                "\" (expected admin, weight=N, share=F or max_waiting=N)"));
      }
    }
    for (const Entry& other : auth.entries_) {
      if (other.digest == e.digest) return bad("duplicate token");
    }
    // One policy per tenant: a later line of the tenant may repeat or add to it, not change
    // what an earlier line said.
    auto known = std::find_if(auth.policies_.begin(), auth.policies_.end(),
                              [&](const TenantPolicy& q) { return q.name == p.name; });
    if (known == auth.policies_.end()) {
      auth.policies_.push_back(p);
      weight_given[p.name] = has_weight;
    } else {
      const bool weight_known = weight_given[p.name];
      if ((has_weight && weight_known && known->weight != p.weight) ||
          (p.cache_share && known->cache_share && *known->cache_share != *p.cache_share) ||
          (p.max_waiting && known->max_waiting && *known->max_waiting != *p.max_waiting)) {
        return bad(absl::StrCat("tenant \"", p.name,
                                "\" has another weight, share or max_waiting on an earlier line"));
      }
      if (has_weight) known->weight = p.weight;
      weight_given[p.name] = weight_known || has_weight;
      if (p.cache_share) known->cache_share = p.cache_share;
      if (p.max_waiting) known->max_waiting = p.max_waiting;
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
    return absl::UnauthenticatedError(
        "missing \"authorization: Bearer <token>\" (gRPC metadata, or the HTTP header)");
  }
  constexpr std::string_view kBearer = "Bearer ";
  if (!absl::StartsWithIgnoreCase(absl::string_view(authorization->data(), authorization->size()),
                                  absl::string_view(kBearer.data(), kBearer.size()))) {
    return absl::UnauthenticatedError("authorization must be \"Bearer <token>\"");
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
