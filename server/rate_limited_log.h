// A log that writes at most one line per interval, and says how many it left out: for lines
// a client can cause at will (libprotobuf's complaint about each request with invalid UTF-8),
// which must not let a client fill the disk or drown the other lines.
#ifndef PREFIXD_SERVER_RATE_LIMITED_LOG_H_
#define PREFIXD_SERVER_RATE_LIMITED_LOG_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace prefixd {

class RateLimitedLog {
 public:
  struct Options {
    std::function<void(std::string_view)> sink;  // receives each written line
    absl::Duration interval = absl::Seconds(1);
    std::function<absl::Time()> clock = [] { return absl::Now(); };
  };
  explicit RateLimitedLog(Options options);

  // Writes `line` unless a line was written less than `interval` ago; then it is counted,
  // and the next written line ends with "(N similar lines suppressed)". Thread-safe.
  void Write(std::string_view line);

 private:
  friend class RateLimitedLogTestPeer;  // tests/server/rate_limited_log_test.cc
  uint64_t suppressed_total() const;

  Options options_;
  mutable absl::Mutex mu_;
  absl::Time last_written_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t pending_suppressed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t suppressed_total_ ABSL_GUARDED_BY(mu_) = 0;
};

// Sends libprotobuf's log lines (e.g. "String field ... contains invalid UTF-8 data when
// parsing a protocol buffer", one per such request) through a RateLimitedLog (one line per
// second) to stderr, prefixed "prefixd: protobuf: ". Process-wide; later calls do nothing.
void RouteProtobufLogThroughRateLimit();

}  // namespace prefixd

#endif  // PREFIXD_SERVER_RATE_LIMITED_LOG_H_
