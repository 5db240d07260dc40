#include "server/rate_limited_log.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace prefixd {
namespace {

TEST(RateLimitedLogTest, OneLinePerIntervalWithTheSuppressedCount) {
  absl::Time now = absl::FromUnixSeconds(1000);
  std::vector<std::string> lines;
  RateLimitedLog log(RateLimitedLog::Options{
      .sink = [&](std::string_view l) { lines.emplace_back(l); },
      .interval = absl::Seconds(1),
      .clock = [&] { return now; },
  });
  log.Write("a");
  for (int i = 0; i < 5; ++i) log.Write("b");
  EXPECT_EQ(lines, std::vector<std::string>{"a"});
  now += absl::Milliseconds(999);
  log.Write("c");
  EXPECT_EQ(lines.size(), 1u);
  now += absl::Milliseconds(1);
  log.Write("d");
  EXPECT_EQ(lines, (std::vector<std::string>{"a", "d (6 similar lines suppressed)"}));
  now += absl::Seconds(5);
  log.Write("e");  // nothing was suppressed since "d"
  EXPECT_EQ(lines.back(), "e");
  EXPECT_EQ(log.suppressed_total(), 6u);
}

}  // namespace
}  // namespace prefixd
