#include "stitch/net/worker_pool.h"

#include <atomic>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "stitch/net/event_loop.h"

namespace stitch {
namespace {

using boost::asio::awaitable;

TEST(RunBlockingTest, ReturnsTheValueAndRunsOffTheLoopThread) {
  EventLoop loop;
  WorkerPool pool(2);
  std::thread::id loop_thread, worker_thread, resumed_thread;
  int value = loop.BlockOn([&]() -> awaitable<int> {
    loop_thread = std::this_thread::get_id();
    int v = co_await RunBlocking(pool, [&] {
      worker_thread = std::this_thread::get_id();
      return 42;
    });
    resumed_thread = std::this_thread::get_id();
    co_return v;
  }());
  EXPECT_EQ(value, 42);
  EXPECT_NE(worker_thread, loop_thread);
  EXPECT_NE(worker_thread, std::this_thread::get_id());
  EXPECT_EQ(resumed_thread, loop_thread);
}

TEST(RunBlockingTest, VoidAndMoveOnlyResults) {
  EventLoop loop;
  WorkerPool pool(1);
  int side_effect = 0;
  loop.BlockOn(
      [&]() -> awaitable<void> { co_await RunBlocking(pool, [&] { side_effect = 7; }); }());
  EXPECT_EQ(side_effect, 7);
  auto p = loop.BlockOn([&]() -> awaitable<std::unique_ptr<int>> {
    co_return co_await RunBlocking(pool, [] { return std::make_unique<int>(5); });
  }());
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 5);
}

TEST(RunBlockingTest, ExceptionsBecomeStatusForStatusResults) {
  EventLoop loop;
  WorkerPool pool(1);
  absl::Status s = loop.BlockOn(
      RunBlocking(pool, []() -> absl::Status { throw std::runtime_error("disk on fire"); }));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("disk on fire"), std::string::npos) << s;

  absl::StatusOr<int> v = loop.BlockOn(
      RunBlocking(pool, []() -> absl::StatusOr<int> { throw std::runtime_error("bad bytes"); }));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInternal);

  absl::StatusOr<int> ok =
      loop.BlockOn(RunBlocking(pool, []() -> absl::StatusOr<int> { return 3; }));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 3);
}

TEST(RunBlockingTest, OtherExceptionsAreRethrownInTheCoroutine) {
  EventLoop loop;
  WorkerPool pool(1);
  bool caught = false;
  loop.BlockOn([&]() -> awaitable<void> {
    try {
      co_await RunBlocking(pool, []() -> int { throw std::logic_error("nope"); });
    } catch (const std::logic_error&) {
      caught = true;
    }
  }());
  EXPECT_TRUE(caught);
}

TEST(RunBlockingTest, BlockingWorkDoesNotStallTheLoop) {
  EventLoop loop;
  WorkerPool pool(1);
  absl::Notification release;
  std::atomic<bool> blocked_done{false};
  // Start a task that blocks its worker until released...
  // (Spawned coroutines take their state as parameters: a lambda's captures
  // die with the temporary closure, before the coroutine runs.)
  Spawn(loop.executor(),
        [](WorkerPool* pool, absl::Notification* release,
           std::atomic<bool>* done) -> awaitable<void> {
          co_await RunBlocking(*pool, [release] { release->WaitForNotification(); });
          *done = true;
        }(&pool, &release, &blocked_done));
  // ...and meanwhile the loop still runs other coroutines.
  int answered = loop.BlockOn([]() -> awaitable<int> { co_return 1; }());
  EXPECT_EQ(answered, 1);
  EXPECT_FALSE(blocked_done.load());
  release.Notify();
  loop.BlockOn([&]() -> awaitable<void> {
    co_await RunBlocking(pool, [] {});  // queued behind the blocked task
  }());
  EXPECT_TRUE(blocked_done.load());
}

TEST(RunBlockingTest, ManyConcurrentCallsAllComplete) {
  EventLoop loop;
  WorkerPool pool(3);
  constexpr int kCalls = 200;
  std::atomic<int> sum{0};
  absl::Notification all_done;
  std::atomic<int> remaining{kCalls};
  for (int i = 0; i < kCalls; ++i) {
    Spawn(loop.executor(),
          [](WorkerPool* pool, int i, std::atomic<int>* sum, std::atomic<int>* remaining,
             absl::Notification* all_done) -> awaitable<void> {
            int v = co_await RunBlocking(*pool, [i] { return i; });
            *sum += v;
            if (--*remaining == 0) all_done->Notify();
          }(&pool, i, &sum, &remaining, &all_done));
  }
  ASSERT_TRUE(all_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(sum.load(), kCalls * (kCalls - 1) / 2);
}

}  // namespace
}  // namespace stitch
