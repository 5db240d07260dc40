#include "cache/token_chain.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "cache/block_key.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

const Digest kRoot = CacheRootKey("manifest-1", CacheNamespace("tenant", ""));

std::vector<uint32_t> Iota(uint32_t n, uint32_t start = 0) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// The keys a chain must hold, computed the obvious way from scratch.
std::vector<Digest> KeysOf(const Digest& root, int32_t bs, const std::vector<uint32_t>& tokens) {
  std::vector<Digest> keys;
  Digest parent = root;
  for (size_t i = 0; (i + 1) * bs <= tokens.size(); ++i) {
    parent = ChainKey(parent, absl::MakeConstSpan(tokens).subspan(i * bs, bs));
    keys.push_back(parent);
  }
  return keys;
}

std::vector<Digest> Keys(const TokenChain& c) { return {c.keys().begin(), c.keys().end()}; }

TEST(TokenChainTest, HoldsTheKeyOfEveryFullBlockAndNoMore) {
  const std::vector<uint32_t> tokens = Iota(11);
  const TokenChain chain(kRoot, 4, tokens);
  EXPECT_EQ(chain.size(), 11u);
  ASSERT_EQ(chain.keys().size(), 2u);  // 11 / 4: the partial block has none
  EXPECT_EQ(Keys(chain), KeysOf(kRoot, 4, tokens));
  EXPECT_EQ(std::vector<uint32_t>(chain.block(1).begin(), chain.block(1).end()),
            (std::vector<uint32_t>{4, 5, 6, 7}));
  chain.CheckInvariants();
}

TEST(TokenChainTest, AppendingTokenByTokenGivesTheKeysOfTheWholeList) {
  TokenChain grown(kRoot, 4, Iota(3));
  std::vector<uint32_t> all = Iota(3);
  for (uint32_t t = 100; t < 110; ++t) {
    grown.Append({t});
    all.push_back(t);
    EXPECT_EQ(grown.keys().size(), all.size() / 4);
  }
  EXPECT_EQ(Keys(grown), KeysOf(kRoot, 4, all));
  EXPECT_EQ(Keys(grown), Keys(TokenChain(kRoot, 4, all)));
  grown.CheckInvariants();
}

TEST(TokenChainTest, TruncateDropsTheKeysOfBlocksNoLongerFull) {
  TokenChain chain(kRoot, 4, Iota(12));
  chain.Truncate(7);
  EXPECT_EQ(chain.size(), 7u);
  EXPECT_EQ(Keys(chain), KeysOf(kRoot, 4, Iota(7)));
  // Growing again past the cut recomputes the key from the new tokens.
  chain.Append({50, 51});
  std::vector<uint32_t> expect = Iota(7);
  expect.insert(expect.end(), {50, 51});
  EXPECT_EQ(Keys(chain), KeysOf(kRoot, 4, expect));
  chain.CheckInvariants();
}

TEST(TokenChainTest, ACopyGrowsOnItsOwn) {
  const TokenChain parent(kRoot, 4, Iota(6));
  TokenChain child = parent;
  child.Append({7, 8});
  EXPECT_EQ(parent.size(), 6u);
  EXPECT_EQ(parent.keys().size(), 1u);
  EXPECT_EQ(child.keys().size(), 2u);
  EXPECT_EQ(child.keys()[0], parent.keys()[0]);
}

TEST(TokenChainTest, TheRootSeparatesChainsOfTheSameTokens) {
  const TokenChain a(kRoot, 4, Iota(8));
  const TokenChain b(CacheRootKey("manifest-1", CacheNamespace("other", "")), 4, Iota(8));
  EXPECT_NE(a.keys()[0], b.keys()[0]);
  EXPECT_NE(a.keys()[1], b.keys()[1]);
}

}  // namespace
}  // namespace prefixd
