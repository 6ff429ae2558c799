#include "stitch/net/event_loop.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "absl/synchronization/notification.h"

namespace stitch {

struct EventLoop::Impl {
  Impl() : work(io.get_executor()) {}

  // One thread runs the context: Asio then queues handlers posted from that
  // thread without taking its lock.
  boost::asio::io_context io{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work;
  std::thread thread;
};

EventLoop::EventLoop() : impl_(std::make_unique<Impl>()) {
  impl_->thread = std::thread([io = &impl_->io] { io->run(); });
}

EventLoop::~EventLoop() {
  Stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

boost::asio::any_io_executor EventLoop::executor() const { return impl_->io.get_executor(); }

bool EventLoop::InLoopThread() const {
  return impl_->thread.get_id() == std::this_thread::get_id();
}

void EventLoop::Stop() {
  impl_->work.reset();
  impl_->io.stop();
}

void EventLoop::BlockOnVoid(boost::asio::awaitable<void> task) {
  if (InLoopThread()) {
    std::fputs("stitch: EventLoop::BlockOn called on its own loop thread (deadlock)\n", stderr);
    std::abort();
  }
  absl::Notification done;
  std::exception_ptr error;
  boost::asio::co_spawn(impl_->io, std::move(task), [&](std::exception_ptr e) {
    error = std::move(e);
    done.Notify();
  });
  done.WaitForNotification();
  if (error) std::rethrow_exception(error);
}

void Spawn(const boost::asio::any_io_executor& executor, boost::asio::awaitable<void> task) {
  boost::asio::co_spawn(executor, std::move(task), [](const std::exception_ptr& e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "stitch: a spawned task threw: %s\n", ex.what());
    } catch (...) {
      std::fputs("stitch: a spawned task threw a non-standard exception\n", stderr);
    }
    std::abort();
  });
}

}  // namespace stitch
