// A condition for coroutines confined to one event loop. Pulls in Asio's
// timer; include it from .cc files only (headers forward-declare the class).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace stitch {

// Waiters suspend until the next NotifyAll() and then re-check whatever
// condition they wait for. Loop thread only.
class LoopSignal {
 public:
  explicit LoopSignal(const boost::asio::any_io_executor& executor) : timer_(executor) {
    timer_.expires_at(boost::asio::steady_timer::time_point::max());
  }

  void NotifyAll() { timer_.cancel(); }

  // Returns after the next NotifyAll() (true), or false when the awaiting
  // coroutine was cancelled. A cancelled coroutine must not co_await again:
  // Asio would throw operation_aborted (this_coro::throw_if_cancelled).
  boost::asio::awaitable<bool> Wait() {
    co_await timer_.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    auto state = co_await boost::asio::this_coro::cancellation_state;
    co_return state.cancelled() == boost::asio::cancellation_type::none;
  }

 private:
  boost::asio::steady_timer timer_;
};

}  // namespace stitch
