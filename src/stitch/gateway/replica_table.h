// The gateway's replica table: which replicas the pool has (discovery), what
// each says about itself (/server_info probes), what the answers relayed
// from each teach, what this gateway has outstanding on each, and which of
// them have stalled. It keeps the routing index (chooser.h) current and
// tells waiting requests when it changes.
//
// Time: the poll schedule, probe timeouts, waits for the fleet and the
// stall watch all read and sleep on the injected Clock, so tests drive them
// with a ManualClock.
//   - every `poll_interval` (at least every `waiting_poll_interval` while a
//     request waits for the fleet, and at once after a wake) the pool is
//     discovered and every replica probed; a replica whose probe fails or
//     takes longer than `probe_timeout` leaves rotation until one succeeds;
//   - while any request waits for the fleet, the fleet is woken again at
//     every poll, at most once per `waiting_wake_interval` (a version
//     published after the wait began is found by replicas in their idle
//     backoff only when woken);
//   - a replica that stays busy (requests outstanding from this gateway)
//     without sending anything back for `stall_timeout` is stalled (seen
//     within 1.2 stall timeouts, by a watch that looks five times per
//     timeout); its next answer or byte ends the stall. Zero disables it.
//
// Threading: confined to the gateway's event loop; Pool calls (blocking)
// run on the worker pool.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "absl/status/status.h"
#include "stitch/core/state.h"
#include "stitch/gateway/chooser.h"
#include "stitch/gateway/fleet_history.h"
#include "stitch/net/client.h"
#include "stitch/net/clock.h"
#include "stitch/net/worker_pool.h"
#include "stitch/pool/pool.h"

namespace stitch {

class LoopSignal;

struct ReplicaTableOptions {
  std::chrono::milliseconds poll_interval = std::chrono::seconds(1);
  std::chrono::milliseconds waiting_poll_interval = std::chrono::milliseconds(200);
  std::chrono::milliseconds waiting_wake_interval = std::chrono::seconds(2);
  std::chrono::milliseconds probe_timeout = std::chrono::seconds(2);
  std::chrono::milliseconds stall_timeout = std::chrono::seconds(5);
  // Presented with every probe when not empty (net/auth.h).
  std::string bearer_token;
};

// What the table counts, for the gateway's /metrics.
struct ReplicaTableCounters {
  uint64_t stalls = 0;  // replicas found stalled
  uint64_t wakes = 0;   // fleet wakes started
};

// Whether a failure says the replica cannot be reached at all.
enum class Reachability { kReached, kUnreachable };

class ReplicaTable {
 public:
  // `pool`, `workers`, `client` and `clock` must outlive the table;
  // `client` is the one probes go through.
  ReplicaTable(boost::asio::any_io_executor executor, Pool& pool, WorkerPool& workers,
               HttpClient& client, Clock& clock, ReplicaTableOptions options);
  ~ReplicaTable();
  ReplicaTable(const ReplicaTable&) = delete;
  ReplicaTable& operator=(const ReplicaTable&) = delete;

  // Starts discovering, probing and watching (the first discovery at once).
  void Start();
  // Stops starting work and wakes every waiting request (they see
  // stopping()). Then Stopped() returns once every background task (polls,
  // probes, wakes, the watch) ended.
  void Stop();
  boost::asio::awaitable<void> Stopped();
  bool stopping() const { return stopping_; }

  // --- what the relay reports --------------------------------------------------
  // A request to `r` starts or ends.
  void Begin(ReplicaEntry& r);
  void End(ReplicaEntry& r);
  // An answer, a response header or stream bytes arrived from `r`.
  void Progress(ReplicaEntry& r);
  // `r` failed a request (`why`); it leaves rotation until a probe says it
  // is ready again.
  void MarkFailed(ReplicaEntry& r, std::string why, Reachability reach);
  // `r` said (a 409) that it serves `applied`.
  void LearnApplied(ReplicaEntry& r, const VersionRef& applied);
  // `r` stamped an answer with `version` as its end version.
  void LearnVersion(ReplicaEntry& r, int64_t version);

  // --- waiting for the fleet -------------------------------------------------
  // Starts a wake of every replica (Pool::Wake) unless one runs or one
  // started less than waiting_wake_interval ago; the replicas are polled
  // once it ends. While requests wait, the table calls it at every poll.
  void Wake();
  // Returns at the next change of the routing index, at `deadline`, or when
  // cancelled (then CancelledError, as CancelOnDisconnect wants). While any
  // request waits, replicas are polled at least every waiting_poll_interval.
  boost::asio::awaitable<absl::Status> WaitForChange(Clock::TimePoint deadline);

  // --- reading ----------------------------------------------------------------
  // The routing index, rebuilt first when something changed.
  const RoutingIndex& index();
  const ReplicaMap& replicas() const { return replicas_; }
  // Every replica as the gateway's /replicas shows it.
  PoolState Snapshot() const;
  const ReplicaTableCounters& counters() const { return counters_; }
  // What the dashboard shows; the table records every replica's changes in
  // it, the relay what it served.
  FleetHistory& history() { return history_; }
  const FleetHistory& history() const { return history_; }

 private:
  void Changed();
  class TaskScope;
  class WaitScope;
  void StartTask(boost::asio::awaitable<void> task);
  void TaskEnded();
  boost::asio::awaitable<void> PollLoop();
  boost::asio::awaitable<void> PollOnce();
  boost::asio::awaitable<void> Probe(ReplicaPtr r);
  boost::asio::awaitable<void> RunWake();
  boost::asio::awaitable<void> WatchStalls();
  void CheckStalls(Clock::TimePoint now);

  const boost::asio::any_io_executor executor_;
  Pool& pool_;
  WorkerPool& workers_;
  HttpClient& client_;
  Clock& clock_;
  const ReplicaTableOptions options_;

  ReplicaMap replicas_;
  bool dirty_ = true;
  RoutingIndex index_;
  std::string last_discover_error_;
  ReplicaTableCounters counters_;
  FleetHistory history_;
  int waiting_ = 0;  // requests in WaitForChange
  bool wake_running_ = false;
  std::optional<Clock::TimePoint> last_wake_;  // when the last wake started
  bool stopping_ = false;
  int tasks_ = 0;  // background coroutines still running

  std::unique_ptr<LoopSignal> changed_;   // the routing index changed
  std::unique_ptr<LoopSignal> poll_now_;  // a wake ended, or a request began to wait
  std::unique_ptr<LoopSignal> stop_;      // Stop() was called
  std::unique_ptr<LoopSignal> idle_;      // the last background task ended
};

}  // namespace stitch
