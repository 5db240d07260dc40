// Cache identity: the keys that decide which KV blocks may be shared (docs/ARCHITECTURE.md,
// "Cache identity and invariants").
//
// A block's KV rows are correct only for the exact weights, tokenizer, tenant and token ids
// that produced them, so a block is keyed by a hash chain over all of them:
//   k0 = SHA-256("prefixd-v1" ‖ LP(manifest) ‖ LP(namespace))
//   k_i = SHA-256(k_{i-1} ‖ token ids of block i as uint32 little-endian)
// where LP(x) is x prefixed with its length (Sha256::UpdateLengthPrefixed), so no two
// different field splits hash alike. k_{i-1} is 32 bytes and a pool's block size is fixed, so
// the chain step needs no length prefix. Keys are only an index: a hit still compares the
// stored token ids, so a collision can never return another prefix's state.
#ifndef PREFIXD_CACHE_BLOCK_KEY_H_
#define PREFIXD_CACHE_BLOCK_KEY_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/types/span.h"
#include "cache/sha256.h"

namespace prefixd {

// The opaque namespace string for a tenant and an optional cache salt: LP(tenant) ‖ LP(salt).
// Tenant "ab" + salt "c" and tenant "a" + salt "bc" give different namespaces. The server
// derives the tenant from authentication; the client never chooses it alone.
std::string CacheNamespace(std::string_view tenant, std::string_view salt);

// k0 for a (model manifest, namespace) pair. Different manifests or namespaces never share a
// block, because every chain key below k0 depends on it.
Digest CacheRootKey(std::string_view manifest, std::string_view cache_namespace);

// k_i from k_{i-1} and the token ids of block i (exactly one full block).
Digest ChainKey(const Digest& parent, absl::Span<const uint32_t> block_tokens);

}  // namespace prefixd

#endif  // PREFIXD_CACHE_BLOCK_KEY_H_
