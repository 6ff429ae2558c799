#include "stitch/replica/admission_gate.h"

#include <memory>

#include <gtest/gtest.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "stitch/core/errors.h"
#include "stitch/net/event_loop.h"
#include "stitch/replica/replica_test_util.h"

namespace stitch {
namespace {

using boost::asio::awaitable;
using testing::LoopLatch;
using testing::RollingRequest;
using testing::Settle;
using testing::SpawnRoll;
using testing::Until;

#define CO_ASSERT(cond)                            \
  do {                                             \
    if (!(cond)) {                                 \
      ADD_FAILURE() << "assertion failed: " #cond; \
      co_return;                                   \
    }                                              \
  } while (0)

class AdmissionGateTest : public ::testing::Test {
 protected:
  AdmissionGateTest()
      : loop_(std::make_unique<EventLoop>()),
        gate_(std::make_unique<AdmissionGate>(loop_->executor(), VersionRef{"r1", 5})) {
    gate_->SetRejectListener([this] { ++wakes_; });
  }
  ~AdmissionGateTest() override {
    gate_.reset();
    loop_.reset();
  }
  template <typename F>
  void Run(F body) {
    loop_->BlockOn(body());
  }

  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<AdmissionGate> gate_;
  int wakes_ = 0;
};

TEST_F(AdmissionGateTest, AdmitsSatisfiedConstraintsAndCapturesTheServedVersion) {
  Run([&]() -> awaitable<void> {
    for (VersionConstraint c : {VersionConstraint{}, VersionConstraint::AtLeast(3),
                                VersionConstraint::AtLeast(5), VersionConstraint::Exact(5)}) {
      auto t = gate_->TryAdmit(c);
      CO_ASSERT(t.has_value() && t->ok());
      EXPECT_EQ((*t)->start(), (VersionRef{"r1", 5}));
      EXPECT_EQ(gate_->active(), 1);
      EXPECT_EQ(gate_->active_exact(), c.is_exact() ? 1 : 0);
    }
    EXPECT_EQ(gate_->active(), 0);
    EXPECT_EQ(gate_->admitted_total(), 4u);
    EXPECT_EQ(wakes_, 0);
    co_return;
  });
}

TEST_F(AdmissionGateTest, RejectionIsVersionNotReadyAndAWake) {
  Run([&]() -> awaitable<void> {
    for (VersionConstraint c : {VersionConstraint::AtLeast(6), VersionConstraint::Exact(4)}) {
      auto t = co_await gate_->Admit(c);
      EXPECT_TRUE(absl::IsFailedPrecondition(t.status())) << t.status();
      EXPECT_EQ(GetErrorKind(t.status()), ErrorKind::kVersionNotReady);
      EXPECT_NE(t.status().message().find("r1/weight_v000005"), std::string::npos);
      // A pin on a version this replica has passed is not worth waiting for.
      EXPECT_EQ(t.status().message().find("moved past") != std::string::npos, c.is_exact())
          << t.status();
    }
    EXPECT_EQ(wakes_, 2);
    EXPECT_EQ(gate_->rejected_not_ready_total(), 2u);
    EXPECT_EQ(gate_->active(), 0);
  });
}

// A version above the store's pointer is not published: the 409 says so
// instead of suggesting that this replica is catching up, and names the
// pointer. A version the pointer holds is one this replica is behind on.
TEST_F(AdmissionGateTest, AVersionAboveThePointerIsRefusedAsNotPublished) {
  Run([&]() -> awaitable<void> {
    gate_->SetPointer(VersionRef{"r1", 5});
    for (VersionConstraint c : {VersionConstraint::AtLeast(7), VersionConstraint::Exact(7)}) {
      auto t = gate_->TryAdmit(c);
      CO_ASSERT(t.has_value() && !t->ok());
      const std::string message(t->status().message());
      EXPECT_EQ(GetErrorKind(t->status()), ErrorKind::kVersionNotReady);
      EXPECT_NE(message.find("version 7 is not published (the store's pointer is at "
                             "r1/weight_v000005"),
                std::string::npos)
          << message;
      EXPECT_EQ(message.find("catching up"), std::string::npos) << message;
    }
    gate_->SetPointer(VersionRef{"r1", 7});
    auto behind = gate_->TryAdmit(VersionConstraint::AtLeast(7));
    CO_ASSERT(behind.has_value() && !behind->ok());
    EXPECT_NE(behind->status().message().find("catching up"), std::string::npos)
        << behind->status();
    EXPECT_EQ(behind->status().message().find("not published"), std::string::npos)
        << behind->status();
    // The pointer of another run says nothing about this run's versions.
    gate_->SetPointer(VersionRef{"r2", 0});
    auto other = gate_->TryAdmit(VersionConstraint::AtLeast(7));
    CO_ASSERT(other.has_value() && !other->ok());
    EXPECT_EQ(other->status().message().find("not published"), std::string::npos)
        << other->status();
  });
}

TEST_F(AdmissionGateTest, MaxStalenessIsJudgedAgainstThePointerAsLastRead) {
  Run([&]() -> awaitable<void> {
    VersionConstraint fresh = VersionConstraint::Fresh(1);
    // No pointer read yet: nothing to be behind.
    auto t = gate_->TryAdmit(fresh);
    CO_ASSERT(t.has_value() && t->ok());
    gate_->SetPointer(VersionRef{"r1", 6});
    t = gate_->TryAdmit(fresh);
    CO_ASSERT(t.has_value() && t->ok());
    gate_->SetPointer(VersionRef{"r1", 7});
    t = gate_->TryAdmit(fresh);
    CO_ASSERT(t.has_value() && !t->ok());
    EXPECT_EQ(GetErrorKind(t->status()), ErrorKind::kVersionNotReady);
    EXPECT_NE(t->status().message().find("max_staleness 1"), std::string::npos) << t->status();
    EXPECT_NE(t->status().message().find("r1/weight_v000007"), std::string::npos) << t->status();
    EXPECT_EQ(gate_->Unmet(fresh), VersionConstraint::Bound::kStaleness);
    // With min_version too: the first failing bound is named.
    VersionConstraint both = VersionConstraint::AtLeast(6);
    both.max_staleness = 3;
    EXPECT_EQ(gate_->Unmet(both), VersionConstraint::Bound::kMin);
    both.min_version = 5;
    EXPECT_EQ(gate_->Unmet(both), std::nullopt);
    // A pointer of another run is beyond any staleness.
    gate_->SetPointer(VersionRef{"r2", 1});
    EXPECT_EQ(gate_->Unmet(VersionConstraint::Fresh(100)), VersionConstraint::Bound::kStaleness);
    EXPECT_EQ(wakes_, 1);
  });
}

TEST_F(AdmissionGateTest, CloseWaitsForExactPinsOnlyWhenInPlace) {
  Run([&]() -> awaitable<void> {
    LoopLatch release_pin(loop_->executor());
    LoopLatch release_other(loop_->executor());
    RollingRequest pin, other;
    SpawnRoll(loop_->executor(), *gate_, VersionConstraint::Exact(5), &release_pin, &pin);
    SpawnRoll(loop_->executor(), *gate_, VersionConstraint{}, &release_other, &other);
    CO_ASSERT(co_await Until([&] { return pin.admitted && other.admitted; }));
    bool closed = false;
    std::optional<absl::StatusOr<AdmissionGate::CommitWindow>> window;
    boost::asio::co_spawn(
        loop_->executor(),
        [&]() -> awaitable<void> {
          window.emplace(co_await gate_->Close(DrainScope::kExactPins));
          closed = true;
        },
        boost::asio::detached);
    co_await Settle();
    EXPECT_FALSE(closed);
    EXPECT_FALSE(gate_->is_open());
    EXPECT_FALSE(gate_->TryAdmit(VersionConstraint{}).has_value());  // closed: must wait
    release_pin.Open();
    CO_ASSERT(co_await Until([&] { return closed; }));
    CO_ASSERT(window->ok());
    (*window)->Flip(VersionRef{"r1", 6});
    window.reset();  // reopens
    EXPECT_TRUE(gate_->is_open());
    release_other.Open();
    CO_ASSERT(co_await Until([&] { return other.done; }));
    EXPECT_EQ(other.stamp->start, 5);
    EXPECT_EQ(other.stamp->end, 6);
    EXPECT_EQ(pin.stamp->end, 5);
  });
}

// Routes that are not versioned go through the gate too: a commit that
// drains everything waits for them, and while admission is closed they wait
// for it to reopen. Trust does not matter to them.
TEST_F(AdmissionGateTest, UnversionedRequestsWaitForACommitAndAQuiesceDrainsThem) {
  Run([&]() -> awaitable<void> {
    auto held = co_await gate_->AdmitUnversioned();
    CO_ASSERT(held.ok());
    EXPECT_EQ(gate_->active(), 1);
    // An in_place commit drains exact pins only: it closes at once.
    {
      auto in_place = co_await gate_->Close(DrainScope::kExactPins);
      CO_ASSERT(in_place.ok());
    }
    bool closed = false;
    std::optional<absl::StatusOr<AdmissionGate::CommitWindow>> window;
    boost::asio::co_spawn(
        loop_->executor(),
        [&]() -> awaitable<void> {
          window.emplace(co_await gate_->Close(DrainScope::kAll));
          closed = true;
        },
        boost::asio::detached);
    co_await Settle();
    EXPECT_FALSE(closed) << "a quiesce waits for the unversioned request in flight";
    { auto done = *std::move(held); }
    CO_ASSERT(co_await Until([&] { return closed; }));
    CO_ASSERT(window->ok());

    bool admitted = false;
    boost::asio::co_spawn(
        loop_->executor(),
        [&]() -> awaitable<void> {
          auto t = co_await gate_->AdmitUnversioned();
          admitted = t.ok();
        },
        boost::asio::detached);
    co_await Settle();
    EXPECT_FALSE(admitted) << "admission is closed for the commit";
    window.reset();  // reopens
    CO_ASSERT(co_await Until([&] { return admitted; }));

    AdmissionGate untrusted(loop_->executor());
    auto t = co_await untrusted.AdmitUnversioned();
    EXPECT_TRUE(t.ok()) << t.status();
  });
}

TEST_F(AdmissionGateTest, WaitingAdmissionsAreDecidedOnTheNewVersion) {
  Run([&]() -> awaitable<void> {
    auto window = co_await gate_->Close(DrainScope::kAll);
    CO_ASSERT(window.ok());
    RollingRequest waiting_min, waiting_exact;
    SpawnRoll(loop_->executor(), *gate_, VersionConstraint::AtLeast(6), nullptr, &waiting_min);
    SpawnRoll(loop_->executor(), *gate_, VersionConstraint::Exact(5), nullptr, &waiting_exact);
    co_await Settle();
    EXPECT_FALSE(waiting_min.done);
    window->Flip(VersionRef{"r1", 6});
    { auto reopen = std::move(*window); }
    CO_ASSERT(co_await Until([&] { return waiting_min.done && waiting_exact.done; }));
    EXPECT_EQ(waiting_min.start, (VersionRef{"r1", 6}));
    EXPECT_EQ(GetErrorKind(waiting_exact.status), ErrorKind::kVersionNotReady);
  });
}

TEST_F(AdmissionGateTest, TerminateFailsWaitersAndNewAdmissions) {
  Run([&]() -> awaitable<void> {
    auto window = co_await gate_->Close(DrainScope::kAll);
    CO_ASSERT(window.ok());
    RollingRequest waiting;
    SpawnRoll(loop_->executor(), *gate_, VersionConstraint{}, nullptr, &waiting);
    co_await Settle();
    gate_->Terminate(absl::InternalError("commit failed"));
    CO_ASSERT(co_await Until([&] { return waiting.done; }));
    EXPECT_TRUE(absl::IsUnavailable(waiting.status)) << waiting.status;
    EXPECT_NE(waiting.status.message().find("commit failed"), std::string::npos);
    auto late = gate_->TryAdmit(VersionConstraint{});
    CO_ASSERT(late.has_value());
    EXPECT_TRUE(absl::IsUnavailable(late->status()));
    EXPECT_EQ(gate_->rejected_terminal_total(), 2u);
  });
}

TEST_F(AdmissionGateTest, AnUntrustedGateAdmitsNothingVersionedAndWakesNobody) {
  Run([&]() -> awaitable<void> {
    AdmissionGate fresh(loop_->executor());
    int wakes = 0;
    fresh.SetRejectListener([&] { ++wakes; });
    EXPECT_FALSE(fresh.known_serving().has_value());
    auto pinned = fresh.TryAdmit(VersionConstraint::AtLeast(0));
    CO_ASSERT(pinned.has_value() && !pinned->ok());
    EXPECT_EQ(GetErrorKind(pinned->status()), ErrorKind::kVersionNotReady);
    auto any = fresh.TryAdmit(VersionConstraint{});
    CO_ASSERT(any.has_value() && !any->ok());
    EXPECT_TRUE(absl::IsUnavailable(any->status())) << any->status();
    EXPECT_NE(any->status().message().find("not verified"), std::string::npos) << any->status();
    EXPECT_EQ(wakes, 0);
    EXPECT_EQ(fresh.rejected_unverified_total(), 2u);
    fresh.Trust(VersionRef{"r1", 4}, VersionRef{"r1", 4});
    auto admitted = fresh.TryAdmit(VersionConstraint::Exact(4));
    CO_ASSERT(admitted.has_value() && admitted->ok());
    EXPECT_EQ((*admitted)->start(), (VersionRef{"r1", 4}));
  });
}

TEST_F(AdmissionGateTest, DistrustWithdrawsTrustFromTicketsInFlightAndNoCommitWaitsForThem) {
  Run([&]() -> awaitable<void> {
    auto before = gate_->TryAdmit(VersionConstraint::Exact(5));
    CO_ASSERT(before.has_value() && before->ok());
    EXPECT_TRUE((*before)->trusted());
    gate_->Distrust("the engine restarted");
    EXPECT_FALSE((*before)->trusted());
    auto refused = gate_->TryAdmit(VersionConstraint::Exact(5));
    CO_ASSERT(refused.has_value() && !refused->ok());
    EXPECT_NE(refused->status().message().find("the engine restarted"), std::string::npos);
    // Loading weights while untrusted does not wait for the stale pin.
    auto window = co_await gate_->Close(DrainScope::kAll);
    CO_ASSERT(window.ok());
    window->Flip(VersionRef{"r1", 6});
    { auto reopen = std::move(*window); }
    EXPECT_TRUE(gate_->trusted());
    EXPECT_FALSE((*before)->trusted());  // trust returns for new tickets only
    auto after = gate_->TryAdmit(VersionConstraint::Exact(6));
    CO_ASSERT(after.has_value() && after->ok());
    EXPECT_TRUE((*after)->trusted());
    EXPECT_EQ(gate_->active(), 2);
    EXPECT_EQ(gate_->active_exact(), 1);
    // The next in-place commit waits for the new pin, not the stale one.
    RollingRequest closing;
    bool closed = false;
    boost::asio::co_spawn(
        loop_->executor(),
        [&]() -> awaitable<void> {
          auto w = co_await gate_->Close(DrainScope::kExactPins);
          closed = w.ok();
        },
        boost::asio::detached);
    co_await Settle();
    EXPECT_FALSE(closed);
    after.reset();
    CO_ASSERT(co_await Until([&] { return closed; }));
  });
}

TEST_F(AdmissionGateTest, HoldRefusesNewRequestsButKeepsThoseInFlightVouchedFor) {
  Run([&]() -> awaitable<void> {
    auto in_flight = gate_->TryAdmit(VersionConstraint{});
    CO_ASSERT(in_flight.has_value() && in_flight->ok());
    gate_->Hold("the engine did not answer: timed out");
    EXPECT_FALSE(gate_->is_open());
    auto refused = gate_->TryAdmit(VersionConstraint::AtLeast(1));
    CO_ASSERT(refused.has_value() && !refused->ok());
    EXPECT_NE(refused->status().message().find("timed out"), std::string::npos);
    EXPECT_TRUE((*in_flight)->trusted());
    gate_->Unhold();
    auto admitted = gate_->TryAdmit(VersionConstraint::AtLeast(1));
    CO_ASSERT(admitted.has_value() && admitted->ok());
  });
}

// The label the engine puts on a response must name weights it held while
// that request ran: from its label at admission to its label now, or the
// one a commit in progress loads.
TEST_F(AdmissionGateTest, EngineLabelsAreCheckedAgainstWhatTheEngineHeldDuringTheRequest) {
  Run([&]() -> awaitable<void> {
    auto t = gate_->TryAdmit(VersionConstraint::AtLeast(5));
    CO_ASSERT(t.has_value() && t->ok());
    const AdmissionGate::Ticket& ticket = **t;
    for (std::string_view good : {"5", "r1/weight_v000005", "weight_v000005"}) {
      EXPECT_TRUE(gate_->CheckEngineLabel(ticket, good).ok()) << good;
    }
    for (std::string_view bad : {"4", "6", "r2/weight_v000005", "default", ""}) {
      absl::Status s = gate_->CheckEngineLabel(ticket, bad);
      EXPECT_TRUE(absl::IsFailedPrecondition(s)) << bad;
    }
    auto window = co_await gate_->Close(DrainScope::kExactPins);
    CO_ASSERT(window.ok());
    EXPECT_FALSE(gate_->CheckEngineLabel(ticket, "6").ok());
    window->Expect(VersionRef{"r1", 6});
    EXPECT_TRUE(gate_->CheckEngineLabel(ticket, "6").ok());
    window->Flip(VersionRef{"r1", 6});
    { auto reopen = std::move(*window); }
    EXPECT_TRUE(gate_->CheckEngineLabel(ticket, "5").ok());
    EXPECT_TRUE(gate_->CheckEngineLabel(ticket, "6").ok());
    EXPECT_FALSE(gate_->CheckEngineLabel(ticket, "7").ok());
    auto later = gate_->TryAdmit(VersionConstraint{});
    CO_ASSERT(later.has_value() && later->ok());
    EXPECT_FALSE(gate_->CheckEngineLabel(**later, "5").ok());
  });
}

TEST_F(AdmissionGateTest, EngineLabelsMapToTheServedVersionsTheyStoodForDuringTheRequest) {
  Run([&]() -> awaitable<void> {
    auto t = gate_->TryAdmit(VersionConstraint{});
    CO_ASSERT(t.has_value() && t->ok());
    const AdmissionGate::Ticket& ticket = **t;
    EXPECT_FALSE(gate_->ChangedSince(ticket));
    EXPECT_EQ(gate_->ServedForLabel(ticket, 5), 5);
    EXPECT_EQ(gate_->ServedForLabel(ticket, 6), std::nullopt);
    // Two in-place commits while it runs.
    for (int64_t v : {6, 7}) {
      auto window = co_await gate_->Close(DrainScope::kExactPins);
      CO_ASSERT(window.ok());
      window->Flip(VersionRef{"r1", v});
    }
    EXPECT_TRUE(gate_->ChangedSince(ticket));
    EXPECT_EQ(gate_->ServedForLabel(ticket, 5), 5);
    EXPECT_EQ(gate_->ServedForLabel(ticket, 6), 6);
    EXPECT_EQ(gate_->ServedForLabel(ticket, 7), 7);
    // An empty delta: served 8 on the weights labelled 7. Label 7 now stands
    // for two versions, so it names neither.
    {
      auto window = co_await gate_->Close(DrainScope::kExactPins);
      CO_ASSERT(window.ok());
      window->Flip(VersionRef{"r1", 8}, VersionRef{"r1", 7});
    }
    EXPECT_EQ(gate_->ServedForLabel(ticket, 7), std::nullopt);
    EXPECT_EQ(gate_->ServedForLabel(ticket, 6), 6);
    // A request admitted after it knows label 7 as 8 only.
    auto later = gate_->TryAdmit(VersionConstraint{});
    CO_ASSERT(later.has_value() && later->ok());
    EXPECT_EQ(gate_->ServedForLabel(**later, 7), 8);
    EXPECT_FALSE(gate_->ChangedSince(**later));
  });
}

TEST_F(AdmissionGateTest, AdmissionsWaitingForACommitAreRefusedWhenTrustIsWithdrawn) {
  Run([&]() -> awaitable<void> {
    auto window = co_await gate_->Close(DrainScope::kAll);
    CO_ASSERT(window.ok());
    RollingRequest waiting;
    SpawnRoll(loop_->executor(), *gate_, VersionConstraint::AtLeast(5), nullptr, &waiting);
    co_await Settle();
    EXPECT_FALSE(waiting.done);
    gate_->Distrust("the engine's weights changed");
    CO_ASSERT(co_await Until([&] { return waiting.done; }));
    EXPECT_FALSE(waiting.admitted);
    EXPECT_EQ(GetErrorKind(waiting.status), ErrorKind::kVersionNotReady);
  });
}

}  // namespace
}  // namespace stitch
