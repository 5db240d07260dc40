#include "server/validation.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

ValidationLimits Limits() {
  ValidationLimits l;
  l.vocab_size = 100;
  l.context_length = 64;
  l.max_samples = 4;
  l.block_size = 16;
  l.pool_blocks = 3;  // 48 tokens: smaller than the context on purpose
  return l;
}

v1::GenerateRequest Valid() {
  v1::GenerateRequest r;
  r.mutable_token_ids()->add_ids(1);
  r.mutable_token_ids()->add_ids(2);
  r.set_max_new_tokens(8);
  return r;
}

std::vector<uint32_t> Ids(const v1::GenerateRequest& r) {
  return {r.token_ids().ids().begin(), r.token_ids().ids().end()};
}

absl::Status Check(const v1::GenerateRequest& r) {
  return ValidateGenerateRequest(r, Ids(r), Limits());
}

void ExpectInvalid(const absl::Status& s, const std::string& what) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(what));
}

TEST(ValidationTest, AcceptsAValidRequest) { EXPECT_TRUE(Check(Valid()).ok()); }

TEST(ValidationTest, NoPrompt) {
  v1::GenerateRequest r = Valid();
  r.clear_prompt();
  ExpectInvalid(ValidateGenerateRequest(r, {}, Limits()), "no prompt");
}

TEST(ValidationTest, EmptyPrompt) {
  v1::GenerateRequest r = Valid();
  r.mutable_token_ids()->clear_ids();
  ExpectInvalid(Check(r), "empty prompt");
  r.set_text("");
  ExpectInvalid(ValidateGenerateRequest(r, {}, Limits()), "`text` must produce");
}

TEST(ValidationTest, TokenIdAtVocabSize) {
  v1::GenerateRequest r = Valid();
  r.mutable_token_ids()->add_ids(100);
  ExpectInvalid(Check(r), "prompt token id 100 at position 2");
  r.mutable_token_ids()->set_ids(2, 99);
  EXPECT_TRUE(Check(r).ok());
}

TEST(ValidationTest, BeyondContextLength) {
  v1::GenerateRequest r = Valid();
  r.set_max_new_tokens(63);  // 2 + 63 = 65 > 64
  ExpectInvalid(Check(r), "exceeds the model's context length 64");
}

TEST(ValidationTest, MaxNewTokensZero) {
  v1::GenerateRequest r = Valid();
  r.set_max_new_tokens(0);
  ExpectInvalid(Check(r), "max_new_tokens is 0");
}

TEST(ValidationTest, TooManySamples) {
  v1::GenerateRequest r = Valid();
  r.set_num_samples(5);
  ExpectInvalid(Check(r), "num_samples 5 exceeds this server's limit 4");
  r.set_num_samples(4);
  EXPECT_TRUE(Check(r).ok());
  r.set_num_samples(0);  // 0 means 1
  EXPECT_TRUE(Check(r).ok());
}

TEST(ValidationTest, Temperature) {
  v1::GenerateRequest r = Valid();
  r.set_temperature(-0.1f);
  ExpectInvalid(Check(r), "temperature");
  r.set_temperature(std::numeric_limits<float>::infinity());
  ExpectInvalid(Check(r), "temperature");
  r.set_temperature(std::nanf(""));
  ExpectInvalid(Check(r), "temperature");
  r.set_temperature(1.5f);
  EXPECT_TRUE(Check(r).ok());
}

TEST(ValidationTest, TopP) {
  v1::GenerateRequest r = Valid();
  for (float p : {0.0f, -1.0f, 1.0001f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
    r.set_top_p(p);
    ExpectInvalid(Check(r), "top_p");
  }
  r.set_top_p(1.0f);
  EXPECT_TRUE(Check(r).ok());
  r.set_top_p(0.01f);
  EXPECT_TRUE(Check(r).ok());
}

TEST(ValidationTest, TopLogprobs) {
  v1::GenerateRequest r = Valid();
  r.set_top_logprobs(21);
  ExpectInvalid(Check(r), "top_logprobs 21");
  r.set_top_logprobs(20);
  EXPECT_TRUE(Check(r).ok());
}

TEST(ValidationTest, StopIds) {
  v1::GenerateRequest r = Valid();
  r.add_stop_token_ids(5);
  EXPECT_TRUE(Check(r).ok());
  r.add_stop_token_ids(100);
  ExpectInvalid(Check(r), "stop token id 100");
}

TEST(ValidationTest, MoreBlocksThanThePool) {
  v1::GenerateRequest r = Valid();
  r.set_max_new_tokens(46);  // 48 tokens = 3 blocks: fits exactly
  EXPECT_TRUE(Check(r).ok());
  r.set_max_new_tokens(47);  // 49 tokens = 4 blocks > 3
  absl::Status s = Check(r);
  ExpectInvalid(s, "needs 4 KV blocks");
  EXPECT_THAT(std::string(s.message()), HasSubstr("pool holds 3 blocks (48 tokens)"));
}

TEST(ValidationTest, BlocksNeededRoundsUp) {
  EXPECT_EQ(BlocksNeeded(1, 0, 16), 1u);
  EXPECT_EQ(BlocksNeeded(16, 0, 16), 1u);
  EXPECT_EQ(BlocksNeeded(16, 1, 16), 2u);
  EXPECT_EQ(BlocksNeeded(200, 40, 16), 15u);
}

}  // namespace
}  // namespace prefixd
