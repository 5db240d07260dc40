#include "cache/block_key.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace prefixd {
namespace {

TEST(BlockKeyTest, RootKeyHashesVersionAndLengthPrefixedFields) {
  Sha256 h;
  h.Update("prefixd-v1");
  h.UpdateLengthPrefixed("manifest");
  h.UpdateLengthPrefixed("ns");
  EXPECT_EQ(CacheRootKey("manifest", "ns"), h.Final());
}

TEST(BlockKeyTest, NamespaceLengthPrefixesTenantAndSalt) {
  EXPECT_NE(CacheNamespace("ab", "c"), CacheNamespace("a", "bc"));
  EXPECT_NE(CacheNamespace("", "a"), CacheNamespace("a", ""));
  EXPECT_EQ(CacheNamespace("t", "s"), std::string("\x01\0\0\0\0\0\0\0t\x01\0\0\0\0\0\0\0s", 18));
  EXPECT_NE(CacheRootKey("m", CacheNamespace("ab", "c")),
            CacheRootKey("m", CacheNamespace("a", "bc")));
  // Manifest and namespace cannot trade bytes either.
  EXPECT_NE(CacheRootKey("ab", "c"), CacheRootKey("a", "bc"));
}

TEST(BlockKeyTest, NamespaceSaltNarrowsWithinATenantOnly) {
  std::set<std::string> seen;
  for (const char* tenant : {"alice", "bob", "", "default"}) {
    for (const char* salt : {"", "x", "salt", "alice", "bob"}) {
      EXPECT_TRUE(seen.insert(CacheNamespace(tenant, salt)).second) << tenant << " / " << salt;
    }
  }
  EXPECT_EQ(CacheNamespace("alice", "s"), CacheNamespace("alice", "s"));
  // A salt that embeds another tenant's encoded fields still yields a different namespace,
  // because the tenant's own length prefix comes first.
  const std::string bob = CacheNamespace("bob", "");
  EXPECT_NE(CacheNamespace("", bob), bob);
  EXPECT_NE(CacheNamespace("alice", bob.substr(8)), bob);
}

TEST(BlockKeyTest, AdapterIsATypedLengthPrefixedFieldAfterTheNamespace) {
  Sha256 h;
  h.Update("prefixd-v1");
  h.UpdateLengthPrefixed("manifest");
  h.UpdateLengthPrefixed("ns");
  h.Update("A");
  h.UpdateLengthPrefixed("digest");
  EXPECT_EQ(CacheRootKey("manifest", "ns", "digest"), h.Final());
  // No adapter is the base, whose root is unchanged.
  EXPECT_EQ(CacheRootKey("manifest", "ns", ""), CacheRootKey("manifest", "ns"));
  EXPECT_NE(CacheRootKey("manifest", "ns", "digest"), CacheRootKey("manifest", "ns"));
  EXPECT_NE(CacheRootKey("m", "ns", "d1"), CacheRootKey("m", "ns", "d2"));
}

// No string in one field can equal another's: a salt or tenant spelled like the adapter's
// digest (vllm#44701's collision of a salt with an adapter name), a namespace that carries
// the very bytes of the adapter field, or a manifest that swallows the namespace.
TEST(BlockKeyTest, AdapterFieldCannotBeForgedByTenantSaltOrManifest) {
  const std::string d = "3f2a9c";
  const Digest adapter = CacheRootKey("m", CacheNamespace("tenant", ""), d);
  EXPECT_NE(adapter, CacheRootKey("m", CacheNamespace("tenant", d)));
  EXPECT_NE(adapter, CacheRootKey("m", CacheNamespace("tenant", d), ""));
  EXPECT_NE(adapter, CacheRootKey("m", CacheNamespace(d, "")));
  EXPECT_NE(adapter, CacheRootKey("m", CacheNamespace("tenant" + d, "")));
  // The namespace field followed by the adapter field's bytes, all inside the namespace.
  const std::string ns = CacheNamespace("tenant", "");
  std::string forged = ns + "A";
  const uint64_t n = d.size();
  for (int i = 0; i < 8; ++i) forged.push_back(static_cast<char>(n >> (8 * i)));
  forged += d;
  EXPECT_NE(adapter, CacheRootKey("m", forged));
  // The adapter field holding what would otherwise be the namespace.
  EXPECT_NE(CacheRootKey("m", "", ns), CacheRootKey("m", ns));
  // Manifest and adapter cannot trade bytes.
  EXPECT_NE(CacheRootKey("m" + d, "ns", ""), CacheRootKey("m", "ns", d));
  // Same adapter, other tenant: still apart.
  EXPECT_NE(adapter, CacheRootKey("m", CacheNamespace("other", ""), d));
}

TEST(BlockKeyTest, ChainKeyIsParentThenLittleEndianTokens) {
  const Digest parent = Sha256Of("parent");
  const std::vector<uint32_t> tokens = {1, 0x01020304u, 50256};
  Sha256 h;
  h.Update(parent.data(), parent.size());
  const uint8_t le[] = {1, 0, 0, 0, 4, 3, 2, 1, 0x50, 0xc4, 0, 0};
  h.Update(le, sizeof(le));
  EXPECT_EQ(ChainKey(parent, tokens), h.Final());
  // Order and parent both matter.
  EXPECT_NE(ChainKey(parent, {50256, 0x01020304u, 1}), ChainKey(parent, tokens));
  EXPECT_NE(ChainKey(Sha256Of("other"), tokens), ChainKey(parent, tokens));
}

TEST(BlockKeyTest, LargeBlocksUseTheHeapPath) {
  std::vector<uint32_t> tokens(256, 7);
  Sha256 h;
  const Digest parent{};
  h.Update(parent.data(), parent.size());
  for (uint32_t t : tokens) {
    const uint8_t le[4] = {static_cast<uint8_t>(t), 0, 0, 0};
    h.Update(le, 4);
  }
  EXPECT_EQ(ChainKey(parent, tokens), h.Final());
}

}  // namespace
}  // namespace prefixd
