// The admission gate: the one place where requests meet weight changes.
//
// Every versioned request is admitted here before it reaches the engine. One
// decision captures the version the request will start on and checks its
// constraint against it; an unmet constraint is rejected (HTTP 409) and
// reported to the reject listener (the reconciler's wake). The request holds
// a Ticket while it runs.
//
// A commit goes through Close(): admission closes first, then the requests
// that must not cross the change drain (exact pins for an in-place commit;
// every request for a quiesce commit or a run change), then the caller
// changes the engine's weights, flips the served version with
// CommitWindow::Flip, and only then reopens admission (destroying the
// window). Requests that arrive while admission is closed wait and are
// decided after it reopens, on the new version.
//
// Threading: the gate is confined to one event loop (the executor it was
// built with). Every method, and every Ticket and CommitWindow, is used on
// that loop's thread only, so the hot path takes no lock.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stitch/core/constraint.h"
#include "stitch/core/version.h"
#include "stitch/engine/engine.h"

namespace stitch {

namespace replica_internal {
class LoopSignal;
}

// Which requests a commit waits for.
enum class DrainScope {
  kExactPins,  // in-place commit: exact pins must not cross the change
  kAll,        // quiesce commit or run change: nothing crosses it
};

class AdmissionGate {
 public:
  // `serving` is what the engine serves when the gate opens.
  AdmissionGate(const boost::asio::any_io_executor& loop, VersionRef serving);
  ~AdmissionGate();
  AdmissionGate(const AdmissionGate&) = delete;
  AdmissionGate& operator=(const AdmissionGate&) = delete;

  // Called once for every rejected request. Set before the first Admit.
  void SetRejectListener(std::function<void()> listener) { on_reject_ = std::move(listener); }

  // An admitted request. Move-only; destroying it releases admission (and
  // may let a draining commit proceed). REQUIRES: destroyed before the gate.
  class Ticket {
   public:
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket();

    // The version captured at admission: the request starts on it.
    const VersionRef& start() const { return start_; }
    // Start and the version served now (the end version when the response
    // is produced now). Never another run: run changes drain every request.
    VersionStamp Stamp() const;
    bool exact() const { return exact_; }

   private:
    friend class AdmissionGate;
    Ticket(AdmissionGate* gate, VersionRef start, bool exact)
        : gate_(gate), start_(std::move(start)), exact_(exact) {}
    void Release();

    AdmissionGate* gate_;
    VersionRef start_;
    bool exact_;
  };

  // Decides at once when admission is open: a Ticket, FailedPrecondition of
  // kind kVersionNotReady for an unmet constraint, or Unavailable once the
  // gate is terminated. nullopt while admission is closed for a commit.
  std::optional<absl::StatusOr<Ticket>> TryAdmit(const VersionConstraint& constraint);

  // Like TryAdmit, but while admission is closed waits for it to reopen.
  // Cancelled when the awaiting coroutine is cancelled while waiting.
  boost::asio::awaitable<absl::StatusOr<Ticket>> Admit(VersionConstraint constraint);

  // An open commit: admission stays closed until it is destroyed.
  class CommitWindow {
   public:
    CommitWindow(CommitWindow&& other) noexcept;
    CommitWindow& operator=(CommitWindow&&) = delete;
    ~CommitWindow();

    // The served version becomes `now` (what the engine serves after the
    // change): admissions after the window closes start on it.
    void Flip(const VersionRef& now);

   private:
    friend class AdmissionGate;
    explicit CommitWindow(AdmissionGate* gate) : gate_(gate) {}
    AdmissionGate* gate_;
  };

  // Closes admission, then waits until the requests of `scope` have drained.
  // Errors: Cancelled when the awaiting coroutine is cancelled (admission
  // reopens), Unavailable when the gate is terminated meanwhile.
  // REQUIRES: no other window is open.
  boost::asio::awaitable<absl::StatusOr<CommitWindow>> Close(DrainScope scope);

  // Closes admission for good: waiting and future admissions fail with
  // Unavailable carrying `why`. Requests already admitted keep their tickets.
  void Terminate(absl::Status why);

  const VersionRef& serving() const { return serving_; }
  bool is_open() const { return open_ && terminal_.ok(); }
  const absl::Status& terminal() const { return terminal_; }
  // Requests holding a ticket now, all / exact pins only.
  int64_t active() const { return active_; }
  int64_t active_exact() const { return active_exact_; }
  uint64_t admitted_total() const { return admitted_total_; }
  // Rejections: unmet constraints (409) / after Terminate (503).
  uint64_t rejected_not_ready_total() const { return rejected_not_ready_total_; }
  uint64_t rejected_terminal_total() const { return rejected_terminal_total_; }

 private:
  absl::StatusOr<Ticket> Decide(const VersionConstraint& constraint);
  void Release(bool exact);
  void Reopen();
  bool Drained(DrainScope scope) const {
    return scope == DrainScope::kAll ? active_ == 0 : active_exact_ == 0;
  }

  VersionRef serving_;
  bool open_ = true;
  bool window_open_ = false;
  absl::Status terminal_;
  int64_t active_ = 0;
  int64_t active_exact_ = 0;
  uint64_t admitted_total_ = 0;
  uint64_t rejected_not_ready_total_ = 0;
  uint64_t rejected_terminal_total_ = 0;
  std::function<void()> on_reject_;
  std::unique_ptr<replica_internal::LoopSignal> reopened_;
  std::unique_ptr<replica_internal::LoopSignal> released_;
  std::optional<DrainScope> draining_;
};

}  // namespace stitch
