#include "stitch/net/worker_pool.h"

#include <cstdio>
#include <cstdlib>

#include <boost/asio/async_result.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "absl/strings/str_cat.h"

namespace stitch {

struct WorkerPool::Impl {
  explicit Impl(int threads) : pool(static_cast<size_t>(threads)) {}
  boost::asio::thread_pool pool;
};

WorkerPool::WorkerPool(int threads) : threads_(threads) {
  if (threads < 1) {
    std::fprintf(stderr, "stitch: WorkerPool needs at least one thread, got %d\n", threads);
    std::abort();
  }
  impl_ = std::make_unique<Impl>(threads);
}

WorkerPool::~WorkerPool() {
  // Without a prior stop(), join() waits until the queue is empty.
  impl_->pool.join();
}

boost::asio::awaitable<void> WorkerPool::Run(absl::AnyInvocable<void() &&> fn) {
  boost::asio::any_io_executor executor = co_await boost::asio::this_coro::executor;
  co_await boost::asio::async_initiate<const boost::asio::use_awaitable_t<>, void()>(
      [this, &fn, &executor](auto handler) {
        // The guard keeps the caller's context running while fn is away.
        auto work = boost::asio::make_work_guard(executor);
        boost::asio::post(impl_->pool, [fn = std::move(fn), handler = std::move(handler),
                                        work = std::move(work)]() mutable {
          std::move(fn)();
          boost::asio::any_io_executor resume_on = work.get_executor();
          boost::asio::post(resume_on, std::move(handler));
        });
      },
      boost::asio::use_awaitable);
}

namespace net_internal {

std::string DescribeException(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return absl::StrCat("blocking task threw: ", e.what());
  } catch (...) {
    return "blocking task threw a non-standard exception";
  }
}

}  // namespace net_internal

}  // namespace stitch
