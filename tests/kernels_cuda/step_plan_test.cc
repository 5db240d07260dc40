// PlanPasses: how a Forward() is cut into passes that fit the CUDA backend's buffers. Pure
// host code, so these run everywhere (no device needed).
#include "kernels/cuda/step_plan.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace prefixd::cuda {
namespace {

using Passes = std::vector<std::vector<StepPiece>>;

SequenceStep Step(const std::vector<uint32_t>& tokens, bool want_logits) {
  SequenceStep s;
  s.token_ids = tokens;
  s.want_logits = want_logits;
  return s;
}

TEST(StepPlanTest, EverythingFitsInOnePass) {
  const std::vector<uint32_t> a(5), b(1), c(3);
  const std::vector<SequenceStep> steps = {Step(a, true), Step(b, false), Step(c, true)};
  EXPECT_EQ(PlanPasses(steps, 16, 4),
            (Passes{{{0, 0, 5, true}, {1, 0, 1, false}, {2, 0, 3, true}}}));
}

TEST(StepPlanTest, LongPrefillIsSplitAndOnlyItsLastPieceWantsLogits) {
  const std::vector<uint32_t> a(10), b(2);
  const std::vector<SequenceStep> steps = {Step(a, true), Step(b, true)};
  EXPECT_EQ(PlanPasses(steps, 4, 4),
            (Passes{{{0, 0, 4, false}}, {{0, 4, 4, false}}, {{0, 8, 2, true}, {1, 0, 2, true}}}));
}

TEST(StepPlanTest, LogitRowCapStartsANewPass) {
  const std::vector<uint32_t> one(1);
  const std::vector<SequenceStep> steps = {Step(one, true), Step(one, false), Step(one, true),
                                           Step(one, true)};
  EXPECT_EQ(PlanPasses(steps, 100, 2),
            (Passes{{{0, 0, 1, true}, {1, 0, 1, false}, {2, 0, 1, true}}, {{3, 0, 1, true}}}));
}

TEST(StepPlanTest, StepsWithoutTokensGetNoPiece) {
  const std::vector<uint32_t> none, one(1);
  const std::vector<SequenceStep> steps = {Step(none, false), Step(one, true)};
  EXPECT_EQ(PlanPasses(steps, 4, 4), (Passes{{{1, 0, 1, true}}}));
  EXPECT_TRUE(PlanPasses({}, 4, 4).empty());
}

// Prompt logprobs: every token of a want_all_logits step is a logit row, so the row cap cuts
// the step (3 + 2) and the next step's one row shares the second pass.
TEST(StepPlanTest, AllLogitsStepsHaveARowPerTokenWithinTheRowCap) {
  const std::vector<uint32_t> a(5), b(3);
  SequenceStep all = Step(a, false);
  all.want_all_logits = true;
  const std::vector<SequenceStep> steps = {all, Step(b, true)};
  EXPECT_EQ(PlanPasses(steps, 100, 3),
            (Passes{{{0, 0, 3, false, true}}, {{0, 3, 2, false, true}, {1, 0, 3, true}}}));
  // The token cap cuts it too, as any prefill.
  EXPECT_EQ(PlanPasses({all}, 2, 8),
            (Passes{{{0, 0, 2, false, true}}, {{0, 2, 2, false, true}}, {{0, 4, 1, false, true}}}));
}

TEST(StepPlanTest, PiecesCoverEveryTokenOnceWithinCaps) {
  std::vector<std::vector<uint32_t>> tokens;
  std::vector<SequenceStep> steps;
  for (int n : {1, 17, 3, 64, 1, 1, 40}) tokens.emplace_back(n);
  for (size_t i = 0; i < tokens.size(); ++i) steps.push_back(Step(tokens[i], i % 2 == 0));
  steps[3].want_all_logits = true;  // 64 rows, whatever the caps
  steps[3].want_logits = false;
  for (int token_cap : {1, 5, 16, 200}) {
    for (int row_cap : {1, 2, 8}) {
      std::vector<int> covered(steps.size(), 0);
      int logits = 0;
      for (const auto& pass : PlanPasses(steps, token_cap, row_cap)) {
        int t = 0, r = 0;
        std::vector<bool> seen(steps.size(), false);
        for (const StepPiece& p : pass) {
          EXPECT_FALSE(seen[p.step]) << "one piece per step per pass";
          seen[p.step] = true;
          EXPECT_EQ(p.begin, covered[p.step]) << "pieces in position order";
          covered[p.step] += p.length;
          EXPECT_EQ(p.logits, steps[p.step].want_logits &&
                                  covered[p.step] == static_cast<int>(tokens[p.step].size()));
          EXPECT_EQ(p.all_logits, steps[p.step].want_all_logits);
          t += p.length;
          r += p.all_logits ? p.length : p.logits;
          logits += p.all_logits ? p.length : p.logits;
        }
        EXPECT_LE(t, token_cap);
        EXPECT_LE(r, row_cap);
      }
      for (size_t i = 0; i < steps.size(); ++i) {
        EXPECT_EQ(covered[i], static_cast<int>(tokens[i].size()));
      }
      EXPECT_EQ(logits, 4 + 64);
    }
  }
}

}  // namespace
}  // namespace prefixd::cuda
