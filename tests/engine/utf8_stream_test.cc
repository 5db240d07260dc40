// Utf8StreamDecoder: characters split across pushes are held back and released whole;
// invalid bytes become U+FFFD (one per maximal invalid subpart, as the Unicode standard
// recommends); Flush turns a held-back tail into U+FFFD.
#include <string>
#include <string_view>

#include "engine/tokenizer.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

// Pushes `bytes` one byte at a time and returns everything emitted, Flush included.
std::string ByteByByte(std::string_view bytes) {
  Utf8StreamDecoder d;
  std::string out;
  for (char c : bytes) out += d.Push(std::string_view(&c, 1));
  return out + d.Flush();
}

std::string Whole(std::string_view bytes) {
  Utf8StreamDecoder d;
  std::string out = d.Push(bytes);
  return out + d.Flush();
}

TEST(Utf8StreamDecoderTest, AsciiPassesThrough) {
  Utf8StreamDecoder d;
  EXPECT_EQ(d.Push("hello "), "hello ");
  EXPECT_EQ(d.Push("world"), "world");
  EXPECT_EQ(d.Flush(), "");
}

TEST(Utf8StreamDecoderTest, HoldsBackSplitCharacters) {
  Utf8StreamDecoder d;
  EXPECT_EQ(d.Push("caf\xC3"), "caf");
  EXPECT_EQ(d.Push("\xA9!"), "\xC3\xA9!");
  // A 4-byte emoji arriving one byte at a time comes out only when complete.
  EXPECT_EQ(d.Push("\xF0"), "");
  EXPECT_EQ(d.Push("\x9F"), "");
  EXPECT_EQ(d.Push("\x98"), "");
  EXPECT_EQ(d.Push("\x80"), "\xF0\x9F\x98\x80");
  // 3-byte character split 2 + 1.
  EXPECT_EQ(d.Push("\xE4\xB8"), "");
  EXPECT_EQ(d.Push("\xAD"
                   "x"),
            "\xE4\xB8\xAD"
            "x");
  EXPECT_EQ(d.Flush(), "");
}

TEST(Utf8StreamDecoderTest, InvalidBytesBecomeReplacementCharacters) {
  EXPECT_EQ(Whole("a\xFF"
                  "b"),
            "a" + kFffd + "b");
  EXPECT_EQ(Whole("a\x80"
                  "b"),
            "a" + kFffd + "b");                                         // stray continuation
  EXPECT_EQ(Whole("\xC0\xAF"), kFffd + kFffd);                          // overlong
  EXPECT_EQ(Whole("\xED\xA0\x80"), kFffd + kFffd + kFffd);              // surrogate
  EXPECT_EQ(Whole("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(Whole("\xE2\x28\xA1"), kFffd + "(" + kFffd);                // bad continuation
  EXPECT_EQ(Whole("\xE2\x82"
                  "a"),
            kFffd + "a");  // truncated, one U+FFFD
}

TEST(Utf8StreamDecoderTest, FlushReplacesAnIncompleteTail) {
  Utf8StreamDecoder d;
  EXPECT_EQ(d.Push("ok\xE2\x82"), "ok");
  EXPECT_EQ(d.Flush(), kFffd);
  EXPECT_EQ(d.Flush(), "");          // nothing held any more
  EXPECT_EQ(d.Push("\xAC"), kFffd);  // the tail was dropped: a lone continuation now
}

TEST(Utf8StreamDecoderTest, SplittingNeverChangesTheOutput) {
  const std::string texts[] = {"plain ascii",
                               "caf\xC3\xA9 na\xC3\xAFve",
                               "\xE4\xB8\xAD\xE6\x96\x87",
                               "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB zwj",
                               "bad \xFF\xFE mid \xC3",
                               "\xE2\x82\xE2\x82\xAC",
                               "\xF0\x9F\x98"};
  for (const std::string& t : texts) {
    const std::string whole = Whole(t);
    EXPECT_EQ(ByteByByte(t), whole) << t;
    for (size_t cut = 0; cut <= t.size(); ++cut) {
      Utf8StreamDecoder d;
      std::string out = d.Push(std::string_view(t).substr(0, cut));
      out += d.Push(std::string_view(t).substr(cut));
      out += d.Flush();
      EXPECT_EQ(out, whole) << t << " cut at " << cut;
    }
  }
  EXPECT_EQ(Whole("caf\xC3\xA9"), "caf\xC3\xA9");  // valid text is unchanged
}

}  // namespace
}  // namespace prefixd
