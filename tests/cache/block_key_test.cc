#include "cache/block_key.h"

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
