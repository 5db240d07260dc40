// What tests may see of a running prefixd::Server beyond its public API (the friend
// ServerTestPeer): the calls in flight, and the gRPC front end's pump threads.
#ifndef PREFIXD_TESTS_SERVER_SERVER_TEST_PEER_H_
#define PREFIXD_TESTS_SERVER_SERVER_TEST_PEER_H_

#include <cstdint>
#include <memory>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "server/executor.h"
#include "server/inference_service.h"
#include "server/request_path.h"
#include "server/server.h"

namespace prefixd {

class ServerTestPeer {
 public:
  // Generate calls whose gRPC reactor still exists.
  static int64_t live_generate_calls(Server& server) {
    return server.grpc_service().live_generates();
  }
  // Generate requests the engine accepted since start-up, from either front end.
  static uint64_t accepted_generates(Server& server) {
    return server.request_path().accepted_generates();
  }

  // The one request path (to start a call and act on the server while it runs).
  static RequestPath& request_path(Server& server) { return server.request_path(); }

  // Holds every thread of the gRPC pump executor in a task until Release() (or destruction):
  // no Generate reactor can pump meanwhile, as if each one's pump were stuck.
  class PumpBlocker {
   public:
    explicit PumpBlocker(Server& server) : executor_(server.grpc_pumps()) {
      const int n = executor_.num_threads();
      auto started = std::make_shared<absl::BlockingCounter>(n);
      for (int i = 0; i < n; ++i) {
        executor_.Post([started, release = release_] {
          started->DecrementCount();
          release->WaitForNotification();
        });
      }
      started->Wait();  // every thread is inside one of the tasks
    }
    ~PumpBlocker() { Release(); }
    PumpBlocker(const PumpBlocker&) = delete;
    PumpBlocker& operator=(const PumpBlocker&) = delete;

    void Release() {
      if (!release_->HasBeenNotified()) release_->Notify();
    }

   private:
    Executor& executor_;
    std::shared_ptr<absl::Notification> release_ = std::make_shared<absl::Notification>();
  };
};

}  // namespace prefixd

#endif  // PREFIXD_TESTS_SERVER_SERVER_TEST_PEER_H_
