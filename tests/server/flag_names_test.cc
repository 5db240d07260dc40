#include "server/flag_names.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;

TEST(FlagNamesTest, DashesInNamesBecomeUnderscores) {
  EXPECT_THAT(NormalizeFlagNames({"prefixd", "--kv-cache-bytes=1-2", "--no-prefix-cache",
                                  "--tls-cert", "my-cert.pem", "-max-queue=3"}),
              ElementsAre("prefixd", "--kv_cache_bytes=1-2", "--no_prefix_cache", "--tls_cert",
                          "my-cert.pem", "-max_queue=3"));
}

TEST(FlagNamesTest, RepeatedFlagValuesSeesEveryOccurrence) {
  const std::vector<std::string> args = {"prefixd", "--adapter", "a=/x", "--max_adapters=2",
                                         "-adapter=b=/y", "--adapter=c=/z", "--adapterx=q",
                                         "--", "--adapter=d=/w"};
  EXPECT_THAT(RepeatedFlagValues(args, "adapter"), ElementsAre("a=/x", "b=/y", "c=/z"));
  EXPECT_THAT(RepeatedFlagValues({"prefixd", "--adapter"}, "adapter"), ElementsAre());
}

TEST(FlagNamesTest, LeavesPositionalsAndEverythingAfterDoubleDash) {
  EXPECT_THAT(NormalizeFlagNames({"bin-name", "pos-arg", "--", "--a-b"}),
              ElementsAre("bin-name", "pos-arg", "--", "--a-b"));
}

}  // namespace
}  // namespace prefixd
