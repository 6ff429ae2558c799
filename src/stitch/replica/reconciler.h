// The reconciler: converges one engine to the store's pointer, on its own,
// and never lets the sidecar claim a version for weights it has not verified
// the engine holds.
//
// At start it initializes the engine's update destination (a failure is
// terminal). Then, and again whenever trust in the engine is withdrawn, it
// establishes what the engine holds before anything versioned is admitted
// (whether a report can be vouched for is engine_verifier.h's to say):
//   - it asks the engine what it holds (Engine::Report): a label naming a
//     version of the run it follows (the boot version, or a published
//     version at or below the pointer), and, when the engine reports one, a
//     weights fingerprint equal to the one the store's checksums give for
//     that version (WeightsFingerprint): then that version is verified and
//     served without touching the engine (a sidecar restarted beside a live
//     engine picks up where it was);
//   - otherwise (no label, an unknown one, another run, a label ahead of the
//     pointer, a fingerprint that disagrees) it establishes the weights by
//     loading a complete version itself: the pointer's version (staged from
//     its anchor, then committed) or the boot checkpoint (ResetToBoot).
// Every load (commit, reset) is followed by a report that must name what
// was loaded (and match its fingerprint, when reported); a mismatch leaves
// the engine's state unknown, which is terminal.
//
// Then it runs passes. Each pass:
//   1. refreshes the store and reads the pointer (unset: nothing to follow,
//      unless the replica or its engine holds a later version than boot: a
//      pointer never goes back to unset, so the store is missing, an error);
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
//      through the gate (pause, commit, verify, flip the served version,
//      resume).
// A pass that committed is followed at once by another, which confirms the
// replica is at the pointer: that confirmation makes it `ready` (/health
// 200), and it stays ready until trust in the engine is withdrawn. Wakes
// (Wake(), every 409 of the gate) coalesce, and a wake during a pass asks
// for one more pass; a periodic backstop (options.reconcile_interval, 0
// disables it) catches missed wakes.
//
// Watching the engine. CheckEngine() is the watchdog's probe: the engine's
// health, then its report, compared with what the sidecar loaded (the label,
// the instance id, the fingerprint). An engine that does not answer puts the
// gate on hold (no new requests, /health 503) until it answers again as
// expected; EngineUnreachable() does the same at once when a request could
// not reach it. An engine that answers with another label, a new instance
// (it restarted) or another fingerprint has changed behind the sidecar's
// back: Distrust() withdraws trust (requests in flight are answered as
// retryable, the distrust listener aborts them in the engine) and the
// reconciler establishes the weights again, as at start.
//
// Errors: a store, materialization or staging error is transient:
// sync_state ERROR with the reason, retried on the next wake or backstop
// tick. A failed destination initialization, a failed commit, a failed
// reset to boot, an engine that does not resume after a commit, or one that
// reports other weights than it just loaded is terminal: readiness is lost,
// the gate refuses every new request, and the terminal listener is told
// (the sidecar then exits non-zero so that its supervisor replaces the
// replica). Fail() makes any other error terminal (the watchdog's).
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
#include <random>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stitch/core/state.h"
#include "stitch/core/version.h"
#include "stitch/engine/engine.h"
#include "stitch/net/clock.h"
#include "stitch/net/worker_pool.h"
#include "stitch/replica/admission_gate.h"
#include "stitch/replica/engine_verifier.h"
#include "stitch/store/store.h"

namespace stitch {

class LoopSignal;

struct ReconcilerOptions {
  // The run of the boot checkpoint the engine starts with, and its version.
  std::string run_id;
  int64_t boot_version = 0;
  // The boot checkpoint (for stage plans, and the fingerprint of the boot
  // weights).
  std::filesystem::path base_checkpoint_dir;
  CommitMode commit_mode = CommitMode::kInPlace;
  bool flush_cache_on_commit = false;
  // The backstop period; zero disables it.
  Clock::Duration reconcile_interval = std::chrono::seconds(5);
  // Idle backoff: after each pass in a row that found the replica already at
  // the pointer, the backstop's period doubles, up to this, with jitter
  // (x0.8 to x1.2 once it has doubled) so that a fleet's reads of the
  // pointer spread out; any other pass (one that moved the replica, failed,
  // or verified the engine) brings it back to reconcile_interval at once. A
  // publish's wake, or a request refused for being ahead, runs a pass
  // whatever the period: the backoff only delays noticing a publish whose
  // wake was lost. At most reconcile_interval disables it.
  Clock::Duration reconcile_max_interval = std::chrono::seconds(30);
  // How long the store's pointer may stay unreadable (reads failing, or one
  // read hanging) before the replica leaves rotation: it can no longer tell
  // how far behind the pointer it is (a host cut off from the store). It
  // rejoins only once a pass has caught up with the pointer again. Zero:
  // never leave rotation for store errors. A pointer the store returns but
  // that does not parse is no outage: the store answered, and the replica
  // keeps serving its version while it reports the error.
  Clock::Duration store_outage_limit = std::chrono::seconds(30);
  // How long one engine report (establishing, after a load, a probe) may
  // take (real time).
  std::chrono::milliseconds report_timeout = std::chrono::seconds(5);
  // How long the engine may take to start: initializing its update
  // destination is retried (out of rotation, saying what it waits for) while
  // the engine cannot be reached, for this long.
  Clock::Duration engine_start_timeout = std::chrono::minutes(30);
};

// Cumulative numbers, for /metrics.
struct ReconcilerCounters {
  uint64_t passes = 0;
  uint64_t commits = 0;         // engine commits
  uint64_t commits_undone = 0;  // commits the engine undid (Engine::Commit's Aborted)
  uint64_t skipped = 0;         // served-version moves without the engine (empty deltas)
  uint64_t run_switches = 0;
  // Pointers seen behind the applied version of the same run (each moved-
  // back pointer once): a store writer rolled the pointer back; the
  // replica keeps what it serves, a replica starting now would not.
  uint64_t pointer_rewinds = 0;
  uint64_t errors = 0;  // transient pass errors
  double stage_seconds_sum = 0;
  double commit_seconds_sum = 0;
  uint64_t stages = 0;
  double last_stage_seconds = 0;
  double last_commit_seconds = 0;
  uint64_t verified = 0;     // engine weights verified without a load
  uint64_t established = 0;  // engine weights established by loading them
  uint64_t distrusted = 0;   // times trust in the engine was withdrawn
  uint64_t unreachable = 0;  // times the engine did not answer (probe or request)
};

class Reconciler {
 public:
  // Every reference must outlive the reconciler. The gate may start
  // trusted or not: the reconciler establishes what the engine holds
  // before anything else either way.
  Reconciler(boost::asio::any_io_executor loop, ReconcilerOptions options, Store& store,
             Engine& engine, AdmissionGate& gate, WorkerPool& pool, Clock& clock);
  ~Reconciler();
  Reconciler(const Reconciler&) = delete;
  Reconciler& operator=(const Reconciler&) = delete;

  // Called once when the replica turns terminal, with the reason.
  void SetTerminalListener(std::function<void(const absl::Status&)> listener) {
    on_terminal_ = std::move(listener);
  }
  // Called whenever trust in the engine is withdrawn (the sidecar aborts the
  // requests in flight in the engine).
  void SetDistrustListener(std::function<void()> listener) { on_distrust_ = std::move(listener); }

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

  // The watchdog's probe (see above): OK when the engine answered, whatever
  // it said; Unavailable when it did not. A probe that overlaps a load says
  // nothing about the weights and is ignored.
  boost::asio::awaitable<absl::Status> CheckEngine(std::chrono::milliseconds timeout);
  // Whether probing makes sense now: not terminal, not loading weights.
  bool may_probe() const { return terminal_.ok() && !loading_; }
  // A request could not reach the engine: hold new requests until a probe
  // finds it answering as expected.
  void EngineUnreachable(std::string_view why);
  // The engine's weights are not what the sidecar loaded (why): withdraw
  // trust and establish them again. No-op while already untrusted.
  void Distrust(std::string why);

  // Evaluation holds (docs/deploy.md, "Long runs"): from the next pass on,
  // the replica serves `version` instead of following the pointer, loading
  // it from its chain if it has moved past it, until the hold is released.
  // InvalidArgument for an empty holder; FailedPrecondition for a version of
  // another run than the one followed, one above the pointer last read, or
  // while another holder holds the replica (release it first). Holding
  // again under the same holder moves the hold.
  absl::Status HoldForEvaluation(const VersionRef& version, std::string holder);
  // Lets the replica follow the pointer again: it leaves rotation until a
  // pass has caught up with the pointer. NotFound when `holder` does not
  // hold it (another holder's hold stays).
  absl::Status ReleaseEvaluationHold(std::string_view holder);
  const std::optional<ReplicaState::Held>& evaluation_hold() const { return eval_hold_; }

  bool ready() const {
    return ready_ && terminal_.ok() && gate_.trusted() && !gate_.held() && !StoreLost();
  }
  SyncState sync_state() const { return sync_state_; }
  // Whether the engine has answered a report since start.
  bool engine_answered() const { return engine_answered_; }
  const absl::Status& terminal() const { return terminal_; }
  // Why /health is not 200 ("" when it is). /server_info's `reason` is the
  // state's own reason, also once ready (a transient sync error, say).
  std::string reason() const;
  // The served version; meaningful only while the gate is trusted.
  const VersionRef& applied() const { return gate_.serving(); }
  const ReconcilerCounters& counters() const { return counters_; }
  // The last pass that moved the served version (stage_s, commit_s, ...).
  const std::map<std::string, double>& last_pass() const { return last_pass_; }

  // What /server_info reports.
  ReplicaState State() const;

 private:
  enum class PassResult { kCaughtUp, kMore, kError, kTerminal };
  // What a pass loads: every version after the applied one, up to the
  // target, is an empty delta (`empty`), or the engine stages `stage`.
  struct Plan {
    bool empty = false;
    StagePlan stage;
  };

  boost::asio::awaitable<void> Loop();
  boost::asio::awaitable<void> Backstop();
  boost::asio::awaitable<PassResult> Pass();
  // What one pass that moves the served version did, for last_pass().
  struct PassRecord {
    int64_t applied_before = 0;
    VersionRef pointer;  // the pointer the pass started from
    VersionRef target;   // what it served in the end (a newer head, coalesced)
    std::chrono::steady_clock::time_point start;
    bool skipped = false;  // only empty deltas: no engine update
    bool coalesce_failed = false;
    double stage_s = 0;
    double commit_s = 0;
  };
  // The pass's steps: the replica is at the pointer; the pointer is ahead
  // (plan, stage, coalesce, commit); staging the newer head of the same run
  // once (false: the pass failed, the error is set); recording the pass.
  PassResult CaughtUp();
  boost::asio::awaitable<PassResult> Advance(const VersionRef& pointer,
                                             std::chrono::steady_clock::time_point pass_start);
  // A pass while held for evaluation: at the held version already, ahead
  // of it (load it from its chain) or behind it (advance to it).
  boost::asio::awaitable<PassResult> FollowHold(std::chrono::steady_clock::time_point pass_start);
  boost::asio::awaitable<bool> StageNewerHead(PassRecord& record);
  void Record(PassRecord record);
  boost::asio::awaitable<PassResult> Establish();
  boost::asio::awaitable<absl::StatusOr<std::optional<VersionRef>>> ReadHead();
  // The chain from `from` (the applied version, or the boot version when
  // nothing else can be relied on) to `target`; `allow_empty`: when every
  // version after `from` is an empty delta, say so instead of a chain.
  boost::asio::awaitable<absl::StatusOr<Plan>> MakePlan(const VersionRef& target, int64_t from,
                                                        bool allow_empty);
  boost::asio::awaitable<absl::Status> SwitchRun(const std::string& run_id, bool force_reset);
  boost::asio::awaitable<absl::Status> Commit(const VersionRef& target);
  boost::asio::awaitable<absl::Status> MoveWithoutEngine(const VersionRef& target);
  // Stages and commits `target` from its anchor (the weights are unknown).
  boost::asio::awaitable<PassResult> LoadVersion(const VersionRef& target);
  DrainScope CommitScope() const {
    return options_.commit_mode == CommitMode::kQuiesce ? DrainScope::kAll : DrainScope::kExactPins;
  }
  void SetError(const absl::Status& status);
  // Counts and logs (once per pointer) a pointer behind the applied version
  // of the same run; forgets a rewind the pointer has moved past. Called on
  // every pointer read.
  void NotePointer(const VersionRef& pointer);
  // What the pointer did that the operator should know of, for
  // ReplicaState::pointer_notice.
  std::string PointerNotice() const;
  // The error of a pointer that reads unset while `held` (a later version
  // than boot) is held: the store is missing or unreadable.
  absl::Status PointerVanished(const std::string& held) const;
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
  EngineVerifier verifier_;

  std::function<void(const absl::Status&)> on_terminal_;
  std::function<void()> on_distrust_;
  std::unique_ptr<LoopSignal> wake_;
  std::unique_ptr<LoopSignal> ended_;
  bool wake_pending_ = false;
  // Idle backoff (ReconcilerOptions::reconcile_max_interval): passes in a
  // row that found the replica at the pointer, and when the backstop wakes
  // the loop next.
  int idle_passes_ = 0;
  Clock::TimePoint next_backstop_{};
  uint64_t jitter_state_ = std::random_device{}();
  // Sets next_backstop_ from idle_passes_, counting from now.
  void ScheduleBackstop();
  bool started_ = false;
  bool stopping_ = false;

  // Coroutines started by Start(): the pass loop and the backstop.
  static constexpr int kTasks = 2;
  struct Task;
  std::unique_ptr<Task[]> tasks_;

  bool ready_ = false;
  std::optional<ReplicaState::Held> eval_hold_;
  // When a commit last dropped the cached copies of deleted versions
  // (Store::PruneLocalCopies), at most once per kPruneEvery.
  static constexpr Clock::Duration kPruneEvery = std::chrono::minutes(5);
  std::optional<Clock::TimePoint> last_prune_;
  // Since when the pointer cannot be read: the first failed read of the
  // current streak, and the start of the read in flight.
  std::optional<Clock::TimePoint> reads_failing_since_;
  std::optional<Clock::TimePoint> read_started_;
  // Whether the pointer has been unreadable for options_.store_outage_limit.
  bool StoreLost() const;
  bool destination_ready_ = false;
  std::string destination_error_;
  // The run being followed: the boot run, then the pointer's after a switch.
  std::string run_id_;
  bool weights_are_boot_ = false;
  // While a commit or reset changes the engine's weights; bumped at each
  // load so that a probe overlapping one is ignored.
  bool loading_ = false;
  uint64_t loads_ = 0;
  // The last attempt to establish the weights found the engine silent.
  bool waiting_for_engine_ = false;
  // The version the pointer names when its files were refused as malformed
  // (InvalidArgument, DataLoss: a published version never changes), why,
  // and when: later passes say so again without reading it, until the
  // pointer moves or kRefusedVersionRecheck has passed.
  struct RefusedVersion {
    VersionRef version;
    absl::Status why;
    Clock::TimePoint at;
  };
  std::optional<RefusedVersion> refused_;
  // Remembers `version` as refused for `why`, and reports it.
  void RefuseVersion(const VersionRef& version, const absl::Status& why);
  bool engine_answered_ = false;
  static constexpr Clock::Duration kRefusedVersionRecheck = std::chrono::minutes(10);
  SyncState sync_state_ = SyncState::kIdle;
  std::string reason_ = "initializing: preparing the engine's update destination";
  // The error of the last pass that failed, until a pass catches up.
  std::string sync_error_;
  // The moved-back pointer last counted in pointer_rewinds (loop thread).
  std::optional<VersionRef> rewound_to_;
  // The last run switch (loop thread): the run served before, the boot
  // switched to, and when; told for kRunSwitchNoticeFor.
  struct RunSwitch {
    std::string from;
    VersionRef to;
    Clock::TimePoint at;
  };
  std::optional<RunSwitch> switched_;
  static constexpr Clock::Duration kRunSwitchNoticeFor = std::chrono::minutes(10);
  absl::Status terminal_;
  ReconcilerCounters counters_;
  std::map<std::string, double> last_pass_;
};

}  // namespace stitch
