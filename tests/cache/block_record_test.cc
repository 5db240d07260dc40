// The block file format (cache/block_record.h): every byte is covered by the checksum,
// every truncation is refused, and every header field is checked on its own even when the
// checksum is recomputed over the damage.
#include "cache/block_record.h"

#include <bit>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "cache/block_key.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/tier_test_util.h"

namespace prefixd {
namespace {

using testing::ExpectationOf;
using testing::MakeChain;
using testing::MakeRecord;
using testing::ScoredLayout;
using testing::SmallLayout;
using testing::TestRoot;
using testing::WithScores;

// Section boundaries of a SmallLayout file.
constexpr size_t kHeader = kBlockRecordHeaderBytes;
constexpr size_t kTokensEnd = kHeader + 4 * 4;
constexpr size_t kDataEnd = kTokensEnd + 256;
constexpr size_t kFileEnd = kDataEnd + 32;

// Recomputes the checksum after a deliberate edit, so the field checks are reached.
void Reseal(std::string* file) {
  const Digest sum = Sha256Of(std::string_view(*file).substr(0, file->size() - 32));
  std::memcpy(file->data() + file->size() - 32, sum.data(), 32);
}

TEST(BlockRecordTest, RoundTripReturnsTheData) {
  const BlockLayout layout = SmallLayout();
  const BlockRecord r = MakeChain(layout, 1, 2)[1];
  const std::string file = EncodeBlockRecord(layout, r);
  ASSERT_EQ(file.size(), kFileEnd);
  EXPECT_EQ(layout.record_bytes(), static_cast<int64_t>(kFileEnd));
  auto data = DecodeBlockRecord(file, layout, ExpectationOf(r));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(std::vector<uint8_t>(data->begin(), data->end()), r.data);
}

TEST(BlockRecordTest, EveryFlippedByteIsRejected) {
  const BlockLayout layout = SmallLayout();
  const BlockRecord r = MakeRecord(layout, TestRoot(), 1, 0);
  const std::string good = EncodeBlockRecord(layout, r);
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    auto data = DecodeBlockRecord(bad, layout, ExpectationOf(r));
    EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
  }
}

TEST(BlockRecordTest, EveryTruncationAndAnExtraByteAreRejected) {
  const BlockLayout layout = SmallLayout();
  const BlockRecord r = MakeRecord(layout, TestRoot(), 1, 0);
  const std::string good = EncodeBlockRecord(layout, r);
  // Every length, so every section (header, tokens, data, checksum) is cut at its start,
  // inside and at its end.
  for (size_t n = 0; n < good.size(); ++n) {
    auto data = DecodeBlockRecord(good.substr(0, n), layout, ExpectationOf(r));
    EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss) << "length " << n;
  }
  for (size_t n : {size_t{0}, kHeader - 1, kHeader, kTokensEnd, kDataEnd, kFileEnd - 1}) {
    auto data = DecodeBlockRecord(good.substr(0, n), layout, ExpectationOf(r));
    EXPECT_TRUE(absl::StrContains(data.status().message(), "size")) << n << data.status();
  }
  auto longer = DecodeBlockRecord(good + "x", layout, ExpectationOf(r));
  EXPECT_TRUE(absl::StrContains(longer.status().message(), "size")) << longer.status();
}

// Each header field changed, checksum recomputed: the field's own check refuses it.
TEST(BlockRecordTest, EveryHeaderFieldIsCheckedEvenWithAValidChecksum) {
  const BlockLayout layout = SmallLayout();
  const BlockRecord r = MakeChain(layout, 1, 2)[1];
  const std::string good = EncodeBlockRecord(layout, r);
  struct Field {
    size_t offset;
    std::string expected_message;
  };
  const Field fields[] = {
      {0, "magic"},
      {8, "format version"},
      {12, "header size"},
      {16, "layout"},
      {47, "layout"},
      {48, "layout"},  // manifest, dtype
      {52, "layout"},
      {56, "layout"},
      {60, "layout"},  // elem, block, layers
      {64, "layout"},
      {68, "layout"},
      {72, "data size"},
      {80, "root key"},
      {111, "root key"},
      {112, "tokens do not hash"},  // parent
      {144, "chain key"},
      {175, "chain key"},
      {176, "layout"},
      {207, "layout"},  // numerics
      {kHeader, "tokens do not hash"},
      {kTokensEnd - 1, "tokens do not hash"},
  };
  for (const Field& f : fields) {
    std::string bad = good;
    bad[f.offset] = static_cast<char>(bad[f.offset] ^ 0x04);
    Reseal(&bad);
    auto data = DecodeBlockRecord(bad, layout, ExpectationOf(r));
    EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss) << "offset " << f.offset;
    EXPECT_TRUE(absl::StrContains(data.status().message(), f.expected_message))
        << "offset " << f.offset << ": " << data.status();
  }
}

TEST(BlockRecordTest, TheReaderExpectationMustMatch) {
  const BlockLayout layout = SmallLayout();
  const std::vector<BlockRecord> chain = MakeChain(layout, 1, 2);
  const std::string file = EncodeBlockRecord(layout, chain[1]);
  // Looked up under another key (a renamed file).
  BlockExpectation e = ExpectationOf(chain[1]);
  e.key = chain[0].key;
  EXPECT_TRUE(
      absl::StrContains(DecodeBlockRecord(file, layout, e).status().message(), "chain key"));
  // Another tenant's root.
  e = ExpectationOf(chain[1]);
  e.root = CacheRootKey("manifest-1", CacheNamespace("other", ""));
  EXPECT_TRUE(absl::StrContains(DecodeBlockRecord(file, layout, e).status().message(), "root"));
  // The prompt's tokens differ though the key matched (what a SHA-256 collision would be).
  std::vector<uint32_t> tokens = chain[1].tokens;
  tokens[3] += 1;
  e = ExpectationOf(chain[1]);
  e.tokens = tokens;
  EXPECT_TRUE(absl::StrContains(DecodeBlockRecord(file, layout, e).status().message(), "prompt"));
  // Another model, dtype, block size, geometry or numerics: the layout check.
  for (int field = 0; field < 8; ++field) {
    BlockLayout other = layout;
    switch (field) {
      case 0:
        other.manifest_key = Sha256Of("manifest-2");
        break;
      case 1:
        other.dtype = 2;
        break;
      case 2:
        other.element_bytes = 2;
        other.head_dim = 8;
        break;
      case 3:
        other.block_size = 8;
        other.head_dim = 2;
        break;
      case 4:
        other.n_layer = 2;
        other.head_dim = 2;
        break;
      case 5:
        other.n_head = 1;
        other.head_dim = 8;
        break;
      case 6:
        other.head_dim = 8;
        other.n_head = 1;
        other.dtype = 1;
        break;
      case 7:  // the same bytes, computed by another backend
        other.numerics_key = Sha256Of("numerics-2");
        break;
    }
    EXPECT_NE(other.Id(), layout.Id()) << field;
    auto data = DecodeBlockRecord(file, other, ExpectationOf(chain[1]));
    EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss) << field;
  }
}

TEST(BlockRecordTest, LayoutIdIsStableAndValidationRefusesEmptyGeometry) {
  EXPECT_EQ(SmallLayout().Id(), SmallLayout().Id());
  EXPECT_EQ(SmallLayout().Id().size(), 16u);
  EXPECT_NE(SmallLayout("a").Id(), SmallLayout("b").Id());
  EXPECT_TRUE(ValidateBlockLayout(SmallLayout()).ok());
  BlockLayout bad = SmallLayout();
  bad.n_head = 0;
  EXPECT_EQ(ValidateBlockLayout(bad).code(), absl::StatusCode::kInvalidArgument);
}

// The score section: every bit comes back, first block or not, and a record without one
// decodes as "no scores" under the same layout.
TEST(BlockRecordTest, ScoreSectionRoundTripsBitForBit) {
  const BlockLayout layout = ScoredLayout();
  EXPECT_EQ(layout.score_bytes(), 4 * (12 + 8 * 3));
  for (const BlockRecord& plain : MakeChain(layout, 1, 2)) {
    const BlockRecord r = WithScores(plain, layout);
    const std::string file = EncodeBlockRecord(layout, r);
    ASSERT_EQ(static_cast<int64_t>(file.size()), layout.scored_record_bytes());
    std::vector<PositionScore> scores = {PositionScore{}};
    auto data = DecodeBlockRecord(file, layout, ExpectationOf(r), &scores);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(std::vector<uint8_t>(data->begin(), data->end()), r.data);
    ASSERT_EQ(scores.size(), r.scores.size());
    for (size_t j = 0; j < scores.size(); ++j) {
      EXPECT_EQ(scores[j].has_logprob, r.scores[j].has_logprob) << j;
      EXPECT_EQ(std::bit_cast<uint32_t>(scores[j].logprob),
                std::bit_cast<uint32_t>(r.scores[j].logprob))
          << j;
      EXPECT_EQ(scores[j].top, r.scores[j].top) << j;
    }
    EXPECT_EQ(scores[0].has_logprob, plain.parent_key != plain.root);

    const std::string without = EncodeBlockRecord(layout, plain);
    ASSERT_EQ(static_cast<int64_t>(without.size()), layout.record_bytes());
    auto bare = DecodeBlockRecord(without, layout, ExpectationOf(plain), &scores);
    ASSERT_TRUE(bare.ok()) << bare.status();
    EXPECT_TRUE(scores.empty());
  }
}

TEST(BlockRecordTest, EveryFlippedScoreByteIsRejected) {
  const BlockLayout layout = ScoredLayout();
  const BlockRecord r = WithScores(MakeChain(layout, 1, 2)[1], layout);
  const std::string good = EncodeBlockRecord(layout, r);
  const size_t scores_at = kDataEnd;
  for (size_t i = scores_at; i < scores_at + static_cast<size_t>(layout.score_bytes()); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    std::vector<PositionScore> scores;
    auto data = DecodeBlockRecord(bad, layout, ExpectationOf(r), &scores);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
    EXPECT_TRUE(absl::StrContains(data.status().message(), "checksum")) << data.status();
  }
}

// Damage that keeps a valid checksum (a writer's bug, or a forged record) still fails the
// record, naming the score section; so does a header whose section size is not the block's.
TEST(BlockRecordTest, BrokenScoreRulesAreRejectedEvenWithAValidChecksum) {
  const BlockLayout layout = ScoredLayout();
  const BlockRecord first = WithScores(MakeChain(layout, 1, 2)[0], layout);
  const BlockRecord second = WithScores(MakeChain(layout, 1, 2)[1], layout);
  const size_t position = 12 + 8 * 3;
  auto put_u32 = [](std::string* f, size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) (*f)[at + i] = static_cast<char>(v >> (8 * i));
  };
  struct Case {
    const char* name;
    const BlockRecord* record;
    size_t at;
    uint32_t value;
    const char* message;
  };
  const Case cases[] = {
      {"flags", &second, kDataEnd + position, 3, "flags"},
      {"top count above K", &second, kDataEnd + 2 * position + 8, 4, "top entries"},
      {"a slot past the count", &second, kDataEnd + 12 + 8 * 2, 5, "past its entries"},
      {"first position of a first block with a logprob", &first, kDataEnd, 1, "has a logprob"},
      {"a later position without one", &second, kDataEnd + position, 0, "lacks a logprob"},
      {"not descending", &second, kDataEnd + 3 * position + 12 + 8 + 4,
       std::bit_cast<uint32_t>(5.0f), "descending"},
      {"section size", &second, 212, 3, "score section of 3 positions"},
  };
  for (const Case& c : cases) {
    std::string bad = EncodeBlockRecord(layout, *c.record);
    put_u32(&bad, c.at, c.value);
    Reseal(&bad);
    auto data = DecodeBlockRecord(bad, layout, ExpectationOf(*c.record));
    EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss) << c.name;
    EXPECT_TRUE(absl::StrContains(data.status().message(), c.message))
        << c.name << ": " << data.status();
  }
}

// Format version 2 (no score section) is foreign: refused by version, and the layout id that
// names files differs with the version and with score_top_k.
TEST(BlockRecordTest, VersionTwoRecordsAreForeign) {
  const BlockLayout layout = ScoredLayout();
  const BlockRecord r = MakeChain(layout, 1, 1)[0];
  std::string old = EncodeBlockRecord(layout, r);
  old[8] = 2;
  Reseal(&old);
  auto data = DecodeBlockRecord(old, layout, ExpectationOf(r));
  EXPECT_TRUE(absl::StrContains(data.status().message(), "format version 2")) << data.status();
  EXPECT_NE(ScoredLayout(3).Id(), ScoredLayout(4).Id());
  EXPECT_NE(ScoredLayout(3).Id(), SmallLayout().Id());
  EXPECT_FALSE(ValidateBlockLayout(ScoredLayout(kMaxScoreTopK + 1)).ok());
  EXPECT_TRUE(ValidateBlockLayout(ScoredLayout(kMaxScoreTopK)).ok());
}

// The record's bytes are the format's, not this code's: files and Redis values written before
// the record moved out of the disk tier (cache/disk/block_file.h) read the same. The digests
// and the layout id were computed with that code.
TEST(BlockRecordTest, BytesArePinned) {
  const BlockLayout plain_layout = SmallLayout();
  const std::string plain = EncodeBlockRecord(plain_layout, MakeChain(plain_layout, 1, 2)[1]);
  EXPECT_EQ(plain.size(), 520u);
  EXPECT_EQ(DigestHex(Sha256Of(plain)),
            "3af3bb29fa4f45a220ebfb3f7f033c361a347b04e0d184783bc03d1aaabeead5");
  const BlockLayout scored_layout = ScoredLayout();
  const std::string scored = EncodeBlockRecord(
      scored_layout, WithScores(MakeChain(scored_layout, 1, 2)[1], scored_layout));
  EXPECT_EQ(scored.size(), 664u);
  EXPECT_EQ(DigestHex(Sha256Of(scored)),
            "992775b16ecc9284e06eb83b7cf5050f7e7cb67c0d9ed7b2832c7cf980641af1");
  EXPECT_EQ(plain_layout.Id(), "00c50c973bdf1c0f");
}

// A record's head (DecodeBlockRecordHead): the identity from the first bytes alone, with the
// checks those bytes allow; damage past them is the full decoder's to find.
TEST(BlockRecordTest, TheHeadDecodesFromTheFirstBytesWithTheChecksTheyAllow) {
  const BlockLayout layout = ScoredLayout();
  const std::vector<BlockRecord> chain = MakeChain(layout, 1, 2);
  const std::string file = EncodeBlockRecord(layout, chain[1]);
  ASSERT_EQ(BlockRecordHeadBytes(layout), static_cast<int64_t>(kHeader + 4 * 4));
  const std::string head_bytes = file.substr(0, kHeader + 4 * 4);
  auto head = DecodeBlockRecordHead(head_bytes, layout);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(*head, (BlockRecordHead{.root = TestRoot(),
                                    .parent_key = chain[0].key,
                                    .key = chain[1].key,
                                    .tokens = chain[1].tokens,
                                    .scored = false}));
  const std::string scored = EncodeBlockRecord(layout, WithScores(chain[0], layout));
  auto scored_head = DecodeBlockRecordHead(scored, layout);  // the whole record: the rest ignored
  ASSERT_TRUE(scored_head.ok()) << scored_head.status();
  EXPECT_TRUE(scored_head->scored);
  EXPECT_EQ(scored_head->parent_key, TestRoot());

  // Damage in the data section: the head still decodes (only the checksum would tell).
  std::string damaged = file;
  damaged[kTokensEnd + 3] = static_cast<char>(damaged[kTokensEnd + 3] ^ 1);
  EXPECT_TRUE(DecodeBlockRecordHead(damaged, layout).ok());
  // A token changed: it no longer hashes to the chain key.
  std::string token = head_bytes;
  token[kHeader] = static_cast<char>(token[kHeader] ^ 1);
  EXPECT_EQ(DecodeBlockRecordHead(token, layout).status().message(),
            "disk tier block rejected: tokens do not hash to the key");
  // Cut inside the header or the tokens.
  for (size_t n : {size_t{0}, kHeader - 1, kHeader, kHeader + 4 * 4 - 1}) {
    EXPECT_EQ(DecodeBlockRecordHead(head_bytes.substr(0, n), layout).status().code(),
              absl::StatusCode::kDataLoss)
        << n;
  }
  // Another layout's record.
  EXPECT_THAT(
      std::string(DecodeBlockRecordHead(head_bytes, SmallLayout("manifest-2")).status().message()),
      ::testing::HasSubstr("layout"));
}

TEST(BlockRecordTest, ParentsComeBeforeTheirChildrenAndTiesKeepTheirOrder) {
  const BlockLayout layout = SmallLayout();
  const std::vector<BlockRecord> a = MakeChain(layout, 1, 3);
  const std::vector<BlockRecord> b = MakeChain(layout, 2, 2);
  auto head = [](const BlockRecord& r) {
    return BlockRecordHead{
        .root = r.root, .parent_key = r.parent_key, .key = r.key, .tokens = r.tokens};
  };
  // b[1]'s parent is not in the set: it counts as a first block.
  std::vector<BlockRecordHead> heads = {head(a[2]), head(b[1]), head(a[1]), head(a[0])};
  OrderParentsFirst(&heads);
  std::vector<Digest> keys;
  for (const BlockRecordHead& h : heads) keys.push_back(h.key);
  EXPECT_THAT(keys, ::testing::ElementsAre(b[1].key, a[0].key, a[1].key, a[2].key));
  std::vector<BlockRecordHead> none;
  OrderParentsFirst(&none);
  EXPECT_TRUE(none.empty());
}

}  // namespace
}  // namespace prefixd
