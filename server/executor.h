// A fixed pool of threads that run posted tasks, first posted first started. The gRPC front
// end pumps its reactors here: the engine thread's notify only posts (engine/request_stream.h),
// so the text decoding, stop-string search, protobuf building and reactor locks of a Generate
// call run on these threads, never on the engine thread.
//
// Invariants: a task runs exactly once, on one of the pool's threads; Post never runs a task
// on the calling thread and never blocks on a running task. The destructor runs every task
// posted before it began, then joins the threads; Post after that is a bug (checked).
#ifndef PREFIXD_SERVER_EXECUTOR_H_
#define PREFIXD_SERVER_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace prefixd {

class Executor {
 public:
  // `threads` >= 1.
  explicit Executor(int threads);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `task`; any thread.
  void Post(std::function<void()> task);
  int num_threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_EXECUTOR_H_
