#include "stitch/replica/admission_gate.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/replica/loop_signal.h"

namespace stitch {

using replica_internal::LoopSignal;

AdmissionGate::AdmissionGate(const boost::asio::any_io_executor& loop, VersionRef serving)
    : serving_(std::move(serving)),
      reopened_(std::make_unique<LoopSignal>(loop)),
      released_(std::make_unique<LoopSignal>(loop)) {}

AdmissionGate::~AdmissionGate() = default;

// Ticket ---------------------------------------------------------------------

AdmissionGate::Ticket::Ticket(Ticket&& other) noexcept
    : gate_(std::exchange(other.gate_, nullptr)),
      start_(std::move(other.start_)),
      exact_(other.exact_) {}

AdmissionGate::Ticket& AdmissionGate::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    gate_ = std::exchange(other.gate_, nullptr);
    start_ = std::move(other.start_);
    exact_ = other.exact_;
  }
  return *this;
}

AdmissionGate::Ticket::~Ticket() { Release(); }

void AdmissionGate::Ticket::Release() {
  if (gate_ != nullptr) std::exchange(gate_, nullptr)->Release(exact_);
}

VersionStamp AdmissionGate::Ticket::Stamp() const {
  return VersionStamp{start_.version, gate_ != nullptr ? gate_->serving_.version : start_.version};
}

// Admission ------------------------------------------------------------------

absl::StatusOr<AdmissionGate::Ticket> AdmissionGate::Decide(const VersionConstraint& constraint) {
  if (!terminal_.ok()) {
    ++rejected_terminal_total_;
    return absl::UnavailableError(
        absl::StrCat("the replica is shutting down after a terminal error: ", terminal_.message()));
  }
  if (!constraint.SatisfiedBy(serving_.version)) {
    ++rejected_not_ready_total_;
    if (on_reject_) on_reject_();
    // An exact pin below the served version will never be served here again
    // (versions only move forward); another replica may still hold it.
    const bool passed = constraint.is_exact() && *constraint.exact_version < serving_.version;
    return WithKind(absl::FailedPreconditionError(absl::StrCat(
                        "this replica serves ", serving_.ToString(), ", which does not satisfy ",
                        constraint.ToString(),
                        passed ? "; it has moved past that version, retry on another replica"
                               : "; it is catching up, retry shortly")),
                    ErrorKind::kVersionNotReady);
  }
  ++admitted_total_;
  ++active_;
  if (constraint.is_exact()) ++active_exact_;
  return Ticket(this, serving_, constraint.is_exact());
}

std::optional<absl::StatusOr<AdmissionGate::Ticket>> AdmissionGate::TryAdmit(
    const VersionConstraint& constraint) {
  if (open_ || !terminal_.ok()) return Decide(constraint);
  return std::nullopt;
}

boost::asio::awaitable<absl::StatusOr<AdmissionGate::Ticket>> AdmissionGate::Admit(
    VersionConstraint constraint) {
  while (!open_ && terminal_.ok()) {
    const bool notified = co_await reopened_->Wait();
    if (!notified) {
      co_return absl::CancelledError("the request was cancelled while waiting for a commit");
    }
  }
  absl::StatusOr<Ticket> decided = Decide(constraint);
  co_return decided;
}

void AdmissionGate::Release(bool exact) {
  --active_;
  if (exact) --active_exact_;
  if (draining_.has_value() && Drained(*draining_)) released_->NotifyAll();
}

// Commits --------------------------------------------------------------------

AdmissionGate::CommitWindow::CommitWindow(CommitWindow&& other) noexcept
    : gate_(std::exchange(other.gate_, nullptr)) {}

AdmissionGate::CommitWindow::~CommitWindow() {
  if (gate_ != nullptr) gate_->Reopen();
}

void AdmissionGate::CommitWindow::Flip(const VersionRef& now) {
  if (gate_ != nullptr) gate_->serving_ = now;
}

void AdmissionGate::Reopen() {
  window_open_ = false;
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
