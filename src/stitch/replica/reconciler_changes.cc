// The reconciler's changes to the engine (reconciler.h): establishing what
// it holds when trust is withdrawn, loading a complete version, switching
// runs, and committing a staged version under the gate. The passes that
// decide on them are in reconciler.cc.
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/replica/reconciler.h"

namespace stitch {

using boost::asio::awaitable;

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

// Changes under the gate --------------------------------------------------------

awaitable<absl::Status> Reconciler::SwitchRun(const std::string& run_id, bool force_reset) {
  const VersionRef boot{run_id, options_.boot_version};
  const bool switching = gate_.trusted() && gate_.serving().run_id != run_id;
  const std::string from_run = gate_.trusted() ? gate_.serving().run_id : std::string();
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
    switched_ = RunSwitch{from_run, boot, clock_.Now()};
    spdlog::warn(
        "the store's pointer names run {}: switched to it at its boot version {} (a claim, or a "
        "pointer written by hand, changes the run every replica serves)",
        run_id, boot.ToString());
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
  if (absl::IsAborted(committed)) {
    // The engine undid the commit and says it serves what it served before:
    // its label must say so too, or the process ends as for any failure.
    const absl::Status before = co_await verifier_.CheckLoaded(gate_.engine_label(), run_id_);
    if (before.ok()) {
      spdlog::warn("commit of {} undone: {}", target.ToString(), std::string(committed.message()));
      ++counters_.commits_undone;
      window->Abandon();
      if (absl::Status resumed = co_await engine_.Resume(); !resumed.ok()) {
        Fail(Annotate(resumed, absl::StrCat("the engine did not resume after undoing the commit "
                                            "of ",
                                            target.ToString())));
        co_return terminal_;
      }
      co_return committed;
    }
    committed = Annotate(before, std::string(committed.message()));
  }
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
