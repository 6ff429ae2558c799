// The watchdog: notices an engine that stopped working while nothing else
// would. Every `interval` it probes the engine's health, but only while the
// replica is expected to make progress (ready and not in the paused commit
// moment: a paused or still-loading engine is not a dead one). `threshold`
// consecutive failed probes trip it: the replica turns terminal (the sidecar
// then exits non-zero so that its supervisor replaces it). A skipped probe
// resets the count.
//
// Threading: confined to the event loop whose executor it was built with.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "absl/status/status.h"
#include "stitch/engine/engine.h"
#include "stitch/replica/clock.h"

namespace stitch {

namespace replica_internal {
class LoopSignal;
}

struct WatchdogOptions {
  Clock::Duration interval = std::chrono::seconds(5);
  int threshold = 3;
  // How long one probe may take (real time: the engine's HTTP timeout).
  std::chrono::milliseconds probe_timeout = std::chrono::seconds(5);
};

class Watchdog {
 public:
  // `expects_progress` says whether to probe now; `on_trip` is called once,
  // with the reason, when the watchdog trips. References must outlive it.
  Watchdog(boost::asio::any_io_executor loop, WatchdogOptions options, Engine& engine, Clock& clock,
           std::function<bool()> expects_progress, std::function<void(absl::Status)> on_trip);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts probing. Call once.
  void Start();
  // Cancels the loop and returns once it has ended.
  boost::asio::awaitable<void> Stop();

  uint64_t probes() const { return probes_; }
  uint64_t failures() const { return failures_total_; }
  int consecutive_failures() const { return consecutive_; }
  bool tripped() const { return tripped_; }

 private:
  boost::asio::awaitable<void> Loop();

  const boost::asio::any_io_executor loop_;
  const WatchdogOptions options_;
  Engine& engine_;
  Clock& clock_;
  std::function<bool()> expects_progress_;
  std::function<void(absl::Status)> on_trip_;

  struct Task;
  std::unique_ptr<Task> task_;
  std::unique_ptr<replica_internal::LoopSignal> ended_;
  bool stopping_ = false;
  uint64_t probes_ = 0;
  uint64_t failures_total_ = 0;
  int consecutive_ = 0;
  bool tripped_ = false;
};

}  // namespace stitch
