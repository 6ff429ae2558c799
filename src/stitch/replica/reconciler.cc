#include "stitch/replica/reconciler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
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
  s.pointer_notice = PointerNotice();
  s.held = eval_hold_;
  return s;
}

absl::Status Reconciler::HoldForEvaluation(const VersionRef& version, std::string holder) {
  if (holder.empty()) return absl::InvalidArgumentError("a hold needs a holder's name");
  if (eval_hold_.has_value() && eval_hold_->holder != holder) {
    return absl::FailedPreconditionError(
        absl::StrCat("this replica is held by '", eval_hold_->holder, "' on ",
                     eval_hold_->version.ToString(), "; release that hold first"));
  }
  const std::string& run = gate_.trusted() ? gate_.serving().run_id : run_id_;
  if (version.run_id != run) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot hold ", version.ToString(), ": this replica follows run ", run));
  }
  const std::optional<VersionRef> pointer = gate_.pointer();
  if (pointer.has_value() && pointer->run_id == version.run_id &&
      version.version > pointer->version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot hold ", version.ToString(), ": the store's pointer is at ", pointer->ToString()));
  }
  spdlog::info("held for evaluation by '{}' on {}: the pointer is no longer followed", holder,
               version.ToString());
  eval_hold_ = ReplicaState::Held{version, std::move(holder)};
  Wake();
  return absl::OkStatus();
}

absl::Status Reconciler::ReleaseEvaluationHold(std::string_view holder) {
  if (!eval_hold_.has_value() || eval_hold_->holder != holder) {
    return absl::NotFoundError(absl::StrCat(
        "this replica is not held by '", AbslView(holder), "'",
        eval_hold_.has_value() ? absl::StrCat(" (it is held by '", eval_hold_->holder, "')")
                               : std::string()));
  }
  spdlog::info("released by '{}' (held on {}): out of rotation until caught up with the pointer",
               eval_hold_->holder, eval_hold_->version.ToString());
  eval_hold_.reset();
  ready_ = false;
  Wake();
  return absl::OkStatus();
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

void Reconciler::ScheduleBackstop() {
  const Clock::Duration base = options_.reconcile_interval;
  Clock::Duration period = base;
  if (idle_passes_ >= 2 && options_.reconcile_max_interval > base) {
    // SplitMix64: a fleet started at once spreads out, deterministically
    // per replica seed.
    jitter_state_ += 0x9E3779B97F4A7C15ULL;
    uint64_t z = jitter_state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    const double jitter = 0.8 + 0.4 * static_cast<double>(z >> 11) / 9007199254740992.0;
    const int doublings = std::min(idle_passes_ - 1, 16);
    const double seconds =
        std::chrono::duration<double>(base).count() * static_cast<double>(1 << doublings) * jitter;
    period = std::min<Clock::Duration>(
        options_.reconcile_max_interval,
        std::chrono::duration_cast<Clock::Duration>(std::chrono::duration<double>(seconds)));
  }
  next_backstop_ = clock_.Now() + period;
}

awaitable<void> Reconciler::Backstop() {
  // Sleeps at most one base period at a time, so that a pass that ends the
  // backoff (next_backstop_ moved closer) takes effect within one.
  next_backstop_ = clock_.Now() + options_.reconcile_interval;
  while (!stopping_ && terminal_.ok()) {
    const Clock::Duration left = next_backstop_ - clock_.Now();
    if (left <= Clock::Duration::zero()) {
      next_backstop_ = clock_.Now() + options_.reconcile_interval;  // until the pass says more
      Wake();
      co_await clock_.SleepFor(options_.reconcile_interval);
    } else {
      co_await clock_.SleepFor(std::min(left, options_.reconcile_interval));
    }
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
    idle_passes_ = result == PassResult::kCaughtUp ? std::min(idle_passes_ + 1, 1000) : 0;
    ScheduleBackstop();
  }
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
      // An anchor written after the fact lives in the anchors store's
      // directory; every other link in the store's.
      const bool outside_ok = link.anchor && &link == &chain->front();
      if (!outside_ok && link.dir.parent_path() != plan.stage.source_dir) {
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
  if (!head->has_value()) {
    if (applied().version == options_.boot_version) co_return CaughtUp();
    // Serving a later version, the replica keeps it (and its place in
    // rotation, as through any store error) until the pointer is back.
    SetError(PointerVanished(applied().ToString()));
    co_return PassResult::kError;
  }
  const VersionRef pointer = **head;
  if (eval_hold_.has_value() && eval_hold_->version.run_id != pointer.run_id) {
    spdlog::warn("the pointer names run {}: the hold by '{}' on {} ends", pointer.run_id,
                 eval_hold_->holder, eval_hold_->version.ToString());
    eval_hold_.reset();
  }

  if (PlanFollow(applied(), pointer) == FollowAction::kRunReset) {
    absl::Status switched = co_await SwitchRun(pointer.run_id, /*force_reset=*/false);
    if (!terminal_.ok()) co_return PassResult::kTerminal;
    if (!switched.ok()) {
      SetError(switched);
      co_return PassResult::kError;
    }
  }
  if (!gate_.trusted()) co_return PassResult::kMore;
  if (eval_hold_.has_value()) co_return co_await FollowHold(pass_start);
  NotePointer(pointer);
  if (PlanFollow(applied(), pointer) != FollowAction::kAdvance) co_return CaughtUp();
  if (refused_.has_value() && refused_->version == pointer &&
      clock_.Now() - refused_->at < kRefusedVersionRecheck) {
    SetError(refused_->why);
    co_return PassResult::kError;
  }
  co_return co_await Advance(pointer, pass_start);
}

awaitable<Reconciler::PassResult> Reconciler::FollowHold(
    std::chrono::steady_clock::time_point pass_start) {
  const VersionRef target = eval_hold_->version;
  const VersionRef serving = applied();
  if (serving == target) co_return CaughtUp();
  if (serving.run_id == target.run_id && serving.version < target.version) {
    co_return co_await Advance(target, pass_start);
  }
  // Past the held version: its weights come from its chain, as when the
  // engine's are unknown.
  co_return co_await LoadVersion(target);
}

void Reconciler::NotePointer(const VersionRef& pointer) {
  const VersionRef serving = applied();
  if (pointer.run_id != serving.run_id || pointer.version >= serving.version) {
    rewound_to_.reset();
    return;
  }
  if (rewound_to_ == pointer) return;
  rewound_to_ = pointer;
  ++counters_.pointer_rewinds;
  spdlog::warn(
      "{}: the pointer moved back to {} while this replica serves {}; it keeps {} (versions only "
      "move forward within a run), but a replica that starts now loads {}: move the pointer "
      "forward again, or claim a new run to roll back",
      store_.uri(), pointer.ToString(), serving.ToString(), serving.ToString(), pointer.ToString());
}

std::string Reconciler::PointerNotice() const {
  if (rewound_to_.has_value()) {
    const std::string serving = applied().ToString();
    return absl::StrCat("the store's pointer moved back to ", rewound_to_->ToString(),
                        "; this replica keeps ", serving,
                        " (versions only move forward within a run): move the pointer forward "
                        "again, or claim a new run to roll back");
  }
  if (switched_.has_value() && clock_.Now() - switched_->at < kRunSwitchNoticeFor) {
    return absl::StrCat("the store's pointer moved from run ", switched_->from, " to run ",
                        switched_->to.run_id, ": this replica switched to its boot version ",
                        switched_->to.ToString());
  }
  return "";
}

Reconciler::PassResult Reconciler::CaughtUp() {
  SetState(SyncState::kIdle, "");
  sync_error_.clear();
  gate_.SetBehindReason("");
  if (!ready_) spdlog::info("caught up with the store at {}: ready", applied().ToString());
  ready_ = true;
  return PassResult::kCaughtUp;
}

awaitable<Reconciler::PassResult> Reconciler::Advance(
    const VersionRef& pointer, std::chrono::steady_clock::time_point pass_start) {
  PassRecord record{applied().version, pointer, pointer, pass_start};
  SetState(SyncState::kFetching, CatchingUp());
  auto plan = co_await MakePlan(pointer, record.applied_before, /*allow_empty=*/true);
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
    record.skipped = true;
    Record(std::move(record));
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
  const bool staged_newest = co_await StageNewerHead(record);
  if (!staged_newest) co_return PassResult::kError;
  record.stage_s = SecondsSince(stage_start);
  counters_.stage_seconds_sum += record.stage_s;
  counters_.last_stage_seconds = record.stage_s;
  // Trust may have been withdrawn while staging: the weights are then
  // established from scratch, not from what the engine was thought to hold.
  if (!gate_.trusted()) co_return PassResult::kMore;

  const auto commit_start = std::chrono::steady_clock::now();
  absl::Status committed = co_await Commit(record.target);
  if (!terminal_.ok()) co_return PassResult::kTerminal;
  if (!committed.ok()) {
    SetError(committed);
    co_return PassResult::kError;
  }
  record.commit_s = SecondsSince(commit_start);
  counters_.commit_seconds_sum += record.commit_s;
  counters_.last_commit_seconds = record.commit_s;
  ++counters_.commits;
  spdlog::info("committed {} (stage {:.3f} s, commit {:.3f} s)", record.target.ToString(),
               record.stage_s, record.commit_s);
  // What retention deleted from the store below the new version is needed
  // by nobody: its local copies go too. It takes a listing of the store,
  // so at most once per kPruneEvery.
  const int64_t committed_version = record.target.version;
  Record(std::move(record));
  if (!last_prune_.has_value() || clock_.Now() - *last_prune_ >= kPruneEvery) {
    last_prune_ = clock_.Now();
    absl::StatusOr<int> pruned = co_await RunBlocking(
        pool_, [this, committed_version] { return store_.PruneLocalCopies(committed_version); });
    if (!pruned.ok()) {
      spdlog::warn("dropping cached versions the store deleted: {}",
                   std::string(pruned.status().message()));
    } else if (*pruned > 0) {
      spdlog::info("dropped {} cached version(s) the store no longer holds", *pruned);
    }
  }
  co_return PassResult::kMore;
}

// Coalesce once: stage the newer head of the same run instead of committing
// a version that is already stale. Only once, so continuous publishing
// cannot starve commits; a failed re-read commits what was staged.
awaitable<bool> Reconciler::StageNewerHead(PassRecord& record) {
  if (eval_hold_.has_value()) co_return true;  // the held version is the target
  auto newer = co_await ReadHead();
  if (!newer.ok()) {
    spdlog::warn("reconcile: re-reading the pointer after staging {} failed ({}); committing it",
                 record.target.ToString(), std::string(newer.status().message()));
    record.coalesce_failed = true;
    co_return true;
  }
  if (!newer->has_value() || (*newer)->run_id != record.target.run_id ||
      (*newer)->version <= record.target.version) {
    co_return true;
  }
  const VersionRef head_now = **newer;
  SetState(SyncState::kFetching, CatchingUp());
  auto newer_plan = co_await MakePlan(head_now, record.applied_before, /*allow_empty=*/true);
  if (!newer_plan.ok()) {
    SetError(newer_plan.status());
    co_return false;
  }
  if (newer_plan->empty) co_return true;
  SetState(SyncState::kStaging, CatchingUp());
  absl::Status restaged = co_await engine_.Stage(newer_plan->stage);
  if (!restaged.ok()) {
    SetError(Annotate(restaged, absl::StrCat("staging ", head_now.ToString())));
    co_return false;
  }
  ++counters_.stages;
  record.target = head_now;
  co_return true;
}

void Reconciler::Record(PassRecord record) {
  std::map<std::string, double> m;
  m["initial_target_version"] = static_cast<double>(record.pointer.version);
  m["applied_before_version"] = static_cast<double>(record.applied_before);
  if (record.coalesce_failed) m["coalesce_failed"] = 1;
  m["target_version"] = static_cast<double>(record.target.version);
  m["versions"] = static_cast<double>(record.target.version - record.applied_before);
  m["coalesced_versions"] = static_cast<double>(record.target.version - record.pointer.version);
  m["skipped_weight_update"] = record.skipped ? 1 : 0;
  m["stage_s"] = record.stage_s;
  m["commit_s"] = record.commit_s;
  m["pass_s"] = SecondsSince(record.start);
  last_pass_ = std::move(m);
}

}  // namespace stitch
