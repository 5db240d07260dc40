#include "server/cache_namespace.h"

#include <cstdint>

namespace prefixd {
namespace {

void AppendField(std::string* out, std::string_view field) {
  uint64_t n = field.size();
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out->append(field);
}

}  // namespace

std::string DeriveCacheNamespace(std::string_view tenant, std::string_view cache_salt) {
  std::string ns;
  ns.reserve(16 + tenant.size() + cache_salt.size());
  AppendField(&ns, tenant);
  AppendField(&ns, cache_salt);
  return ns;
}

}  // namespace prefixd
