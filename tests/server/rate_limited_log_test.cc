#include "server/rate_limited_log.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace prefixd {

// The friend of RateLimitedLog: its running count of suppressed lines.
class RateLimitedLogTestPeer {
 public:
  static uint64_t suppressed_total(const RateLimitedLog& log) { return log.suppressed_total(); }
};

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
  EXPECT_EQ(RateLimitedLogTestPeer::suppressed_total(log), 6u);
}

}  // namespace
}  // namespace prefixd
