#include "stitch/replica/watchdog.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <utility>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/net/loop_signal.h"

namespace stitch {

using boost::asio::awaitable;

struct Watchdog::Task {
  boost::asio::cancellation_signal cancel;
  bool running = false;
};

Watchdog::Watchdog(boost::asio::any_io_executor loop, WatchdogOptions options, Clock& clock,
                   std::function<bool()> may_probe, Probe probe,
                   std::function<void(absl::Status)> on_trip)
    : loop_(std::move(loop)),
      options_(options),
      clock_(clock),
      may_probe_(std::move(may_probe)),
      probe_(std::move(probe)),
      on_trip_(std::move(on_trip)),
      task_(std::make_unique<Task>()),
      ended_(std::make_unique<LoopSignal>(loop_)),
      now_(std::make_unique<LoopSignal>(loop_)) {}

Watchdog::~Watchdog() = default;

void Watchdog::Start() {
  if (task_->running || options_.threshold <= 0) return;
  task_->running = true;
  boost::asio::co_spawn(
      loop_, Loop(),
      boost::asio::bind_cancellation_slot(task_->cancel.slot(), [this](std::exception_ptr error) {
        task_->running = false;
        ended_->NotifyAll();
        if (error && !stopping_) {
          tripped_ = true;
          on_trip_(absl::InternalError("the engine watchdog failed"));
        }
      }));
}

awaitable<void> Watchdog::Stop() {
  stopping_ = true;
  if (task_->running) task_->cancel.emit(boost::asio::cancellation_type::terminal);
  while (task_->running) co_await ended_->Wait();
}

void Watchdog::ProbeNow() {
  probe_now_ = true;
  now_->NotifyAll();
}

awaitable<void> Watchdog::WaitForTurn() {
  using namespace boost::asio::experimental::awaitable_operators;
  if (probe_now_) co_return;
  if (options_.interval <= Clock::Duration::zero()) {
    while (!probe_now_ && !stopping_) {
      const bool notified = co_await now_->Wait();
      if (!notified) co_return;
    }
    co_return;
  }
  (void)co_await (clock_.SleepFor(options_.interval) || now_->Wait());
}

awaitable<void> Watchdog::Loop() {
  while (!stopping_) {
    co_await WaitForTurn();
    if (stopping_) break;
    probe_now_ = false;
    if (!may_probe_()) {
      consecutive_ = 0;
      continue;
    }
    ++probes_;
    absl::Status health = co_await probe_();
    if (stopping_) break;
    if (health.ok()) {
      if (!answered_ || consecutive_ > 0) spdlog::info("the engine answers its checks");
      answered_ = true;
      consecutive_ = 0;
      continue;
    }
    ++failures_total_;
    if (consecutive_++ == 0) failing_since_ = clock_.Now();
    if (!answered_ && answered_before_ && answered_before_()) answered_ = true;
    const Clock::Duration bound = answered_ ? options_.restart_grace : options_.start_timeout;
    const Clock::Duration failing = clock_.Now() - failing_since_;
    const auto seconds = [](Clock::Duration d) {
      return std::chrono::duration_cast<std::chrono::seconds>(d).count();
    };
    spdlog::warn("engine check failed ({} in a row, for {} s of {} s {}): {}", consecutive_,
                 seconds(failing), seconds(bound),
                 answered_ ? "allowed for the engine to come back" : "allowed for it to start",
                 std::string(health.message()));
    if (consecutive_ >= options_.threshold && failing >= bound) {
      tripped_ = true;
      on_trip_(absl::UnavailableError(absl::StrCat(
          answered_ ? "the engine went away and did not come back within "
                    : "the engine did not start within ",
          seconds(bound), " s (", consecutive_,
          " health checks in a row failed, last: ", health.message(), "); replace this replica")));
      co_return;
    }
  }
}

}  // namespace stitch
