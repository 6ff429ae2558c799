#include "stitch/publish/claim.h"

#include <atomic>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stitch/core/errors.h"
#include "stitch/publish/testing_fakes.h"
#include "stitch/store/fs_store.h"
#include "stitch/store/mem_store.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

using ::stitch::testing::CountingPool;
using ::stitch::testing::TempDir;
using ::testing::HasSubstr;

std::unique_ptr<MemStore> Mem(const std::string& run) {
  // One fresh state per test: the test's name is unique.
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto s = MemStore::Open(std::string("claim/") + info->name(), run);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

VersionRef A(int64_t v) { return VersionRef{"run-a", v}; }

TEST(ClaimTest, ClaimingAnUnsetPointerMovesItToTheBootVersion) {
  auto store = Mem("run-a");
  CountingPool pool;
  auto outcome = ClaimRun(*store, 0, &pool);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->moved);
  EXPECT_EQ(outcome->previous, std::nullopt);
  EXPECT_EQ(outcome->pointer, A(0));
  EXPECT_EQ(*store->ReadPointer(), A(0));
  EXPECT_EQ(pool.wakes, 1);
}

TEST(ClaimTest, ClaimingTwiceIsANoOp) {
  auto store = Mem("run-a");
  CountingPool pool;
  ASSERT_TRUE(ClaimRun(*store, 4, &pool).ok());
  auto again = ClaimRun(*store, 4, &pool);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->moved);
  EXPECT_EQ(again->pointer, A(4));
  EXPECT_EQ(again->previous, A(4));
  EXPECT_EQ(*store->ReadPointer(), A(4));
  EXPECT_EQ(pool.wakes, 1);  // no move, no wake
}

TEST(ClaimTest, ARunChangeIsAResetToTheBootVersion) {
  auto store = Mem("run-a");
  auto other = Mem("run-b");
  ASSERT_TRUE(other->AdvancePointer(std::nullopt, VersionRef{"run-b", 7}).ok());
  auto outcome = ClaimRun(*store, 0, nullptr);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->moved);
  EXPECT_EQ(outcome->previous, (VersionRef{"run-b", 7}));
  EXPECT_EQ(*store->ReadPointer(), A(0));
}

TEST(ClaimTest, AReusedRunIdAboveItsBootIsARewind) {
  auto store = Mem("run-a");
  ASSERT_TRUE(store->AdvancePointer(std::nullopt, A(3)).ok());
  auto outcome = ClaimRun(*store, 0, nullptr);
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(GetErrorKind(outcome.status()), ErrorKind::kPointerRewind);
  EXPECT_THAT(std::string(outcome.status().message()),
              HasSubstr("run run-a already published weight_v000003; a reused run id above its "
                        "boot (weight_v000000) is a rewind; use a new run id"));
  EXPECT_THAT(std::string(outcome.status().message()), HasSubstr("mem://"));
  EXPECT_EQ(*store->ReadPointer(), A(3));
}

TEST(ClaimTest, TheSameRunBelowItsBootAdvancesToIt) {
  auto store = Mem("run-a");
  ASSERT_TRUE(store->AdvancePointer(std::nullopt, A(2)).ok());
  auto outcome = ClaimRun(*store, 5, nullptr);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->moved);
  EXPECT_EQ(*store->ReadPointer(), A(5));
}

TEST(ClaimTest, AGarbagePointerIsNeverClaimedOver) {
  auto store = Mem("run-a");
  store->SetPointerTextForTesting("not a version");
  auto outcome = ClaimRun(*store, 0, nullptr);
  ASSERT_FALSE(outcome.ok());
  EXPECT_THAT(std::string(outcome.status().message()), HasSubstr("not a version"));
  EXPECT_FALSE(store->ReadPointer().ok());
}

TEST(ClaimTest, NegativeBootVersionAndMissingRunIdAreRefused) {
  auto store = Mem("run-a");
  EXPECT_TRUE(absl::IsInvalidArgument(ClaimRun(*store, -1, nullptr).status()));
  auto view = Mem("");
  EXPECT_TRUE(absl::IsInvalidArgument(ClaimRun(*view, 0, nullptr).status()));
  EXPECT_EQ(*store->ReadPointer(), std::nullopt);
}

TEST(ClaimTest, ConcurrentClaimsOfOneRunAllSucceedAndMoveOnce) {
  TempDir tmp;
  constexpr int kThreads = 8;
  std::atomic<int> ok{0};
  std::atomic<int> moved{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      auto store = FsStore::Open(tmp / "store", "run-a");
      if (!store.ok()) return;
      while (!go.load()) std::this_thread::yield();
      auto outcome = ClaimRun(**store, 0, nullptr);
      if (outcome.ok()) {
        ++ok;
        if (outcome->moved) ++moved;
      }
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads);
  EXPECT_EQ(moved.load(), 1);
}

}  // namespace
}  // namespace stitch
