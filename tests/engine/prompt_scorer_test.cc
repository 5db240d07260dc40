// The PromptScorer on a tiny fake logits matrix (vocab 4, blocks of 2 tokens): which row
// scores which position, which blocks it records and when, what it takes from records (in
// the pool or loaded from a tier), and the finished scores, all compared exactly.
//
// Each fake row has one "hot" id at logit 100 and 0 elsewhere, so its log-softmax is exact:
// 0 for the hot id and -100 for every other (exp(-100) is lost next to 1 in the sum).
#include "engine/prompt_scorer.h"

#include <memory>
#include <vector>

#include "cache/sha256.h"
#include "engine/score_store.h"
#include "engine/sequence.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;

constexpr int32_t kVocab = 4;
constexpr int32_t kBlock = 2;

// One row per hot id.
std::vector<float> Rows(std::vector<uint32_t> hot) {
  std::vector<float> rows;
  for (uint32_t h : hot) {
    for (int32_t v = 0; v < kVocab; ++v) rows.push_back(v == static_cast<int32_t>(h) ? 100 : 0);
  }
  return rows;
}

// The entry a row with `hot` gives `token`, its top list cut to `top_n`: the hot id first,
// then the others by lower id.
PromptToken Scored(uint32_t token, uint32_t hot, uint32_t top_n = kScoreTopK) {
  PromptToken t{.token_id = token, .has_logprob = true, .logprob = token == hot ? 0.0f : -100.0f};
  t.top.push_back({hot, 0.0f});
  for (uint32_t v = 0; v < kVocab; ++v) {
    if (v != hot) t.top.push_back({v, -100.0f});
  }
  if (t.top.size() > top_n) t.top.resize(top_n);
  return t;
}

PromptToken Unscored(uint32_t token) { return {.token_id = token}; }

class PromptScorerTest : public ::testing::Test {
 protected:
  ScoreStore store_;
  PromptScorer scorer_{{.scores = &store_, .block_size = kBlock, .vocab_size = kVocab}};
  // The prompt {1, 2, 3, 0, 2}: two full blocks, keyed by the fake keys below.
  const std::vector<uint32_t> prompt_ = {1, 2, 3, 0, 2};
  const std::vector<Digest> keys_ = {Sha256Of("block 0"), Sha256Of("block 1")};
  RequestState a_, b_;  // only their addresses are used
};

TEST_F(PromptScorerTest, RowQScoresPositionQPlusOneAndFullBlocksAreRecorded) {
  scorer_.Begin(&a_, prompt_);
  EXPECT_TRUE(scorer_.Scoring(&a_));
  EXPECT_FALSE(scorer_.Scoring(&b_));
  // Rows 0..2 score positions 1..3; block 0 (positions 0, 1) is full and scored.
  std::vector<float> rows = Rows({2, 1, 0});
  scorer_.ScoreRows(&a_, keys_, /*start=*/0, /*count=*/3, rows);
  EXPECT_EQ(store_.size(), 1u);
  ASSERT_NE(store_.Find(keys_[0]), nullptr);
  EXPECT_THAT(store_.Find(keys_[0])->positions, ElementsAre(Unscored(1), Scored(2, 2)));
  EXPECT_EQ(store_.Find(keys_[1]), nullptr);
  // Rows 3, 4: row 3 scores the last position, row 4 has no position after it. Block 1
  // (positions 2, 3) is full now.
  rows = Rows({2, 3});
  scorer_.ScoreRows(&a_, keys_, /*start=*/3, /*count=*/2, rows);
  EXPECT_EQ(store_.size(), 2u);
  ASSERT_NE(store_.Find(keys_[1]), nullptr);
  EXPECT_THAT(store_.Find(keys_[1])->positions, ElementsAre(Scored(3, 1), Scored(0, 0)));

  const PromptScorer::Scores scores = scorer_.Finish(&a_, /*top_n=*/2);
  EXPECT_THAT(scores.positions, ElementsAre(Unscored(1), Scored(2, 2, 2), Scored(3, 1, 2),
                                            Scored(0, 0, 2), Scored(2, 2, 2)));
  EXPECT_EQ(scores.cached, 0u);
  EXPECT_FALSE(scorer_.Scoring(&a_));
}

TEST_F(PromptScorerTest, AnAdmissionTakesEntriesFromTheRecordsOfItsCachedBlocks) {
  scorer_.Begin(&a_, prompt_);
  std::vector<float> rows = Rows({2, 1, 0, 2, 3});
  scorer_.ScoreRows(&a_, keys_, 0, 5, rows);
  const PromptScorer::Scores cold = scorer_.Finish(&a_, kScoreTopK);

  scorer_.Begin(&b_, prompt_);
  EXPECT_EQ(scorer_.RecordedPrefixBlocks(keys_), 2);
  EXPECT_EQ(scorer_.RecordedPrefixBlocks(absl::MakeConstSpan(keys_).first(1)), 1);
  // Two recorded blocks less the last row, which is recomputed: entries 1..3 from records.
  scorer_.TakeRecorded(&b_, keys_, /*num_cached=*/3);
  // Row 3's logits differ from the cold run's: only position 4 takes them.
  rows = Rows({1, 0});
  scorer_.ScoreRows(&b_, keys_, /*start=*/3, /*count=*/2, rows);
  const PromptScorer::Scores warm = scorer_.Finish(&b_, kScoreTopK);
  EXPECT_EQ(warm.cached, 3u);
  EXPECT_THAT(warm.positions, ElementsAre(cold.positions[0], cold.positions[1], cold.positions[2],
                                          cold.positions[3], Scored(2, 1)));
}

TEST_F(PromptScorerTest, WithoutAStoreNothingIsRecordedOrTaken) {
  PromptScorer bare({.scores = nullptr, .block_size = kBlock, .vocab_size = kVocab});
  store_.Insert(keys_[0], std::make_shared<BlockScores>());
  EXPECT_EQ(bare.RecordedPrefixBlocks(keys_), 0);
  bare.Begin(&a_, prompt_);
  std::vector<float> rows = Rows({2, 1, 0, 2, 3});
  bare.ScoreRows(&a_, keys_, 0, 5, rows);
  EXPECT_EQ(store_.size(), 1u);
  EXPECT_EQ(bare.Finish(&a_, 1).positions[4], Scored(2, 2, 1));
}

TEST_F(PromptScorerTest, LoadedRecordsReturnToTheStoreOnlyForFullBlocks) {
  auto r0 = std::make_shared<BlockScores>(BlockScores{{Unscored(1), Scored(2, 3)}});
  auto r1 = std::make_shared<BlockScores>(BlockScores{{Scored(3, 3), Scored(0, 3)}});
  const std::vector<std::shared_ptr<const BlockScores>> records = {r0, r1};
  // A request that does not score: 3 rows computed, so block 1 is not full (not indexed).
  scorer_.RestoreLoaded(nullptr, keys_, /*first_block=*/0, records, /*cached=*/3);
  EXPECT_EQ(store_.size(), 1u);
  EXPECT_EQ(store_.Find(keys_[0]), r0.get());
  // A block loaded without a record stays out of the store.
  store_.Forget(keys_[0]);
  const std::vector<std::shared_ptr<const BlockScores>> partial = {nullptr, r1};
  scorer_.RestoreLoaded(nullptr, keys_, 0, partial, /*cached=*/4);
  EXPECT_EQ(store_.Find(keys_[0]), nullptr);
  EXPECT_EQ(store_.Find(keys_[1]), r1.get());
}

TEST_F(PromptScorerTest, AScoringRequestTakesEveryLoadedPositionAndRecordsTheRest) {
  auto r0 = std::make_shared<BlockScores>(BlockScores{{Unscored(1), Scored(2, 3)}});
  auto r1 = std::make_shared<BlockScores>(BlockScores{{Scored(3, 3), Scored(0, 3)}});
  const std::vector<std::shared_ptr<const BlockScores>> records = {r0, r1};
  scorer_.Begin(&a_, prompt_);
  // The last loaded row is recomputed (cached = 3): block 1 is indexed only after it, so its
  // record enters the store with the rows' step.
  scorer_.RestoreLoaded(&a_, keys_, 0, records, /*cached=*/3);
  EXPECT_EQ(store_.size(), 1u);
  std::vector<float> rows = Rows({2, 1});
  scorer_.ScoreRows(&a_, keys_, /*start=*/3, /*count=*/2, rows);
  ASSERT_NE(store_.Find(keys_[1]), nullptr);
  EXPECT_THAT(store_.Find(keys_[1])->positions, ElementsAre(Scored(3, 3), Scored(0, 3)));
  const PromptScorer::Scores scores = scorer_.Finish(&a_, kScoreTopK);
  EXPECT_EQ(scores.cached, 3u);
  EXPECT_THAT(scores.positions,
              ElementsAre(Unscored(1), Scored(2, 3), Scored(3, 3), Scored(0, 3), Scored(2, 2)));
}

TEST_F(PromptScorerTest, ForgetDropsAPromptThatWasNotFinished) {
  scorer_.Begin(&a_, prompt_);
  scorer_.Forget(&a_);
  EXPECT_FALSE(scorer_.Scoring(&a_));
  scorer_.Begin(&a_, prompt_);  // the same handle may score again
  EXPECT_TRUE(scorer_.Scoring(&a_));
}

}  // namespace
}  // namespace prefixd
