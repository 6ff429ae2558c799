// The watchdog: keeps checking the engine while nothing else would. Every
// `interval`, and at once when ProbeNow() asks (a request could not reach
// the engine), it runs the probe it was given (the reconciler's engine check:
// alive, and holding the weights the sidecar loaded), but only while probing
// makes sense (not in the paused commit moment, when an engine is busy
// loading and its label is changing). A failed probe takes the replica out
// of rotation (the probe's own doing); the watchdog trips (the replica turns
// terminal, and the sidecar exits non-zero so that its supervisor replaces
// it) only once `threshold` probes in a row have failed AND the engine has
// been failing for `restart_grace` (or, before it ever answered, for
// `start_timeout`): real engines take minutes to load a model, and an engine
// that restarts and comes back within the grace is followed again. A
// skipped probe resets the run of failures.
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
#include "stitch/net/clock.h"

namespace stitch {

class LoopSignal;

struct WatchdogOptions {
  // Zero disables the periodic probes (ProbeNow() still probes).
  Clock::Duration interval = std::chrono::seconds(1);
  int threshold = 15;
  // How long an engine that has not answered yet may take to start, and
  // how long one that answered before may stay away, before it trips.
  Clock::Duration start_timeout = std::chrono::minutes(30);
  Clock::Duration restart_grace = std::chrono::minutes(30);
  // How long one probe may take (real time: the engine's HTTP timeout).
  std::chrono::milliseconds probe_timeout = std::chrono::seconds(1);
};

class Watchdog {
 public:
  // The probe: OK when the engine answered as it should.
  using Probe = std::function<boost::asio::awaitable<absl::Status>()>;

  // `may_probe` says whether to probe now; `on_trip` is called once, with
  // the reason, when the watchdog trips. References must outlive it.
  Watchdog(boost::asio::any_io_executor loop, WatchdogOptions options, Clock& clock,
           std::function<bool()> may_probe, Probe probe, std::function<void(absl::Status)> on_trip);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Tells whether the engine answered since start other than through a
  // probe (the reconciler verified it): such an engine has the restart
  // grace, not the start timeout. Call before Start().
  void SetAnsweredBefore(std::function<bool()> answered) { answered_before_ = std::move(answered); }

  // Starts probing. Call once.
  void Start();
  // Cancels the loop and returns once it has ended.
  boost::asio::awaitable<void> Stop();
  // Probes as soon as possible (coalesced with a pending request), without
  // waiting for the interval.
  void ProbeNow();

  uint64_t probes() const { return probes_; }
  uint64_t failures() const { return failures_total_; }
  int consecutive_failures() const { return consecutive_; }
  bool tripped() const { return tripped_; }

 private:
  boost::asio::awaitable<void> Loop();
  boost::asio::awaitable<void> WaitForTurn();

  const boost::asio::any_io_executor loop_;
  const WatchdogOptions options_;
  Clock& clock_;
  std::function<bool()> may_probe_;
  Probe probe_;
  std::function<void(absl::Status)> on_trip_;
  std::function<bool()> answered_before_;

  struct Task;
  std::unique_ptr<Task> task_;
  std::unique_ptr<LoopSignal> ended_;
  std::unique_ptr<LoopSignal> now_;
  bool probe_now_ = false;
  bool stopping_ = false;
  uint64_t probes_ = 0;
  uint64_t failures_total_ = 0;
  bool answered_ = false;  // a probe has passed since Start()
  Clock::TimePoint failing_since_{};
  int consecutive_ = 0;
  bool tripped_ = false;
};

}  // namespace stitch
