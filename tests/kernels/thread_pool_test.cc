#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace prefixd {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskExactlyOnceAcrossManyRuns) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int run = 0; run < 300; ++run) {
      const int64_t n = run % 37;
      std::vector<std::atomic<int>> hits(n);
      pool.Run(n, [&](int64_t t) { hits[t].fetch_add(1); });
      for (int64_t t = 0; t < n; ++t) ASSERT_EQ(hits[t].load(), 1) << "run " << run;
    }
  }
}

TEST(ThreadPoolTest, RunReturnsOnlyAfterAllTasksFinished) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int run = 0; run < 100; ++run) {
    sum = 0;
    pool.Run(64, [&](int64_t t) {
      volatile int64_t spin = 0;
      for (int i = 0; i < 1000; ++i) spin = spin + i;
      sum.fetch_add(t);
    });
    ASSERT_EQ(sum.load(), 64 * 63 / 2);
  }
}

}  // namespace
}  // namespace prefixd
