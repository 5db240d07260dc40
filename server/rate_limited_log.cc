#include "server/rate_limited_log.h"

#include <cstdio>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"

namespace prefixd {

RateLimitedLog::RateLimitedLog(Options options) : options_(std::move(options)) {}

void RateLimitedLog::Write(std::string_view line) {
  std::string out;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.clock();
    if (now - last_written_ < options_.interval) {
      ++pending_suppressed_;
      ++suppressed_total_;
      return;
    }
    last_written_ = now;
    out = std::string(line);
    if (pending_suppressed_ > 0) {
      absl::StrAppend(&out, " (", pending_suppressed_, " similar lines suppressed)");
      pending_suppressed_ = 0;
    }
  }
  options_.sink(out);
}

uint64_t RateLimitedLog::suppressed_total() const {
  absl::MutexLock lock(&mu_);
  return suppressed_total_;
}

namespace {

RateLimitedLog& ProtobufLog() {
  static RateLimitedLog* log = new RateLimitedLog(RateLimitedLog::Options{
      .sink =
          [](std::string_view line) {
            std::fprintf(stderr, "prefixd: protobuf: %.*s\n", static_cast<int>(line.size()),
                         line.data());
            std::fflush(stderr);
          },
  });
  return *log;
}

const char* LevelName(google::protobuf::LogLevel level) {
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO:
      return "INFO";
    case google::protobuf::LOGLEVEL_WARNING:
      return "WARNING";
    case google::protobuf::LOGLEVEL_ERROR:
      return "ERROR";
    default:
      return "FATAL";
  }
}

void OnProtobufLog(google::protobuf::LogLevel level, const char* filename, int line,
                   const std::string& message) {
  // A FATAL line precedes an abort: it is written whatever the rate.
  const std::string text = absl::StrCat(LevelName(level), " ", filename, ":", line, " ", message);
  if (level == google::protobuf::LOGLEVEL_FATAL) {
    std::fprintf(stderr, "prefixd: protobuf: %s\n", text.c_str());
    return;
  }
  ProtobufLog().Write(text);
}

}  // namespace

void RouteProtobufLogThroughRateLimit() {
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&OnProtobufLog); });
}

}  // namespace prefixd
