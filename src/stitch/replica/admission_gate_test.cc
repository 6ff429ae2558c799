#include "stitch/replica/admission_gate.h"

#include <memory>

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace stitch
