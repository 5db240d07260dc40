// The one set of request rules (engine/request_validation.h): each rule once, with the field
// its refusal carries and its message (written to follow the field's name, which each front
// end puts first: tests/server for their names).
#include "engine/request_validation.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/lora_adapter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

void ExpectInvalid(const absl::Status& s, RequestField field, const std::string& what) {
  ExpectInvalid(s, what);
  EXPECT_EQ(ErrorField(s), field) << s;
}

TEST(RequestValidationTest, ARefusalCarriesItsField) {
  const absl::Status s = FieldError(RequestField::kMinP, "is wrong");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "is wrong");
  EXPECT_EQ(ErrorField(s), RequestField::kMinP);
  EXPECT_EQ(ErrorField(WithField(absl::NotFoundError("x"), RequestField::kAdapter)),
            RequestField::kAdapter);
  EXPECT_TRUE(WithField(absl::OkStatus(), RequestField::kAdapter).ok());
  EXPECT_EQ(ErrorField(absl::InvalidArgumentError("no field")), RequestField::kNone);
  EXPECT_EQ(ErrorField(absl::OkStatus()), RequestField::kNone);
}

// prompt_cache_retention takes OpenAI's two values; anything else names the field.
TEST(RequestValidationTest, CacheRetentionIsInMemoryOr24h) {
  EXPECT_EQ(*ParseCacheRetention(""), absl::ZeroDuration());
  EXPECT_EQ(*ParseCacheRetention("in_memory"), absl::ZeroDuration());
  EXPECT_EQ(*ParseCacheRetention("24h"), absl::Hours(24));
  for (const char* bad : {"1h", "24H", "in-memory", "86400"}) {
    const absl::Status s = ParseCacheRetention(bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(ErrorField(s), RequestField::kCacheRetention) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr("must be \"in_memory\" or \"24h\""));
  }
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
  ExpectInvalid(ValidateEngineRequest(r, l), RequestField::kAdapter,
                "names an adapter that does not fit: ");
  ExpectInvalid(ValidateEngineRequest(r, l), "the adapter was made for another model");
  r.adapter = Adapter(4);
  l.applies_lora = false;
  const absl::Status s = ValidateEngineRequest(r, l);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_EQ(ErrorField(s), RequestField::kAdapter);
  EXPECT_THAT(std::string(s.message()), HasSubstr("backend cannot apply"));
  r.adapter = nullptr;
  EXPECT_TRUE(ValidateEngineRequest(r, l).ok());
}

TEST(RequestValidationTest, RequestIdIsShortPrintableAscii) {
  EngineRequest r = Valid();
  r.request_id = std::string(256, 'a');
  EXPECT_TRUE(Check(r).ok());
  r.request_id = std::string(257, 'a');
  ExpectInvalid(Check(r), RequestField::kRequestId, "is 257 bytes: use at most 256");
  r.request_id = " ~printable all the way";
  EXPECT_TRUE(Check(r).ok());
  for (char c : {'\n', '\x7f', '\x00', '\xff'}) {
    r.request_id = std::string("ab") + c;
    ExpectInvalid(Check(r), RequestField::kRequestId, "has byte 0x");
    ExpectInvalid(Check(r), "at offset 2: use printable ASCII only");
  }
}

TEST(RequestValidationTest, AtMost1024StopTokenIds) {
  EngineRequest r = Valid();
  r.stop_token_ids.assign(1024, 7);
  EXPECT_TRUE(Check(r).ok());
  r.stop_token_ids.push_back(7);
  ExpectInvalid(Check(r), RequestField::kStopTokenIds, "has 1025 ids: give at most 1024");
}

TEST(RequestValidationTest, EmptyPrompt) {
  EngineRequest r = Valid();
  r.prompt.clear();
  ExpectInvalid(Check(r), RequestField::kPrompt, "is an empty prompt");
}

TEST(RequestValidationTest, TokenIdAtVocabSize) {
  EngineRequest r = Valid();
  r.prompt.push_back(100);
  ExpectInvalid(Check(r), RequestField::kPrompt,
                "has token id 100 at position 2, out of range: ids must be < vocab_size 100");
  r.prompt[2] = 99;
  EXPECT_TRUE(Check(r).ok());
}

TEST(RequestValidationTest, BeyondContextLength) {
  EngineRequest r = Valid();
  r.max_new_tokens = 62;  // 2 + 62 = 64: fits the context (but not the pool, below)
  EXPECT_EQ(ErrorField(Check(r)), RequestField::kMaxNewTokens);
  EXPECT_THAT(std::string(Check(r).message()), HasSubstr("KV blocks"));
  r.max_new_tokens = 63;  // 2 + 63 = 65 > 64
  ExpectInvalid(Check(r), RequestField::kMaxNewTokens,
                "63 + the prompt's 2 tokens = 65, more than the model's context length 64: "
                "lower it or shorten the prompt");
  // A prompt alone past the context is the prompt's fault, whatever max_new_tokens is; its
  // count is not given (a text prompt is tokenized only one token past the context).
  r.prompt.assign(65, 1);
  r.max_new_tokens = 1;
  ExpectInvalid(Check(r), RequestField::kPrompt,
                "has more than 64 tokens, the model's context length: shorten it");
}

TEST(RequestValidationTest, MaxNewTokensZero) {
  EngineRequest r = Valid();
  r.max_new_tokens = 0;
  ExpectInvalid(Check(r), RequestField::kMaxNewTokens, "is 0: ask for at least 1 token");
}

TEST(RequestValidationTest, Samples) {
  EngineRequest r = Valid();
  r.num_samples = 5;
  ExpectInvalid(Check(r), RequestField::kNumSamples,
                "5 exceeds this server's limit 4 (--max-samples)");
  r.num_samples = 4;
  EXPECT_TRUE(Check(r).ok());
  // The one rule on 0 (OpenAI's n = 0 reaches it; gRPC's parser reads proto3's 0 as unset).
  r.num_samples = 0;
  ExpectInvalid(Check(r), RequestField::kNumSamples, "is 0: ask for at least 1 sample");
}

TEST(RequestValidationTest, Temperature) {
  EngineRequest r = Valid();
  for (float t : {-0.1f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    r.sampling.temperature = t;
    ExpectInvalid(Check(r), RequestField::kTemperature, "is invalid: use a finite value >= 0");
  }
  r.sampling.temperature = 1.5f;
  EXPECT_TRUE(Check(r).ok());
}

TEST(RequestValidationTest, TopP) {
  EngineRequest r = Valid();
  for (float p : {0.0f, -1.0f, 1.0001f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
    r.sampling.top_p = p;
    ExpectInvalid(Check(r), RequestField::kTopP, "is invalid: use a value in (0, 1]");
  }
  // Enough digits that a value just above 1 is not printed as "1".
  r.sampling.top_p = 1.0000001f;
  ExpectInvalid(Check(r), "1.00000012 is invalid");
  r.sampling.top_p = 1.0f;
  EXPECT_TRUE(Check(r).ok());
  r.sampling.top_p = 0.01f;
  EXPECT_TRUE(Check(r).ok());
}

TEST(RequestValidationTest, PresenceAndFrequencyPenaltiesWithinPlusMinusTwo) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float SamplingParams::*field :
       {&SamplingParams::presence_penalty, &SamplingParams::frequency_penalty}) {
    const RequestField name = field == &SamplingParams::presence_penalty
                                  ? RequestField::kPresencePenalty
                                  : RequestField::kFrequencyPenalty;
    EngineRequest r = Valid();
    for (float v : {-2.0f, -0.5f, 0.0f, 1.25f, 2.0f}) {
      r.sampling.*field = v;
      EXPECT_TRUE(Check(r).ok()) << static_cast<int>(name) << " " << v;
    }
    for (float v : {-2.0001f, 2.5f, inf, -inf, std::nanf("")}) {
      r.sampling.*field = v;
      ExpectInvalid(Check(r), name, "is invalid: use a value in [-2, 2] (0 = off)");
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
    ExpectInvalid(Check(r), RequestField::kRepetitionPenalty,
                  "use a value in [0.01, 100] (1 = off");
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
    ExpectInvalid(Check(r), RequestField::kMinP, "use a value in [0, 1] (0 = off)");
  }
}

TEST(RequestValidationTest, LogitBiasIdsRangesAndCount) {
  EngineRequest r = Valid();
  r.sampling.logit_bias = {{0, -100.0f}, {99, 100.0f}, {5, 0.5f}};
  EXPECT_TRUE(Check(r).ok());
  r.sampling.logit_bias = {{100, 1.0f}};
  ExpectInvalid(Check(r), RequestField::kLogitBias,
                "token id 100 is out of range: ids must be < vocab_size 100");
  r.sampling.logit_bias = {{3, 100.5f}};
  ExpectInvalid(Check(r), RequestField::kLogitBias,
                "for token 3 is 100.5: use a value in [-100, 100]");
  r.sampling.logit_bias = {{3, -std::numeric_limits<float>::infinity()}};
  ExpectInvalid(Check(r), "use a value in [-100, 100]");
  r.sampling.logit_bias = {{3, std::nanf("")}};
  ExpectInvalid(Check(r), "use a value in [-100, 100]");
  r.sampling.logit_bias = {{3, 1.0f}, {4, 1.0f}, {3, 2.0f}};
  ExpectInvalid(Check(r), RequestField::kLogitBias, "gives token 3 twice");
  RequestLimits big = Limits();
  big.model_config.vocab_size = 1000;
  r.sampling.logit_bias.clear();
  for (uint32_t i = 0; i < 300; ++i) r.sampling.logit_bias.push_back({i, 1.0f});
  EXPECT_TRUE(ValidateEngineRequest(r, big).ok());
  r.sampling.logit_bias.push_back({300, 1.0f});
  ExpectInvalid(ValidateEngineRequest(r, big), RequestField::kLogitBias,
                "has 301 entries: give at most 300");
}

TEST(RequestValidationTest, PromptLogprobsAndEcho) {
  EngineRequest r = Valid();
  r.max_new_tokens = 0;
  ExpectInvalid(Check(r), RequestField::kMaxNewTokens,
                "0 is allowed only with prompt logprobs or echo");
  r.echo_prompt = true;
  EXPECT_TRUE(Check(r).ok());
  r.echo_prompt = false;
  r.prompt_logprobs = 20;
  EXPECT_TRUE(Check(r).ok());
  r.prompt_logprobs = 21;
  ExpectInvalid(Check(r), RequestField::kPromptLogprobs, "21 is too large: use 0..20");
  r.prompt_logprobs = 0;
  RequestLimits no_all_logits = Limits();
  no_all_logits.computes_all_logits = false;
  const absl::Status s = ValidateEngineRequest(r, no_all_logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(ErrorField(s), RequestField::kPromptLogprobs);
  EXPECT_THAT(std::string(s.message()), HasSubstr("leave it unset"));
  r.prompt_logprobs.reset();
  r.echo_prompt = true;  // echo alone needs no all-position logits
  EXPECT_TRUE(ValidateEngineRequest(r, no_all_logits).ok());
}

TEST(RequestValidationTest, TopLogprobs) {
  EngineRequest r = Valid();
  r.top_logprobs = 21;
  ExpectInvalid(Check(r), RequestField::kTopLogprobs, "21 is too large: use 0..20");
  r.top_logprobs = 20;
  EXPECT_TRUE(Check(r).ok());
}

TEST(RequestValidationTest, StopIds) {
  EngineRequest r = Valid();
  r.stop_token_ids.push_back(5);
  EXPECT_TRUE(Check(r).ok());
  r.stop_token_ids.push_back(100);
  ExpectInvalid(Check(r), RequestField::kStopTokenIds,
                "has token id 100 at position 1, out of range");
}

TEST(RequestValidationTest, MoreBlocksThanThePool) {
  EngineRequest r = Valid();
  r.max_new_tokens = 46;  // 48 tokens = 3 blocks: fits exactly
  EXPECT_TRUE(Check(r).ok());
  r.max_new_tokens = 47;  // 49 tokens = 4 blocks > 3
  absl::Status s = Check(r);
  ExpectInvalid(s, RequestField::kMaxNewTokens,
                "47 + the prompt's 2 tokens need 4 KV blocks of 16 tokens");
  EXPECT_THAT(std::string(s.message()), HasSubstr("whole pool holds 3 blocks (48 tokens)"));
}

// What only a front end holds, checked by the same rules before it becomes an EngineRequest.
TEST(RequestValidationTest, PromptTextAtMostContextTimesTheLongestToken) {
  EXPECT_EQ(MaxPromptTextBytes(64, 3), 192u);
  EXPECT_TRUE(ValidatePromptText(std::string(192, 'a'), 64, 3).ok());
  ExpectInvalid(ValidatePromptText(std::string(193, 'a'), 64, 3), RequestField::kPrompt,
                "is 193 bytes, more than any text of at most 64 tokens (the model's context "
                "length) can be: 192 bytes (64 tokens x 3 bytes, the longest token)");
}

TEST(RequestValidationTest, AtMostFourStopStringsOf1To64Bytes) {
  EXPECT_TRUE(ValidateStopStrings({}).ok());
  EXPECT_TRUE(ValidateStopStrings({"a", "b", "c", std::string(64, 'd')}).ok());
  ExpectInvalid(ValidateStopStrings({"a", "b", "c", "d", "e"}), RequestField::kStop,
                "has 5 strings: at most 4");
  ExpectInvalid(ValidateStopStrings({""}), RequestField::kStop,
                "has a string of 0 bytes: each must be 1 to 64 bytes");
  ExpectInvalid(ValidateStopStrings({std::string(65, 'x')}), RequestField::kStop,
                "has a string of 65 bytes");
}

// The one vocabulary rule, for every field of ids (and ids to detokenize).
TEST(RequestValidationTest, TokenIdsBelowTheVocabulary) {
  EXPECT_TRUE(ValidateTokenIds(std::vector<uint32_t>{0, 99}, 100, RequestField::kPrompt).ok());
  ExpectInvalid(ValidateTokenIds(std::vector<uint32_t>{0, 100}, 100, RequestField::kStopTokenIds),
                RequestField::kStopTokenIds,
                "has token id 100 at position 1, out of range: ids must be < vocab_size 100");
}

TEST(RequestValidationTest, BlocksForTokensRoundsUp) {
  EXPECT_EQ(BlocksForTokens(1, 16), 1);
  EXPECT_EQ(BlocksForTokens(16, 16), 1);
  EXPECT_EQ(BlocksForTokens(17, 16), 2);
  EXPECT_EQ(BlocksForTokens(240, 16), 15);
}

}  // namespace
}  // namespace prefixd
