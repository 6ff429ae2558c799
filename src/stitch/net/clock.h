// Time for periodic and deadline-bound work on an event loop (the sidecar's
// backstop and watchdog, the gateway's probes, waits and stall watch),
// injected so that tests advance it by hand and never sleep.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace stitch {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;

  virtual ~Clock() = default;

  virtual TimePoint Now() const = 0;

  // Returns once Now() >= deadline, or early when the awaiting coroutine is
  // cancelled (Asio cancellation; the coroutine then sees it cancelled).
  virtual boost::asio::awaitable<void> SleepUntil(TimePoint deadline) = 0;

  boost::asio::awaitable<void> SleepFor(Duration d) { return SleepUntil(Now() + d); }
};

// The real monotonic clock; sleeps are Asio timers on the awaiting
// coroutine's executor. Thread-safe.
class SteadyClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  boost::asio::awaitable<void> SleepUntil(TimePoint deadline) override;
};

// A clock that moves only when told to, for tests. Sleepers run on the
// event loop whose executor the clock was built with.
// Thread-safety: Advance, Now and sleepers may be called from any thread.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(boost::asio::any_io_executor loop);
  ~ManualClock() override;

  TimePoint Now() const override;
  boost::asio::awaitable<void> SleepUntil(TimePoint deadline) override;

  // Moves time forward by `d`, then wakes (on the loop) every sleeper whose
  // deadline has passed.
  void Advance(Duration d);

  // How many coroutines are sleeping now.
  size_t sleepers() const;
  // How many sleeps have started so far (a test waits for the next one to
  // know that a sleeper has acted on the last Advance).
  uint64_t sleeps_started() const;

  struct Sleeper;

 private:
  void Unregister(Sleeper* sleeper);

  boost::asio::any_io_executor loop_;
  mutable absl::Mutex mu_;
  TimePoint now_ ABSL_GUARDED_BY(mu_);
  std::vector<Sleeper*> sleepers_ ABSL_GUARDED_BY(mu_);
  uint64_t sleeps_started_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stitch
