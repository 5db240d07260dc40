// Bearer-token authentication of Inference calls.
//
// With an --auth-tokens file (lines "token tenant [admin] [weight=N] [share=F]
// [max_waiting=N]"; blank lines and lines starting with '#' ignored), every call must carry
// `authorization: Bearer <token>` naming one of its tokens; the tenant it maps to owns the
// call's cache namespace, and `admin` lets it read pool-wide statistics (which show other
// tenants' traffic). weight, share and max_waiting are the tenant's policy
// (engine/tenant_policy.h); a tenant named on several lines has one policy, so the lines
// that give one of them must agree. Without a
// file every call belongs to kDefaultTenant, which is then admin. Token comparison is constant
// time: the presented token's SHA-256 is compared with every stored token's digest with
// CRYPTO_memcmp, with no early exit, so the time taken reveals neither which token nor how much of
// one matched.
#ifndef PREFIXD_SERVER_AUTH_H_
#define PREFIXD_SERVER_AUTH_H_

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tenant_policy.h"

namespace prefixd {

inline constexpr std::string_view kDefaultTenant = "default";

// Who made a call.
struct Caller {
  std::string tenant;
  bool admin = false;  // may read pool-wide statistics
};

class Authenticator {
 public:
  // Every call is the default tenant.
  static Authenticator AllowAll();
  // Parses the token file's contents. INVALID_ARGUMENT names the line that is malformed, a
  // duplicate token, or a file without tokens.
  static absl::StatusOr<Authenticator> FromText(std::string_view text);
  static absl::StatusOr<Authenticator> FromFile(const std::string& path);

  bool enabled() const { return enabled_; }
  size_t num_tokens() const { return entries_.size(); }
  // One per tenant of the file, in the order of their first lines (none without a file).
  const std::vector<TenantPolicy>& policies() const { return policies_; }

  // `authorization` is the metadata value, absent when the call carried none. Returns the
  // caller, or UNAUTHENTICATED (missing header, not "Bearer", unknown token).
  absl::StatusOr<Caller> Identify(std::optional<std::string_view> authorization) const;
  // Identify's tenant.
  absl::StatusOr<std::string> Authenticate(std::optional<std::string_view> authorization) const;

 private:
  struct Entry {
    std::array<unsigned char, 32> digest;
    std::string tenant;
    bool admin = false;
  };
  bool enabled_ = false;
  std::vector<Entry> entries_;
  std::vector<TenantPolicy> policies_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_AUTH_H_
