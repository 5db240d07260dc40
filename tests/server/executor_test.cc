#include "server/executor.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

TEST(ExecutorTest, PostRunsTheTaskOnAPoolThreadWithoutWaitingForIt) {
  Executor executor(1);
  absl::Notification release, ran;
  std::thread::id ran_on;
  executor.Post([&] {
    release.WaitForNotification();  // Post must return while this task is still blocked
    ran_on = std::this_thread::get_id();
    ran.Notify();
  });
  release.Notify();
  ran.WaitForNotification();
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(ExecutorTest, OneBlockedThreadLeavesTheOthersRunning) {
  Executor executor(2);
  absl::Notification release, second;
  executor.Post([&] { release.WaitForNotification(); });
  executor.Post([&] { second.Notify(); });
  second.WaitForNotification();  // ran although the first task still holds a thread
  release.Notify();
}

TEST(ExecutorTest, DestructionRunsEveryPostedTask) {
  std::atomic<int> ran{0};
  {
    Executor executor(2);
    for (int i = 0; i < 100; ++i) executor.Post([&] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(ExecutorTest, TasksOnOneThreadRunInPostOrder) {
  std::vector<int> order;
  {
    Executor executor(1);
    for (int i = 0; i < 10; ++i) executor.Post([&order, i] { order.push_back(i); });
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

}  // namespace
}  // namespace prefixd
