// Tokenizer: GPT-2 exactness against OpenAI's encoder (golden file made by
// testdata/make_tokenizer_golden.js), pre-tokenizer splits, byte round trips including
// invalid UTF-8, BPE semantics on a tiny vocabulary, and Load's errors.
#include "engine/tokenizer.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "engine/internal/bpe_pretokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kDir = PREFIXD_TOKENIZER_DIR;

class Gpt2TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = Tokenizer::Load(kDir + "/vocab.json", kDir + "/merges.txt");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok).release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  // The tokens of `text`, as strings, to read failures easily.
  static std::vector<std::string> Pieces(std::string_view text) {
    std::vector<std::string> out;
    for (uint32_t id : tok_->Encode(text)) out.emplace_back(tok_->TokenBytes(id));
    return out;
  }
  static void ExpectRoundTrip(std::string_view bytes) {
    const std::vector<uint32_t> ids = tok_->Encode(bytes);
    auto back = tok_->Decode(ids);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, bytes);
  }
  static Tokenizer* tok_;
};
Tokenizer* Gpt2TokenizerTest::tok_ = nullptr;

TEST_F(Gpt2TokenizerTest, KnownIds) {
  EXPECT_EQ(tok_->vocab_size(), 50257u);
  EXPECT_THAT(tok_->Encode("Hello world"), ElementsAre(15496, 995));
  EXPECT_EQ(tok_->TokenBytes(15496), "Hello");
  EXPECT_EQ(tok_->TokenBytes(995), " world");
  EXPECT_EQ(tok_->TokenBytes(50256), "<|endoftext|>");
  EXPECT_EQ(tok_->TokenBytes(50257), "");
  EXPECT_EQ(tok_->TokenBytes(0xFFFFFFFFu), "");
  EXPECT_TRUE(tok_->Encode("").empty());
  // Byte tokens: '!' is id 0 and the space byte is 220 ("Ġ").
  EXPECT_THAT(tok_->Encode("!"), ElementsAre(0));
  EXPECT_THAT(tok_->Encode(" "), ElementsAre(220));
}

TEST_F(Gpt2TokenizerTest, HandCheckedSplits) {
  EXPECT_THAT(Pieces("I'm sure they'll"), ElementsAre("I", "'m", " sure", " they", "'ll"));
  // Two spaces before a word: the run gives its last space to the word.
  EXPECT_THAT(Pieces("a  b"), ElementsAre("a", " ", " b"));
  // Before a non-space, a newline run also gives back its last newline.
  EXPECT_THAT(Pieces("x\n\ny"), ElementsAre("x", "\n", "\n", "y"));
  EXPECT_THAT(Pieces("x\n\n"), ElementsAre("x", "\n\n"));
  EXPECT_THAT(Pieces("12345"), ElementsAre("123", "45"));
  // "<|endoftext|>" in text is ordinary text, never the special token 50256.
  const std::vector<uint32_t> eot = tok_->Encode("<|endoftext|>");
  EXPECT_THAT(eot, ::testing::Not(::testing::Contains(50256u)));
  EXPECT_GT(eot.size(), 1u);
}

TEST_F(Gpt2TokenizerTest, MatchesOpenAiGoldenCorpus) {
  std::ifstream in(std::string(PREFIXD_SOURCE_DIR) +
                   "/tests/engine/testdata/tokenizer_golden.jsonl");
  ASSERT_TRUE(in) << "golden file missing";
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string text = j.at("text").get<std::string>();
    const std::vector<uint32_t> want = j.at("ids").get<std::vector<uint32_t>>();
    EXPECT_EQ(tok_->Encode(text), want) << "line " << n + 1 << ": " << text;
    auto back = tok_->Decode(want);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text) << "line " << n + 1;
    ++n;
  }
  EXPECT_GE(n, 600);
}

TEST_F(Gpt2TokenizerTest, RoundTripsInvalidUtf8) {
  const std::vector<std::string> cases = {
      std::string("\xff"),
      std::string("a\xff"
                  "b"),
      std::string(" \xff\xfe x"),
      std::string("\xe2\x82"),                  // truncated 3-byte character
      std::string("caf\xc3"),                   // truncated at the end
      std::string("\xc0\xaf"),                  // overlong '/'
      std::string("\xed\xa0\x80\xed\xb0\x80"),  // UTF-8-encoded surrogates
      std::string("\xf4\x90\x80\x80"),          // above U+10FFFF
      std::string("\x80\x80\x80 abc  \xf5"),
      std::string("  \xff"),
      std::string("\xff  x"),
      std::string("x\0y", 3),
      std::string("\0", 1)};
  for (const std::string& c : cases) ExpectRoundTrip(c);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  ExpectRoundTrip(all);
}

TEST_F(Gpt2TokenizerTest, RoundTripsRandomBytes) {
  std::mt19937 rng(7);
  // Biased toward bytes that build (and break) UTF-8 sequences and whitespace.
  const std::string alphabet =
      std::string("ab '\n\t 1.", 9) + "\xc3\xa9\xe2\x80\x8d\xf0\x9f\x98\x80\xff\x80";
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s(rng() % 64, '\0');
    for (char& c : s)
      c = rng() % 3 == 0 ? static_cast<char>(rng()) : alphabet[rng() % alphabet.size()];
    ExpectRoundTrip(s);
  }
}

TEST_F(Gpt2TokenizerTest, LongPiecesRoundTrip) {
  // One pre-token each: BPE must stay fast (O(n log n)) on them.
  ExpectRoundTrip(std::string(50000, ' '));
  ExpectRoundTrip(std::string(50000, 'a'));
  ExpectRoundTrip(std::string(20000, '\n') + "x");
  // Ids checked with the JS oracle on shorter runs: "aaaa" is 24794, " " is 220.
  EXPECT_EQ(tok_->Encode(std::string(50000, 'a')), std::vector<uint32_t>(12500, 24794));
  EXPECT_EQ(tok_->Encode(std::string(50000, ' ')), std::vector<uint32_t>(50000, 220));
}

TEST_F(Gpt2TokenizerTest, EncodeAtMostStopsPastTheLimit) {
  const std::string text = "Hello world, this is a test of a limit.";
  const std::vector<uint32_t> all = tok_->Encode(text);
  ASSERT_GT(all.size(), 5u);
  EXPECT_EQ(tok_->EncodeAtMost(text, all.size()), all);
  EXPECT_EQ(tok_->EncodeAtMost(text, 1000), all);
  // Past the limit it stops: more than the limit, a prefix of the whole encoding.
  const std::vector<uint32_t> cut = tok_->EncodeAtMost(text, 3);
  EXPECT_GT(cut.size(), 3u);
  EXPECT_LT(cut.size(), all.size());
  EXPECT_TRUE(std::equal(cut.begin(), cut.end(), all.begin()));
  // GPT-2's longest tokens are 128 bytes (runs of repeated characters).
  EXPECT_EQ(tok_->max_token_bytes(), 128u);
}

TEST_F(Gpt2TokenizerTest, DecodeRejectsOutOfRangeIds) {
  auto bad = tok_->Decode(std::vector<uint32_t>{15496, 50257});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("50257"));
  // A token may end inside a UTF-8 character: Decode returns the raw bytes.
  const std::vector<uint32_t> ids = tok_->Encode("\xF0\x9F\xA4\x96");  // U+1F916, 3 tokens
  ASSERT_GT(ids.size(), 1u);
  auto first = tok_->Decode(absl::MakeConstSpan(ids).subspan(0, 1));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, std::string_view("\xF0\x9F\xA4\x96").substr(0, first->size()));
}

TEST_F(Gpt2TokenizerTest, ConcurrentEncodesAgree) {
  const std::string text =
      "Concurrent encodes share one tokenizer: caf\xc3\xa9, \xe4\xb8\xad\xe6\x96\x87, 123.";
  const std::vector<uint32_t> want = tok_->Encode(text);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) ok[t] += tok_->Encode(text) == want;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ok[t], 200);
}

// ---- Pre-tokenizer -------------------------------------------------------------------------

std::vector<std::string> Split(std::string_view text) {
  std::vector<std::string> out;
  internal::PreTokenize(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

TEST(PreTokenizeTest, WhitespaceRunsEmulateLookahead) {
  EXPECT_THAT(Split("a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(Split("a \nb"), ElementsAre("a", " ", "\n", "b"));
  EXPECT_THAT(Split("a\nb"), ElementsAre("a", "\n", "b"));
  EXPECT_THAT(Split("end  "), ElementsAre("end", "  "));
  EXPECT_THAT(Split("   "), ElementsAre("   "));
  EXPECT_THAT(Split("  !!"), ElementsAre(" ", " !!"));
  EXPECT_THAT(Split("x \t\n y"), ElementsAre("x", " \t\n", " y"));
}

TEST(PreTokenizeTest, ClassesAndContractions) {
  EXPECT_THAT(Split("I'm you'll we'd"), ElementsAre("I", "'m", " you", "'ll", " we", "'d"));
  EXPECT_THAT(Split("DON'T"), ElementsAre("DON", "'", "T"));  // contractions are case-sensitive
  EXPECT_THAT(Split("abc123 45.6"), ElementsAre("abc", "123", " 45", ".", "6"));
  EXPECT_THAT(Split("caf\xc3\xa9!?"), ElementsAre("caf\xc3\xa9", "!?"));
  EXPECT_THAT(Split("\xe4\xb8\xad\xe6\x96\x87 \xe2\x85\xa7"),  // "中文 Ⅷ": Ⅷ is \p{N}
              ElementsAre("\xe4\xb8\xad\xe6\x96\x87", " \xe2\x85\xa7"));
  // Emoji with a zero-width joiner: all non-letter, non-space: one punctuation run.
  EXPECT_THAT(Split(" \xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb"),
              ElementsAre(" \xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb"));
}

TEST(PreTokenizeTest, UnicodeWhitespaceFollowsPython) {
  // NBSP and U+3000 are Python whitespace: the run gives its last one to the next piece;
  // only an ASCII space joins a word.
  EXPECT_THAT(Split("x\xc2\xa0\xc2\xa0y"), ElementsAre("x", "\xc2\xa0", "\xc2\xa0", "y"));
  EXPECT_THAT(Split("x\xe3\x80\x80y"), ElementsAre("x", "\xe3\x80\x80", "y"));
  // U+0085 is whitespace in Python (not in JS); U+FEFF is whitespace in JS (not in Python).
  EXPECT_THAT(Split("a\xc2\x85\xc2\x85"), ElementsAre("a", "\xc2\x85\xc2\x85"));
  EXPECT_THAT(Split("a \xef\xbb\xbf"), ElementsAre("a", " \xef\xbb\xbf"));
}

std::vector<std::string> SplitWithRe2Only(std::string_view text) {
  std::vector<std::string> out;
  internal::PreTokenizeWithRe2Only(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

TEST(PreTokenizeTest, AsciiFastPathAgreesWithRe2) {
  // Fragments chosen to meet at every kind of boundary: ASCII classes next to Unicode
  // letters, digits, spaces, punctuation and invalid bytes.
  const std::vector<std::string> parts = {"a",
                                          "Z",
                                          "7",
                                          " ",
                                          " ",
                                          "  ",
                                          "\n",
                                          "\t",
                                          "\r\n",
                                          "'",
                                          "'s",
                                          "'ll",
                                          "'re",
                                          "'x",
                                          "!",
                                          ".",
                                          "-",
                                          "\x1f",
                                          "\x7f",
                                          "\xc3\xa9",
                                          "\xc2\xa0",
                                          "\xe3\x80\x80",
                                          "\xc2\x85",
                                          "\xe4\xb8\xad",
                                          "\xe2\x80\x94",
                                          "\xe2\x85\xa7",
                                          "\xf0\x9f\x98\x80",
                                          "\xef\xbb\xbf",
                                          "\xff",
                                          "\xe2\x82"};
  std::mt19937 rng(11);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s;
    for (int k = rng() % 12; k >= 0; --k) s += parts[rng() % parts.size()];
    ASSERT_EQ(Split(s), SplitWithRe2Only(s)) << ::testing::PrintToString(s);
  }
}

TEST(PreTokenizeTest, InvalidBytesAreTheirOwnPieces) {
  EXPECT_THAT(Split("a\xff"
                    "b"),
              ElementsAre("a", "\xff", "b"));
  EXPECT_THAT(Split("a\xff\xfe\x80 b"), ElementsAre("a", "\xff\xfe\x80", " b"));
  // A space run before an invalid byte treats it as non-space.
  EXPECT_THAT(Split("a  \xff"), ElementsAre("a", " ", " ", "\xff"));
  EXPECT_THAT(Split("\xe2\x82"), ElementsAre("\xe2\x82"));
  EXPECT_THAT(Split("ok\xe2\x82"), ElementsAre("ok", "\xe2\x82"));
}

// ---- A tiny vocabulary: BPE semantics and Load errors -------------------------------------

// GPT-2's byte alphabet (encoder.py's bytes_to_unicode), written independently of the
// tokenizer's copy.
std::string Spell(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    int cp = b;
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    if (!printable) {
      int n = 0;
      for (int x = 0; x < b; ++x) {
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) ++n;
      }
      cp = 256 + n;
    }
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

class TinyVocabTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/tokenizer_test_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }
  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  // Byte tokens 0..255 (id = byte), then `extra` tokens from 256 on.
  std::string VocabJson(const std::vector<std::string>& extra) {
    nlohmann::json j = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) j[Spell(std::string(1, static_cast<char>(b)))] = b;
    for (size_t i = 0; i < extra.size(); ++i) j[Spell(extra[i])] = 256 + i;
    return j.dump();
  }
  std::string dir_;
};

TEST_F(TinyVocabTest, BpeMergesLowestRankFirstAndLeftmost) {
  const std::string vocab = Write("vocab.json", VocabJson({"ab", "abc", "aa", "bc"}));
  // Ranks: "a b" 0, "ab c" 1, "a a" 2, "b c" 3 ("b c" loses to "a b" on "abc").
  const std::string merges =
      Write("merges.txt", "#version: 0.2\n" + Spell("a") + " " + Spell("b") + "\n" + Spell("ab") +
                              " " + Spell("c") + "\n" + Spell("a") + " " + Spell("a") + "\n" +
                              Spell("b") + " " + Spell("c") + "\n");
  auto tok = Tokenizer::Load(vocab, merges);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 260u);
  EXPECT_THAT((*tok)->Encode("abc"), ElementsAre(257));
  EXPECT_THAT((*tok)->Encode("bc"), ElementsAre(259));
  EXPECT_THAT((*tok)->Encode("aaa"), ElementsAre(258, 'a'));  // leftmost pair first
  EXPECT_THAT((*tok)->Encode("aaaaa"), ElementsAre(258, 258, 'a'));
  EXPECT_THAT((*tok)->Encode("aab"), ElementsAre('a', 256));  // "a b" outranks "a a"
  EXPECT_THAT((*tok)->Encode("abab"), ElementsAre(256, 256));
  EXPECT_THAT((*tok)->Encode("cab"), ElementsAre('c', 256));
}

TEST_F(TinyVocabTest, MissingFilesNameThePath) {
  const std::string merges = Write("merges.txt", "#version: 0.2\n");
  auto no_vocab = Tokenizer::Load(dir_ + "/absent.json", merges);
  EXPECT_EQ(no_vocab.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_vocab.status().message(), HasSubstr("absent.json"));
  const std::string vocab = Write("vocab.json", VocabJson({}));
  auto no_merges = Tokenizer::Load(vocab, dir_ + "/absent.txt");
  EXPECT_EQ(no_merges.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_merges.status().message(), HasSubstr("absent.txt"));
  // Byte tokens and no merges is a valid (if weak) tokenizer.
  auto bytes_only = Tokenizer::Load(vocab, merges);
  ASSERT_TRUE(bytes_only.ok()) << bytes_only.status();
  EXPECT_THAT((*bytes_only)->Encode("hi"), ElementsAre('h', 'i'));
}

TEST_F(TinyVocabTest, MultiByteTokensWithoutMergesAreRefused) {
  // "ab" could never be produced: every text would encode byte by byte.
  const std::string vocab = Write("vocab.json", VocabJson({"ab", "abc"}));
  for (const char* content : {"", "#version: 0.2\n", "\r\n\n"}) {
    const std::string merges = Write("merges.txt", content);
    auto tok = Tokenizer::Load(vocab, merges);
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << content;
    EXPECT_THAT(tok.status().message(), HasSubstr(merges + ": holds no merges, but " + vocab +
                                                  " has 2 tokens longer than one byte"));
  }
  // One merge is enough to make a tokenizer (the rest of "abc" is a byte).
  auto one = Tokenizer::Load(vocab, Write("merges.txt", Spell("a") + " " + Spell("b") + "\n"));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_THAT((*one)->Encode("abc"), ElementsAre(256, 'c'));
}

TEST_F(TinyVocabTest, BadVocabIsRefusedWithTheFileName) {
  const std::string merges = Write("merges.txt", "#version: 0.2\n");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"a\": 0", "not valid JSON"},
      {"[1, 2]", "JSON object"},
      {"{}", "JSON object"},
      {"{\"a\": \"zero\"}", "not an integer"},
      {"{\"a\": -1}", "not an integer"},
      {"{\"a\": 1}", "not an integer"},  // ids must be dense from 0
      {"{\"a\": 0, \"b\": 0}", "used twice"},
      {"{\"a\": 0, \"b\": 1}", "byte 0 has no token"},
      {"{\"a b\": 0}", "byte alphabet"},  // a literal space is not in the alphabet
  };
  for (const auto& [content, why] : cases) {
    const std::string vocab = Write("vocab.json", content);
    auto tok = Tokenizer::Load(vocab, merges);
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << content;
    EXPECT_THAT(tok.status().message(), HasSubstr(vocab)) << content;
    EXPECT_THAT(tok.status().message(), HasSubstr(why)) << content;
  }
}

TEST_F(TinyVocabTest, BadMergesLineIsRefusedWithFileAndLine) {
  const std::string vocab = Write("vocab.json", VocabJson({"ab"}));
  const std::string good = Spell("a") + " " + Spell("b") + "\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"#version: 0.2\n" + good + "abc\n", "merges.txt:3: expected"},
      {good + "a b c\n", "merges.txt:2: expected"},
      {good + " a\n", "merges.txt:2: expected"},
      {"a  b\n", "merges.txt:1: expected"},
      {"#version: 0.2\nb c\n", "merges.txt:2: \"b c\" uses or makes a token"},  // "bc" unknown
      {"#version: 0.2\na \xe4\xb8\xad\n", "merges.txt:2: not spelled"},
      {"#version: 0.2\na \xc4\n", "merges.txt:2: not spelled"},  // truncated UTF-8
      {"#version: 0.2\na \xc4"
       "A\n",
       "merges.txt:2: not spelled"},
  };
  for (const auto& [content, why] : cases) {
    const std::string merges = Write("merges.txt", content);
    auto tok = Tokenizer::Load(vocab, merges);
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << content;
    EXPECT_THAT(tok.status().message(), HasSubstr(why)) << content;
  }
  // CRLF line ends and a missing final newline are fine.
  auto crlf = Tokenizer::Load(
      vocab, Write("merges.txt", "#version: 0.2\r\n" + Spell("a") + " " + Spell("b")));
  ASSERT_TRUE(crlf.ok()) << crlf.status();
  EXPECT_THAT((*crlf)->Encode("ab"), ElementsAre(256));
}

}  // namespace
}  // namespace prefixd
