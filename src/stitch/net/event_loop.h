// An event loop: one io_context run by one dedicated thread. Servers, clients
// and timers that share a loop share its thread, so their state needs no
// locks; blocking work goes to a WorkerPool instead (worker_pool.h).
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

namespace stitch {

class EventLoop {
 public:
  // Starts the loop thread. It runs until Stop() or destruction, also while
  // nothing is pending.
  EventLoop();
  // Stop()s and joins the thread, then destroys whatever is still pending
  // (suspended coroutines are destroyed, not resumed).
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  boost::asio::any_io_executor executor() const;

  // True when called on the loop thread.
  bool InLoopThread() const;

  // Makes the loop return; pending work stays pending. Idempotent;
  // thread-safe.
  void Stop();

  // Runs `task` on the loop and blocks the calling thread until it finishes,
  // returning its result (or rethrowing its exception). For tests, setup and
  // command-line tools. REQUIRES: not on the loop thread (that would
  // deadlock; it aborts instead), and the loop not stopped.
  template <typename T>
  T BlockOn(boost::asio::awaitable<T> task) {
    if constexpr (std::is_void_v<T>) {
      BlockOnVoid(std::move(task));
    } else {
      std::optional<T> result;
      BlockOnVoid(Store(std::move(task), &result));
      return std::move(*result);
    }
  }

 private:
  template <typename T>
  static boost::asio::awaitable<void> Store(boost::asio::awaitable<T> task, std::optional<T>* out) {
    out->emplace(co_await std::move(task));
  }
  void BlockOnVoid(boost::asio::awaitable<void> task);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Starts `task` on `executor` without waiting for it. An exception escaping
// `task` is an impossible state: it is reported on stderr and ends the
// process.
void Spawn(const boost::asio::any_io_executor& executor, boost::asio::awaitable<void> task);

}  // namespace stitch
