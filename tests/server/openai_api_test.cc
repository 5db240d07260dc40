// The OpenAI wire format without a network: every field of a completion request, every
// refusal (with the field it names), and the shapes of responses, chunks and errors.
#include "server/openai_api.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/request_validation.h"
#include "engine/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/wire_field.h"

namespace prefixd {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<CompletionRequest> Parse(const json& body) {
  return ParseCompletionRequest(body.dump(), "gpt2");
}

void ExpectRefused(const json& body, absl::StatusCode code, const std::string& field,
                   const std::string& message) {
  absl::StatusOr<CompletionRequest> r = Parse(body);
  ASSERT_FALSE(r.ok()) << body.dump();
  EXPECT_EQ(r.status().code(), code) << body.dump();
  EXPECT_EQ(InvalidField(r.status()), field) << body.dump();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(message)) << body.dump();
}

TEST(OpenAiApiTest, DefaultsAreOpenAis) {
  absl::StatusOr<CompletionRequest> r = Parse({{"prompt", "Hello"}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->prompts.size(), 1u);
  const GenerateCall& c = r->prompts[0];
  EXPECT_EQ(c.api, Api::kHttp);
  EXPECT_EQ(c.text, "Hello");
  EXPECT_TRUE(c.request.prompt.empty()) << "the request path tokenizes the text";
  EXPECT_EQ(c.request.max_new_tokens, 16u);
  EXPECT_EQ(c.request.sampling.temperature, 1.0f);
  EXPECT_EQ(c.request.sampling.top_p, 1.0f);
  EXPECT_EQ(c.request.num_samples, 1u);
  EXPECT_EQ(c.request.top_logprobs, 0u);
  EXPECT_TRUE(c.request.request_id.empty()) << "the request path names the request";
  EXPECT_FALSE(r->stream);
  EXPECT_FALSE(r->include_usage);
  EXPECT_FALSE(r->logprobs.has_value());
}

// The field names of docs/SERVER.md's `POST /v1/completions` table (each row's first cell).
std::set<std::string> DocumentedCompletionFields() {
  std::ifstream in(std::string(PREFIXD_SOURCE_DIR) + "/docs/SERVER.md");
  EXPECT_TRUE(in.good());
  std::set<std::string> fields;
  bool in_table = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("**`POST /v1/completions` fields.**", 0) == 0) in_table = true;
    if (!in_table || line.rfind("| `", 0) != 0) {
      if (in_table && !fields.empty() && line.rfind("|", 0) != 0) break;  // the table ended
      continue;
    }
    const std::string first_cell = line.substr(2, line.find(" | ") - 2);
    const std::vector<std::string> parts = absl::StrSplit(first_cell, '`');
    for (size_t i = 1; i < parts.size(); i += 2) fields.insert(parts[i]);
  }
  return fields;
}

// An unknown field's refusal sends clients to docs/SERVER.md's table of completion fields,
// which then says any other field is refused: it must name exactly the fields the parser
// takes. Checked over the names clients send (OpenAI's completions fields and caching
// fields, vLLM's extras), each given as null, which is the same as leaving it out.
TEST(OpenAiApiTest, TheDocumentedFieldTableIsWhatTheParserAccepts) {
  const std::set<std::string> documented = DocumentedCompletionFields();
  ASSERT_GE(documented.size(), 20u);
  std::set<std::string> names = documented;
  for (const char* name : {"model",
                           "prompt",
                           "best_of",
                           "echo",
                           "frequency_penalty",
                           "logit_bias",
                           "logprobs",
                           "max_tokens",
                           "n",
                           "presence_penalty",
                           "seed",
                           "stop",
                           "stream",
                           "stream_options",
                           "suffix",
                           "temperature",
                           "top_p",
                           "user",
                           "prompt_cache_key",
                           "prompt_cache_retention",
                           "top_k",
                           "min_p",
                           "repetition_penalty",
                           "ignore_eos",
                           "stop_token_ids",
                           "cache_salt",
                           "min_tokens",
                           "include_stop_str_in_output",
                           "skip_special_tokens",
                           "prompt_logprobs",
                           "add_special_tokens",
                           "allowed_token_ids",
                           "truncate_prompt_tokens",
                           "response_format",
                           "priority",
                           "use_beam_search",
                           "length_penalty",
                           "return_tokens_as_token_ids",
                           "max_completion_tokens",
                           "metadata",
                           "store",
                           "service_tier"}) {
    names.insert(name);
  }
  for (const std::string& name : names) {
    if (name == "prompt") continue;  // required
    const bool accepted = Parse(json{{"prompt", "a"}, {name, nullptr}}).ok();
    EXPECT_EQ(accepted, documented.count(name) > 0)
        << name << (accepted ? " is accepted but not in" : " is refused but listed in")
        << " docs/SERVER.md's POST /v1/completions fields";
  }
}

// The README's curl examples (copied as they are by readers trying the HTTP API) send
// completion requests the parser accepts.
TEST(OpenAiApiTest, TheReadmesCurlExamplesAreAccepted) {
  std::ifstream in(std::string(PREFIXD_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string readme = text.str();
  int examples = 0;
  for (size_t at = readme.find("curl "); at != std::string::npos;
       at = readme.find("curl ", at + 1)) {
    const size_t eol = readme.find('\n', at);
    if (readme.substr(at, eol - at).find("/v1/completions") == std::string::npos) continue;
    const size_t body = readme.find("-d '", at);
    ASSERT_NE(body, std::string::npos) << readme.substr(at, eol - at);
    const size_t end = readme.find('\'', body + 4);
    ASSERT_NE(end, std::string::npos);
    const std::string json_body = readme.substr(body + 4, end - body - 4);
    absl::StatusOr<CompletionRequest> r = ParseCompletionRequest(json_body, "gpt2");
    EXPECT_TRUE(r.ok()) << json_body << ": " << r.status();
    ++examples;
  }
  EXPECT_GE(examples, 3);
}

TEST(OpenAiApiTest, EveryFieldIsCarried) {
  absl::StatusOr<CompletionRequest> r =
      Parse({{"model", "gpt2"},
             {"prompt", json::array({1, 2, 3})},
             {"max_tokens", 7},
             {"temperature", 0.5},
             {"top_p", 0.9},
             {"n", 3},
             {"seed", 42},
             {"stop", json::array({"\n", "END"})},
             {"logprobs", 2},
             {"stream", true},
             {"stream_options", {{"include_usage", true}}},
             {"user", "u-1"},
             {"echo", false},
             {"best_of", 1},
             {"presence_penalty", 0.5},
             {"frequency_penalty", -1.25},
             {"repetition_penalty", 1.1},
             {"min_p", 0.05},
             {"logit_bias", {{"50256", -100}, {"13", 2.5}, {"7", 0}}},
             {"suffix", nullptr},
             {"top_k", 40},
             {"ignore_eos", true},
             {"cache_salt", "s"},
             {"prompt_cache_retention", "24h"},
             {"prompt_cache_key", "conversation-7"},
             {"stop_token_ids", json::array({50256})}});
  ASSERT_TRUE(r.ok()) << r.status();
  const GenerateCall& c = r->prompts[0];
  EXPECT_FALSE(c.text.has_value());
  EXPECT_THAT(c.request.prompt, ElementsAre(1u, 2u, 3u));
  EXPECT_EQ(c.request.max_new_tokens, 7u);
  EXPECT_EQ(c.request.sampling.temperature, 0.5f);
  EXPECT_EQ(c.request.sampling.top_p, 0.9f);
  EXPECT_EQ(c.request.num_samples, 3u);
  EXPECT_EQ(c.request.sampling.seed, 42u);
  EXPECT_THAT(c.stop, ElementsAre("\n", "END"));
  EXPECT_EQ(c.request.top_logprobs, 2u);
  EXPECT_EQ(r->logprobs, 2u);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(c.request.sampling.top_k, 40u);
  EXPECT_TRUE(c.request.ignore_eos);
  EXPECT_EQ(c.cache_salt, "s");
  // Read as sent: the request path reads the retention (one rule for both front ends).
  EXPECT_EQ(c.cache_retention, "24h");
  EXPECT_EQ(c.prompt_cache_key, "conversation-7");
  EXPECT_THAT(c.request.stop_token_ids, ElementsAre(50256u));
  EXPECT_EQ(c.request.sampling.presence_penalty, 0.5f);
  EXPECT_EQ(c.request.sampling.frequency_penalty, -1.25f);
  EXPECT_EQ(c.request.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(c.request.sampling.min_p, 0.05f);
  // Sorted by id: an object's order means nothing.
  EXPECT_THAT(c.request.sampling.logit_bias,
              ElementsAre(TokenBias{7, 0.0f}, TokenBias{13, 2.5f}, TokenBias{50256, -100.0f}));
}

TEST(OpenAiApiTest, SamplingControlsDefaultToOff) {
  absl::StatusOr<CompletionRequest> r =
      Parse({{"prompt", "x"}, {"presence_penalty", nullptr}, {"logit_bias", nullptr}});
  ASSERT_TRUE(r.ok()) << r.status();
  const GenerateCall& c = r->prompts[0];
  EXPECT_EQ(c.request.sampling.presence_penalty, 0.0f);
  EXPECT_EQ(c.request.sampling.frequency_penalty, 0.0f);
  EXPECT_EQ(c.request.sampling.repetition_penalty, 1.0f);
  EXPECT_EQ(c.request.sampling.min_p, 0.0f);
  EXPECT_TRUE(c.request.sampling.logit_bias.empty());
}

TEST(OpenAiApiTest, PromptForms) {
  absl::StatusOr<CompletionRequest> r = Parse({{"prompt", json::array({"a", "b"})}});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->prompts.size(), 2u);
  EXPECT_EQ(r->prompts[1].text, "b");
  r = Parse({{"prompt", json::array({json::array({5}), json::array({6, 7})})}, {"n", 2}});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->prompts.size(), 2u);
  EXPECT_THAT(r->prompts[1].request.prompt, ElementsAre(6u, 7u));
  EXPECT_EQ(r->prompts[1].request.num_samples, 2u) << "every prompt gets the same options";
  r = Parse({{"prompt", "x"}, {"stop", "\n"}});
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->prompts[0].stop, ElementsAre("\n"));
  // null is "not given"
  r = Parse({{"prompt", "x"}, {"max_tokens", nullptr}, {"logprobs", nullptr}, {"stop", nullptr}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompts[0].request.max_new_tokens, 16u);
}

// A seed the client gave is every prompt's; without one each prompt draws its own, so that
// identical prompts sample differently (as separate requests would).
TEST(OpenAiApiTest, EachPromptWithoutASeedDrawsItsOwn) {
  absl::StatusOr<CompletionRequest> r = Parse({{"prompt", json::array({"a", "a"})}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->prompts[0].request.sampling.seed, r->prompts[1].request.sampling.seed);
  r = Parse({{"prompt", json::array({"a", "a"})}, {"seed", -1}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompts[0].request.sampling.seed, ~uint64_t{0});
  EXPECT_EQ(r->prompts[1].request.sampling.seed, ~uint64_t{0});
}

// `model` other than the served one names a LoRA adapter; the request path resolves it
// (NOT_FOUND, 404, for one that is not loaded: http_api_test, server_lora_test).
TEST(OpenAiApiTest, AnotherModelNameIsAnAdapterName) {
  absl::StatusOr<CompletionRequest> r =
      ParseCompletionRequest(R"({"model": "sql-lora", "prompt": ["a", "b"]})", "gpt2");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->prompts.size(), 2u);
  EXPECT_EQ(r->prompts[0].adapter, "sql-lora");
  EXPECT_EQ(r->prompts[1].adapter, "sql-lora");
  r = ParseCompletionRequest(R"({"model": "gpt2", "prompt": "a"})", "gpt2");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompts[0].adapter, "");
}

TEST(OpenAiApiTest, RefusalsNameTheField) {
  using C = absl::StatusCode;
  ExpectRefused({{"max_tokens", 4}}, C::kInvalidArgument, "prompt", "`prompt` is required");
  ExpectRefused({{"prompt", json::array()}}, C::kInvalidArgument, "prompt", "not empty");
  ExpectRefused({{"prompt", json::array({-1})}}, C::kInvalidArgument, "prompt", "non-negative");
  ExpectRefused({{"prompt", json::array({json::object()})}}, C::kInvalidArgument, "prompt",
                "token ids, strings, or arrays");
  ExpectRefused({{"prompt", 5}}, C::kInvalidArgument, "prompt", "must be a string");
  ExpectRefused({{"prompt", "x"}, {"model", 4}}, C::kInvalidArgument, "model",
                "`model` must be a string");
  ExpectRefused({{"prompt", "x"}, {"max_tokens", "5"}}, C::kInvalidArgument, "max_tokens",
                "must be an integer");
  ExpectRefused({{"prompt", "x"}, {"max_tokens", -1}}, C::kInvalidArgument, "max_tokens",
                "from 0 to");
  ExpectRefused({{"prompt", "x"}, {"temperature", "hot"}}, C::kInvalidArgument, "temperature",
                "must be a number");
  ExpectRefused({{"prompt", "x"}, {"logprobs", 6}}, C::kInvalidArgument, "logprobs", "0 to 5");
  ExpectRefused({{"prompt", "x"}, {"stop", 3}}, C::kInvalidArgument, "stop", "string");
  ExpectRefused({{"prompt", "x"}, {"stream", "yes"}}, C::kInvalidArgument, "stream",
                "true or false");
  ExpectRefused({{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}},
                C::kInvalidArgument, "stream_options", "only allowed with `stream: true`");
  ExpectRefused({{"prompt", "x"}, {"stream", true}, {"stream_options", {{"x", 1}}}},
                C::kInvalidArgument, "stream_options", "unknown field `stream_options.x`");
  ExpectRefused({{"prompt", "x"}, {"best_of", 2}}, C::kInvalidArgument, "best_of", "not supported");
  // The penalties' ranges are the request path's (tests/server/http_api_test.cc); the
  // wire format refuses only what is not even a number, or not a token id.
  ExpectRefused({{"prompt", "x"}, {"presence_penalty", "high"}}, C::kInvalidArgument,
                "presence_penalty", "must be a number");
  ExpectRefused({{"prompt", "x"}, {"frequency_penalty", true}}, C::kInvalidArgument,
                "frequency_penalty", "must be a number");
  ExpectRefused({{"prompt", "x"}, {"repetition_penalty", json::array()}}, C::kInvalidArgument,
                "repetition_penalty", "must be a number");
  ExpectRefused({{"prompt", "x"}, {"min_p", "0.1"}}, C::kInvalidArgument, "min_p",
                "must be a number");
  ExpectRefused({{"prompt", "x"}, {"logit_bias", json::array({1})}}, C::kInvalidArgument,
                "logit_bias", "must be an object from token ids to biases");
  ExpectRefused({{"prompt", "x"}, {"logit_bias", {{"hello", 1}}}}, C::kInvalidArgument,
                "logit_bias", "key `hello` is not a token id");
  ExpectRefused({{"prompt", "x"}, {"logit_bias", {{"-5", 1}}}}, C::kInvalidArgument, "logit_bias",
                "key `-5` is not a token id");
  ExpectRefused({{"prompt", "x"}, {"logit_bias", {{"99999999999", 1}}}}, C::kInvalidArgument,
                "logit_bias", "is not a token id");
  ExpectRefused({{"prompt", "x"}, {"logit_bias", {{"5", "up"}}}}, C::kInvalidArgument, "logit_bias",
                "value for token 5 must be a number from -100 to 100");
  ExpectRefused({{"prompt", "x"}, {"suffix", "y"}}, C::kInvalidArgument, "suffix", "not supported");
  ExpectRefused({{"prompt", "x"}, {"echo", 1}}, C::kInvalidArgument, "echo",
                "must be true or false");
  ExpectRefused({{"prompt", "x"}, {"mystery", 1}}, C::kInvalidArgument, "mystery",
                "unknown field `mystery`");
  ExpectRefused({{"prompt", "x"}, {"stop_token_ids", json::array({"a"})}}, C::kInvalidArgument,
                "stop_token_ids", "non-negative integers");
  ExpectRefused({{"prompt", "x"}, {"ignore_eos", 1}}, C::kInvalidArgument, "ignore_eos",
                "true or false");

  absl::StatusOr<CompletionRequest> bad = ParseCompletionRequest("{\"prompt\": ", "gpt2");
  EXPECT_EQ(bad.status().code(), C::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("not valid JSON"));
  bad = ParseCompletionRequest("[1]", "gpt2");
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("must be a JSON object"));
}

// Parsed bodies the engine's rules refuse (engine/request_validation.h), reported as the API
// names the field: first in the message and as `param`.
absl::Status RuleRefusal(const json& body) {
  absl::StatusOr<CompletionRequest> r = Parse(body);
  if (!r.ok()) return absl::InternalError(absl::StrCat("did not parse: ", r.status().ToString()));
  RequestLimits limits;
  limits.model_config.vocab_size = 50257;
  limits.model_config.n_positions = 256;
  limits.max_samples = 16;
  limits.pool = {.num_blocks = 64, .block_size = 16};
  return ToOpenAiError(ValidateEngineRequest(r->prompts[0].request, limits));
}

TEST(OpenAiApiTest, RuleRefusalsNameTheApisField) {
  struct Case {
    json body;
    std::string param;
    std::string message;
  };
  const Case cases[] = {
      // OpenAI's `n` is at least 1: the parser passes 0 on, the engine's one rule refuses it.
      {{{"prompt", json::array({1})}, {"n", 0}}, "n", "n is 0: ask for at least 1 sample"},
      {{{"prompt", json::array({1})}, {"n", 17}},
       "n",
       "n 17 exceeds this server's limit 16 (--max-samples)"},
      {{{"prompt", json::array({1, 2, 3})}, {"max_tokens", 300}},
       "max_tokens",
       "max_tokens 300 + the prompt's 3 tokens = 303, more than the model's context length 256: "
       "lower it or shorten the prompt"},
      {{{"prompt", json::array({1})}, {"max_tokens", 0}},
       "max_tokens",
       "max_tokens is 0: ask for at least 1"},
      {{{"prompt", json::array({json::array()})}},
       "prompt",
       "prompt is an empty prompt (or no prompt was given)"},
      {{{"prompt", json::array({50257})}},
       "prompt",
       "prompt has token id 50257 at position 0, out of range"},
      {{{"prompt", json::array({1})}, {"stop_token_ids", json::array({50257})}},
       "stop_token_ids",
       "stop_token_ids has token id 50257"},
      {{{"prompt", json::array({1})}, {"temperature", -1}},
       "temperature",
       "temperature -1 is invalid"},
  };
  for (const Case& c : cases) {
    const absl::Status s = RuleRefusal(c.body);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.body.dump() << " " << s;
    EXPECT_EQ(InvalidField(s), c.param) << c.body.dump();
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.body.dump();
  }
  json many = json::object();
  for (int i = 0; i < 301; ++i) many[std::to_string(i)] = 1;
  const absl::Status s = RuleRefusal({{"prompt", json::array({1})}, {"logit_bias", many}});
  EXPECT_EQ(InvalidField(s), "logit_bias");
  EXPECT_EQ(s.message(), "logit_bias has 301 entries: give at most 300");
  // A status without a field is left as it is.
  EXPECT_EQ(ToOpenAiError(absl::ResourceExhaustedError("request queue is full")),
            absl::ResourceExhaustedError("request queue is full"));
}

TEST(OpenAiApiTest, EveryRequestFieldHasAnApiName) {
  EXPECT_EQ(OpenAiFieldName(RequestField::kMaxNewTokens), "max_tokens");
  EXPECT_EQ(OpenAiFieldName(RequestField::kNumSamples), "n");
  EXPECT_EQ(OpenAiFieldName(RequestField::kPrompt), "prompt");
  EXPECT_EQ(OpenAiFieldName(RequestField::kTopLogprobs), "logprobs");
  EXPECT_EQ(OpenAiFieldName(RequestField::kPromptLogprobs), "logprobs");
  EXPECT_EQ(OpenAiFieldName(RequestField::kAdapter), "model");
  for (int f = static_cast<int>(RequestField::kNone) + 1;
       f <= static_cast<int>(RequestField::kCacheSalt); ++f) {
    EXPECT_NE(OpenAiFieldName(static_cast<RequestField>(f)), "body") << f;
  }
}

TEST(OpenAiApiTest, ErrorsHaveOpenAisShapeAndStatus) {
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kPermissionDenied), 403);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInternal), 500);
  const json e = json::parse(ErrorJson(WireFieldError("stop", "stop has 5 strings: at most 4")));
  EXPECT_EQ(e["error"]["message"], "stop has 5 strings: at most 4");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "stop");
  EXPECT_EQ(e["error"]["code"], "INVALID_ARGUMENT");
  const json q = json::parse(ErrorJson(absl::ResourceExhaustedError("queue full")));
  EXPECT_EQ(q["error"]["type"], "rate_limit_error");
  EXPECT_TRUE(q["error"]["param"].is_null());
}

TEST(OpenAiApiTest, ResponseAndChunkShapes) {
  ResponseHeader h{.id = "cmpl-1", .created = 1700000000, .model = "gpt2"};
  Choice c;
  c.index = 1;
  c.text = "hi";
  c.finish_reason = FinishReason::kStop;
  c.logprobs.emplace();
  c.logprobs->tokens = {"hi"};
  c.logprobs->token_logprobs = {-0.25f};
  c.logprobs->top_logprobs = {{{"hi", -0.25f}, {"ho", -2.0f}}};
  c.logprobs->text_offset = {0};
  Usage u;
  u.prompt_tokens = 4;
  u.cached_prompt_tokens = 3;
  u.completion_tokens = 1;
  const json r = json::parse(CompletionJson(h, {c}, u));
  EXPECT_EQ(r["id"], "cmpl-1");
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["created"], 1700000000);
  EXPECT_EQ(r["model"], "gpt2");
  EXPECT_EQ(r["choices"][0]["index"], 1);
  EXPECT_EQ(r["choices"][0]["text"], "hi");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][0]["logprobs"]["tokens"], json::array({"hi"}));
  EXPECT_EQ(r["choices"][0]["logprobs"]["top_logprobs"][0]["ho"], -2.0);
  EXPECT_EQ(r["choices"][0]["logprobs"]["text_offset"], json::array({0}));
  EXPECT_EQ(r["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(r["usage"]["completion_tokens"], 1);
  EXPECT_EQ(r["usage"]["total_tokens"], 5);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_retained_tokens"], 0);
  EXPECT_FALSE(r["usage"].contains("prompt_cache_key"));
  h.prompt_cache_key = "conversation-7";
  u.cached_retained_tokens = 2;
  const json keyed = json::parse(CompletionJson(h, {c}, u));
  EXPECT_EQ(keyed["usage"]["prompt_cache_key"], "conversation-7");
  EXPECT_EQ(keyed["usage"]["prompt_tokens_details"]["cached_retained_tokens"], 2);

  const std::string chunk = CompletionChunk(h, c);
  ASSERT_TRUE(chunk.starts_with("data: "));
  ASSERT_TRUE(chunk.ends_with("\n\n"));
  const json cj = json::parse(chunk.substr(6));
  EXPECT_EQ(cj["choices"].size(), 1u);
  EXPECT_FALSE(cj.contains("usage"));
  const json uj = json::parse(UsageChunk(h, u).substr(6));
  EXPECT_TRUE(uj["choices"].empty());
  EXPECT_EQ(uj["usage"]["total_tokens"], 5);
  EXPECT_EQ(kDoneEvent, "data: [DONE]\n\n");
}

class FakeTokenizer final : public Tokenizer {
 public:
  std::vector<uint32_t> Encode(std::string_view) const override { return {}; }
  std::vector<uint32_t> EncodeAtMost(std::string_view, size_t) const override { return {}; }
  size_t max_token_bytes() const override { return 1; }
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t>) const override { return ""; }
  // Token i is the letter 'a' + i.
  std::string_view TokenBytes(uint32_t id) const override {
    return std::string_view(kLetters).substr(id, 1);
  }
  size_t vocab_size() const override { return 26; }

 private:
  static constexpr char kLetters[] = "abcdefghijklmnopqrstuvwxyz";
};

// OpenAI: "the API will always return the logprob of the sampled token, so there may be up
// to logprobs+1 elements" in each top_logprobs object (vLLM's too, prompt tokens included).
TEST(OpenAiApiTest, TopLogprobsAlwaysListTheTokenItself) {
  const FakeTokenizer tok;
  Choice c;
  c.logprobs.emplace();
  std::vector<PromptToken> prompt(2);
  prompt[0].token_id = 0;  // "a": no logprob
  prompt[1] = {.token_id = 1, .has_logprob = true, .logprob = -3.0f, .top = {{2, -0.5f}}};
  AppendPromptToChoice(tok, prompt, &c);
  SampleOutput out;
  out.tokens.push_back({.token_id = 3, .logprob = -4.0f, .top = {{2, -0.25f}, {4, -1.0f}}});
  out.tokens.push_back({.token_id = 2, .logprob = -0.25f, .top = {{2, -0.25f}, {4, -1.0f}}});
  out.stop_token = OutputToken{.token_id = 5, .logprob = -6.0f, .top = {{4, -0.75f}}};
  out.finish_reason = FinishReason::kStop;
  AppendToChoice(tok, out, &c);
  const nlohmann::ordered_json top = ChoiceJson(c)["logprobs"]["top_logprobs"];
  ASSERT_EQ(top.size(), 5u);
  EXPECT_TRUE(top[0].is_null()) << "the prompt's first token";
  EXPECT_EQ(top[1].dump(), R"({"c":-0.5,"b":-3.0})") << "a prompt token, most likely first";
  EXPECT_EQ(top[2].dump(), R"({"c":-0.25,"e":-1.0,"d":-4.0})") << "a sampled token";
  EXPECT_EQ(top[3].dump(), R"({"c":-0.25,"e":-1.0})") << "already listed: once";
  EXPECT_EQ(top[4].dump(), R"({"e":-0.75,"f":-6.0})") << "the stop token";
}

TEST(OpenAiApiTest, TokenizeBodies) {
  absl::StatusOr<TokenizeBody> t = ParseTokenizeRequest(R"({"prompt": "Hello"})", "gpt2");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->prompt, "Hello");
  EXPECT_EQ(t->adapter, "");
  t = ParseTokenizeRequest(R"({"prompt": "Hi", "model": "gpt2"})", "gpt2");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->adapter, "");
  EXPECT_EQ(ParseTokenizeRequest(R"({"text": "Hello"})", "gpt2").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTokenizeRequest(R"({"prompt": "Hi", "model": 3})", "gpt2").status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<DetokenizeBody> d = ParseDetokenizeRequest(R"({"tokens": [1, 2]})", "gpt2");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->tokens, ElementsAre(1u, 2u));
  EXPECT_EQ(d->adapter, "");
  // Another name is an adapter's, which the request path resolves (or refuses, 404).
  d = ParseDetokenizeRequest(R"({"tokens": [1], "model": "sql"})", "gpt2");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->adapter, "sql");
  t = ParseTokenizeRequest(R"({"prompt": "Hi", "model": "sql"})", "gpt2");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->adapter, "sql");
  // add_special_tokens is a boolean (GPT-2 has none to add, so either value tokenizes alike).
  for (const char* ok : {"true", "false"}) {
    EXPECT_TRUE(ParseTokenizeRequest(
                    absl::StrCat(R"({"prompt": "Hi", "add_special_tokens": )", ok, "}"), "gpt2")
                    .ok())
        << ok;
  }
  for (const char* bad : {"1", "\"yes\"", "null", "[]", "{}"}) {
    const absl::Status s =
        ParseTokenizeRequest(absl::StrCat(R"({"prompt": "Hi", "add_special_tokens": )", bad, "}"),
                             "gpt2")
            .status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr("`add_special_tokens` must be true or false"))
        << bad;
  }
}

}  // namespace
}  // namespace prefixd
