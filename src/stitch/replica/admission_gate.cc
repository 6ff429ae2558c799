#include "stitch/replica/admission_gate.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/engine/engine.h"
#include "stitch/net/loop_signal.h"

namespace stitch {

AdmissionGate::AdmissionGate(const boost::asio::any_io_executor& loop)
    : reopened_(std::make_unique<LoopSignal>(loop)),
      released_(std::make_unique<LoopSignal>(loop)) {}

AdmissionGate::AdmissionGate(const boost::asio::any_io_executor& loop, VersionRef serving)
    : AdmissionGate(loop) {
  engine_label_ = serving;
  serving_ = std::move(serving);
  trusted_ = true;
  distrust_reason_.clear();
}

AdmissionGate::~AdmissionGate() = default;

// Ticket ---------------------------------------------------------------------

AdmissionGate::Ticket::Ticket(Ticket&& other) noexcept
    : gate_(std::exchange(other.gate_, nullptr)),
      start_(std::move(other.start_)),
      start_label_(std::move(other.start_label_)),
      epoch_(other.epoch_),
      flips_(other.flips_),
      exact_(other.exact_) {}

AdmissionGate::Ticket& AdmissionGate::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    gate_ = std::exchange(other.gate_, nullptr);
    start_ = std::move(other.start_);
    start_label_ = std::move(other.start_label_);
    epoch_ = other.epoch_;
    flips_ = other.flips_;
    exact_ = other.exact_;
  }
  return *this;
}

AdmissionGate::Ticket::~Ticket() { Release(); }

void AdmissionGate::Ticket::Release() {
  if (gate_ != nullptr) std::exchange(gate_, nullptr)->Release(exact_, epoch_);
}

VersionStamp AdmissionGate::Ticket::Stamp() const {
  return VersionStamp{start_.version, gate_ != nullptr ? gate_->serving_.version : start_.version};
}

bool AdmissionGate::Ticket::trusted() const {
  return gate_ != nullptr && gate_->trusted_ && gate_->epoch_ == epoch_;
}

// Admission ------------------------------------------------------------------

absl::StatusOr<AdmissionGate::Ticket> AdmissionGate::Decide(const VersionConstraint& constraint) {
  if (!terminal_.ok()) {
    ++rejected_terminal_total_;
    return absl::UnavailableError(
        absl::StrCat("the replica is shutting down after a terminal error: ", terminal_.message()));
  }
  if (!trusted_ || held()) {
    ++rejected_unverified_total_;
    const std::string why = absl::StrCat("this replica cannot vouch for its engine's weights now (",
                                         held() ? *hold_reason_ : distrust_reason_,
                                         "); retry, possibly on another replica");
    if (constraint.empty()) return absl::UnavailableError(why);
    return WithKind(absl::FailedPreconditionError(why), ErrorKind::kVersionNotReady);
  }
  if (std::optional<VersionConstraint::Bound> unmet = Unmet(constraint); unmet.has_value()) {
    ++rejected_not_ready_total_;
    if (on_reject_) on_reject_();
    // An exact pin below the served version will never be served here again
    // (versions only move forward); another replica may still hold it.
    const bool passed =
        *unmet == VersionConstraint::Bound::kExact && *constraint.exact_version < serving_.version;
    std::string why;
    if (passed) {
      why = "; it has moved past that version, retry on another replica";
    } else if (std::optional<int64_t> wanted = Unpublished(constraint, *unmet)) {
      // No replica can serve what the trainer has not published: waiting
      // for this one to catch up would not help.
      why = absl::StrCat("; version ", *wanted, " is not published (the store's pointer is at ",
                         pointer_->ToString(),
                         " as this replica last read it): retry once the trainer has published it");
    } else if (behind_reason_.empty()) {
      why = "; it is catching up, retry shortly";
    } else {
      why = absl::StrCat("; it cannot catch up (", behind_reason_, "), retry on another replica");
    }
    const std::string bound =
        *unmet == VersionConstraint::Bound::kStaleness
            ? absl::StrCat("max_staleness ", *constraint.max_staleness,
                           " (the store's pointer is at ", pointer_->ToString(), ")")
            : std::string(BoundName(*unmet));
    return WithKind(absl::FailedPreconditionError(absl::StrCat(
                        "this replica serves ", serving_.ToString(), ", which does not satisfy ",
                        constraint.ToString(), ": ", bound, " failed", why)),
                    ErrorKind::kVersionNotReady);
  }
  ++admitted_total_;
  ++active_;
  ++vouched_;
  if (constraint.is_exact()) ++active_exact_;
  return Ticket(this, serving_, engine_label_, epoch_, flip_count_, constraint.is_exact());
}

std::optional<VersionConstraint::Bound> AdmissionGate::Unmet(
    const VersionConstraint& constraint) const {
  std::optional<int64_t> pointer;
  if (pointer_.has_value()) {
    const bool same_run =
        pointer_->run_id == serving_.run_id || pointer_->run_id.empty() || serving_.run_id.empty();
    // The pointer of another run is one this replica has not reached at all.
    pointer = same_run ? pointer_->version
                       : std::max(pointer_->version, serving_.version) +
                             constraint.max_staleness.value_or(0) + 1;
  }
  return constraint.Unmet(serving_.version, pointer);
}

std::optional<int64_t> AdmissionGate::Unpublished(const VersionConstraint& constraint,
                                                  VersionConstraint::Bound unmet) const {
  std::optional<int64_t> wanted;
  if (unmet == VersionConstraint::Bound::kExact) wanted = constraint.exact_version;
  if (unmet == VersionConstraint::Bound::kMin) wanted = constraint.min_version;
  // The pointer of another run says nothing about this run's versions.
  if (!wanted || !pointer_ || pointer_->run_id != serving_.run_id) return std::nullopt;
  if (*wanted <= pointer_->version) return std::nullopt;
  return wanted;
}

absl::Status AdmissionGate::CheckEngineLabel(const Ticket& ticket, std::string_view label) const {
  const std::optional<VersionRef> held = ParseEngineLabel(label);
  const VersionRef& from = ticket.start_label_;
  int64_t to = engine_label_.version;
  if (pending_label_.has_value()) to = std::max(to, pending_label_->version);
  auto disagree = [&](std::string_view what) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the engine labelled a response \"", absl::CEscape(AbslView(label.substr(0, 64))), "\", ",
        AbslView(what), " (it held ", from.ToString(), " when the request was admitted",
        to == from.version ? "" : absl::StrCat(" and ", to, " since"), ")"));
  };
  if (!held.has_value()) return disagree("which names no version");
  if (!held->run_id.empty() && !from.run_id.empty() && held->run_id != from.run_id) {
    return disagree("a version of another run");
  }
  if (held->version < from.version || held->version > to) {
    return disagree("a version it did not hold while the request ran");
  }
  return absl::OkStatus();
}

std::optional<int64_t> AdmissionGate::ServedForLabel(const Ticket& ticket, int64_t label) const {
  const uint64_t since = flip_count_ - ticket.flips_;
  if (since > flips_.size()) return std::nullopt;  // forgotten
  std::optional<int64_t> served;
  bool ambiguous = false;
  auto consider = [&](int64_t engine_label, int64_t version) {
    if (engine_label != label) return;
    if (served.has_value() && *served != version) ambiguous = true;
    served = version;
  };
  consider(ticket.start_label_.version, ticket.start_.version);
  for (size_t i = flips_.size() - since; i < flips_.size(); ++i) {
    consider(flips_[i].first, flips_[i].second);
  }
  if (ambiguous) return std::nullopt;
  return served;
}

void AdmissionGate::RecordFlip() {
  // Enough for any request to look back over the commits it lived through;
  // an older one gets "unknown" spans rather than a guess.
  constexpr size_t kRemembered = 256;
  flips_.emplace_back(engine_label_.version, serving_.version);
  if (flips_.size() > kRemembered) flips_.pop_front();
  ++flip_count_;
}

std::optional<absl::StatusOr<AdmissionGate::Ticket>> AdmissionGate::TryAdmit(
    const VersionConstraint& constraint) {
  if (open_ || !terminal_.ok()) return Decide(constraint);
  return std::nullopt;
}

boost::asio::awaitable<absl::StatusOr<AdmissionGate::Ticket>> AdmissionGate::Admit(
    VersionConstraint constraint) {
  while (!open_ && terminal_.ok() && trusted_ && !held()) {
    const bool notified = co_await reopened_->Wait();
    if (!notified) {
      co_return absl::CancelledError("the request was cancelled while waiting for a commit");
    }
  }
  absl::StatusOr<Ticket> decided = Decide(constraint);
  co_return decided;
}

boost::asio::awaitable<absl::StatusOr<AdmissionGate::Ticket>> AdmissionGate::AdmitUnversioned() {
  while (!open_ && terminal_.ok()) {
    const bool notified = co_await reopened_->Wait();
    if (!notified) {
      co_return absl::CancelledError("the request was cancelled while waiting for a commit");
    }
  }
  if (!terminal_.ok()) {
    ++rejected_terminal_total_;
    co_return absl::UnavailableError(
        absl::StrCat("the replica is shutting down after a terminal error: ", terminal_.message()));
  }
  ++active_;
  ++vouched_;
  co_return Ticket(this, serving_, engine_label_, epoch_, flip_count_, /*exact=*/false);
}

void AdmissionGate::Release(bool exact, uint64_t epoch) {
  --active_;
  if (epoch == epoch_) {
    --vouched_;
    if (exact) --active_exact_;
  }
  if (draining_.has_value() && Drained(*draining_)) released_->NotifyAll();
}

// Commits --------------------------------------------------------------------

AdmissionGate::CommitWindow::CommitWindow(CommitWindow&& other) noexcept
    : gate_(std::exchange(other.gate_, nullptr)) {}

AdmissionGate::CommitWindow::~CommitWindow() {
  if (gate_ != nullptr) gate_->Reopen();
}

void AdmissionGate::CommitWindow::Expect(const VersionRef& label) {
  if (gate_ != nullptr) gate_->pending_label_ = label;
}

void AdmissionGate::CommitWindow::Abandon() {
  if (gate_ != nullptr) gate_->pending_label_.reset();
}

void AdmissionGate::CommitWindow::Flip(const VersionRef& serving, const VersionRef& engine_label) {
  if (gate_ == nullptr) return;
  gate_->serving_ = serving;
  gate_->engine_label_ = engine_label;
  gate_->pending_label_.reset();
  gate_->trusted_ = true;
  gate_->distrust_reason_.clear();
  gate_->RecordFlip();
}

void AdmissionGate::Trust(const VersionRef& serving, const VersionRef& engine_label) {
  serving_ = serving;
  engine_label_ = engine_label;
  trusted_ = true;
  distrust_reason_.clear();
  RecordFlip();
  reopened_->NotifyAll();
}

void AdmissionGate::Distrust(std::string why) {
  if (!trusted_) return;
  trusted_ = false;
  ++epoch_;
  // Tickets of earlier epochs will not be stamped: no commit waits for them.
  vouched_ = 0;
  active_exact_ = 0;
  last_distrust_reason_ = why;
  distrust_reason_ = std::move(why);
  // Waiting admissions are refused now, and a draining commit need not wait
  // for tickets that will not be stamped.
  reopened_->NotifyAll();
  released_->NotifyAll();
}

void AdmissionGate::Hold(std::string why) {
  hold_reason_ = std::move(why);
  reopened_->NotifyAll();
}

void AdmissionGate::Unhold() { hold_reason_.reset(); }

void AdmissionGate::Reopen() {
  window_open_ = false;
  pending_label_.reset();
  draining_.reset();
  open_ = true;
  reopened_->NotifyAll();
}

boost::asio::awaitable<absl::StatusOr<AdmissionGate::CommitWindow>> AdmissionGate::Close(
    DrainScope scope) {
  if (window_open_) {
    co_return absl::InternalError("a commit window is already open on this gate");
  }
  if (!terminal_.ok()) co_return absl::UnavailableError(terminal_.message());
  window_open_ = true;
  open_ = false;
  CommitWindow window(this);  // reopens on every early return below
  draining_ = scope;
  while (!Drained(scope)) {
    const bool notified = co_await released_->Wait();
    if (!notified) {
      co_return absl::CancelledError("the commit was cancelled while requests drained");
    }
    if (!terminal_.ok()) co_return absl::UnavailableError(terminal_.message());
  }
  draining_.reset();
  co_return std::move(window);
}

void AdmissionGate::Terminate(absl::Status why) {
  if (why.ok()) why = absl::InternalError("terminated");
  if (terminal_.ok()) terminal_ = std::move(why);
  open_ = false;
  reopened_->NotifyAll();
  released_->NotifyAll();
}

}  // namespace stitch
