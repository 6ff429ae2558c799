// The admission gate: the one place where requests meet weight changes.
//
// Every versioned request is admitted here before it reaches the engine. One
// decision captures the version the request will start on and checks its
// constraint against it; an unmet constraint is rejected (HTTP 409) and
// reported to the reject listener (the reconciler's wake). The request holds
// a Ticket while it runs.
//
// Trust. The gate serves a version only while it trusts that the engine
// holds it. It starts untrusted (AdmissionGate(loop)): nothing versioned is
// admitted until Trust() names what the engine was verified to hold, or a
// commit window's Flip() names what was just loaded into it. Distrust()
// (an engine that restarted, or whose weights changed behind the sidecar's
// back) withdraws it at once: new requests are refused, and every ticket
// already issued stops being trusted(), so that its response is answered as
// retryable instead of being stamped with a version nobody can vouch for.
// Hold() refuses new requests while the engine is in doubt (it did not
// answer), without withdrawing trust from what is in flight.
//
// Besides the served version, the gate knows the engine's own label of its
// weights (what the last load named). It differs from the served version
// after empty deltas, which move the served version without touching the
// engine. CheckEngineLabel() tells whether the label an engine put on a
// response is one this request may legitimately have been produced under.
//
// A commit goes through Close(): admission closes first, then the requests
// that must not cross the change drain (exact pins for an in-place commit;
// every request for a quiesce commit or a run change; none when the gate is
// untrusted, since nothing in flight will be stamped anyway), then the caller
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
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stitch/api/response.h"
#include "stitch/core/constraint.h"
#include "stitch/core/version.h"

namespace stitch {

class LoopSignal;

// Which requests a commit waits for.
enum class DrainScope {
  kExactPins,  // in-place commit: exact pins must not cross the change
  kAll,        // quiesce commit or run change: nothing crosses it
};

class AdmissionGate {
 public:
  // Untrusted: admits nothing versioned until Trust() or a window's Flip().
  explicit AdmissionGate(const boost::asio::any_io_executor& loop);
  // Trusted from the start: the engine serves `serving`, labelled so.
  AdmissionGate(const boost::asio::any_io_executor& loop, VersionRef serving);
  ~AdmissionGate();
  AdmissionGate(const AdmissionGate&) = delete;
  AdmissionGate& operator=(const AdmissionGate&) = delete;

  // Called once for every request rejected for an unmet constraint (not for
  // refusals while untrusted or held). Set before the first Admit.
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
    // The engine's label of its weights at admission.
    const VersionRef& start_label() const { return start_label_; }
    // Start and the version served now (the end version when the response
    // is produced now). Never another run: run changes drain every request.
    VersionStamp Stamp() const;
    bool exact() const { return exact_; }
    // Whether the gate still trusts the weights this request was admitted
    // on: false once Distrust() was called after its admission.
    bool trusted() const;

   private:
    friend class AdmissionGate;
    Ticket(AdmissionGate* gate, VersionRef start, VersionRef start_label, uint64_t epoch,
           uint64_t flips, bool exact)
        : gate_(gate),
          start_(std::move(start)),
          start_label_(std::move(start_label)),
          epoch_(epoch),
          flips_(flips),
          exact_(exact) {}
    void Release();

    AdmissionGate* gate_;
    VersionRef start_;
    VersionRef start_label_;  // the engine's label at admission
    uint64_t epoch_;
    uint64_t flips_;  // the gate's flip count at admission
    bool exact_;
  };

  // Decides at once when admission is open: a Ticket; FailedPrecondition of
  // kind kVersionNotReady for an unmet constraint, or for a constrained
  // request while untrusted or held; Unavailable for an unconstrained one
  // then, or once the gate is terminated. nullopt while admission is closed
  // for a commit.
  std::optional<absl::StatusOr<Ticket>> TryAdmit(const VersionConstraint& constraint);

  // Like TryAdmit, but while admission is closed waits for it to reopen.
  // Cancelled when the awaiting coroutine is cancelled while waiting.
  boost::asio::awaitable<absl::StatusOr<Ticket>> Admit(VersionConstraint constraint);

  // Admits a request of a route that is not versioned (forwarded to the
  // engine as is): it waits while a commit holds admission closed, counts
  // as in flight for the commits that drain everything (quiesce, a run
  // change), and is refused only once the gate is terminated. Trust does
  // not matter: nothing in its answer is stamped with a version.
  boost::asio::awaitable<absl::StatusOr<Ticket>> AdmitUnversioned();

  // OK when `label`, the weight label the engine put on a response to
  // `ticket`'s request, names a version the engine held at some moment of
  // that request: from its label at admission to its label now (or the one
  // a commit in progress is loading). FailedPrecondition saying what
  // disagrees otherwise (a label that is no version included).
  absl::Status CheckEngineLabel(const Ticket& ticket, std::string_view label) const;

  // The served version that engine label `label` stood for while `ticket`'s
  // request ran (from admission to now); nullopt when the label stood for
  // more than one (an empty delta moved the served version without the
  // engine) or for none the gate remembers. A commit flips the served
  // version before the engine resumes, so every label an engine puts on
  // tokens of an admitted request is known here by the time it is read.
  std::optional<int64_t> ServedForLabel(const Ticket& ticket, int64_t label) const;

  // Whether the served version or the engine's weights changed (a flip or a
  // Trust) since `ticket`'s admission: when not, everything the request
  // generated came from its start version.
  bool ChangedSince(const Ticket& ticket) const { return flip_count_ != ticket.flips_; }

  // An open commit: admission stays closed until it is destroyed.
  class CommitWindow {
   public:
    CommitWindow(CommitWindow&& other) noexcept;
    CommitWindow& operator=(CommitWindow&&) = delete;
    ~CommitWindow();

    // The engine is about to load weights labelled `label`: from now on
    // responses may carry that label.
    void Expect(const VersionRef& label);
    // The engine now holds weights labelled `engine_label`, which are the
    // weights of `serving`: admissions after the window closes start on
    // `serving`. Trusts the gate (what was just loaded is known).
    void Flip(const VersionRef& serving, const VersionRef& engine_label);
    void Flip(const VersionRef& now) { Flip(now, now); }
    // The commit did not happen (the engine undid it): responses carry the
    // label they carried before, and nothing flips.
    void Abandon();

   private:
    friend class AdmissionGate;
    explicit CommitWindow(AdmissionGate* gate) : gate_(gate) {}
    AdmissionGate* gate_;
  };

  // Closes admission, then waits until the requests of `scope` have drained
  // (nothing when the gate is untrusted). Errors: Cancelled when the
  // awaiting coroutine is cancelled (admission reopens), Unavailable when
  // the gate is terminated meanwhile. REQUIRES: no other window is open.
  boost::asio::awaitable<absl::StatusOr<CommitWindow>> Close(DrainScope scope);

  // Verified: the engine serves `serving`, its weights labelled
  // `engine_label`. REQUIRES: no window is open.
  void Trust(const VersionRef& serving, const VersionRef& engine_label);
  // Withdraws trust, saying `why` to refused requests (see above).
  // Idempotent while untrusted (the first reason stays).
  void Distrust(std::string why);
  // Refuses new requests, saying `why`, until Unhold().
  void Hold(std::string why);
  void Unhold();
  // Why the served version is behind the store (a version that cannot be
  // applied), added to the 409 of unmet constraints; "" when nothing is
  // wrong.
  void SetBehindReason(std::string why) { behind_reason_ = std::move(why); }
  // The store's pointer as last read (nullopt: none yet, or no pointer), by
  // which requests with max_staleness are judged.
  void SetPointer(std::optional<VersionRef> pointer) { pointer_ = std::move(pointer); }
  const std::optional<VersionRef>& pointer() const { return pointer_; }

  // Closes admission for good: waiting and future admissions fail with
  // Unavailable carrying `why`. Requests already admitted keep their tickets.
  void Terminate(absl::Status why);

  // The first bound of `constraint` the served version fails, judged
  // against the pointer as last read (SetPointer); a pointer of another run
  // counts as beyond any staleness. nullopt when it holds.
  std::optional<VersionConstraint::Bound> Unmet(const VersionConstraint& constraint) const;

  // The served version; meaningful only while trusted().
  const VersionRef& serving() const { return serving_; }
  // The served version when trusted, else nullopt.
  std::optional<VersionRef> known_serving() const {
    return trusted_ ? std::optional<VersionRef>(serving_) : std::nullopt;
  }
  // The engine's label of the weights it holds; meaningful while trusted.
  const VersionRef& engine_label() const { return engine_label_; }
  bool trusted() const { return trusted_; }
  const std::string& distrust_reason() const { return distrust_reason_; }
  // The reason of the latest Distrust(), kept after trust returns (what a
  // ticket issued before it was withdrawn for).
  const std::string& last_distrust_reason() const { return last_distrust_reason_; }
  bool held() const { return hold_reason_.has_value(); }
  bool is_open() const { return open_ && terminal_.ok() && trusted_ && !held(); }
  const absl::Status& terminal() const { return terminal_; }
  // Requests holding a ticket now, all / exact pins still vouched for
  // (issued since the last Distrust()).
  int64_t active() const { return active_; }
  int64_t active_exact() const { return active_exact_; }
  uint64_t admitted_total() const { return admitted_total_; }
  // Rejections: unmet constraints (409) / after Terminate (503) / while
  // untrusted or held (409 or 503).
  uint64_t rejected_not_ready_total() const { return rejected_not_ready_total_; }
  uint64_t rejected_terminal_total() const { return rejected_terminal_total_; }
  uint64_t rejected_unverified_total() const { return rejected_unverified_total_; }

 private:
  absl::StatusOr<Ticket> Decide(const VersionConstraint& constraint);
  // The version `constraint` asks for when its `unmet` bound (exact or min)
  // names one above the pointer as last read, of the served run: one the
  // store does not hold yet. nullopt otherwise.
  std::optional<int64_t> Unpublished(const VersionConstraint& constraint,
                                     VersionConstraint::Bound unmet) const;
  void Release(bool exact, uint64_t epoch);
  void Reopen();
  void RecordFlip();
  bool Drained(DrainScope scope) const {
    if (!trusted_) return true;
    return scope == DrainScope::kAll ? vouched_ == 0 : active_exact_ == 0;
  }

  VersionRef serving_;
  VersionRef engine_label_;
  std::optional<VersionRef> pending_label_;  // while a window loads new weights
  bool trusted_ = false;
  std::string distrust_reason_ = "the engine's weights are not verified yet";
  std::string last_distrust_reason_;
  std::optional<std::string> hold_reason_;
  std::string behind_reason_;
  std::optional<VersionRef> pointer_;
  uint64_t epoch_ = 0;
  // The latest (engine label, served version) pairs set by Flip and Trust,
  // newest last, and how many there were in all.
  std::deque<std::pair<int64_t, int64_t>> flips_;
  uint64_t flip_count_ = 0;
  bool open_ = true;
  bool window_open_ = false;
  absl::Status terminal_;
  int64_t active_ = 0;        // every ticket alive
  int64_t vouched_ = 0;       // those of the current epoch (commits drain these)
  int64_t active_exact_ = 0;  // exact pins of the current epoch
  uint64_t admitted_total_ = 0;
  uint64_t rejected_not_ready_total_ = 0;
  uint64_t rejected_terminal_total_ = 0;
  uint64_t rejected_unverified_total_ = 0;
  std::function<void()> on_reject_;
  std::unique_ptr<LoopSignal> reopened_;
  std::unique_ptr<LoopSignal> released_;
  std::optional<DrainScope> draining_;
};

}  // namespace stitch
