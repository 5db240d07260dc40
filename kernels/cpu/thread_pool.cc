#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>

#include "base/check.h"

namespace prefixd {
namespace {

// Up to ~50 us of pause instructions (a pause is ~40-140 cycles on recent Xeons): long enough
// to catch the next Run() within a layer without a futex round trip, short enough not to
// starve a thread that shares the core.
constexpr int kSpinIterations = 1000;

// Waits until `a` no longer holds `old`: spin, then sleep.
template <typename T>
void SpinThenWait(const std::atomic<T>& a, T old) {
  for (int i = 0; i < kSpinIterations; ++i) {
    if (a.load(std::memory_order_acquire) != old) return;
    _mm_pause();
  }
  while (a.load(std::memory_order_acquire) == old) a.wait(old, std::memory_order_acquire);
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  PREFIXD_CHECK(num_threads >= 1);
  workers_.reserve(num_threads - 1);
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::DrainTasks() {
  while (true) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) return;
    (*fn_)(task);
  }
}

void ThreadPool::Run(int64_t num_tasks, const std::function<void(int64_t)>& fn) {
  if (num_tasks <= 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (int64_t t = 0; t < num_tasks; ++t) fn(t);
    return;
  }
  fn_ = &fn;
  num_tasks_ = num_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  busy_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);  // publishes the fields above
  generation_.notify_all();
  DrainTasks();
  // Wait for the workers to leave this Run, so the next one may reset the fields.
  for (int busy = busy_workers_.load(std::memory_order_acquire); busy != 0;
       busy = busy_workers_.load(std::memory_order_acquire)) {
    SpinThenWait(busy_workers_, busy);
  }
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop() {
  // 0, not a load: a Run() may already have bumped the generation before this thread started.
  uint32_t seen = 0;
  while (true) {
    SpinThenWait(generation_, seen);
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    DrainTasks();
    if (busy_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_workers_.notify_all();
  }
}

}  // namespace prefixd
