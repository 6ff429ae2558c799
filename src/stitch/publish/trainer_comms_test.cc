#include "stitch/publish/trainer_comms.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/str_cat.h"

namespace stitch {
namespace {

TEST(TrainerCommsTest, SingleProcessGathersItsOwnValue) {
  SingleProcessComms comms;
  EXPECT_EQ(comms.rank(), 0);
  EXPECT_EQ(comms.world_size(), 1);
  EXPECT_TRUE(comms.IsHostLeader());
  auto values = comms.AllGather("x");
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(*values, std::vector<std::string>{"x"});
}

TEST(TrainerCommsTest, ThreadGroupGathersInRankOrderRoundAfterRound) {
  constexpr int kWorld = 4;
  ThreadCommsGroup group(kWorld, 2);
  EXPECT_TRUE(group.comms(0).IsHostLeader());
  EXPECT_FALSE(group.comms(1).IsHostLeader());
  EXPECT_TRUE(group.comms(2).IsHostLeader());
  std::vector<std::vector<std::vector<std::string>>> seen(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      for (int round = 0; round < 50; ++round) {
        auto values = group.comms(r).AllGather(absl::StrCat(round, ":", r));
        ASSERT_TRUE(values.ok()) << values.status().message();
        seen[r].push_back(*values);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(seen[r].size(), 50u);
    for (int round = 0; round < 50; ++round) {
      std::vector<std::string> want;
      for (int q = 0; q < kWorld; ++q) want.push_back(absl::StrCat(round, ":", q));
      EXPECT_EQ(seen[r][round], want);
    }
  }
}

TEST(TrainerCommsTest, AMissingRankTimesOutAndBreaksTheGroup) {
  ThreadCommsGroup group(2, 1, absl::Milliseconds(50));
  auto alone = group.comms(0).AllGather("x");
  EXPECT_TRUE(absl::IsDeadlineExceeded(alone.status())) << alone.status().message();
  auto late = group.comms(1).AllGather("y");
  EXPECT_TRUE(absl::IsUnavailable(late.status())) << late.status().message();
}

}  // namespace
}  // namespace stitch
