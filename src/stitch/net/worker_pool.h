// A small pool of worker threads for blocking work (store calls, codec work,
// hashing), and the one awaitable helper that event-loop coroutines use to
// reach it:
//
//   absl::StatusOr<VersionManifest> m =
//       co_await RunBlocking(pool, [&] { return store.ReadManifest(7); });
//
// The coroutine suspends, `fn` runs on a worker thread, and the coroutine
// resumes on its own executor with fn's result. The loop thread never blocks.
#pragma once

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <boost/asio/awaitable.hpp>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stitch {

class WorkerPool {
 public:
  // Starts `threads` worker threads. REQUIRES: threads >= 1.
  explicit WorkerPool(int threads);
  // Runs every task already submitted to the end, then joins the threads.
  // Destroy the pool before the io_contexts its callers run on: a finishing
  // task resumes its coroutine through that context.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const { return threads_; }

  // Runs `fn` on a worker and completes, on the awaiting coroutine's
  // executor, after `fn` returned. Not cancellable: once started, the
  // awaiting coroutine waits for `fn`. REQUIRES: `fn` does not throw
  // (RunBlocking below takes care of that).
  boost::asio::awaitable<void> Run(absl::AnyInvocable<void() &&> fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int threads_;
};

namespace net_internal {

template <typename T>
struct IsStatusOr : std::false_type {};
template <typename T>
struct IsStatusOr<absl::StatusOr<T>> : std::true_type {};

template <typename R>
inline constexpr bool kIsStatusLike = std::is_same_v<R, absl::Status> || IsStatusOr<R>::value;

std::string DescribeException(const std::exception_ptr& error);

}  // namespace net_internal

// Runs `fn()` on `pool` and returns its result on the caller's executor.
// When fn returns absl::Status or absl::StatusOr<T>, an exception it throws
// becomes an Internal status naming the exception; for other result types
// (void included) the exception is rethrown in the awaiting coroutine, as if
// fn had run inline.
template <typename F>
boost::asio::awaitable<std::invoke_result_t<F&>> RunBlocking(WorkerPool& pool, F fn) {
  using R = std::invoke_result_t<F&>;
  std::exception_ptr error;
  if constexpr (std::is_void_v<R>) {
    co_await pool.Run([&fn, &error] {
      try {
        fn();
      } catch (...) {
        error = std::current_exception();
      }
    });
    if (error) std::rethrow_exception(error);
  } else {
    std::optional<R> result;
    co_await pool.Run([&fn, &error, &result] {
      try {
        result.emplace(fn());
      } catch (...) {
        error = std::current_exception();
      }
    });
    if (error) {
      if constexpr (net_internal::kIsStatusLike<R>) {
        co_return R(absl::InternalError(net_internal::DescribeException(error)));
      } else {
        std::rethrow_exception(error);
      }
    }
    co_return std::move(*result);
  }
}

}  // namespace stitch
