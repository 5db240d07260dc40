// The fixture of the HTTP tests that hold a request in flight: prefixd::Server in-process on
// the tiny model, its HTTP front end and metrics on free loopback ports, and an engine on the
// gated fake backend (tests/engine/fake_backend.h), whose first step waits for gate_. A
// completion then stays running for as long as the test needs, on any machine.
#ifndef PREFIXD_TESTS_SERVER_GATED_BACKEND_SERVER_H_
#define PREFIXD_TESTS_SERVER_GATED_BACKEND_SERVER_H_

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/engine/fake_backend.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/in_process_server.h"
#include "tests/server/process.h"

namespace prefixd::testing {

class GatedBackendServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    model_dir_ = dir_->path() + "/tiny-model";
    ASSERT_TRUE(WriteTinyModel(model_dir_).ok());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // Starts the server; `tweak` adjusts the options first (the listeners and the backend are
  // set after it).
  void StartServer(const std::function<void(ServerOptions&)>& tweak = nullptr) {
    ServerOptions o = TestServerOptions(model_dir_);
    if (tweak) tweak(o);
    o.metrics_listen = "127.0.0.1:0";
    o.http_listen = "127.0.0.1:0";
    o.backend_factory = [this](const Model& m) -> absl::StatusOr<std::unique_ptr<Backend>> {
      auto b = std::make_unique<FakeBackend>(64, 16, m.config().vocab_size);
      b->set_gate(&gate_, 0);
      backend_ = b.get();
      return std::unique_ptr<Backend>(std::move(b));
    };
    absl::StatusOr<std::unique_ptr<Server>> s = Server::Start(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }

  void TearDown() override {
    if (!gate_.HasBeenNotified()) gate_.Notify();
    server_.reset();
  }

  // A counter's value, 0 before its first count; -1 when /metrics does not answer.
  double Metric(const std::string& series) {
    absl::StatusOr<std::string> text = HttpGet(server_->metrics_port(), "/metrics");
    return text.ok() ? std::max(0.0, MetricValue(*text, series)) : -1;
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string model_dir_;
  absl::Notification gate_;
  FakeBackend* backend_ = nullptr;
  std::unique_ptr<Server> server_;
};

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_SERVER_GATED_BACKEND_SERVER_H_
