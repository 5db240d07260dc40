// A persistent pool of worker threads for the CPU backend's parallel loops.
//
// Invariants: the pool's threads live as long as the pool; Run() is called from one thread at
// a time (the backend's caller) and returns only after every task has finished, so tasks may
// capture locals by reference. Which thread runs which task is unspecified: callers make each
// task's result independent of that (the backend splits work by output, never by a
// reduction), which is what keeps logits identical for 1 or N threads.
//
// Waiting spins briefly, then sleeps on a futex (std::atomic::wait): the machine's vCPUs may
// share one physical core, where spinning forever would steal the core from the thread that
// is doing the work.
#ifndef PREFIXD_KERNELS_CPU_THREAD_POOL_H_
#define PREFIXD_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace prefixd {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread: 1 runs everything inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(task) for task in [0, num_tasks), spread over the pool; blocks until all are done.
  void Run(int64_t num_tasks, const std::function<void(int64_t)>& fn);

 private:
  void WorkerLoop();
  void DrainTasks();

  std::vector<std::thread> workers_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  std::atomic<uint32_t> generation_{0};  // bumped once per Run (and at shutdown)
  std::atomic<int> busy_workers_{0};     // workers still inside the current Run
  std::atomic<bool> stop_{false};
};

}  // namespace prefixd

#endif  // PREFIXD_KERNELS_CPU_THREAD_POOL_H_
