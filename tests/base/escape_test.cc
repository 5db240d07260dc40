#include "base/escape.h"

#include <string>

#include "gtest/gtest.h"

namespace prefixd {
namespace {

TEST(EscapeBytesTest, PrintableAsciiStaysAsItIs) {
  EXPECT_EQ(EscapeBytes("h.0.attn.c_attn.weight [1, 2] {x}"), "h.0.attn.c_attn.weight [1, 2] {x}");
  EXPECT_EQ(EscapeBytes(""), "");
}

TEST(EscapeBytesTest, QuotesBackslashAndWhitespaceAreEscaped) {
  EXPECT_EQ(EscapeBytes("a\"b\\c\nd\re\tf"), "a\\\"b\\\\c\\nd\\re\\tf");
}

TEST(EscapeBytesTest, ControlBytesDelAndInvalidUtf8BecomeHex) {
  EXPECT_EQ(EscapeBytes(std::string("\x1b[31mred\x7f", 9)), "\\x1b[31mred\\x7f");
  EXPECT_EQ(EscapeBytes(std::string("\0z", 2)), "\\x00z");
  EXPECT_EQ(EscapeBytes("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(EscapeBytes("\xc3"), "\\xc3");                             // truncated
  EXPECT_EQ(EscapeBytes("\xc0\xaf"), "\\xc0\\xaf");                    // overlong '/'
  EXPECT_EQ(EscapeBytes("\xed\xa0\x80"), "\\xed\\xa0\\x80");           // surrogate
  EXPECT_EQ(EscapeBytes("\xc2\x85"), "\\xc2\\x85");                    // U+0085, a C1 control
  EXPECT_EQ(EscapeBytes("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
}

TEST(EscapeBytesTest, PrintableUtf8StaysReadable) {
  EXPECT_EQ(EscapeBytes("\xc4\xa0world caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80"),
            "\xc4\xa0world caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80");
  EXPECT_EQ(EscapeBytes("\xc2\xa0"), "\xc2\xa0");  // U+00A0, the first kept
}

TEST(EscapeBytesTest, BidirectionalOverridesAreEscaped) {
  EXPECT_EQ(EscapeBytes("a\xe2\x80\xae"
                        "b"),
            "a\\xe2\\x80\\xae"
            "b");                                             // U+202E
  EXPECT_EQ(EscapeBytes("\xe2\x81\xa6"), "\\xe2\\x81\\xa6");  // U+2066
  EXPECT_EQ(EscapeBytes("\xe2\x80\xa9"), "\xe2\x80\xa9");     // U+2029: not an override
}

}  // namespace
}  // namespace prefixd
