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

TEST(FlagNamesTest, LeavesPositionalsAndEverythingAfterDoubleDash) {
  EXPECT_THAT(NormalizeFlagNames({"bin-name", "pos-arg", "--", "--a-b"}),
              ElementsAre("bin-name", "pos-arg", "--", "--a-b"));
}

}  // namespace
}  // namespace prefixd
