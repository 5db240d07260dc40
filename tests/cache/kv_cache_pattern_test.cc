// Copy-on-write tested by pattern: a host-memory fake of the backend's KV
// storage, laid out like a real one ([block][layer][K|V][head][row][head_dim]), executes the
// BlockCopy lists that cache/ returns. Every element written for a position is a function of
// the position's whole prefix, so after forks, partial reuse and writes, checking every
// element of every sequence (and of the blocks they no longer own) proves that each copy
// moved exactly the right rows and that no write landed in a shared block.
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "cache/block_key.h"
#include "cache/kv_cache.h"
#include "cache/token_chain.h"
#include "tests/cache/fork_chains.h"
#include "gtest/gtest.h"
#include "tests/cache/kv_cache_test_peer.h"

namespace prefixd {
namespace {

constexpr int kLayers = 2, kHeads = 2, kHeadDim = 3, kBlock = 4;

class FakeKvStorage {
 public:
  explicit FakeKvStorage(int num_blocks)
      : data_(static_cast<size_t>(num_blocks) * kLayers * 2 * kHeads * kBlock * kHeadDim,
              std::numeric_limits<float>::quiet_NaN()) {}

  float& At(int block, int layer, int kv, int head, int row, int dim) {
    return data_[((((static_cast<size_t>(block) * kLayers + layer) * 2 + kv) * kHeads + head) *
                      kBlock +
                  row) *
                     kHeadDim +
                 dim];
  }

  // What a backend's CopyBlocks does: rows [0, num_rows) of every layer's K and V.
  void Execute(const std::vector<BlockCopy>& copies) {
    for (const BlockCopy& c : copies) {
      for (int l = 0; l < kLayers; ++l)
        for (int kv = 0; kv < 2; ++kv)
          for (int h = 0; h < kHeads; ++h)
            for (int r = 0; r < c.num_rows; ++r)
              for (int d = 0; d < kHeadDim; ++d)
                At(c.dst, l, kv, h, r, d) = At(c.src, l, kv, h, r, d);
    }
  }

 private:
  std::vector<float> data_;
};

// The value a forward pass would store for position p of `tokens`: depends on all of
// tokens[0..p] and on the element's coordinates.
float Expected(const std::vector<uint32_t>& tokens, int p, int l, int kv, int h, int d) {
  uint32_t x = 17;
  for (int i = 0; i <= p; ++i) x = x * 31 + tokens[i] + 1;
  x = x * 7 + static_cast<uint32_t>(((l * 2 + kv) * kHeads + h) * kHeadDim + d);
  return static_cast<float>(x % 100003);
}

class KvCachePatternTest : public ::testing::Test {
 protected:
  KvCachePatternTest() : storage_(kBlocks) {
    KvCacheOptions o;
    o.pool.num_blocks = kBlocks;
    o.pool.block_size = kBlock;
    cache_ = std::move(*KvCache::Create(o));
  }

  // Reserves, writes rows [computed, tokens) through the block table, marks them computed.
  void Compute(SequenceId seq) {
    const int n = cache_->NumTokens(seq);
    auto copies = cache_->Reserve(seq, n);
    ASSERT_TRUE(copies.ok()) << copies.status();
    storage_.Execute(*copies);
    auto table = cache_->BlockTable(seq);
    std::vector<uint32_t> tokens(cache_->Tokens(seq).begin(), cache_->Tokens(seq).end());
    for (int p = cache_->NumComputed(seq); p < n; ++p)
      for (int l = 0; l < kLayers; ++l)
        for (int kv = 0; kv < 2; ++kv)
          for (int h = 0; h < kHeads; ++h)
            for (int d = 0; d < kHeadDim; ++d)
              storage_.At(table[p / kBlock], l, kv, h, p % kBlock, d) =
                  Expected(tokens, p, l, kv, h, d);
    cache_->MarkComputed(seq, n);
    cache_->CheckInvariants();
  }

  // Every element of every computed row of `seq` holds its prefix's value.
  void ExpectIntact(SequenceId seq) {
    auto table = cache_->BlockTable(seq);
    std::vector<uint32_t> tokens(cache_->Tokens(seq).begin(), cache_->Tokens(seq).end());
    int bad = 0;
    for (int p = 0; p < cache_->NumComputed(seq); ++p)
      for (int l = 0; l < kLayers; ++l)
        for (int kv = 0; kv < 2; ++kv)
          for (int h = 0; h < kHeads; ++h)
            for (int d = 0; d < kHeadDim; ++d)
              bad += storage_.At(table[p / kBlock], l, kv, h, p % kBlock, d) !=
                     Expected(tokens, p, l, kv, h, d);
    EXPECT_EQ(bad, 0) << "sequence " << seq;
  }

  // Every indexed block holds its prefix's rows.
  void ExpectIndexIntact() {
    for (const IndexedBlockInfo& info : KvCacheTestPeer::IndexedBlocks(*cache_)) {
      const int first = static_cast<int>(info.tokens.size()) - kBlock;
      int bad = 0;
      for (int r = 0; r < kBlock; ++r)
        for (int l = 0; l < kLayers; ++l)
          for (int kv = 0; kv < 2; ++kv)
            for (int h = 0; h < kHeads; ++h)
              for (int d = 0; d < kHeadDim; ++d)
                bad += storage_.At(info.block, l, kv, h, r, d) !=
                       Expected(info.tokens, first + r, l, kv, h, d);
      EXPECT_EQ(bad, 0) << "indexed block " << info.block;
    }
  }

  SequenceId AdmitAndCompute(const std::vector<uint32_t>& prompt, std::vector<BlockCopy>* copies) {
    AdmissionRequest r;
    r.chain = std::make_shared<TokenChain>(root_, kBlock, prompt);
    r.reserve_tokens = static_cast<int32_t>(prompt.size());
    auto a = cache_->Admit(r);
    EXPECT_TRUE(a.ok()) << a.status();
    if (copies != nullptr) *copies = a->copies;
    storage_.Execute(a->copies);
    Compute(a->seq);
    return a->seq;
  }

  static constexpr int kBlocks = 16;
  const Digest root_ = CacheRootKey("m", CacheNamespace("t", ""));
  FakeKvStorage storage_;
  std::unique_ptr<KvCache> cache_;
};

TEST_F(KvCachePatternTest, PartialReuseCopiesExactlyTheMatchingRows) {
  std::vector<uint32_t> a_tokens(8);
  std::iota(a_tokens.begin(), a_tokens.end(), 0);
  SequenceId a = AdmitAndCompute(a_tokens, nullptr);
  const std::vector<int32_t> a_table(cache_->BlockTable(a).begin(), cache_->BlockTable(a).end());
  cache_->Release(a);

  std::vector<BlockCopy> copies;
  SequenceId b = AdmitAndCompute({0, 1, 2, 3, 4, 5, 50, 51, 52}, &copies);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, a_table[1]);
  EXPECT_EQ(copies[0].num_rows, 2);
  ExpectIntact(b);
  // The source block is untouched: A's rows 4..7 are all still there.
  for (int r = 0; r < kBlock; ++r)
    EXPECT_EQ(storage_.At(a_table[1], 1, 1, 1, r, 2), Expected(a_tokens, 4 + r, 1, 1, 1, 2));
  ExpectIndexIntact();
}

TEST_F(KvCachePatternTest, CopyMovesOnlyTheRequestedRows) {
  std::vector<uint32_t> a_tokens = {9, 9, 9, 9, 8, 8, 8, 8};
  cache_->Release(AdmitAndCompute(a_tokens, nullptr));
  AdmissionRequest r;
  std::vector<uint32_t> prompt = {9, 9, 9, 9, 8, 8, 1};
  r.chain = std::make_shared<TokenChain>(root_, kBlock, prompt);
  r.reserve_tokens = 7;
  auto adm = cache_->Admit(r);
  ASSERT_TRUE(adm.ok());
  ASSERT_EQ(adm->copies.size(), 1u);
  const BlockCopy c = adm->copies[0];
  EXPECT_EQ(c.num_rows, 2);
  storage_.Execute(adm->copies);
  // Rows past num_rows of the fresh block were never written: still NaN.
  for (int l = 0; l < kLayers; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < kHeads; ++h)
        for (int d = 0; d < kHeadDim; ++d) {
          EXPECT_EQ(storage_.At(c.dst, l, kv, h, 1, d), Expected(a_tokens, 5, l, kv, h, d));
          EXPECT_TRUE(std::isnan(storage_.At(c.dst, l, kv, h, 2, d)));
          EXPECT_TRUE(std::isnan(storage_.At(c.dst, l, kv, h, 3, d)));
        }
}

TEST_F(KvCachePatternTest, ForkedChildrenDivergeWithoutTouchingEachOther) {
  SequenceId parent = AdmitAndCompute({1, 2, 3, 4, 5, 6}, nullptr);  // 1.5 blocks
  std::vector<SequenceId> kids = testing::ForkCopies(*cache_, parent, 3);
  for (int step = 0; step < 7; ++step) {
    for (size_t i = 0; i < kids.size(); ++i) {
      const uint32_t t = static_cast<uint32_t>(100 * (i + 1) + step);
      cache_->AppendTokens(kids[i], {t});
      Compute(kids[i]);
    }
    cache_->AppendTokens(parent, {static_cast<uint32_t>(step)});
    Compute(parent);
    for (SequenceId k : kids) ExpectIntact(k);
    ExpectIntact(parent);
    ExpectIndexIntact();
  }
  // Two children that happen to continue identically end up sharing their blocks again.
  SequenceId twin = testing::ForkCopies(*cache_, kids[0], 1)[0];
  for (SequenceId s : {kids[0], twin}) {
    cache_->AppendTokens(s, {7, 7, 7, 7});
    Compute(s);
    ExpectIntact(s);
  }
  EXPECT_EQ(cache_->BlockTable(kids[0])[3], cache_->BlockTable(twin)[3]);  // full, deduplicated
  ExpectIndexIntact();
}

TEST_F(KvCachePatternTest, TruncateThenRewriteInsideASharedBlock) {
  SequenceId parent = AdmitAndCompute({1, 2, 3, 4, 5, 6, 7, 8}, nullptr);
  SequenceId kid = testing::ForkCopies(*cache_, parent, 1)[0];
  cache_->Truncate(kid, 5);
  cache_->AppendTokens(kid, {60, 61, 62});
  Compute(kid);
  ExpectIntact(kid);
  ExpectIntact(parent);
  cache_->Truncate(parent, 2);
  cache_->AppendTokens(parent, {70, 71, 72, 73, 74});
  Compute(parent);
  ExpectIntact(parent);
  ExpectIntact(kid);
  ExpectIndexIntact();
}

}  // namespace
}  // namespace prefixd
