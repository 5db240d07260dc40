#include "server/executor.h"

#include <utility>

#include "base/check.h"

namespace prefixd {

Executor::Executor(int threads) {
  PREFIXD_CHECK(threads >= 1);
  threads_.reserve(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

Executor::~Executor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void Executor::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  PREFIXD_CHECK_MSG(!stopping_, "task posted to an executor being destroyed");
  tasks_.push_back(std::move(task));
}

void Executor::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !tasks_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      // Queued tasks run even when stopping: the destructor promises every posted task runs.
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace prefixd
