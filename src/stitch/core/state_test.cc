#include "stitch/core/state.h"

#include <gtest/gtest.h>

#include <boost/json/parse.hpp>

#include "stitch/core/json.h"

namespace stitch {
namespace {

TEST(ReplicaState, JsonRoundTrip) {
  ReplicaState s;
  s.ready = true;
  s.applied = VersionRef{"run-a", 7};
  s.sync_state = SyncState::kStaging;
  s.reason = "staging v8";
  s.run_id = "run-a";
  s.commit_mode = CommitMode::kQuiesce;
  s.active_requests = 3;
  s.update_destination_ready = true;
  s.metrics["stage_s"] = 0.25;
  auto back = ReplicaState::FromJson(s.ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->ready);
  EXPECT_EQ(back->applied, s.applied);
  EXPECT_EQ(back->sync_state, SyncState::kStaging);
  EXPECT_EQ(back->reason, "staging v8");
  EXPECT_EQ(back->commit_mode, CommitMode::kQuiesce);
  EXPECT_EQ(back->active_requests, 3);
  EXPECT_TRUE(back->update_destination_ready);
  EXPECT_DOUBLE_EQ(back->metrics.at("stage_s"), 0.25);
}

TEST(ReplicaState, JsonFieldsFollowTheContract) {
  ReplicaState s;
  auto v = boost::json::parse(s.ToJson());
  const auto& o = v.as_object();
  for (const char* key :
       {"ready", "applied", "sync_state", "reason", "run_id", "commit_mode", "active_requests",
        "update_destination_ready", "update_destination_error", "terminal_error", "metrics"}) {
    EXPECT_TRUE(o.contains(key)) << key;
  }
  EXPECT_TRUE(o.at("applied").is_null());
  EXPECT_EQ(o.at("sync_state").as_string(), "IDLE");
  EXPECT_EQ(o.at("commit_mode").as_string(), "in_place");
}

TEST(ReplicaState, BadJsonIsRejectedWithTheField) {
  auto s = ReplicaState::FromJson(R"({"ready": "yes"})");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("ready"), std::string::npos);
  s = ReplicaState::FromJson(R"({"applied": "garbage"})");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("applied"), std::string::npos);
  s = ReplicaState::FromJson(R"({"sync_state": "NAPPING"})");
  ASSERT_FALSE(s.ok());
  s = ReplicaState::FromJson("not json");
  ASSERT_FALSE(s.ok());
}

TEST(SyncState, NamesRoundTrip) {
  for (SyncState st : {SyncState::kIdle, SyncState::kFetching, SyncState::kStaging,
                       SyncState::kCommitting, SyncState::kError}) {
    auto back = ParseSyncState(SyncStateName(st));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, st);
  }
}

TEST(PoolState, CountsReadyReachableReplicas) {
  PoolState p;
  ReplicaStatus a;
  a.url = "http://a";
  a.reachable = true;
  a.state.ready = true;
  ReplicaStatus b = a;
  b.url = "http://b";
  b.reachable = false;
  ReplicaStatus c = a;
  c.url = "http://c";
  c.state.ready = false;
  p.replicas = {a, b, c};
  EXPECT_EQ(p.ready_count(), 1);
  auto v = boost::json::parse(p.ToJson());
  EXPECT_EQ(v.at("ready").as_int64(), 1);
  EXPECT_EQ(v.at("replicas").as_array().size(), 3u);
  EXPECT_EQ(v.at("replicas").as_array()[0].at("url").as_string(), "http://a");
}

}  // namespace
}  // namespace stitch
