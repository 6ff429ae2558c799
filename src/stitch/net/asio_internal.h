// Internal to src/stitch/net: helpers shared by server.cc and client.cc. Pulls
// in Asio; never include it from a public header.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace stitch::net_internal {

using Clock = std::chrono::steady_clock;
using Tcp = boost::asio::ip::tcp;

// Completion token for coroutine code: errors come back as values, never as
// exceptions.
inline constexpr auto kAwait = boost::asio::as_tuple(boost::asio::use_awaitable);

// Closes a socket when a deadline passes, so that whatever operation is
// pending on it completes with an error. One timer per socket, re-armed
// lazily: moving the deadline later only updates a field, so arming around
// every read and write costs no timer operation in the common case.
//
// The timer's handler owns the shared state, so the owner may be destroyed at
// any time (the destructor detaches the socket). Loop thread only.
class SocketDeadline {
 public:
  explicit SocketDeadline(Tcp::socket& socket)
      : state_(std::make_shared<State>(socket.get_executor(), &socket)) {}
  ~SocketDeadline() {
    state_->socket = nullptr;
    state_->timer.cancel();
  }
  SocketDeadline(const SocketDeadline&) = delete;
  SocketDeadline& operator=(const SocketDeadline&) = delete;

  void ArmAfter(Clock::duration timeout) { ArmAt(Clock::now() + timeout); }
  void ArmAt(Clock::time_point deadline) {
    State& s = *state_;
    s.expired = false;
    s.deadline = deadline;
    if (s.waiting && s.timer.expiry() <= deadline) return;
    s.timer.expires_at(deadline);  // abandons a pending wait, which then sees a stale generation
    Wait(state_);
  }
  // Clears the deadline lazily: a pending timer wait stays and is ignored
  // when it fires. Cheapest between operations of one exchange.
  void Disarm() { state_->deadline = Clock::time_point::max(); }
  // Clears the deadline and cancels the timer wait, for a socket that will
  // sit idle (a pending wait would keep its io_context from running out of
  // work).
  void Cancel() {
    state_->deadline = Clock::time_point::max();
    state_->timer.cancel();
  }
  // True when the socket was closed because the last armed deadline passed.
  bool expired() const { return state_->expired; }

 private:
  struct State {
    State(const boost::asio::any_io_executor& ex, Tcp::socket* s) : timer(ex), socket(s) {}
    boost::asio::steady_timer timer;
    Tcp::socket* socket;
    Clock::time_point deadline = Clock::time_point::max();
    uint64_t generation = 0;
    bool waiting = false;
    bool expired = false;
  };

  static void Wait(const std::shared_ptr<State>& state) {
    state->waiting = true;
    uint64_t generation = ++state->generation;
    state->timer.async_wait([state, generation](const boost::system::error_code& ec) {
      State& s = *state;
      if (generation != s.generation) return;
      s.waiting = false;
      if (ec || s.socket == nullptr || s.deadline == Clock::time_point::max()) return;
      if (Clock::now() < s.deadline) {
        s.timer.expires_at(s.deadline);
        Wait(state);
        return;
      }
      s.expired = true;
      boost::system::error_code ignored;
      s.socket->shutdown(Tcp::socket::shutdown_both, ignored);
      s.socket->close(ignored);
    });
  }

  std::shared_ptr<State> state_;
};

// A level-triggered event for coroutines on one loop thread: Wait() returns
// once Set() was called (at once if it already was). Any number of waiters.
class LoopEvent {
 public:
  explicit LoopEvent(const boost::asio::any_io_executor& executor) : timer_(executor) {
    timer_.expires_at(boost::asio::steady_timer::time_point::max());
  }
  void Set() {
    set_ = true;
    timer_.cancel();
  }
  void Reset() { set_ = false; }
  bool is_set() const { return set_; }

  // Returns when the event is set or when the awaiting coroutine is
  // cancelled through its cancellation slot.
  boost::asio::awaitable<void> Wait() {
    while (!set_) {
      co_await timer_.async_wait(kAwait);
      if (set_) break;
      auto state = co_await boost::asio::this_coro::cancellation_state;
      if (state.cancelled() != boost::asio::cancellation_type::none) break;
    }
  }

 private:
  boost::asio::steady_timer timer_;
  bool set_ = false;
};

}  // namespace stitch::net_internal
