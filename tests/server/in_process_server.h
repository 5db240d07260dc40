// prefixd::Server in the test's own process, on the tiny model: the default CPU backend, or
// a backend the test builds (the gated fake one, tests/engine/fake_backend.h). Listens on
// 127.0.0.1 with an OS-chosen port; metrics only when asked for.
#ifndef PREFIXD_TESTS_SERVER_IN_PROCESS_SERVER_H_
#define PREFIXD_TESTS_SERVER_IN_PROCESS_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/server.h"

namespace prefixd::testing {

// Options for a test server on `model_dir`: device cpu, gRPC on port 0, metrics and HTTP
// off, log kept in `log` (when not null) instead of stderr.
inline ServerOptions TestServerOptions(const std::string& model_dir,
                                       std::function<void(std::string_view)> log = nullptr) {
  ServerOptions o;
  o.model_dir = model_dir;
  o.device.device = "cpu";
  o.device.threads = 1;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "off";
  o.http_listen = "off";
  o.log = log ? std::move(log) : [](std::string_view) {};
  return o;
}

// Log lines a Server wrote, for tests that check what it says.
class LogSink {
 public:
  std::function<void(std::string_view)> Writer() {
    return [this](std::string_view line) {
      absl::MutexLock lock(&mu_);
      text_.append(line).push_back('\n');
    };
  }
  std::string Text() const {
    absl::MutexLock lock(&mu_);
    return text_;
  }

 private:
  mutable absl::Mutex mu_;
  std::string text_;
};

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_SERVER_IN_PROCESS_SERVER_H_
