// The reconciler: converges one engine to the store's pointer, on its own.
//
// At start it initializes the engine's update destination (a failure is
// terminal), then runs passes. Each pass:
//   1. refreshes the store and reads the pointer (unset: nothing to follow);
//   2. when the pointer names another run, switches runs: admission closes,
//      every request drains, the engine resets to the boot checkpoint (only
//      when its weights are not already the boot weights), and the served
//      version becomes `<new run>/weight_v<boot>`;
//   3. when the pointer is ahead, reads the manifests of the versions in
//      between: if every one is an empty delta, the served version moves
//      under the gate without touching the engine; otherwise it materializes
//      the chain, stages the target while the engine serves, re-reads the
//      pointer once and stages the newer head of the same run too (so that
//      continuous publishing cannot starve commits and coalescing never
//      crosses runs; a failed re-read commits what was staged), and commits
//      through the gate (pause, commit, flip the served version, resume).
// A pass that committed is followed at once by another, which confirms the
// replica is at the pointer: the first such confirmation latches `ready`
// (/health 200) for good. Wakes (Wake(), every 409 of the gate) coalesce, and
// a wake during a pass asks for one more pass; a periodic backstop
// (options.reconcile_interval, 0 disables it) catches missed wakes.
//
// Errors: a store, materialization or staging error is transient:
// sync_state ERROR with the reason, retried on the next wake or backstop
// tick. A failed destination initialization, a failed commit, a failed
// reset to boot, or an engine that does not resume after a commit is
// terminal: readiness is lost, the gate refuses every new request, and the
// terminal listener is told (the sidecar then exits non-zero so that its
// supervisor replaces the replica). Fail() makes any other error terminal
// (the watchdog's).
//
// Threading: confined to the event loop whose executor it was built with;
// store and codec calls run on the worker pool.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stitch/core/state.h"
#include "stitch/core/version.h"
#include "stitch/engine/engine.h"
#include "stitch/net/worker_pool.h"
#include "stitch/replica/admission_gate.h"
#include "stitch/replica/clock.h"
#include "stitch/store/store.h"

namespace stitch {

namespace replica_internal {
class LoopSignal;
}

struct ReconcilerOptions {
  // The run of the boot checkpoint the engine starts with, and its version.
  std::string run_id;
  int64_t boot_version = 0;
  // The boot checkpoint (for stage plans).
  std::filesystem::path base_checkpoint_dir;
  CommitMode commit_mode = CommitMode::kInPlace;
  bool flush_cache_on_commit = false;
  // The backstop period; zero disables it.
  Clock::Duration reconcile_interval = std::chrono::seconds(5);
};

// Cumulative numbers, for /metrics.
struct ReconcilerCounters {
  uint64_t passes = 0;
  uint64_t commits = 0;  // engine commits
  uint64_t skipped = 0;  // served-version moves without the engine (empty deltas)
  uint64_t run_switches = 0;
  uint64_t errors = 0;  // transient pass errors
  double stage_seconds_sum = 0;
  double commit_seconds_sum = 0;
  uint64_t stages = 0;
  double last_stage_seconds = 0;
  double last_commit_seconds = 0;
};

class Reconciler {
 public:
  // Every reference must outlive the reconciler. `gate` serves the boot
  // version `<options.run_id>/weight_v<boot_version>` when the reconciler
  // starts (the caller builds it so).
  Reconciler(boost::asio::any_io_executor loop, ReconcilerOptions options, Store& store,
             Engine& engine, AdmissionGate& gate, WorkerPool& pool, Clock& clock);
  ~Reconciler();
  Reconciler(const Reconciler&) = delete;
  Reconciler& operator=(const Reconciler&) = delete;

  // Called once when the replica turns terminal, with the reason.
  void SetTerminalListener(std::function<void(const absl::Status&)> listener) {
    on_terminal_ = std::move(listener);
  }

  // Starts the work described above. Call once.
  void Start();

  // Cancels whatever is in flight and returns once every coroutine the
  // reconciler started has ended.
  boost::asio::awaitable<void> Stop();

  // Asks for a pass (coalesced with any pending one).
  void Wake();

  // Makes the replica terminal with `why` (idempotent: the first reason
  // stays).
  void Fail(absl::Status why);

  bool ready() const { return ready_ && terminal_.ok(); }
  SyncState sync_state() const { return sync_state_; }
  // Whether the engine is expected to make progress now: ready and not in
  // the paused commit moment (the watchdog probes only then).
  bool expects_progress() const { return ready() && sync_state_ != SyncState::kCommitting; }
  const absl::Status& terminal() const { return terminal_; }
  // Why /health is not 200 ("" when it is). /server_info's `reason` is the
  // state's own reason, also once ready (a transient sync error, say).
  std::string reason() const;
  const VersionRef& applied() const { return gate_.serving(); }
  const ReconcilerCounters& counters() const { return counters_; }
  // The last pass that moved the served version (stage_s, commit_s, ...).
  const std::map<std::string, double>& last_pass() const { return last_pass_; }

  // What /server_info reports.
  ReplicaState State() const;

 private:
  enum class PassResult { kCaughtUp, kMore, kError, kTerminal };
  struct Plan;

  boost::asio::awaitable<void> Loop();
  boost::asio::awaitable<void> Backstop();
  boost::asio::awaitable<PassResult> Pass();
  boost::asio::awaitable<absl::StatusOr<std::optional<VersionRef>>> ReadHead();
  boost::asio::awaitable<absl::StatusOr<Plan>> MakePlan(const VersionRef& target);
  boost::asio::awaitable<absl::Status> SwitchRun(const std::string& run_id);
  boost::asio::awaitable<absl::Status> Commit(const VersionRef& target);
  boost::asio::awaitable<absl::Status> MoveWithoutEngine(const VersionRef& target);
  DrainScope CommitScope() const {
    return options_.commit_mode == CommitMode::kQuiesce ? DrainScope::kAll : DrainScope::kExactPins;
  }
  void SetError(const absl::Status& status);
  // The reason while not yet ready ("" once ready).
  std::string CatchingUp() const;
  void SetState(SyncState state, std::string reason);
  void Spawn(boost::asio::awaitable<void> task, int slot);

  const boost::asio::any_io_executor loop_;
  const ReconcilerOptions options_;
  Store& store_;
  Engine& engine_;
  AdmissionGate& gate_;
  WorkerPool& pool_;
  Clock& clock_;

  std::function<void(const absl::Status&)> on_terminal_;
  std::unique_ptr<replica_internal::LoopSignal> wake_;
  std::unique_ptr<replica_internal::LoopSignal> ended_;
  bool wake_pending_ = false;
  bool started_ = false;
  bool stopping_ = false;

  // Coroutines started by Start(): the pass loop and the backstop.
  static constexpr int kTasks = 2;
  struct Task;
  std::unique_ptr<Task[]> tasks_;

  bool ready_ = false;
  bool destination_ready_ = false;
  std::string destination_error_;
  bool weights_are_boot_ = true;
  SyncState sync_state_ = SyncState::kIdle;
  std::string reason_ = "initializing: preparing the engine's update destination";
  absl::Status terminal_;
  ReconcilerCounters counters_;
  std::map<std::string, double> last_pass_;
};

}  // namespace stitch
