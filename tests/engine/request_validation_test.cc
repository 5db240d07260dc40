// The one set of request rules (engine/request_validation.h): each refusal and its message.
#include "engine/request_validation.h"

#include <cmath>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "engine/lora_adapter.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

RequestLimits Limits() {
  RequestLimits l;
  l.model_config.vocab_size = 100;
  l.model_config.n_positions = 64;
  l.max_samples = 4;
  l.pool = {.num_blocks = 3, .block_size = 16};  // 48 tokens: smaller than the context on purpose
  return l;
}

EngineRequest Valid() {
  EngineRequest r;
  r.prompt = {1, 2};
  r.max_new_tokens = 8;
  return r;
}

absl::Status Check(const EngineRequest& r) { return ValidateEngineRequest(r, Limits()); }

void ExpectInvalid(const absl::Status& s, const std::string& what) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(what));
}

TEST(RequestValidationTest, AcceptsAValidRequest) { EXPECT_TRUE(Check(Valid()).ok()); }

// An adapter changing c_attn of a 1-layer, 4-wide model.
std::shared_ptr<const LoraAdapter> Adapter(int64_t width) {
  auto a = std::make_shared<LoraAdapter>();
  a->dir = "/adapters/x";
  a->rank = 1;
  a->target_modules = {"c_attn"};
  a->layers.resize(1);
  LoraModule& m = a->layers[0][static_cast<int>(LoraTarget::kAttnCAttn)];
  m.in = width;
  m.out = 3 * width;
  m.a_t.assign(width, 0.0f);
  m.b_t.assign(3 * width, 0.0f);
  return a;
}

TEST(RequestValidationTest, AdapterMustFitTheModelAndTheBackend) {
  RequestLimits l = Limits();
  l.model_config.n_layer = 1;
  l.model_config.n_embd = 4;
  EngineRequest r = Valid();
  r.adapter = Adapter(4);
  EXPECT_TRUE(ValidateEngineRequest(r, l).ok());
  r.adapter = Adapter(8);
  const absl::Status other = ValidateEngineRequest(r, l);
  ExpectInvalid(other, "another model");
  EXPECT_EQ(InvalidField(other), "adapter");
  r.adapter = Adapter(4);
  l.applies_lora = false;
  const absl::Status s = ValidateEngineRequest(r, l);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot apply LoRA adapters"));
  r.adapter = nullptr;
  EXPECT_TRUE(ValidateEngineRequest(r, l).ok());
}

TEST(RequestValidationTest, RequestIdIsShortPrintableAscii) {
  EngineRequest r = Valid();
  r.request_id = std::string(256, 'a');
  EXPECT_TRUE(Check(r).ok());
  r.request_id = std::string(257, 'a');
  ExpectInvalid(Check(r), "request_id is 257 bytes: use at most 256");
  r.request_id = " ~printable all the way";
  EXPECT_TRUE(Check(r).ok());
  for (char c : {'\n', '\x7f', '\x00', '\xff'}) {
    r.request_id = std::string("ab") + c;
    ExpectInvalid(Check(r), "request_id has byte 0x");
    ExpectInvalid(Check(r), "at offset 2: use printable ASCII only");
  }
}

TEST(RequestValidationTest, AtMost1024StopTokenIds) {
  EngineRequest r = Valid();
  r.stop_token_ids.assign(1024, 7);
  EXPECT_TRUE(Check(r).ok());
  r.stop_token_ids.push_back(7);
  ExpectInvalid(Check(r), "1025 stop_token_ids is too many: give at most 1024");
}

TEST(RequestValidationTest, EmptyPrompt) {
  EngineRequest r = Valid();
  r.prompt.clear();
  ExpectInvalid(Check(r), "empty prompt");
}

TEST(RequestValidationTest, TokenIdAtVocabSize) {
  EngineRequest r = Valid();
  r.prompt.push_back(100);
  ExpectInvalid(Check(r), "prompt token id 100 at position 2 is out of range: ids must be < "
                          "vocab_size 100");
  r.prompt[2] = 99;
  EXPECT_TRUE(Check(r).ok());
}

TEST(RequestValidationTest, BeyondContextLength) {
  EngineRequest r = Valid();
  r.max_new_tokens = 63;  // 2 + 63 = 65 > 64
  ExpectInvalid(Check(r), "prompt (2 tokens) + max_new_tokens (63) = 65 exceeds the model's "
                          "context length 64");
}

TEST(RequestValidationTest, MaxNewTokensZero) {
  EngineRequest r = Valid();
  r.max_new_tokens = 0;
  ExpectInvalid(Check(r), "max_new_tokens is 0");
}

TEST(RequestValidationTest, Samples) {
  EngineRequest r = Valid();
  r.num_samples = 5;
  ExpectInvalid(Check(r), "num_samples 5 exceeds this server's limit 4 (--max-samples)");
  r.num_samples = 4;
  EXPECT_TRUE(Check(r).ok());
  r.num_samples = 0;  // the request path turns a client's 0 into 1 before this
  ExpectInvalid(Check(r), "num_samples is 0");
}

TEST(RequestValidationTest, Temperature) {
  EngineRequest r = Valid();
  for (float t : {-0.1f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    r.sampling.temperature = t;
    ExpectInvalid(Check(r), "temperature");
  }
  r.sampling.temperature = 1.5f;
  EXPECT_TRUE(Check(r).ok());
}

TEST(RequestValidationTest, TopP) {
  EngineRequest r = Valid();
  for (float p : {0.0f, -1.0f, 1.0001f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
    r.sampling.top_p = p;
    ExpectInvalid(Check(r), "top_p");
  }
  // Enough digits that a value just above 1 is not printed as "1".
  r.sampling.top_p = 1.0000001f;
  ExpectInvalid(Check(r), "top_p 1.00000012 is invalid");
  r.sampling.top_p = 1.0f;
  EXPECT_TRUE(Check(r).ok());
  r.sampling.top_p = 0.01f;
  EXPECT_TRUE(Check(r).ok());
}

TEST(RequestValidationTest, PresenceAndFrequencyPenaltiesWithinPlusMinusTwo) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float SamplingParams::*field :
       {&SamplingParams::presence_penalty, &SamplingParams::frequency_penalty}) {
    const std::string name =
        field == &SamplingParams::presence_penalty ? "presence_penalty" : "frequency_penalty";
    EngineRequest r = Valid();
    for (float v : {-2.0f, -0.5f, 0.0f, 1.25f, 2.0f}) {
      r.sampling.*field = v;
      EXPECT_TRUE(Check(r).ok()) << name << " " << v;
    }
    for (float v : {-2.0001f, 2.5f, inf, -inf, std::nanf("")}) {
      r.sampling.*field = v;
      const absl::Status s = Check(r);
      ExpectInvalid(s, name + " ");
      ExpectInvalid(s, "use a value in [-2, 2]");
      EXPECT_EQ(InvalidField(s), name);
    }
  }
}

// [0.01, 100]: a penalty of 1e-40 once made repeated tokens' logits +Inf.
TEST(RequestValidationTest, RepetitionPenaltyInARangeThatCannotOverflow) {
  EngineRequest r = Valid();
  for (float v : {0.01f, 1.0f, 1.3f, 10.0f, 100.0f}) {
    r.sampling.repetition_penalty = v;
    EXPECT_TRUE(Check(r).ok()) << v;
  }
  for (float v : {0.0f, -1.0f, 1e-40f, 1e-37f, 0.0099f, 100.01f, 1e30f,
                  std::numeric_limits<float>::infinity(), std::nanf("")}) {
    r.sampling.repetition_penalty = v;
    const absl::Status s = Check(r);
    ExpectInvalid(s, "use a value in [0.01, 100] (1 = off");
    EXPECT_EQ(InvalidField(s), "repetition_penalty");
  }
}

TEST(RequestValidationTest, MinPInTheUnitInterval) {
  EngineRequest r = Valid();
  for (float v : {0.0f, 0.05f, 1.0f}) {
    r.sampling.min_p = v;
    EXPECT_TRUE(Check(r).ok()) << v;
  }
  for (float v : {-0.01f, 1.01f, std::nanf("")}) {
    r.sampling.min_p = v;
    const absl::Status s = Check(r);
    ExpectInvalid(s, "use a value in [0, 1] (0 = off)");
    EXPECT_EQ(InvalidField(s), "min_p");
  }
}

TEST(RequestValidationTest, LogitBiasIdsRangesAndCount) {
  EngineRequest r = Valid();
  r.sampling.logit_bias = {{0, -100.0f}, {99, 100.0f}, {5, 0.5f}};
  EXPECT_TRUE(Check(r).ok());
  r.sampling.logit_bias = {{100, 1.0f}};
  ExpectInvalid(Check(r), "logit_bias token id 100 is out of range: ids must be < vocab_size 100");
  r.sampling.logit_bias = {{3, 100.5f}};
  ExpectInvalid(Check(r), "logit_bias for token 3 is 100.5: use a value in [-100, 100]");
  r.sampling.logit_bias = {{3, -std::numeric_limits<float>::infinity()}};
  ExpectInvalid(Check(r), "use a value in [-100, 100]");
  r.sampling.logit_bias = {{3, std::nanf("")}};
  ExpectInvalid(Check(r), "use a value in [-100, 100]");
  r.sampling.logit_bias = {{3, 1.0f}, {4, 1.0f}, {3, 2.0f}};
  ExpectInvalid(Check(r), "logit_bias gives token 3 twice");
  EXPECT_EQ(InvalidField(Check(r)), "logit_bias");
  RequestLimits big = Limits();
  big.model_config.vocab_size = 1000;
  r.sampling.logit_bias.clear();
  for (uint32_t i = 0; i < 300; ++i) r.sampling.logit_bias.push_back({i, 1.0f});
  EXPECT_TRUE(ValidateEngineRequest(r, big).ok());
  r.sampling.logit_bias.push_back({300, 1.0f});
  ExpectInvalid(ValidateEngineRequest(r, big), "logit_bias has 301 entries: give at most 300");
}

TEST(RequestValidationTest, PromptLogprobsAndEcho) {
  EngineRequest r = Valid();
  r.max_new_tokens = 0;
  ExpectInvalid(Check(r), "0 is allowed only with prompt_logprobs or echo");
  r.echo_prompt = true;
  EXPECT_TRUE(Check(r).ok());
  r.echo_prompt = false;
  r.prompt_logprobs = 20;
  EXPECT_TRUE(Check(r).ok());
  r.prompt_logprobs = 21;
  ExpectInvalid(Check(r), "prompt_logprobs 21 is too large: use 0..20");
  EXPECT_EQ(InvalidField(Check(r)), "prompt_logprobs");
  r.prompt_logprobs = 0;
  RequestLimits no_all_logits = Limits();
  no_all_logits.computes_all_logits = false;
  const absl::Status s = ValidateEngineRequest(r, no_all_logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), HasSubstr("leave prompt_logprobs unset"));
  r.prompt_logprobs.reset();
  r.echo_prompt = true;  // echo alone needs no all-position logits
  EXPECT_TRUE(ValidateEngineRequest(r, no_all_logits).ok());
}

TEST(RequestValidationTest, TopLogprobs) {
  EngineRequest r = Valid();
  r.top_logprobs = 21;
  ExpectInvalid(Check(r), "top_logprobs 21 is too large: use 0..20");
  r.top_logprobs = 20;
  EXPECT_TRUE(Check(r).ok());
}

TEST(RequestValidationTest, StopIds) {
  EngineRequest r = Valid();
  r.stop_token_ids.push_back(5);
  EXPECT_TRUE(Check(r).ok());
  r.stop_token_ids.push_back(100);
  ExpectInvalid(Check(r), "stop token id 100");
}

TEST(RequestValidationTest, MoreBlocksThanThePool) {
  EngineRequest r = Valid();
  r.max_new_tokens = 46;  // 48 tokens = 3 blocks: fits exactly
  EXPECT_TRUE(Check(r).ok());
  r.max_new_tokens = 47;  // 49 tokens = 4 blocks > 3
  absl::Status s = Check(r);
  ExpectInvalid(s, "needs 4 KV blocks");
  EXPECT_THAT(std::string(s.message()), HasSubstr("whole pool holds 3 blocks (48 tokens)"));
}

TEST(RequestValidationTest, BlocksForTokensRoundsUp) {
  EXPECT_EQ(BlocksForTokens(1, 16), 1);
  EXPECT_EQ(BlocksForTokens(16, 16), 1);
  EXPECT_EQ(BlocksForTokens(17, 16), 2);
  EXPECT_EQ(BlocksForTokens(240, 16), 15);
}

}  // namespace
}  // namespace prefixd
