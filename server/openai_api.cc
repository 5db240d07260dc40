#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/request_validation.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "server/wire_field.h"

namespace prefixd {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;  // responses keep OpenAI's field order

absl::Status Invalid(std::string_view field, const std::string& message) {
  return WireFieldError(field, message);
}

absl::StatusOr<json> ParseObject(const std::string& body) {
  // Nothing a client sends may raise: every nlohmann error (syntax, a number past a double's
  // range such as 1e400, invalid UTF-8) is caught here, the one place every body passes,
  // and answered naming the object key it came after, when there was one.
  std::string last_key;
  const json::parser_callback_t track_key = [&last_key](int, json::parse_event_t event,
                                                        json& parsed) {
    if (event == json::parse_event_t::key && parsed.is_string()) {
      last_key = parsed.get<std::string>();
    }
    return true;
  };
  json j;
  try {
    j = json::parse(body.begin(), body.end(), track_key);
  } catch (const json::exception& e) {
    std::string where;
    if (!last_key.empty()) {
      where = absl::StrCat(" in or after `", absl::CHexEscape(last_key.substr(0, 64)), "`");
    }
    absl::Status s = absl::InvalidArgumentError(
        absl::StrCat("the body is not valid JSON", where, " (", e.what(),
                     "): send a JSON object whose numbers fit a double"));
    return last_key.empty() ? s : WithWireField(s, last_key.substr(0, 64));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError("the body must be a JSON object");
  }
  return j;
}

// Typed readers: each refuses a value of the wrong type naming the field. `null` is the
// same as leaving the field out (OpenAI's SDKs send nulls for unset options).
absl::StatusOr<std::optional<int64_t>> GetInt(const json& j, const char* field, int64_t lo,
                                              int64_t hi) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::optional<int64_t>();
  if (!it->is_number_integer()) {
    return Invalid(field, absl::StrCat("`", field, "` must be an integer"));
  }
  // Unsigned values past int64 wrap when read as int64; they are out of range anyway.
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Invalid(field, absl::StrCat("`", field, "` must be from ", lo, " to ", hi));
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    return Invalid(field, absl::StrCat("`", field, "` must be from ", lo, " to ", hi, ", got ", v));
  }
  return std::optional<int64_t>(v);
}

absl::StatusOr<std::optional<double>> GetNumber(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return Invalid(field, absl::StrCat("`", field, "` must be a number"));
  const double v = it->get<double>();
  // Every number field is read as a float: one past its range would convert to infinity
  // (undefined behaviour in C++).
  if (!(std::fabs(v) <= std::numeric_limits<float>::max())) {
    return Invalid(field, absl::StrCat("`", field, "` is out of range, got ", v));
  }
  return std::optional<double>(v);
}

absl::StatusOr<std::optional<bool>> GetBool(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean()) return Invalid(field, absl::StrCat("`", field, "` must be true or false"));
  return std::optional<bool>(it->get<bool>());
}

absl::StatusOr<std::optional<std::string>> GetString(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return Invalid(field, absl::StrCat("`", field, "` must be a string"));
  return std::optional<std::string>(it->get<std::string>());
}

absl::StatusOr<std::vector<uint32_t>> TokenIdArray(const json& a, const char* field) {
  std::vector<uint32_t> ids;
  ids.reserve(a.size());
  for (const json& v : a) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        (v.is_number_unsigned() && v.get<uint64_t>() > std::numeric_limits<uint32_t>::max())) {
      return Invalid(field, absl::StrCat("`", field, "` token ids must be non-negative integers"));
    }
    ids.push_back(static_cast<uint32_t>(v.get<uint64_t>()));
  }
  return ids;
}

// `model`: absent, null or `served_model` is the base (""); any other name is taken as a
// LoRA adapter's, which the request path resolves (NOT_FOUND for an unknown one).
absl::StatusOr<std::string> ModelAdapter(const json& j, const std::string& served_model) {
  auto it = j.find("model");
  if (it == j.end() || it->is_null()) return std::string();
  if (!it->is_string()) return Invalid("model", "`model` must be a string");
  if (it->get<std::string>() == served_model) return std::string();
  return it->get<std::string>();
}

// The prompt(s): a string, an array of token ids, an array of strings, or an array of
// arrays of token ids. Each is a call with its `text` set or its ids in request.prompt.
absl::StatusOr<std::vector<GenerateCall>> ParsePrompts(const json& j) {
  auto it = j.find("prompt");
  if (it == j.end() || it->is_null()) {
    return Invalid("prompt", "`prompt` is required: a string or an array of token ids");
  }
  std::vector<GenerateCall> calls;
  auto text = [&](const std::string& s) { calls.emplace_back().text = s; };
  auto ids = [&](std::vector<uint32_t> v) { calls.emplace_back().request.prompt = std::move(v); };
  const json& p = *it;
  if (p.is_string()) {
    text(p.get<std::string>());
    return calls;
  }
  if (!p.is_array() || p.empty()) {
    return Invalid("prompt",
                   "`prompt` must be a string, an array of token ids, an array of strings or "
                   "an array of arrays of token ids (not empty)");
  }
  if (p[0].is_number()) {
    absl::StatusOr<std::vector<uint32_t>> v = TokenIdArray(p, "prompt");
    if (!v.ok()) return v.status();
    ids(*std::move(v));
    return calls;
  }
  for (const json& e : p) {
    if (e.is_string()) {
      text(e.get<std::string>());
    } else if (e.is_array()) {
      absl::StatusOr<std::vector<uint32_t>> v = TokenIdArray(e, "prompt");
      if (!v.ok()) return v.status();
      ids(*std::move(v));
    } else {
      return Invalid("prompt",
                     "`prompt` as an array holds token ids, strings, or arrays of token ids");
    }
  }
  return calls;
}

// OpenAI's `logit_bias`: an object from token ids (decimal strings, as JSON keys are) to
// numbers. Ranges, the entry limit and the ids' vocabulary are the engine's rules.
absl::StatusOr<std::vector<TokenBias>> ParseLogitBias(const json& j) {
  std::vector<TokenBias> out;
  auto it = j.find("logit_bias");
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_object()) {
    return Invalid("logit_bias",
                   "`logit_bias` must be an object from token ids to biases, e.g. "
                   "{\"50256\": -100}");
  }
  for (const auto& [key, value] : it->items()) {
    uint32_t id = 0;
    const bool digits = !key.empty() && key.size() <= 10 &&
                        key.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || !absl::SimpleAtoi(key, &id)) {
      return Invalid("logit_bias",
                     absl::StrCat("`logit_bias` key `", absl::CHexEscape(key.substr(0, 64)),
                                  "` is not a token id: keys are token ids in decimal"));
    }
    if (!value.is_number()) {
      return Invalid("logit_bias", absl::StrCat("`logit_bias` value for token ", id,
                                                " must be a number from -100 to 100"));
    }
    const double v = value.get<double>();
    if (!(std::fabs(v) <= std::numeric_limits<float>::max())) {
      return Invalid("logit_bias", absl::StrCat("`logit_bias` value for token ", id,
                                                " is out of range: use -100 to 100"));
    }
    out.push_back({id, static_cast<float>(v)});
  }
  // JSON objects have no order that means anything: sorted by id.
  std::sort(out.begin(), out.end(),
            [](const TokenBias& a, const TokenBias& b) { return a.token_id < b.token_id; });
  return out;
}

// Parameters OpenAI has and prefixd does not implement: accepted only at their neutral value.
absl::Status CheckUnsupported(const json& j) {
  if (auto it = j.find("best_of");
      it != j.end() && !it->is_null() && !(it->is_number_integer() && it->get<int64_t>() == 1)) {
    return Invalid("best_of", "`best_of` other than 1 is not supported: use `n`");
  }
  if (auto it = j.find("suffix");
      it != j.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
    return Invalid("suffix", "`suffix` is not supported: leave it out");
  }
  return absl::OkStatus();
}

constexpr const char* kKnownFields[] = {"model",
                                        "prompt",
                                        "max_tokens",
                                        "temperature",
                                        "top_p",
                                        "n",
                                        "seed",
                                        "stop",
                                        "logprobs",
                                        "stream",
                                        "stream_options",
                                        "user",
                                        "echo",
                                        "best_of",
                                        "presence_penalty",
                                        "frequency_penalty",
                                        "logit_bias",
                                        "suffix",
                                        "top_k",
                                        "min_p",
                                        "repetition_penalty",
                                        "ignore_eos",
                                        "cache_salt",
                                        "prompt_cache_retention",
                                        "prompt_cache_key",
                                        "stop_token_ids"};

}  // namespace

absl::StatusOr<CompletionRequest> ParseCompletionRequest(const std::string& body,
                                                         const std::string& served_model) {
  absl::StatusOr<json> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  const json& j = *parsed;
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (const char* f : kKnownFields) known = known || key == f;
    if (!known) {
      return Invalid(key, absl::StrCat("unknown field `", absl::CHexEscape(key),
                                       "`: see docs/SERVER.md for the fields prefixd accepts"));
    }
  }
  // `model` names the base or a LoRA adapter; the request path resolves an adapter's name
  // (NOT_FOUND, 404, for one that is not loaded).
  absl::StatusOr<std::string> adapter = ModelAdapter(j, served_model);
  if (!adapter.ok()) return adapter.status();
  if (absl::Status s = CheckUnsupported(j); !s.ok()) return s;

  GenerateCall base;
  base.api = Api::kHttp;
  base.adapter = *std::move(adapter);
  EngineRequest& r = base.request;
  SamplingParams& sampling = r.sampling;
  // Numbers are range-checked here only as far as their type needs; the engine's rules
  // (engine/request_validation.h) decide the rest, for both front ends.
  constexpr int64_t kU32 = std::numeric_limits<uint32_t>::max();
  absl::StatusOr<std::optional<int64_t>> max_tokens = GetInt(j, "max_tokens", 0, kU32);
  if (!max_tokens.ok()) return max_tokens.status();
  r.max_new_tokens = static_cast<uint32_t>(max_tokens->value_or(16));
  absl::StatusOr<std::optional<double>> temperature = GetNumber(j, "temperature");
  if (!temperature.ok()) return temperature.status();
  sampling.temperature = static_cast<float>(temperature->value_or(1.0));
  absl::StatusOr<std::optional<double>> top_p = GetNumber(j, "top_p");
  if (!top_p.ok()) return top_p.status();
  if (top_p->has_value()) sampling.top_p = static_cast<float>(**top_p);
  // OpenAI's `n` is at least 1: 0 reaches the engine's rule, which refuses it naming `n`.
  absl::StatusOr<std::optional<int64_t>> n = GetInt(j, "n", 0, kU32);
  if (!n.ok()) return n.status();
  r.num_samples = static_cast<uint32_t>(n->value_or(1));
  absl::StatusOr<std::optional<int64_t>> seed =
      GetInt(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  if (!seed.ok()) return seed.status();
  absl::StatusOr<std::optional<int64_t>> top_k = GetInt(j, "top_k", -1, kU32);
  if (!top_k.ok()) return top_k.status();
  // vLLM's convention: -1 (or 0) turns top-k off.
  sampling.top_k = top_k->has_value() && **top_k > 0 ? static_cast<uint32_t>(**top_k) : 0;
  for (auto [field, target] : {std::pair{"presence_penalty", &sampling.presence_penalty},
                               std::pair{"frequency_penalty", &sampling.frequency_penalty},
                               std::pair{"min_p", &sampling.min_p}}) {
    absl::StatusOr<std::optional<double>> v = GetNumber(j, field);
    if (!v.ok()) return v.status();
    if (v->has_value()) *target = static_cast<float>(**v);
  }
  absl::StatusOr<std::optional<double>> repetition = GetNumber(j, "repetition_penalty");
  if (!repetition.ok()) return repetition.status();
  if (repetition->has_value()) sampling.repetition_penalty = static_cast<float>(**repetition);
  absl::StatusOr<std::vector<TokenBias>> bias = ParseLogitBias(j);
  if (!bias.ok()) return bias.status();
  sampling.logit_bias = *std::move(bias);
  absl::StatusOr<std::optional<bool>> ignore_eos = GetBool(j, "ignore_eos");
  if (!ignore_eos.ok()) return ignore_eos.status();
  r.ignore_eos = ignore_eos->value_or(false);
  absl::StatusOr<std::optional<std::string>> salt = GetString(j, "cache_salt");
  if (!salt.ok()) return salt.status();
  base.cache_salt = salt->value_or("");
  for (auto [field, target] : {std::pair{"prompt_cache_retention", &base.cache_retention},
                               std::pair{"prompt_cache_key", &base.prompt_cache_key}}) {
    absl::StatusOr<std::optional<std::string>> v = GetString(j, field);
    if (!v.ok()) return v.status();
    *target = v->value_or("");
  }
  if (absl::StatusOr<std::optional<std::string>> user = GetString(j, "user"); !user.ok()) {
    return user.status();
  }
  if (auto it = j.find("stop_token_ids"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return Invalid("stop_token_ids", "`stop_token_ids` must be an array");
    absl::StatusOr<std::vector<uint32_t>> v = TokenIdArray(*it, "stop_token_ids");
    if (!v.ok()) return v.status();
    r.stop_token_ids = *std::move(v);
  }
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      base.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const json& s : *it) {
        if (!s.is_string())
          return Invalid("stop", "`stop` must be a string or an array of strings");
        base.stop.push_back(s.get<std::string>());
      }
    } else {
      return Invalid("stop", "`stop` must be a string or an array of strings");
    }
  }

  CompletionRequest req;
  absl::StatusOr<std::optional<int64_t>> logprobs = GetInt(j, "logprobs", 0, kMaxOpenAiLogprobs);
  if (!logprobs.ok()) return logprobs.status();
  if (logprobs->has_value()) {
    req.logprobs = static_cast<uint32_t>(**logprobs);
    r.top_logprobs = *req.logprobs;
  }
  absl::StatusOr<std::optional<bool>> echo = GetBool(j, "echo");
  if (!echo.ok()) return echo.status();
  req.echo = echo->value_or(false);
  if (req.echo) {
    // The prompt first in every choice; its logprobs only when asked for (only then are the
    // logits of every prompt position computed).
    r.echo_prompt = true;
    if (req.logprobs.has_value()) r.prompt_logprobs = req.logprobs;
  }
  absl::StatusOr<std::optional<bool>> stream = GetBool(j, "stream");
  if (!stream.ok()) return stream.status();
  req.stream = stream->value_or(false);
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return Invalid("stream_options", "`stream_options` must be an object");
    for (const auto& [key, value] : it->items()) {
      if (key != "include_usage") {
        return Invalid("stream_options",
                       absl::StrCat("unknown field `stream_options.", absl::CHexEscape(key), "`"));
      }
    }
    absl::StatusOr<std::optional<bool>> usage = GetBool(*it, "include_usage");
    if (!usage.ok()) return usage.status();
    if (!req.stream && usage->has_value()) {
      return Invalid("stream_options", "`stream_options` is only allowed with `stream: true`");
    }
    req.include_usage = usage->value_or(false);
  }

  absl::StatusOr<std::vector<GenerateCall>> prompts = ParsePrompts(j);
  if (!prompts.ok()) return prompts.status();
  for (GenerateCall& p : *prompts) {
    GenerateCall call = base;
    call.text = std::move(p.text);
    call.request.prompt = std::move(p.request.prompt);
    // Without a seed each prompt draws its own, so identical prompts sample differently.
    call.request.sampling.seed = seed->has_value() ? static_cast<uint64_t>(**seed) : RandomSeed();
    req.prompts.push_back(std::move(call));
  }
  return req;
}

std::string TokenName(const Tokenizer& tokenizer, uint32_t token_id) {
  const std::string_view bytes = tokenizer.TokenBytes(token_id);
  Utf8StreamDecoder d;
  std::string text = d.Push(bytes);
  if (text.size() == bytes.size() && d.Flush().empty()) return text;
  std::string name = "bytes:";
  for (unsigned char c : bytes) absl::StrAppend(&name, "\\x", absl::Hex(c, absl::kZeroPad2));
  return name;
}

namespace {

// A token's `top_logprobs` entry: the most likely entries, then the token itself when it is
// not among them. OpenAI's API "will always return the logprob of the sampled token, so
// there may be up to logprobs+1 elements" (vLLM does the same, for prompt tokens too).
std::vector<std::pair<std::string, float>> TopEntries(const Tokenizer& tokenizer, uint32_t token_id,
                                                      float logprob,
                                                      const std::vector<TokenLogprob>& entries) {
  std::vector<std::pair<std::string, float>> top;
  bool listed = false;
  for (const TokenLogprob& e : entries) {
    top.emplace_back(TokenName(tokenizer, e.token_id), e.logprob);
    listed = listed || e.token_id == token_id;
  }
  if (!listed) top.emplace_back(TokenName(tokenizer, token_id), logprob);
  return top;
}

// One token's logprobs entry at the end of the choice's text, when logprobs were asked for.
void AppendLogprobs(const Tokenizer& tokenizer, const OutputToken& t, Choice* choice) {
  if (!choice->logprobs.has_value()) return;
  ChoiceLogprobs& lp = *choice->logprobs;
  lp.tokens.push_back(TokenName(tokenizer, t.token_id));
  lp.token_logprobs.push_back(t.logprob);
  lp.top_logprobs.push_back(TopEntries(tokenizer, t.token_id, t.logprob, t.top));
  lp.text_offset.push_back(static_cast<uint32_t>(choice->text.size()));
}

}  // namespace

void AppendToChoice(const Tokenizer& tokenizer, const SampleOutput& out, Choice* choice) {
  for (const OutputToken& t : out.tokens) {
    AppendLogprobs(tokenizer, t, choice);
    choice->text += t.text;
  }
  choice->text += out.trailing_text;
  // The stop token (EOS, a stop id) that ended the choice: in its logprobs, as OpenAI and
  // vLLM list it, but not in its text. lm-evaluation-harness scores an echoed prompt with
  // max_tokens 1 by dropping the last entry, taken to be the one generated token.
  if (out.stop_token.has_value()) AppendLogprobs(tokenizer, *out.stop_token, choice);
  if (out.finish_reason != FinishReason::kNone) choice->finish_reason = out.finish_reason;
}

void AppendPromptToChoice(const Tokenizer& tokenizer, const std::vector<PromptToken>& prompt,
                          Choice* choice) {
  Utf8StreamDecoder decoder;
  for (const PromptToken& t : prompt) {
    if (choice->logprobs.has_value()) {
      ChoiceLogprobs& lp = *choice->logprobs;
      lp.tokens.push_back(TokenName(tokenizer, t.token_id));
      lp.token_logprobs.push_back(t.has_logprob ? t.logprob
                                                : std::numeric_limits<float>::quiet_NaN());
      // The first token has none (null in the JSON).
      lp.top_logprobs.push_back(t.has_logprob ? TopEntries(tokenizer, t.token_id, t.logprob, t.top)
                                              : std::vector<std::pair<std::string, float>>());
      lp.text_offset.push_back(static_cast<uint32_t>(choice->text.size()));
    }
    choice->text += decoder.Push(tokenizer.TokenBytes(t.token_id));
  }
  choice->text += decoder.Flush();
}

ojson UsageJson(const Usage& u, const std::string& prompt_cache_key) {
  ojson j{{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          // OpenAI's cached_tokens, prefixd's split of it by where it came from, and the part
          // retained blocks served.
          {"prompt_tokens_details",
           {{"cached_tokens", u.cached_prompt_tokens},
            {"cached_pool_tokens",
             u.cached_prompt_tokens - u.cached_disk_tokens - u.cached_remote_tokens},
            {"cached_disk_tokens", u.cached_disk_tokens},
            {"cached_remote_tokens", u.cached_remote_tokens},
            {"cached_retained_tokens", u.cached_retained_tokens}}}};
  if (!prompt_cache_key.empty()) j["prompt_cache_key"] = prompt_cache_key;
  return j;
}

ojson ChoiceJson(const Choice& c) {
  ojson choice{{"index", c.index}, {"text", c.text}, {"logprobs", nullptr}};
  if (c.logprobs.has_value()) {
    ojson top = ojson::array();
    ojson token_logprobs = ojson::array();
    for (float lp : c.logprobs->token_logprobs) {
      if (std::isnan(lp)) {
        token_logprobs.push_back(nullptr);
      } else {
        token_logprobs.push_back(lp);
      }
    }
    for (size_t i = 0; i < c.logprobs->top_logprobs.size(); ++i) {
      const auto& entries = c.logprobs->top_logprobs[i];
      if (i < c.logprobs->token_logprobs.size() && std::isnan(c.logprobs->token_logprobs[i])) {
        top.push_back(nullptr);  // the echoed prompt's first token
        continue;
      }
      // Most probable first, as OpenAI sends them (an ordered object). Two ids with the same
      // text keep the first, the more probable.
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const auto& [name, lp] : entries) {
        if (!o.contains(name)) o[name] = lp;
      }
      top.push_back(std::move(o));
    }
    choice["logprobs"] = ojson{{"tokens", c.logprobs->tokens},
                               {"token_logprobs", std::move(token_logprobs)},
                               {"top_logprobs", std::move(top)},
                               {"text_offset", c.logprobs->text_offset}};
  }
  switch (c.finish_reason) {
    case FinishReason::kLength:
      choice["finish_reason"] = "length";
      break;
    case FinishReason::kStop:
      choice["finish_reason"] = "stop";
      break;
    case FinishReason::kNone:
      choice["finish_reason"] = nullptr;
      break;
  }
  return choice;
}

namespace {

ojson Header(const ResponseHeader& h) {
  return ojson{
      {"id", h.id}, {"object", "text_completion"}, {"created", h.created}, {"model", h.model}};
}

// Invalid UTF-8 cannot reach here (text is decoded with U+FFFD), but token names and
// error messages are escaped rather than thrown on if it ever did.
std::string Dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

}  // namespace

std::string CompletionJson(const ResponseHeader& header, const std::vector<Choice>& choices,
                           const Usage& usage) {
  ojson j = Header(header);
  j["choices"] = ojson::array();
  for (const Choice& c : choices) j["choices"].push_back(ChoiceJson(c));
  j["usage"] = UsageJson(usage, header.prompt_cache_key);
  return Dump(j);
}

std::string CompletionChunk(const ResponseHeader& header, const Choice& delta) {
  ojson j = Header(header);
  j["choices"] = ojson::array({ChoiceJson(delta)});
  return absl::StrCat("data: ", Dump(j), "\n\n");
}

std::string UsageChunk(const ResponseHeader& header, const Usage& usage) {
  ojson j = Header(header);
  j["choices"] = ojson::array();
  j["usage"] = UsageJson(usage, header.prompt_cache_key);
  return absl::StrCat("data: ", Dump(j), "\n\n");
}

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:  // an adapter name in use
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;  // the client went away (nginx's code; nobody reads it)
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

std::string ErrorJson(const absl::Status& status) {
  const char* type = "server_error";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
      type = "invalid_request_error";
      break;
    case absl::StatusCode::kUnauthenticated:
      type = "authentication_error";
      break;
    case absl::StatusCode::kPermissionDenied:
      type = "permission_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      type = "rate_limit_error";
      break;
    default:
      break;
  }
  const std::string field = InvalidField(status);
  ojson error{{"message", std::string(status.message())},
              {"type", type},
              {"param", field.empty() ? ojson(nullptr) : ojson(field)},
              {"code", status.code() == absl::StatusCode::kNotFound && field == "model"
                           ? ojson("model_not_found")
                           : ojson(absl::StatusCodeToString(status.code()))}};
  return Dump(ojson{{"error", std::move(error)}});
}

std::string_view OpenAiFieldName(RequestField field) {
  switch (field) {
    case RequestField::kNone:
      break;
    case RequestField::kRequestId:
      return "request_id";  // the API has none: the server names every request
    case RequestField::kPrompt:
      return "prompt";
    case RequestField::kMaxNewTokens:
      return "max_tokens";
    case RequestField::kTemperature:
      return "temperature";
    case RequestField::kTopK:
      return "top_k";
    case RequestField::kTopP:
      return "top_p";
    case RequestField::kSeed:
      return "seed";
    case RequestField::kPresencePenalty:
      return "presence_penalty";
    case RequestField::kFrequencyPenalty:
      return "frequency_penalty";
    case RequestField::kRepetitionPenalty:
      return "repetition_penalty";
    case RequestField::kMinP:
      return "min_p";
    case RequestField::kLogitBias:
      return "logit_bias";
    case RequestField::kStopTokenIds:
      return "stop_token_ids";
    case RequestField::kIgnoreEos:
      return "ignore_eos";
    case RequestField::kNumSamples:
      return "n";
    case RequestField::kEchoPrompt:
      return "echo";
    case RequestField::kTopLogprobs:
    case RequestField::kPromptLogprobs:  // `logprobs` with `echo`
      return "logprobs";
    case RequestField::kAdapter:
      return "model";
    case RequestField::kStop:
      return "stop";
    case RequestField::kCacheSalt:
      return "cache_salt";
    case RequestField::kCacheRetention:
      return "prompt_cache_retention";
  }
  return "body";
}

absl::Status ToOpenAiError(const absl::Status& status) {
  return NameRequestField(status, OpenAiFieldName);
}

absl::StatusOr<std::pair<std::string, std::string>> ParseLoadLoraAdapterRequest(
    const std::string& body) {
  absl::StatusOr<json> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  for (const auto& [key, value] : parsed->items()) {
    if (key != "lora_name" && key != "lora_path") {
      return Invalid(key, absl::StrCat("unknown field `", absl::CHexEscape(key),
                                       "` (expected lora_name and lora_path)"));
    }
  }
  absl::StatusOr<std::optional<std::string>> name = GetString(*parsed, "lora_name");
  if (!name.ok()) return name.status();
  absl::StatusOr<std::optional<std::string>> path = GetString(*parsed, "lora_path");
  if (!path.ok()) return path.status();
  if (!name->has_value()) return Invalid("lora_name", "`lora_name` (a string) is required");
  if (!path->has_value()) return Invalid("lora_path", "`lora_path` (a string) is required");
  return std::make_pair(**name, **path);
}

absl::StatusOr<std::string> ParseUnloadLoraAdapterRequest(const std::string& body) {
  absl::StatusOr<json> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  for (const auto& [key, value] : parsed->items()) {
    if (key != "lora_name") {
      return Invalid(
          key, absl::StrCat("unknown field `", absl::CHexEscape(key), "` (expected lora_name)"));
    }
  }
  absl::StatusOr<std::optional<std::string>> name = GetString(*parsed, "lora_name");
  if (!name.ok()) return name.status();
  if (!name->has_value()) return Invalid("lora_name", "`lora_name` (a string) is required");
  return **name;
}

absl::StatusOr<TokenizeBody> ParseTokenizeRequest(const std::string& body,
                                                  const std::string& served_model) {
  absl::StatusOr<json> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  for (const auto& [key, value] : parsed->items()) {
    if (key != "model" && key != "prompt" && key != "add_special_tokens") {
      return Invalid(key, absl::StrCat("unknown field `", absl::CHexEscape(key), "`"));
    }
  }
  if (auto it = parsed->find("add_special_tokens"); it != parsed->end() && !it->is_boolean()) {
    return Invalid("add_special_tokens", "`add_special_tokens` must be true or false");
  }
  absl::StatusOr<std::string> adapter = ModelAdapter(*parsed, served_model);
  if (!adapter.ok()) return adapter.status();
  absl::StatusOr<std::optional<std::string>> prompt = GetString(*parsed, "prompt");
  if (!prompt.ok()) return prompt.status();
  if (!prompt->has_value()) return Invalid("prompt", "`prompt` (a string) is required");
  return TokenizeBody{**prompt, *std::move(adapter)};
}

absl::StatusOr<DetokenizeBody> ParseDetokenizeRequest(const std::string& body,
                                                      const std::string& served_model) {
  absl::StatusOr<json> parsed = ParseObject(body);
  if (!parsed.ok()) return parsed.status();
  for (const auto& [key, value] : parsed->items()) {
    if (key != "model" && key != "tokens") {
      return Invalid(key, absl::StrCat("unknown field `", absl::CHexEscape(key), "`"));
    }
  }
  absl::StatusOr<std::string> adapter = ModelAdapter(*parsed, served_model);
  if (!adapter.ok()) return adapter.status();
  auto it = parsed->find("tokens");
  if (it == parsed->end() || !it->is_array()) {
    return Invalid("tokens", "`tokens` (an array of token ids) is required");
  }
  absl::StatusOr<std::vector<uint32_t>> ids = TokenIdArray(*it, "tokens");
  if (!ids.ok()) return ids.status();
  return DetokenizeBody{*std::move(ids), *std::move(adapter)};
}

}  // namespace prefixd
