#include "base/command_line.h"

#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

constexpr FlagSpec kFlags[] = {{"out"}, {"seed"}, {"json", FlagKind::kSwitch}};

std::string Error(std::vector<std::string> words) {
  absl::StatusOr<ParsedCommandLine> p = ParseCommandLine(std::move(words), kFlags);
  EXPECT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(p.status().message());
}

TEST(CommandLineTest, BothValueSpellingsSwitchesAndPositionals) {
  absl::StatusOr<ParsedCommandLine> p =
      ParseCommandLine({"a", "--out", "dir", "-", "--seed=7", "-x", "--json", "b"}, kFlags);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->positional, ElementsAre("a", "-", "-x", "b"));
  EXPECT_THAT(p->flags, ElementsAre(Pair("json", ""), Pair("out", "dir"), Pair("seed", "7")));
  EXPECT_EQ(p->Flag("out"), std::optional<std::string>("dir"));
  EXPECT_EQ(p->Flag("absent"), std::nullopt);
  EXPECT_TRUE(p->Has("json"));
  EXPECT_FALSE(p->Has("absent"));
}

TEST(CommandLineTest, AValueIsTheNextWordWhateverItLooksLike) {
  absl::StatusOr<ParsedCommandLine> p = ParseCommandLine({"--out", "--json", "--seed="}, kFlags);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->Flag("out"), std::optional<std::string>("--json"));
  EXPECT_FALSE(p->Has("json"));
  EXPECT_EQ(p->Flag("seed"), std::optional<std::string>(""));
  p = ParseCommandLine({"--out", "--", "--json"}, kFlags);  // "--" as a value ends nothing
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->Flag("out"), std::optional<std::string>("--"));
  EXPECT_TRUE(p->Has("json"));
}

TEST(CommandLineTest, DoubleDashEndsTheFlags) {
  absl::StatusOr<ParsedCommandLine> p =
      ParseCommandLine({"--json", "--", "--out", "--", "--bogus=1"}, kFlags);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->positional, ElementsAre("--out", "--", "--bogus=1"));
  EXPECT_THAT(p->flags, ElementsAre(Pair("json", "")));
  p = ParseCommandLine({"a", "--"}, kFlags);  // a trailing "--" is allowed
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->positional, ElementsAre("a"));
}

TEST(CommandLineTest, EachMistakeIsOneLineNamingTheFlag) {
  EXPECT_EQ(Error({"--bogus", "1"}), "unknown flag --bogus");
  EXPECT_EQ(Error({"--bogus=1"}), "unknown flag --bogus");
  EXPECT_EQ(Error({"--=1"}), "unknown flag --");
  EXPECT_EQ(Error({"a", "--out"}), "flag --out needs a value");
  EXPECT_EQ(Error({"--out", "a", "--out=b"}), "flag --out given twice");
  EXPECT_EQ(Error({"--json", "--json"}), "flag --json given twice");
  EXPECT_EQ(Error({"--json=1"}), "--json takes no value");
  EXPECT_EQ(Error({"--json="}), "--json takes no value");
  // The first mistake from the left is the one reported.
  EXPECT_EQ(Error({"--bogus", "--out"}), "unknown flag --bogus");
}

TEST(CommandLineReaderTest, FlagsMayChangeAsTheReaderGoes) {
  constexpr FlagSpec kGlobal[] = {{"server"}};
  constexpr FlagSpec kWithCommand[] = {{"server"}, {"max-tokens"}};
  CommandLineReader r({"--server", "h:1", "generate", "--max-tokens=3", "--", "-h"},
                      RepeatedFlags::kReject);
  absl::StatusOr<CommandLineArg> a = r.Next(kGlobal);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->flag, std::optional<std::string>("server"));
  EXPECT_EQ(a->value, "h:1");
  a = r.Next(kGlobal);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->flag.has_value());
  EXPECT_EQ(a->value, "generate");
  EXPECT_FALSE(a->after_double_dash);
  a = r.Next(kWithCommand);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->flag, std::optional<std::string>("max-tokens"));
  EXPECT_EQ(a->value, "3");
  ASSERT_FALSE(r.Done());
  a = r.Next(kWithCommand);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->flag.has_value());
  EXPECT_EQ(a->value, "-h");
  EXPECT_TRUE(a->after_double_dash);
  EXPECT_TRUE(r.Done());
}

TEST(CommandLineReaderTest, HintAndRepeatsWhenAllowed) {
  constexpr FlagSpec kOne[] = {{"n"}};
  CommandLineReader r({"--n", "1", "--n=2", "--m"}, RepeatedFlags::kAllow);
  EXPECT_EQ(r.Next(kOne)->value, "1");
  EXPECT_EQ(r.Next(kOne)->value, "2");
  absl::StatusOr<CommandLineArg> a = r.Next(kOne, " (see tool --help)");
  EXPECT_EQ(a.status().message(), "unknown flag --m (see tool --help)");
  EXPECT_TRUE(r.Done());
  CommandLineReader empty({"--"}, RepeatedFlags::kReject);
  EXPECT_TRUE(empty.Done());
}

TEST(CommandLineValuesTest, IntegerInRange) {
  EXPECT_EQ(*ParseInteger("42", "--n", 0, 100), 42);
  EXPECT_EQ(*ParseInteger("-5", "--n", -10, 0), -5);
  EXPECT_EQ(ParseInteger("two", "--layers", 1, 8).status().message(),
            "--layers \"two\" is not an integer");
  EXPECT_EQ(ParseInteger("", "--n", 0, 1).status().message(), "--n \"\" is not an integer");
  EXPECT_EQ(ParseInteger(" 1", "--n", 0, 1).status().message(), "--n \" 1\" is not an integer");
  EXPECT_EQ(ParseInteger("1x", "--n", 0, 1).status().message(), "--n \"1x\" is not an integer");
  EXPECT_EQ(ParseInteger("99999999999999999999", "--n", 0, 1).status().message(),
            "--n \"99999999999999999999\" is not an integer");
  EXPECT_EQ(ParseInteger("0", "--layers", 1, 8).status().message(),
            "--layers 0 is out of range [1, 8]");
  EXPECT_EQ(ParseInteger("9", "--layers", 1, 8).status().message(),
            "--layers 9 is out of range [1, 8]");
}

TEST(CommandLineValuesTest, NonNegativeIntegers) {
  EXPECT_EQ(*ParseNonNegativeU32("7", "--max-tokens"), 7u);
  EXPECT_EQ(*ParseNonNegativeU32("4294967295", "--max-tokens"), 4294967295u);
  EXPECT_EQ(ParseNonNegativeU32("4294967296", "--max-tokens").status().message(),
            "--max-tokens expects a non-negative integer, got \"4294967296\"");
  EXPECT_EQ(ParseNonNegativeU32("-3", "--max-tokens").status().message(),
            "--max-tokens expects a non-negative integer, got \"-3\"");
  EXPECT_EQ(ParseNonNegativeU32("many", "--max-tokens").status().message(),
            "--max-tokens expects a non-negative integer, got \"many\"");
  EXPECT_EQ(*ParseNonNegativeU64("18446744073709551615", "--seed"),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(ParseNonNegativeU64("1.5", "--seed").status().message(),
            "--seed expects a non-negative integer, got \"1.5\"");
}

TEST(CommandLineValuesTest, FiniteFloats) {
  EXPECT_FLOAT_EQ(*ParseFiniteFloat("0.5", "--temperature"), 0.5f);
  EXPECT_FLOAT_EQ(*ParseFiniteFloat("1e-3", "--top-p"), 1e-3f);
  for (const char* bad : {"hot", "", "inf", "nan", "1e39"}) {
    EXPECT_EQ(ParseFiniteFloat(bad, "--temperature").status().message(),
              std::string("--temperature expects a number, got \"") + bad + "\"")
        << bad;
  }
}

TEST(CommandLineValuesTest, IdLists) {
  EXPECT_THAT(*ParseIdList("15496,995", "token id"), ElementsAre(15496u, 995u));
  EXPECT_THAT(*ParseIdList(" 1, 2 ,3", "--ids entry"), ElementsAre(1u, 2u, 3u));
  EXPECT_THAT(*ParseIdList("4294967295", "token id"), ElementsAre(4294967295u));
  EXPECT_EQ(ParseIdList("1,x", "--ids entry").status().message(),
            "--ids entry \"x\" is not an integer");
  EXPECT_EQ(ParseIdList("1,,2", "token id").status().message(), "token id \"\" is not an integer");
  EXPECT_EQ(ParseIdList("", "token id").status().message(), "token id \"\" is not an integer");
  EXPECT_EQ(ParseIdList("1,-1", "token id").status().message(),
            "token id -1 is out of range [0, 4294967295]");
  EXPECT_EQ(ParseIdList("4294967296", "token id").status().message(),
            "token id 4294967296 is out of range [0, 4294967295]");
}

}  // namespace
}  // namespace prefixd
