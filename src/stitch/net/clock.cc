#include "stitch/net/clock.h"

#include <algorithm>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace stitch {

namespace {
constexpr auto kAwait = boost::asio::as_tuple(boost::asio::use_awaitable);
}  // namespace

boost::asio::awaitable<void> SteadyClock::SleepUntil(TimePoint deadline) {
  boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor, deadline);
  co_await timer.async_wait(kAwait);
}

struct ManualClock::Sleeper {
  TimePoint deadline;
  boost::asio::steady_timer timer;
};

// Starts far from the epoch so that deadlines computed by subtraction stay
// positive.
ManualClock::ManualClock(boost::asio::any_io_executor loop)
    : loop_(std::move(loop)), now_(TimePoint() + std::chrono::hours(24 * 365)) {}

ManualClock::~ManualClock() = default;

Clock::TimePoint ManualClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

size_t ManualClock::sleepers() const {
  absl::MutexLock lock(&mu_);
  return sleepers_.size();
}

uint64_t ManualClock::sleeps_started() const {
  absl::MutexLock lock(&mu_);
  return sleeps_started_;
}

void ManualClock::Unregister(Sleeper* sleeper) {
  absl::MutexLock lock(&mu_);
  std::erase(sleepers_, sleeper);
}

boost::asio::awaitable<void> ManualClock::SleepUntil(TimePoint deadline) {
  Sleeper sleeper{deadline,
                  boost::asio::steady_timer(co_await boost::asio::this_coro::executor,
                                            boost::asio::steady_timer::time_point::max())};
  {
    absl::MutexLock lock(&mu_);
    ++sleeps_started_;
    if (now_ >= deadline) co_return;
    sleepers_.push_back(&sleeper);
  }
  // Unregisters also when the coroutine is destroyed while suspended.
  struct Unregister {
    ManualClock* clock;
    Sleeper* sleeper;
    ~Unregister() { clock->Unregister(sleeper); }
  } unregister{this, &sleeper};
  co_await sleeper.timer.async_wait(kAwait);
}

void ManualClock::Advance(Duration d) {
  {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  // Sleepers unregister on the loop thread only, so the pointers stay valid
  // while this runs there.
  boost::asio::post(loop_, [this] {
    absl::MutexLock lock(&mu_);
    for (Sleeper* s : sleepers_) {
      if (s->deadline <= now_) s->timer.cancel();
    }
  });
}

}  // namespace stitch
