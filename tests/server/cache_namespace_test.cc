#include "server/cache_namespace.h"

#include <set>

#include "gtest/gtest.h"

namespace prefixd {
namespace {

TEST(CacheNamespaceTest, SameInputsSameNamespace) {
  EXPECT_EQ(DeriveCacheNamespace("alice", "s"), DeriveCacheNamespace("alice", "s"));
}

TEST(CacheNamespaceTest, FieldsAreLengthPrefixed) {
  EXPECT_NE(DeriveCacheNamespace("ab", "c"), DeriveCacheNamespace("a", "bc"));
  EXPECT_NE(DeriveCacheNamespace("abc", ""), DeriveCacheNamespace("", "abc"));
  EXPECT_NE(DeriveCacheNamespace("a", ""), DeriveCacheNamespace("", "a"));
}

TEST(CacheNamespaceTest, SaltNarrowsWithinTenantOnly) {
  std::set<std::string> seen;
  for (const char* tenant : {"alice", "bob", "", "default"}) {
    for (const char* salt : {"", "x", "salt", "alice", "bob"}) {
      EXPECT_TRUE(seen.insert(DeriveCacheNamespace(tenant, salt)).second)
          << tenant << " / " << salt;
    }
  }
}

TEST(CacheNamespaceTest, NoSaltCanForgeAnotherTenant) {
  // A salt that embeds another tenant's encoded fields still yields a different namespace,
  // because the tenant's own length prefix comes first.
  const std::string bob = DeriveCacheNamespace("bob", "");
  EXPECT_NE(DeriveCacheNamespace("", bob), bob);
  EXPECT_NE(DeriveCacheNamespace("alice", bob.substr(8)), bob);
}

}  // namespace
}  // namespace prefixd
