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
#include "stitch/replica/loop_signal.h"
#include "stitch/store/materialize_chain.h"

namespace stitch {

using boost::asio::awaitable;
using replica_internal::LoopSignal;

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
      wake_(std::make_unique<LoopSignal>(loop_)),
      ended_(std::make_unique<LoopSignal>(loop_)),
      tasks_(std::make_unique<Task[]>(kTasks)) {
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

std::string Reconciler::reason() const {
  if (!terminal_.ok()) return reason_;
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

void Reconciler::SetError(const absl::Status& status) {
  ++counters_.errors;
  spdlog::warn("reconcile: {} (will retry)", std::string(status.message()));
  SetState(SyncState::kError, absl::StrCat("sync error: ", status.message()));
}

ReplicaState Reconciler::State() const {
  ReplicaState s;
  s.ready = ready();
  s.applied = gate_.serving();
  s.sync_state = sync_state_;
  s.reason = reason_;
  s.run_id = gate_.serving().run_id;
  s.commit_mode = options_.commit_mode;
  s.active_requests = gate_.active();
  s.update_destination_ready = destination_ready_;
  s.update_destination_error = destination_error_;
  s.terminal_error = terminal_.ok() ? std::string() : std::string(terminal_.message());
  s.metrics = last_pass_;
  return s;
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
  absl::Status initialized = co_await engine_.InitializeDestination(boot);
  if (!initialized.ok()) {
    destination_error_ = std::string(initialized.message());
    Fail(Annotate(initialized, "weight update destination initialization failed"));
    co_return;
  }
  destination_ready_ = true;
  SetState(SyncState::kIdle, std::string(kCatchingUp));
  wake_pending_ = true;
  while (!stopping_ && terminal_.ok()) {
    while (!wake_pending_ && !stopping_ && terminal_.ok()) {
      const bool notified = co_await wake_->Wait();
      if (!notified) co_return;
    }
    if (stopping_ || !terminal_.ok()) break;
    wake_pending_ = false;
    PassResult result = co_await Pass();
    if (result == PassResult::kTerminal) break;
    if (result == PassResult::kMore) wake_pending_ = true;
  }
}

// One pass ---------------------------------------------------------------------

awaitable<absl::StatusOr<std::optional<VersionRef>>> Reconciler::ReadHead() {
  co_return co_await RunBlocking(pool_, [this]() -> absl::StatusOr<std::optional<VersionRef>> {
    if (absl::Status s = store_.Refresh(); !s.ok()) return s;
    return store_.ReadPointer();
  });
}

awaitable<absl::StatusOr<Reconciler::Plan>> Reconciler::MakePlan(const VersionRef& target) {
  const int64_t from = applied().version;
  const int64_t boot = options_.boot_version;
  co_return co_await RunBlocking(pool_, [&, this]() -> absl::StatusOr<Plan> {
    Plan plan;
    plan.empty = true;
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
    if (!ready_) spdlog::info("caught up with the store at {}: ready", applied().ToString());
    ready_ = true;
    return PassResult::kCaughtUp;
  };
  if (!head->has_value()) co_return caught_up();
  VersionRef pointer = **head;

  if (PlanFollow(applied(), pointer) == FollowAction::kRunReset) {
    absl::Status switched = co_await SwitchRun(pointer.run_id);
    if (!terminal_.ok()) co_return PassResult::kTerminal;
    if (!switched.ok()) {
      SetError(switched);
      co_return PassResult::kError;
    }
  }
  if (PlanFollow(applied(), pointer) != FollowAction::kAdvance) co_return caught_up();

  const int64_t applied_before = applied().version;
  std::map<std::string, double> metrics;
  metrics["initial_target_version"] = static_cast<double>(pointer.version);
  metrics["applied_before_version"] = static_cast<double>(applied_before);

  SetState(SyncState::kFetching, CatchingUp());
  auto plan = co_await MakePlan(pointer);
  if (!plan.ok()) {
    SetError(plan.status());
    co_return PassResult::kError;
  }
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
    SetError(Annotate(staged, absl::StrCat("staging ", pointer.ToString())));
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
    auto newer_plan = co_await MakePlan(head_now);
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

awaitable<absl::Status> Reconciler::SwitchRun(const std::string& run_id) {
  const VersionRef boot{run_id, options_.boot_version};
  SetState(SyncState::kCommitting, absl::StrCat("switching to run ", run_id));
  auto window = co_await gate_.Close(DrainScope::kAll);
  if (!window.ok()) co_return window.status();
  if (!weights_are_boot_) {
    if (absl::Status paused = co_await engine_.Pause(); !paused.ok()) {
      (void)co_await engine_.Resume();
      co_return Annotate(paused, "pausing the engine for a run switch");
    }
    absl::Status reset = co_await engine_.ResetToBoot(boot);
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
    window->Flip(boot);
  }
  ++counters_.run_switches;
  spdlog::info("switched to run {} at its boot version {}", run_id, boot.ToString());
  co_return absl::OkStatus();
}

awaitable<absl::Status> Reconciler::MoveWithoutEngine(const VersionRef& target) {
  SetState(SyncState::kCommitting, CatchingUp());
  auto window = co_await gate_.Close(CommitScope());
  if (!window.ok()) co_return window.status();
  window->Flip(target);
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
  absl::Status committed = co_await engine_.Commit(target, commit_options);
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
