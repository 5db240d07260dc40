// Cache identity: the keys that decide which KV blocks may be shared (docs/ARCHITECTURE.md,
// "Cache identity and invariants").
//
// A block's KV rows are correct only for the exact weights, tokenizer, tenant and token ids
// that produced them, so a block is keyed by a hash chain over all of them:
//   k0 = SHA-256("prefixd-v1" ‖ LP(manifest) ‖ LP(namespace))                 the base model
//   k0 = SHA-256("prefixd-v1" ‖ LP(manifest) ‖ LP(namespace) ‖ 'A' ‖ LP(adapter))  a LoRA adapter
//   k_i = SHA-256(k_{i-1} ‖ token ids of block i as uint32 little-endian)
// where LP(x) is x prefixed with its length (Sha256::UpdateLengthPrefixed), so no two
// different field splits hash alike. The adapter (the hex digest of its files,
// engine/lora_adapter.h) is a field of its own, after the namespace and marked by its type
// byte 'A': the encoding is prefix-free (each field's length is read before its bytes), so no
// tenant, salt or manifest string can produce the bytes of an adapter's root, an adapter's root
// never equals the base's, and two adapters' roots differ unless their digests do. (vLLM keyed
// by the adapter's name and let a salt equal to a name collide with it.) The base's root is the
// same bytes as before adapters existed, so disk tiers written then stay valid. k_{i-1} is 32 bytes
// and a pool's block size is fixed, so the chain step needs no length prefix. Keys are only an
// index: a hit still compares the stored token ids, so a collision can never return another
// prefix's state.
#ifndef PREFIXD_CACHE_BLOCK_KEY_H_
#define PREFIXD_CACHE_BLOCK_KEY_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/types/span.h"
#include "cache/sha256.h"

namespace prefixd {

// The opaque namespace string for a tenant and an optional cache salt: LP(tenant) ‖ LP(salt)
// (8-byte little-endian lengths). Tenant "ab" + salt "c" and tenant "a" + salt "bc" give
// different namespaces, and no salt can make one tenant's namespace equal another's: the
// salt only narrows within a tenant. The server (server/request_path.cc) derives the tenant
// from authentication, never from the client alone. A LoRA adapter is not part of the
// namespace but a typed field of its own in the root key (below).
std::string CacheNamespace(std::string_view tenant, std::string_view salt);

// k0 for a (model manifest, namespace) pair. Different manifests or namespaces never share a
// block, because every chain key below k0 depends on it.
Digest CacheRootKey(std::string_view manifest, std::string_view cache_namespace);
// k0 for blocks computed with a LoRA adapter whose digest is `adapter_digest`; an empty digest
// is the base model (the two-argument form).
Digest CacheRootKey(std::string_view manifest, std::string_view cache_namespace,
                    std::string_view adapter_digest);

// k_i from k_{i-1} and the token ids of block i (exactly one full block).
Digest ChainKey(const Digest& parent, absl::Span<const uint32_t> block_tokens);

}  // namespace prefixd

#endif  // PREFIXD_CACHE_BLOCK_KEY_H_
