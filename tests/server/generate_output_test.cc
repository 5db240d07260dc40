// GenerateOutput, token by token: text decoding, the stop-string hold-back, the straddling
// token, multi-byte UTF-8, per-sample ends and usage. The tokenizer is a fake whose token
// bytes are chosen by each test.
#include "server/generate_output.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

class FakeTokenizer final : public Tokenizer {
 public:
  explicit FakeTokenizer(std::map<uint32_t, std::string> bytes) : bytes_(std::move(bytes)) {}
  std::vector<uint32_t> Encode(std::string_view) const override { return {}; }
  std::vector<uint32_t> EncodeAtMost(std::string_view, size_t) const override { return {}; }
  size_t max_token_bytes() const override {
    size_t longest = 1;
    for (const auto& [id, b] : bytes_) longest = std::max(longest, b.size());
    return longest;
  }
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t>) const override { return ""; }
  std::string_view TokenBytes(uint32_t id) const override { return bytes_.at(id); }
  size_t vocab_size() const override { return bytes_.size(); }

 private:
  std::map<uint32_t, std::string> bytes_;
};

RequestEvent Token(uint32_t id, uint32_t sample = 0) {
  RequestEvent e;
  e.kind = RequestEvent::Kind::kToken;
  e.sample_index = sample;
  e.token.token_id = id;
  e.token.logprob = -0.5f * static_cast<float>(id);
  return e;
}

RequestEvent Finished(FinishReason reason, uint32_t sample = 0) {
  RequestEvent e;
  e.kind = RequestEvent::Kind::kSampleFinished;
  e.sample_index = sample;
  e.finish_reason = reason;
  return e;
}

RequestEvent Done(uint32_t completion_tokens) {
  RequestEvent e;
  e.kind = RequestEvent::Kind::kDone;
  e.usage.prompt_tokens = 3;
  e.usage.completion_tokens = completion_tokens;
  return e;
}

struct Taken {
  std::vector<uint32_t> ids;
  std::vector<std::string> texts;
  std::string text;
  FinishReason finish = FinishReason::kNone;
};

// Everything ready for sample 0 now.
Taken Take(GenerateOutput& out) {
  Taken t;
  SampleOutput s;
  while (out.Next(&s)) {
    EXPECT_EQ(s.sample_index, 0u);
    for (const OutputToken& tok : s.tokens) {
      t.ids.push_back(tok.token_id);
      t.texts.push_back(tok.text);
      t.text += tok.text;
    }
    t.text += s.trailing_text;
    if (s.finish_reason != FinishReason::kNone) t.finish = s.finish_reason;
  }
  return t;
}

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(GenerateOutputTest, WithoutStopStringsEveryTokenGoesOutAtOnce) {
  FakeTokenizer tok({{1, "Hel"}, {2, "lo"}, {3, " world"}});
  GenerateOutput out(tok, 1, {});
  out.Add({Token(1)});
  Taken t = Take(out);
  EXPECT_THAT(t.ids, ElementsAre(1u));
  EXPECT_EQ(t.text, "Hel");
  out.Add({Token(2), Token(3), Finished(FinishReason::kLength), Done(3)});
  t = Take(out);
  EXPECT_THAT(t.ids, ElementsAre(2u, 3u));
  EXPECT_THAT(t.texts, ElementsAre("lo", " world"));
  EXPECT_EQ(t.finish, FinishReason::kLength);
  EXPECT_TRUE(out.done());
  EXPECT_TRUE(out.status().ok());
  EXPECT_EQ(out.usage().completion_tokens, 3u);
  EXPECT_THAT(out.StoppedSamples(), IsEmpty());
}

TEST(GenerateOutputTest, AStopStringAcrossTokensIsHeldBackThenCut) {
  // Text "ab" + "c E" + "ND" + "x": stop "END" starts inside token 2 and ends in token 3.
  FakeTokenizer tok({{1, "ab"}, {2, "c E"}, {3, "ND"}, {4, "x"}});
  GenerateOutput out(tok, 1, {"END"});
  out.Add({Token(1)});
  Taken t = Take(out);
  EXPECT_THAT(t.ids, ElementsAre(1u)) << "\"ab\" cannot begin \"END\"";
  out.Add({Token(2)});
  t = Take(out);
  EXPECT_THAT(t.ids, IsEmpty()) << "\"c E\" ends with \"E\", which may begin \"END\": held";
  EXPECT_EQ(t.finish, FinishReason::kNone);
  out.Add({Token(3)});
  t = Take(out);
  // Token 2 straddles the stop string's start: sent, with only the text before it. Token 3
  // lies wholly inside the stop string: not sent. Nothing after.
  EXPECT_THAT(t.ids, ElementsAre(2u));
  EXPECT_THAT(t.texts, ElementsAre("c "));
  EXPECT_EQ(t.finish, FinishReason::kStop);
  EXPECT_THAT(out.StoppedSamples(), ElementsAre(0u));
  EXPECT_THAT(out.StoppedSamples(), IsEmpty()) << "reported once";
  // The engine goes on until it sees StopSample: later tokens and its finish are ignored.
  out.Add({Token(4), Finished(FinishReason::kLength), Done(4)});
  t = Take(out);
  EXPECT_THAT(t.ids, IsEmpty());
  EXPECT_EQ(t.finish, FinishReason::kNone) << "the finish was already sent";
  EXPECT_TRUE(out.done());
  EXPECT_EQ(out.usage().completion_tokens, 2u) << "the ids sent";
}

TEST(GenerateOutputTest, AHeldPrefixThatDivergesIsReleased) {
  FakeTokenizer tok({{1, "EN"}, {2, "ough"}, {3, "!"}});
  GenerateOutput out(tok, 1, {"END"});
  out.Add({Token(1)});
  EXPECT_THAT(Take(out).ids, IsEmpty());
  out.Add({Token(2)});
  Taken t = Take(out);
  EXPECT_THAT(t.ids, ElementsAre(1u, 2u));
  EXPECT_EQ(t.text, "ENough");
  out.Add({Token(3), Finished(FinishReason::kLength), Done(3)});
  t = Take(out);
  EXPECT_EQ(t.text, "!");
  EXPECT_EQ(t.finish, FinishReason::kLength);
  EXPECT_EQ(out.usage().completion_tokens, 3u);
}

TEST(GenerateOutputTest, AStopStringAtATokenBoundarySendsNothingOfIt) {
  FakeTokenizer tok({{1, "one"}, {2, "\n\n"}, {3, "two"}});
  GenerateOutput out(tok, 1, {"\n\n"});
  out.Add({Token(1), Token(2), Token(3)});
  Taken t = Take(out);
  EXPECT_THAT(t.ids, ElementsAre(1u));
  EXPECT_EQ(t.text, "one");
  EXPECT_EQ(t.finish, FinishReason::kStop);
}

TEST(GenerateOutputTest, AStopStringInsideOneTokenCutsThatToken) {
  FakeTokenizer tok({{1, "say STOP now"}});
  GenerateOutput out(tok, 1, {"STOP"});
  out.Add({Token(1)});
  Taken t = Take(out);
  EXPECT_THAT(t.ids, ElementsAre(1u));
  EXPECT_THAT(t.texts, ElementsAre("say "));
  EXPECT_EQ(t.finish, FinishReason::kStop);
}

TEST(GenerateOutputTest, TheEarliestOfSeveralStopStringsWins) {
  FakeTokenizer tok({{1, "a;b.c"}});
  GenerateOutput out(tok, 1, {".", ";"});
  out.Add({Token(1)});
  EXPECT_EQ(Take(out).text, "a");
}

// Overlapping stop strings: "bc" is complete one character before "abcd", which contains
// it, so the text is cut at "bc" however the tokens split "abcd" (the cut is a function of
// the text alone, as it is when tokens arrive one character at a time).
TEST(GenerateOutputTest, TheStopStringThatEndsFirstWinsWhateverTheTokenBoundaries) {
  FakeTokenizer tok({{1, "ab"}, {2, "c"}, {3, "d"}, {4, "abcd"}, {5, "a"}, {6, "bcd"}});
  for (const std::vector<uint32_t>& ids :
       std::vector<std::vector<uint32_t>>{{1, 2, 3}, {4}, {5, 6}}) {
    GenerateOutput out(tok, 1, {"abcd", "bc"});
    for (uint32_t id : ids) out.Add({Token(id)});
    const Taken t = Take(out);
    EXPECT_EQ(t.text, "a") << "tokens " << ::testing::PrintToString(ids);
    EXPECT_EQ(t.finish, FinishReason::kStop);
  }
}

TEST(GenerateOutputTest, MultiByteCharactersSplitAcrossTokens) {
  // "é" is C3 A9; "€" is E2 82 AC. Tokens split both characters.
  FakeTokenizer tok({{1, "caf\xC3"}, {2, "\xA9 \xE2\x82"}, {3, "\xAC"}, {4, "5"}});
  GenerateOutput out(tok, 1, {"\xE2\x82\xAC"});  // stop at "€"
  out.Add({Token(1)});
  Taken t = Take(out);
  EXPECT_THAT(t.ids, ElementsAre(1u));
  EXPECT_EQ(t.text, "caf") << "an incomplete character waits for its bytes";
  out.Add({Token(2)});
  t = Take(out);
  // "é " is complete; "€" is still incomplete, so token 2's text so far is "é " and it can
  // go out: no decoded text could begin the stop string yet.
  EXPECT_THAT(t.ids, ElementsAre(2u));
  EXPECT_EQ(t.text, "\xC3\xA9 ");
  out.Add({Token(3), Token(4)});
  t = Take(out);
  EXPECT_THAT(t.ids, IsEmpty()) << "token 3 completes \"€\": the stop string, never sent";
  EXPECT_EQ(t.finish, FinishReason::kStop);
}

TEST(GenerateOutputTest, AnIncompleteCharacterAtTheEndBecomesReplacement) {
  FakeTokenizer tok({{1, "ok"}, {2, "\xE2\x82"}});
  GenerateOutput out(tok, 1, {});
  out.Add({Token(1), Token(2)});
  Taken t = Take(out);
  EXPECT_THAT(t.ids, ElementsAre(1u, 2u));
  EXPECT_EQ(t.text, "ok");
  out.Add({Finished(FinishReason::kLength), Done(2)});
  t = Take(out);
  EXPECT_EQ(t.text, "\xEF\xBF\xBD");  // U+FFFD, as trailing text of the sent token
  EXPECT_EQ(t.finish, FinishReason::kLength);
}

TEST(GenerateOutputTest, SamplesStopIndependently) {
  FakeTokenizer tok({{1, "x"}, {2, "#"}, {3, "y"}});
  GenerateOutput out(tok, 2, {"#"});
  out.Add({Token(1, 0), Token(1, 1), Token(2, 0), Token(3, 1)});
  std::map<uint32_t, std::string> text;
  std::map<uint32_t, FinishReason> finish;
  SampleOutput s;
  while (out.Next(&s)) {
    for (const OutputToken& t : s.tokens) text[s.sample_index] += t.text;
    if (s.finish_reason != FinishReason::kNone) finish[s.sample_index] = s.finish_reason;
  }
  EXPECT_EQ(text[0], "x");
  EXPECT_EQ(finish[0], FinishReason::kStop);
  EXPECT_EQ(text[1], "xy");
  EXPECT_EQ(finish.count(1), 0u);
  EXPECT_THAT(out.StoppedSamples(), ElementsAre(0u));
  out.Add({Finished(FinishReason::kStop, 0), Finished(FinishReason::kLength, 1), Done(4)});
  while (out.Next(&s)) {
    if (s.finish_reason != FinishReason::kNone) finish[s.sample_index] = s.finish_reason;
  }
  EXPECT_EQ(finish[1], FinishReason::kLength);
  EXPECT_TRUE(out.done());
  EXPECT_EQ(out.usage().completion_tokens, 3u) << "1 sent for sample 0, 2 for sample 1";
}

TEST(GenerateOutputTest, AnErrorEndsTheRequestWithItsStatus) {
  FakeTokenizer tok({{1, "a"}});
  GenerateOutput out(tok, 1, {});
  RequestEvent done;
  done.kind = RequestEvent::Kind::kDone;
  done.status = absl::UnavailableError("server is shutting down");
  out.Add({Token(1), done});
  EXPECT_FALSE(out.done()) << "the token before the error is still to be sent";
  EXPECT_EQ(Take(out).text, "a");
  EXPECT_TRUE(out.done());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace prefixd
