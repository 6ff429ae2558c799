#include "stitch/replica/reconciler.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <utility>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/pointer.h"
#include "stitch/net/loop_signal.h"
#include "stitch/store/materialize_chain.h"

namespace stitch {

using boost::asio::awaitable;

namespace {

constexpr std::string_view kCatchingUp = "catching up with the store's pointer";

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

struct Reconciler::Task {
  boost::asio::cancellation_signal cancel;
  bool running = false;
};

struct Reconciler::Plan {
  // Every version after the applied one, up to the target, is an empty delta.
  bool empty = false;
  StagePlan stage;
};

Reconciler::Reconciler(boost::asio::any_io_executor loop, ReconcilerOptions options, Store& store,
                       Engine& engine, AdmissionGate& gate, WorkerPool& pool, Clock& clock)
    : loop_(std::move(loop)),
      options_(std::move(options)),
      store_(store),
      engine_(engine),
      gate_(gate),
      pool_(pool),
      clock_(clock),
      verifier_(EngineVerifierOptions{options_.boot_version, options_.base_checkpoint_dir,
                                      options_.report_timeout},
                store, engine, pool),
      wake_(std::make_unique<LoopSignal>(loop_)),
      ended_(std::make_unique<LoopSignal>(loop_)),
      tasks_(std::make_unique<Task[]>(kTasks)),
      run_id_(options_.run_id) {
  gate_.SetRejectListener([this] { Wake(); });
}

Reconciler::~Reconciler() = default;

void Reconciler::Spawn(awaitable<void> task, int slot) {
  tasks_[slot].running = true;
  boost::asio::co_spawn(
      loop_, std::move(task),
      boost::asio::bind_cancellation_slot(
          tasks_[slot].cancel.slot(), [this, slot](std::exception_ptr error) {
            tasks_[slot].running = false;
            ended_->NotifyAll();
            if (error && !stopping_) {
              // Our coroutines return errors as values; an exception that
              // was not a requested cancellation is an impossible state.
              try {
                std::rethrow_exception(error);
              } catch (const std::exception& e) {
                Fail(absl::InternalError(absl::StrCat("reconciler failed: ", e.what())));
              } catch (...) {
                Fail(absl::InternalError("reconciler failed with an unknown exception"));
              }
            }
          }));
}

void Reconciler::Start() {
  if (started_) return;
  started_ = true;
  Spawn(Loop(), 0);
  if (options_.reconcile_interval > Clock::Duration::zero()) Spawn(Backstop(), 1);
}

awaitable<void> Reconciler::Stop() {
  stopping_ = true;
  for (int i = 0; i < kTasks; ++i) {
    if (tasks_[i].running) tasks_[i].cancel.emit(boost::asio::cancellation_type::terminal);
  }
  wake_->NotifyAll();
  for (int i = 0; i < kTasks; ++i) {
    while (tasks_[i].running) co_await ended_->Wait();
  }
}

void Reconciler::Wake() {
  wake_pending_ = true;
  wake_->NotifyAll();
}

void Reconciler::Fail(absl::Status why) {
  if (!terminal_.ok()) return;
  if (why.ok()) why = absl::InternalError("terminated");
  terminal_ = std::move(why);
  sync_state_ = SyncState::kError;
  reason_ = absl::StrCat("terminal error: ", terminal_.message());
  spdlog::error("replica is terminal: {}", std::string(terminal_.message()));
  gate_.Terminate(terminal_);
  wake_->NotifyAll();
  if (on_terminal_) on_terminal_(terminal_);
}

bool Reconciler::StoreLost() const {
  if (options_.store_outage_limit <= Clock::Duration::zero()) return false;
  std::optional<Clock::TimePoint> since = reads_failing_since_;
  if (read_started_ && (!since || *read_started_ < *since)) since = read_started_;
  return since && clock_.Now() - *since >= options_.store_outage_limit;
}

std::string Reconciler::reason() const {
  if (!terminal_.ok() || !destination_ready_) return reason_;
  if (ready_ && StoreLost()) {
    return absl::StrCat(
        "cannot read the store's pointer for ",
        std::chrono::duration_cast<std::chrono::seconds>(options_.store_outage_limit).count(),
        " s or more, so this replica may be behind it; it returns once caught up (",
        sync_error_.empty() ? "a read is still waiting" : sync_error_, ")");
  }
  if (!gate_.trusted()) {
    if (sync_state_ == SyncState::kError) return reason_;
    return absl::StrCat("verifying the engine: ", gate_.distrust_reason());
  }
  if (gate_.held()) {
    // The hold's reason is in the gate's refusals; /health says the same.
    return "the engine did not answer its last check; waiting for it to answer as expected";
  }
  if (ready_) return "";
  return reason_;
}

std::string Reconciler::CatchingUp() const {
  return ready_ ? std::string() : std::string(kCatchingUp);
}

void Reconciler::SetState(SyncState state, std::string reason) {
  if (!terminal_.ok()) return;
  sync_state_ = state;
  reason_ = std::move(reason);
}

absl::Status Reconciler::PointerVanished(const std::string& held) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "store ", store_.uri(), ": the pointer reads unset, yet the engine holds ", held,
      "; a pointer never goes back to unset, so the store is missing or unreadable: check that "
      "its path or volume is there (the engine keeps its weights until the pointer is back)"));
}

void Reconciler::SetError(const absl::Status& status) {
  ++counters_.errors;
  spdlog::warn("reconcile: {} (will retry)", std::string(status.message()));
  sync_error_ = std::string(status.message());
  gate_.SetBehindReason(sync_error_);
  SetState(SyncState::kError, absl::StrCat("sync error: ", status.message()));
}

ReplicaState Reconciler::State() const {
  ReplicaState s;
  s.ready = ready();
  s.applied = gate_.known_serving();
  s.sync_state = sync_state_;
  s.reason = reason();
  if (s.reason.empty()) s.reason = reason_;
  s.sync_error = sync_error_;
  s.run_id = gate_.trusted() ? gate_.serving().run_id : run_id_;
  s.commit_mode = options_.commit_mode;
  s.active_requests = gate_.active();
  s.update_destination_ready = destination_ready_;
  s.update_destination_error = destination_error_;
  s.terminal_error = terminal_.ok() ? std::string() : std::string(terminal_.message());
  s.metrics = last_pass_;
  s.pointer = gate_.pointer();
  return s;
}

// Watching the engine ----------------------------------------------------------

void Reconciler::EngineUnreachable(std::string_view why) {
  if (!terminal_.ok()) return;
  if (!gate_.held()) {
    ++counters_.unreachable;
    spdlog::warn("the engine did not answer ({}): holding new requests until it does",
                 std::string(why));
  }
  gate_.Hold(absl::StrCat("the engine did not answer: ", AbslView(why)));
}

void Reconciler::Distrust(std::string why) {
  if (!terminal_.ok() || !gate_.trusted()) return;
  ++counters_.distrusted;
  spdlog::error(
      "{}: the sidecar no longer vouches for the engine's weights; establishing them "
      "again",
      why);
  gate_.Distrust(std::move(why));
  ready_ = false;
  if (on_distrust_) on_distrust_();
  Wake();
}

awaitable<absl::Status> Reconciler::CheckEngine(std::chrono::milliseconds timeout) {
  const uint64_t loads = loads_;
  absl::Status health = co_await engine_.Health(timeout);
  absl::StatusOr<EngineReport> report = absl::UnavailableError("not asked");
  if (health.ok()) {
    report = co_await engine_.Report(timeout);
  } else {
    report = health;
  }
  if (loads != loads_ || loading_ || !terminal_.ok()) co_return absl::OkStatus();
  if (!report.ok()) {
    EngineUnreachable(std::string(report.status().message()));
    co_return report.status();
  }
  engine_answered_ = true;
  if (!gate_.trusted()) {
    // The pass loop establishes the weights; when it last failed for want of
    // an answer, the engine answering again is worth another attempt.
    gate_.Unhold();
    if (waiting_for_engine_) Wake();
    co_return absl::OkStatus();
  }
  if (std::string drift = verifier_.Drift(*report, gate_.engine_label()); !drift.empty()) {
    Distrust(std::move(drift));
    gate_.Unhold();
    co_return absl::OkStatus();
  }
  if (gate_.held()) spdlog::info("the engine answers again as expected");
  gate_.Unhold();
  co_return absl::OkStatus();
}

// The loops ------------------------------------------------------------------

awaitable<void> Reconciler::Backstop() {
  while (!stopping_ && terminal_.ok()) {
    co_await clock_.SleepFor(options_.reconcile_interval);
    if (stopping_) break;
    Wake();
  }
}

awaitable<void> Reconciler::Loop() {
  const VersionRef boot{options_.run_id, options_.boot_version};
  const Clock::TimePoint started = clock_.Now();
  absl::Status initialized = co_await engine_.InitializeDestination(boot);
  // An engine that is not up yet (a real one loads its model for minutes)
  // is waited for; anything else it says is final.
  while (!initialized.ok() && !stopping_ &&
         (absl::IsUnavailable(initialized) || absl::IsDeadlineExceeded(initialized)) &&
         clock_.Now() - started < options_.engine_start_timeout) {
    destination_error_ = std::string(initialized.message());
    reason_ = absl::StrCat(
        "initializing: waiting for the engine to start (",
        std::chrono::duration_cast<std::chrono::seconds>(clock_.Now() - started).count(), " s of ",
        std::chrono::duration_cast<std::chrono::seconds>(options_.engine_start_timeout).count(),
        " s allowed): ", initialized.message());
    co_await clock_.SleepFor(std::chrono::seconds(1));
    if (stopping_) co_return;
    initialized = co_await engine_.InitializeDestination(boot);
  }
  if (stopping_) co_return;
  if (!initialized.ok()) {
    destination_error_ = std::string(initialized.message());
    Fail(Annotate(initialized, "weight update destination initialization failed"));
    co_return;
  }
  destination_error_.clear();
  destination_ready_ = true;
  SetState(SyncState::kIdle, std::string(kCatchingUp));
  wake_pending_ = true;
  // Whatever the gate was built with, what the engine holds is verified
  // before anything is served.
  gate_.Distrust("verifying what the engine holds");
  while (!stopping_ && terminal_.ok()) {
    while (!wake_pending_ && !stopping_ && terminal_.ok()) {
      const bool notified = co_await wake_->Wait();
      if (!notified) co_return;
    }
    if (stopping_ || !terminal_.ok()) break;
    wake_pending_ = false;
    PassResult result = PassResult::kError;
    if (gate_.trusted()) {
      result = co_await Pass();
    } else {
      result = co_await Establish();
    }
    if (result == PassResult::kTerminal) break;
    if (result == PassResult::kMore) wake_pending_ = true;
  }
}

// Establishing what the engine holds ------------------------------------------

awaitable<Reconciler::PassResult> Reconciler::Establish() {
  ++counters_.passes;
  SetState(SyncState::kFetching, "verifying what the engine holds");
  absl::StatusOr<EngineReport> report = co_await engine_.Report(options_.report_timeout);
  if (!report.ok()) {
    EngineUnreachable(std::string(report.status().message()));
    waiting_for_engine_ = true;
    SetError(Annotate(report.status(), "verifying what the engine holds"));
    co_return PassResult::kError;
  }
  waiting_for_engine_ = false;
  engine_answered_ = true;
  gate_.Unhold();
  auto head = co_await ReadHead();
  if (!head.ok()) {
    SetError(head.status());
    co_return PassResult::kError;
  }
  const EngineVerdict verdict = co_await verifier_.Verify(*report, *head, run_id_);
  if (!terminal_.ok() || stopping_) co_return PassResult::kTerminal;
  if (!verdict.ok() && !head->has_value() && report->held.has_value() &&
      (report->held->run_id.empty() || report->held->run_id == run_id_) &&
      report->held->version > options_.boot_version) {
    // A pointer never goes back to unset: an unset one beside an engine
    // that holds a later version of this run says the store is missing or
    // unreadable (an unmounted volume, a renamed root), not that there is
    // nothing to follow. Resetting the engine to its boot weights would
    // throw a published version away; the replica waits for the store.
    SetError(PointerVanished(report->held->ToString()));
    co_return PassResult::kError;
  }
  if (verdict.ok()) {
    const VersionRef& verified = verdict.verified;
    run_id_ = verified.run_id;
    // The label as the engine gave it: responses carry it.
    VersionRef label = *report->held;
    if (label.run_id.empty()) label.run_id = verified.run_id;
    gate_.Trust(verified, label);
    verifier_.Vouch(*report);
    weights_are_boot_ = verified.version == options_.boot_version;
    ++counters_.verified;
    spdlog::info("verified the engine's weights: {}{}", verified.ToString(),
                 report->fingerprint.has_value() ? " (label and fingerprint)" : " (label)");
    co_return PassResult::kMore;
  }
  spdlog::warn("cannot vouch for the engine's weights ({}): loading a complete version",
               verdict.unverified);
  // The pointer's version, staged from its anchor; else the boot
  // checkpoint of the run the pointer names (or of the boot run).
  const std::optional<VersionRef> pointer = *head;
  if (pointer.has_value() && pointer->version != options_.boot_version) {
    run_id_ = pointer->run_id;
    co_return co_await LoadVersion(*pointer);
  }
  const std::string run = pointer.has_value() ? pointer->run_id : run_id_;
  absl::Status reset = co_await SwitchRun(run, /*force_reset=*/true);
  if (!terminal_.ok()) co_return PassResult::kTerminal;
  if (!reset.ok()) {
    SetError(reset);
    co_return PassResult::kError;
  }
  ++counters_.established;
  co_return PassResult::kMore;
}

awaitable<Reconciler::PassResult> Reconciler::LoadVersion(const VersionRef& target) {
  SetState(SyncState::kFetching, CatchingUp());
  auto plan = co_await MakePlan(target, options_.boot_version, /*allow_empty=*/false);
  if (!plan.ok()) {
    SetError(plan.status());
    co_return PassResult::kError;
  }
  SetState(SyncState::kStaging, CatchingUp());
  absl::Status staged = co_await engine_.Stage(plan->stage);
  if (!staged.ok()) {
    SetError(Annotate(staged, absl::StrCat("staging ", target.ToString())));
    co_return PassResult::kError;
  }
  ++counters_.stages;
  absl::Status committed = co_await Commit(target);
  if (!terminal_.ok()) co_return PassResult::kTerminal;
  if (!committed.ok()) {
    SetError(committed);
    co_return PassResult::kError;
  }
  ++counters_.commits;
  ++counters_.established;
  spdlog::info("established the engine's weights by loading {}", target.ToString());
  co_return PassResult::kMore;
}

void Reconciler::RefuseVersion(const VersionRef& version, const absl::Status& why) {
  refused_ = RefusedVersion{
      version,
      absl::Status(why.code(),
                   absl::StrCat(version.ToString(), " cannot be applied (", why.message(),
                                "); this replica keeps serving ", applied().ToString(),
                                "; publishing a FULL next version moves it on")),
      clock_.Now()};
  spdlog::error("{}", std::string(refused_->why.message()));
  SetError(refused_->why);
}

// One pass ---------------------------------------------------------------------

awaitable<absl::StatusOr<std::optional<VersionRef>>> Reconciler::ReadHead() {
  const Clock::TimePoint started = clock_.Now();
  if (!read_started_) read_started_ = started;
  absl::StatusOr<std::optional<VersionRef>> head =
      co_await RunBlocking(pool_, [this]() -> absl::StatusOr<std::optional<VersionRef>> {
        if (absl::Status s = store_.Refresh(); !s.ok()) return s;
        return store_.ReadPointer();
      });
  if (!head.ok() && GetErrorKind(head.status()) == ErrorKind::kPointerMalformed) {
    // The store answered: what it holds is wrong, which says nothing of how
    // far behind this replica is. It keeps serving its version (labelled
    // truly), reports the error, and converges once the pointer is fixed.
    reads_failing_since_.reset();
    read_started_.reset();
    co_return head;
  }
  if (!head.ok()) {
    if (!reads_failing_since_) reads_failing_since_ = started;
    read_started_.reset();
    co_return head;
  }
  const bool lost = StoreLost();
  if (ready_ && lost) {
    // Back after losing the store: out of rotation until caught up.
    spdlog::warn(
        "the store's pointer is readable again after {} s or more; out of rotation "
        "until caught up with it",
        std::chrono::duration_cast<std::chrono::seconds>(options_.store_outage_limit).count());
    ready_ = false;
  }
  reads_failing_since_.reset();
  read_started_.reset();
  gate_.SetPointer(*head);
  if (lost && clock_.Now() - started >= options_.store_outage_limit) {
    // This answer may have left the store when the outage began (a response
    // held up in the network): what the store says now takes a fresh read.
    absl::StatusOr<std::optional<VersionRef>> fresh = co_await ReadHead();
    co_return fresh;
  }
  co_return head;
}

awaitable<absl::StatusOr<Reconciler::Plan>> Reconciler::MakePlan(const VersionRef& target,
                                                                 int64_t from, bool allow_empty) {
  const int64_t boot = options_.boot_version;
  const bool fingerprints = verifier_.reports_fingerprints();
  auto plan = co_await RunBlocking(pool_, [&, this]() -> absl::StatusOr<Plan> {
    Plan plan;
    plan.empty = allow_empty;
    for (int64_t v = target.version; v > from; --v) {
      auto manifest = store_.ReadManifest(v);
      if (!manifest.ok()) {
        if (absl::IsNotFound(manifest.status()) && v == target.version) {
          return absl::NotFoundError(absl::StrCat(
              store_.uri(), ": the pointer names ", target.ToString(),
              ", which is not published; if it is a run's boot version, restart the replica with "
              "that run's boot checkpoint (--base-checkpoint, --boot-version)"));
        }
        return manifest.status();
      }
      if (!manifest->is_empty_delta()) {
        plan.empty = false;
        break;
      }
      if (!allow_empty) break;
    }
    if (plan.empty) return plan;
    auto chain = MaterializeChain(store_, target.version, boot);
    if (!chain.ok()) return chain.status();
    if (chain->empty()) {
      return absl::InternalError(
          absl::StrCat("materializing ", target.ToString(), " gave no version"));
    }
    plan.stage.target = target;
    plan.stage.base_checkpoint_dir = options_.base_checkpoint_dir;
    plan.stage.base_version = boot;
    plan.stage.source_dir = chain->back().dir.parent_path();
    for (ChainLink& link : *chain) {
      if (link.dir.parent_path() != plan.stage.source_dir) {
        return absl::InternalError(absl::StrCat(store_.uri(), ": versions of ", target.ToString(),
                                                "'s chain are materialized in different "
                                                "directories (",
                                                link.dir.string(), ")"));
      }
      plan.stage.chain.push_back(
          StagedVersion{link.version, std::move(link.manifest), std::move(link.dir)});
    }
    return plan;
  });
  // What the engine must report after loading the target, computed while
  // it still serves rather than in the paused commit.
  if (plan.ok() && !plan->empty && fingerprints && target.run_id == run_id_) {
    auto expected = co_await verifier_.ExpectedFingerprint(run_id_, target.version);
    if (!expected.ok()) {
      co_return Annotate(expected.status(),
                         absl::StrCat("computing the fingerprint of ", target.ToString()));
    }
  }
  co_return plan;
}

awaitable<Reconciler::PassResult> Reconciler::Pass() {
  ++counters_.passes;
  const auto pass_start = std::chrono::steady_clock::now();
  SetState(SyncState::kFetching, CatchingUp());
  auto head = co_await ReadHead();
  if (!head.ok()) {
    SetError(head.status());
    co_return PassResult::kError;
  }
  auto caught_up = [this] {
    SetState(SyncState::kIdle, "");
    sync_error_.clear();
    gate_.SetBehindReason("");
    if (!ready_) spdlog::info("caught up with the store at {}: ready", applied().ToString());
    ready_ = true;
    return PassResult::kCaughtUp;
  };
  if (!head->has_value()) {
    if (applied().version == options_.boot_version) co_return caught_up();
    // Serving a later version, the replica keeps it (and its place in
    // rotation, as through any store error) until the pointer is back.
    SetError(PointerVanished(applied().ToString()));
    co_return PassResult::kError;
  }
  VersionRef pointer = **head;

  if (PlanFollow(applied(), pointer) == FollowAction::kRunReset) {
    absl::Status switched = co_await SwitchRun(pointer.run_id, /*force_reset=*/false);
    if (!terminal_.ok()) co_return PassResult::kTerminal;
    if (!switched.ok()) {
      SetError(switched);
      co_return PassResult::kError;
    }
  }
  if (!gate_.trusted()) co_return PassResult::kMore;
  if (PlanFollow(applied(), pointer) != FollowAction::kAdvance) co_return caught_up();

  const int64_t applied_before = applied().version;
  std::map<std::string, double> metrics;
  metrics["initial_target_version"] = static_cast<double>(pointer.version);
  metrics["applied_before_version"] = static_cast<double>(applied_before);

  if (refused_.has_value() && refused_->version == pointer &&
      clock_.Now() - refused_->at < kRefusedVersionRecheck) {
    SetError(refused_->why);
    co_return PassResult::kError;
  }
  SetState(SyncState::kFetching, CatchingUp());
  auto plan = co_await MakePlan(pointer, applied_before, /*allow_empty=*/true);
  if (!plan.ok()) {
    const absl::Status& s = plan.status();
    if (absl::IsInvalidArgument(s) || absl::IsDataLoss(s)) {
      RefuseVersion(pointer, s);
    } else {
      SetError(s);
    }
    co_return PassResult::kError;
  }
  refused_.reset();
  if (!gate_.trusted()) co_return PassResult::kMore;
  if (plan->empty) {
    absl::Status moved = co_await MoveWithoutEngine(pointer);
    if (!moved.ok()) {
      SetError(moved);
      co_return PassResult::kError;
    }
    ++counters_.skipped;
    metrics["target_version"] = static_cast<double>(pointer.version);
    metrics["versions"] = static_cast<double>(pointer.version - applied_before);
    metrics["coalesced_versions"] = 0;
    metrics["skipped_weight_update"] = 1;
    metrics["stage_s"] = 0;
    metrics["commit_s"] = 0;
    metrics["pass_s"] = SecondsSince(pass_start);
    last_pass_ = std::move(metrics);
    co_return PassResult::kMore;
  }

  SetState(SyncState::kStaging, CatchingUp());
  const auto stage_start = std::chrono::steady_clock::now();
  absl::Status staged = co_await engine_.Stage(plan->stage);
  if (!staged.ok()) {
    // Bytes that do not give the checksums the version records (a DELTA
    // encoded against another base) never will: remembered like a
    // malformed version, not staged again on every pass.
    if (GetErrorKind(staged) == ErrorKind::kChecksumMismatch) {
      RefuseVersion(pointer, Annotate(staged, absl::StrCat("staging ", pointer.ToString())));
    } else {
      SetError(Annotate(staged, absl::StrCat("staging ", pointer.ToString())));
    }
    co_return PassResult::kError;
  }
  ++counters_.stages;
  VersionRef target = pointer;

  // Coalesce once: stage the newer head of the same run instead of
  // committing a version that is already stale. Only once, so continuous
  // publishing cannot starve commits.
  auto newer = co_await ReadHead();
  if (!newer.ok()) {
    spdlog::warn("reconcile: re-reading the pointer after staging {} failed ({}); committing it",
                 target.ToString(), std::string(newer.status().message()));
    metrics["coalesce_failed"] = 1;
  } else if (newer->has_value() && (*newer)->run_id == target.run_id &&
             (*newer)->version > target.version) {
    const VersionRef head_now = **newer;
    SetState(SyncState::kFetching, CatchingUp());
    auto newer_plan = co_await MakePlan(head_now, applied_before, /*allow_empty=*/true);
    if (!newer_plan.ok()) {
      SetError(newer_plan.status());
      co_return PassResult::kError;
    }
    if (!newer_plan->empty) {
      SetState(SyncState::kStaging, CatchingUp());
      absl::Status restaged = co_await engine_.Stage(newer_plan->stage);
      if (!restaged.ok()) {
        SetError(Annotate(restaged, absl::StrCat("staging ", head_now.ToString())));
        co_return PassResult::kError;
      }
      ++counters_.stages;
      target = head_now;
    }
  }
  const double stage_s = SecondsSince(stage_start);
  counters_.stage_seconds_sum += stage_s;
  counters_.last_stage_seconds = stage_s;
  // Trust may have been withdrawn while staging: the weights are then
  // established from scratch, not from what the engine was thought to hold.
  if (!gate_.trusted()) co_return PassResult::kMore;

  const auto commit_start = std::chrono::steady_clock::now();
  absl::Status committed = co_await Commit(target);
  if (!terminal_.ok()) co_return PassResult::kTerminal;
  if (!committed.ok()) {
    SetError(committed);
    co_return PassResult::kError;
  }
  const double commit_s = SecondsSince(commit_start);
  counters_.commit_seconds_sum += commit_s;
  counters_.last_commit_seconds = commit_s;
  ++counters_.commits;
  metrics["target_version"] = static_cast<double>(target.version);
  metrics["versions"] = static_cast<double>(target.version - applied_before);
  metrics["coalesced_versions"] = static_cast<double>(target.version - pointer.version);
  metrics["skipped_weight_update"] = 0;
  metrics["stage_s"] = stage_s;
  metrics["commit_s"] = commit_s;
  metrics["pass_s"] = SecondsSince(pass_start);
  last_pass_ = std::move(metrics);
  spdlog::info("committed {} (stage {:.3f} s, commit {:.3f} s)", target.ToString(), stage_s,
               commit_s);
  co_return PassResult::kMore;
}

// Changes under the gate --------------------------------------------------------

awaitable<absl::Status> Reconciler::SwitchRun(const std::string& run_id, bool force_reset) {
  const VersionRef boot{run_id, options_.boot_version};
  const bool switching = gate_.trusted() && gate_.serving().run_id != run_id;
  SetState(SyncState::kCommitting, switching ? absl::StrCat("switching to run ", run_id)
                                             : std::string("loading the boot checkpoint"));
  auto window = co_await gate_.Close(DrainScope::kAll);
  if (!window.ok()) co_return window.status();
  run_id_ = run_id;
  if (force_reset || !weights_are_boot_) {
    if (absl::Status paused = co_await engine_.Pause(); !paused.ok()) {
      (void)co_await engine_.Resume();
      co_return Annotate(paused, "pausing the engine to load the boot checkpoint");
    }
    loading_ = true;
    ++loads_;
    window->Expect(boot);
    absl::Status reset = co_await engine_.ResetToBoot(boot);
    if (reset.ok()) reset = co_await verifier_.CheckLoaded(boot, run_id_);
    ++loads_;
    loading_ = false;
    if (!reset.ok()) {
      Fail(Annotate(reset, absl::StrCat("resetting to the boot checkpoint for run ", run_id,
                                        " failed; live engine state is uncertain")));
      co_return terminal_;
    }
    weights_are_boot_ = true;
    window->Flip(boot);
    if (absl::Status resumed = co_await engine_.Resume(); !resumed.ok()) {
      Fail(Annotate(resumed, "the engine did not resume after a reset to boot"));
      co_return terminal_;
    }
  } else {
    // The boot weights of every run are the same checkpoint: only the
    // served version moves; the engine keeps its label.
    window->Flip(boot, gate_.engine_label());
  }
  if (switching) {
    ++counters_.run_switches;
    spdlog::info("switched to run {} at its boot version {}", run_id, boot.ToString());
  }
  co_return absl::OkStatus();
}

awaitable<absl::Status> Reconciler::MoveWithoutEngine(const VersionRef& target) {
  SetState(SyncState::kCommitting, CatchingUp());
  auto window = co_await gate_.Close(CommitScope());
  if (!window.ok()) co_return window.status();
  if (!gate_.trusted()) co_return absl::OkStatus();
  window->Flip(target, gate_.engine_label());
  spdlog::info("{} changes no weights: serving it without an engine update", target.ToString());
  co_return absl::OkStatus();
}

awaitable<absl::Status> Reconciler::Commit(const VersionRef& target) {
  SetState(SyncState::kCommitting, CatchingUp());
  auto window = co_await gate_.Close(CommitScope());
  if (!window.ok()) co_return window.status();
  if (absl::Status paused = co_await engine_.Pause(); !paused.ok()) {
    (void)co_await engine_.Resume();
    co_return Annotate(paused, "pausing the engine for a commit");
  }
  Engine::CommitOptions commit_options;
  commit_options.flush_cache = options_.flush_cache_on_commit;
  loading_ = true;
  ++loads_;
  window->Expect(target);
  absl::Status committed = co_await engine_.Commit(target, commit_options);
  if (committed.ok()) {
    committed = co_await verifier_.CheckLoaded(target, run_id_);
  } else {
    // An error answer does not mean that nothing changed (SGLang answers
    // 400 when it loaded the weights and set the version but could not
    // flush its cache): what the engine holds decides. Holding the target,
    // verified, the commit stands; anything else is as uncertain as before.
    const absl::Status answer = committed;
    const absl::Status holds = co_await verifier_.CheckLoaded(target, run_id_);
    if (holds.ok()) {
      spdlog::warn(
          "the engine answered the commit of {} with an error ({}), but it holds {}: "
          "the commit stands",
          target.ToString(), std::string(answer.message()), target.ToString());
      committed = absl::OkStatus();
    }
  }
  ++loads_;
  loading_ = false;
  if (!committed.ok()) {
    // The engine stays paused: the requests it holds must not continue on
    // weights nobody can name. The process ends; clients retry elsewhere.
    Fail(Annotate(committed, absl::StrCat("weight commit of ", target.ToString(),
                                          " failed; live engine state is uncertain")));
    co_return terminal_;
  }
  weights_are_boot_ = false;
  window->Flip(target);
  if (absl::Status resumed = co_await engine_.Resume(); !resumed.ok()) {
    Fail(Annotate(resumed,
                  absl::StrCat("the engine did not resume after committing ", target.ToString())));
    co_return terminal_;
  }
  co_return absl::OkStatus();
}

}  // namespace stitch
