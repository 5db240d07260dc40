// The cache namespace of a request, derived on the server and never taken from the client
// alone: the authenticated tenant, then the request's cache_salt. Each field is
// length-prefixed, so tenant "ab" + salt "c" and tenant "a" + salt "bc" differ, and no salt
// can make one tenant's namespace equal another's: the salt only narrows within a tenant.
// A LoRA adapter is not part of the namespace: its digest is a typed field of its own in the
// root key (cache/block_key.h), so neither a tenant nor a salt can be spelled like it.
#ifndef PREFIXD_SERVER_CACHE_NAMESPACE_H_
#define PREFIXD_SERVER_CACHE_NAMESPACE_H_

#include <string>
#include <string_view>

namespace prefixd {

std::string DeriveCacheNamespace(std::string_view tenant, std::string_view cache_salt);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_CACHE_NAMESPACE_H_
