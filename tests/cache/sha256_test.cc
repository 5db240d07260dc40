#include "cache/sha256.h"

#include "gtest/gtest.h"

namespace prefixd {
namespace {

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(DigestHex(Sha256Of("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(DigestHex(Sha256Of("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256Test, IncrementalEqualsOneShot) {
  Sha256 h;
  h.Update("a");
  h.Update("bc");
  EXPECT_EQ(h.Final(), Sha256Of("abc"));
}

TEST(Sha256Test, LengthPrefixKeepsFieldsApart) {
  Sha256 a, b;
  a.UpdateLengthPrefixed("ab");
  a.UpdateLengthPrefixed("c");
  b.UpdateLengthPrefixed("a");
  b.UpdateLengthPrefixed("bc");
  EXPECT_NE(a.Final(), b.Final());
}

}  // namespace
}  // namespace prefixd
