#include "stitch/replica/watchdog.h"

#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "stitch/net/event_loop.h"
#include "stitch/replica/replica_test_util.h"

namespace stitch {
namespace {

using boost::asio::awaitable;
using testing::ScriptedEngine;
using testing::Settle;
using testing::Until;

#define CO_ASSERT(cond)                            \
  do {                                             \
    if (!(cond)) {                                 \
      ADD_FAILURE() << "assertion failed: " #cond; \
      co_return;                                   \
    }                                              \
  } while (0)

class WatchdogTest : public ::testing::Test {
 protected:
  WatchdogTest() : loop_(std::make_unique<EventLoop>()) {
    clock_ = std::make_unique<ManualClock>(loop_->executor());
    engine_ = std::make_unique<ScriptedEngine>(loop_->executor());
    WatchdogOptions options;
    options.interval = std::chrono::seconds(5);
    options.threshold = 3;
    // The count alone decides here; the time bounds have tests of their own.
    options.start_timeout = Clock::Duration::zero();
    options.restart_grace = Clock::Duration::zero();
    watchdog_ = MakeWatchdog(options);
  }
  std::unique_ptr<Watchdog> MakeWatchdog(WatchdogOptions options) {
    return std::make_unique<Watchdog>(
        loop_->executor(), options, *clock_, [this] { return expects_progress_; },
        [this]() { return engine_->Health(std::chrono::seconds(1)); },
        [this](absl::Status why) { trips_.push_back(std::move(why)); });
  }
  ~WatchdogTest() override {
    loop_->BlockOn(watchdog_->Stop());
    watchdog_.reset();
    engine_.reset();
    loop_.reset();
  }
  // Replaces the watchdog by one with these time bounds (3 failures, 5 s
  // apart, as the fixture's), expecting progress.
  awaitable<void> WithBounds(Clock::Duration start_timeout, Clock::Duration restart_grace) {
    co_await watchdog_->Stop();
    WatchdogOptions options;
    options.interval = std::chrono::seconds(5);
    options.threshold = 3;
    options.start_timeout = start_timeout;
    options.restart_grace = restart_grace;
    watchdog_ = MakeWatchdog(options);
    expects_progress_ = true;
  }
  template <typename F>
  void Run(F body) {
    loop_->BlockOn(body());
  }
  // One interval passes and the watchdog has acted on it (it went back to
  // sleep).
  awaitable<bool> Tick() {
    if (!co_await Until([&] { return clock_->sleepers() == 1; })) co_return false;
    const uint64_t sleeps = clock_->sleeps_started();
    clock_->Advance(std::chrono::seconds(5));
    co_return co_await Until(
        [&] { return clock_->sleeps_started() > sleeps && clock_->sleepers() == 1; });
  }

  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<ManualClock> clock_;
  std::unique_ptr<ScriptedEngine> engine_;
  std::unique_ptr<Watchdog> watchdog_;
  bool expects_progress_ = false;
  std::vector<absl::Status> trips_;
};

TEST_F(WatchdogTest, ProbesOnlyWhenProgressIsExpected) {
  Run([&]() -> awaitable<void> {
    watchdog_->Start();
    for (int i = 0; i < 5; ++i) CO_ASSERT(co_await Tick());
    EXPECT_EQ(engine_->health_calls, 0);
    expects_progress_ = true;
    CO_ASSERT(co_await Tick());
    EXPECT_EQ(engine_->health_calls, 1);
    expects_progress_ = false;  // committing, say
    CO_ASSERT(co_await Tick());
    EXPECT_EQ(engine_->health_calls, 1);
    EXPECT_TRUE(trips_.empty());
  });
}

TEST_F(WatchdogTest, TripsAfterNConsecutiveFailures) {
  Run([&]() -> awaitable<void> {
    expects_progress_ = true;
    for (int i = 0; i < 2; ++i) engine_->health_results.push_back(absl::UnavailableError("down"));
    engine_->health_results.push_back(absl::OkStatus());  // the count starts over
    for (int i = 0; i < 3; ++i) engine_->health_results.push_back(absl::UnavailableError("down"));
    watchdog_->Start();
    for (int i = 0; i < 5; ++i) CO_ASSERT(co_await Tick());
    EXPECT_TRUE(trips_.empty());
    EXPECT_EQ(watchdog_->consecutive_failures(), 2);
    // A skipped probe (not expected to progress) also starts the count over.
    expects_progress_ = false;
    CO_ASSERT(co_await Tick());
    EXPECT_EQ(watchdog_->consecutive_failures(), 0);
    expects_progress_ = true;
    engine_->health_results.push_back(absl::UnavailableError("down"));
    engine_->health_results.push_back(absl::UnavailableError("down"));
    CO_ASSERT(co_await Tick());
    CO_ASSERT(co_await Tick());
    EXPECT_TRUE(trips_.empty());
    uint64_t probes = watchdog_->probes();
    clock_->Advance(std::chrono::seconds(5));
    CO_ASSERT(co_await Until([&] { return !trips_.empty(); }));
    EXPECT_EQ(watchdog_->probes(), probes + 1);
    EXPECT_TRUE(watchdog_->tripped());
    EXPECT_EQ(trips_.size(), 1u);
    EXPECT_NE(trips_[0].message().find("3 health checks in a row"), std::string::npos) << trips_[0];
    co_await Settle();
    EXPECT_EQ(clock_->sleepers(), 0u);  // it stopped probing
  });
}

TEST_F(WatchdogTest, ProbeNowDoesNotWaitForTheInterval) {
  Run([&]() -> awaitable<void> {
    expects_progress_ = true;
    watchdog_->Start();
    CO_ASSERT(co_await Until([&] { return clock_->sleepers() == 1; }));
    EXPECT_EQ(engine_->health_calls, 0);
    watchdog_->ProbeNow();
    watchdog_->ProbeNow();  // coalesced
    CO_ASSERT(co_await Until([&] { return engine_->health_calls == 1; }));
    co_await Settle();
    EXPECT_EQ(engine_->health_calls, 1);
    // The interval starts over: nothing more without time passing.
    CO_ASSERT(co_await Until([&] { return clock_->sleepers() == 1; }));
    EXPECT_EQ(engine_->health_calls, 1);
  });
}

TEST_F(WatchdogTest, WithoutAnIntervalOnlyProbeNowProbes) {
  Run([&]() -> awaitable<void> {
    co_await watchdog_->Stop();
    WatchdogOptions options;
    options.interval = Clock::Duration::zero();
    options.threshold = 2;
    options.start_timeout = Clock::Duration::zero();
    watchdog_ = MakeWatchdog(options);
    expects_progress_ = true;
    watchdog_->Start();
    co_await Settle();
    clock_->Advance(std::chrono::hours(1));
    co_await Settle();
    EXPECT_EQ(engine_->health_calls, 0);
    EXPECT_EQ(clock_->sleepers(), 0u);
    engine_->health_results.push_back(absl::UnavailableError("down"));
    engine_->health_results.push_back(absl::UnavailableError("down"));
    watchdog_->ProbeNow();
    CO_ASSERT(co_await Until([&] { return engine_->health_calls == 1; }));
    EXPECT_TRUE(trips_.empty());
    watchdog_->ProbeNow();
    CO_ASSERT(co_await Until([&] { return !trips_.empty(); }));
    EXPECT_EQ(engine_->health_calls, 2);
  });
}

// A real engine takes minutes to load: a sidecar started before it waits up
// to start_timeout, however many checks fail meanwhile.
TEST_F(WatchdogTest, AnEngineThatNeverAnsweredHasTheStartTimeout) {
  Run([&]() -> awaitable<void> {
    co_await WithBounds(std::chrono::seconds(60), std::chrono::seconds(600));
    for (int i = 0; i < 20; ++i) engine_->health_results.push_back(absl::UnavailableError("down"));
    watchdog_->Start();
    for (int i = 0; i < 12; ++i) CO_ASSERT(co_await Tick());  // failing for 55 s
    EXPECT_TRUE(trips_.empty());
    CO_ASSERT(co_await Until([&] { return clock_->sleepers() == 1; }));
    clock_->Advance(std::chrono::seconds(5));
    CO_ASSERT(co_await Until([&] { return !trips_.empty(); }));
    EXPECT_NE(trips_[0].message().find("did not start within 60 s"), std::string::npos)
        << trips_[0];
  });
}

// An engine that answered, then went away (restarted), has the restart
// grace to come back; coming back starts the count over.
TEST_F(WatchdogTest, AnEngineThatWentAwayHasTheRestartGraceToComeBack) {
  Run([&]() -> awaitable<void> {
    co_await WithBounds(std::chrono::seconds(10), std::chrono::seconds(100));
    engine_->health_results.push_back(absl::OkStatus());
    for (int i = 0; i < 15; ++i) engine_->health_results.push_back(absl::UnavailableError("gone"));
    engine_->health_results.push_back(absl::OkStatus());  // back after 75 s
    for (int i = 0; i < 30; ++i) engine_->health_results.push_back(absl::UnavailableError("gone"));
    watchdog_->Start();
    for (int i = 0; i < 17; ++i) CO_ASSERT(co_await Tick());
    EXPECT_TRUE(trips_.empty());
    EXPECT_EQ(watchdog_->consecutive_failures(), 0);
    for (int i = 0; i < 20; ++i) CO_ASSERT(co_await Tick());  // 95 s failing
    EXPECT_TRUE(trips_.empty());
    CO_ASSERT(co_await Until([&] { return clock_->sleepers() == 1; }));
    clock_->Advance(std::chrono::seconds(5));
    CO_ASSERT(co_await Until([&] { return !trips_.empty(); }));
    EXPECT_NE(trips_[0].message().find("did not come back within 100 s"), std::string::npos)
        << trips_[0];
  });
}

}  // namespace
}  // namespace stitch
