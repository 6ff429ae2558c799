#include "stitch/api/server_info.h"

#include <gtest/gtest.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

namespace stitch {
namespace {

TEST(ServerInfoTest, JsonRoundTrip) {
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
  s.pointer = VersionRef{"run-a", 9};
  s.held = ReplicaState::Held{VersionRef{"run-a", 7}, "eval-1"};
  auto back = ParseServerInfo(ServerInfoJson(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->ready);
  EXPECT_EQ(back->applied, s.applied);
  EXPECT_EQ(back->sync_state, SyncState::kStaging);
  EXPECT_EQ(back->reason, "staging v8");
  EXPECT_EQ(back->commit_mode, CommitMode::kQuiesce);
  EXPECT_EQ(back->active_requests, 3);
  EXPECT_TRUE(back->update_destination_ready);
  EXPECT_DOUBLE_EQ(back->metrics.at("stage_s"), 0.25);
  EXPECT_EQ(back->pointer, s.pointer);
  EXPECT_EQ(back->held, s.held);
  // Not held: null, read back as nothing.
  s.held.reset();
  EXPECT_NE(ServerInfoJson(s).find(R"("held":null)"), std::string::npos) << ServerInfoJson(s);
  EXPECT_FALSE(ParseServerInfo(ServerInfoJson(s))->held.has_value());
  // A malformed hold is refused, naming the field.
  auto bad = ParseServerInfo(R"({"ready":true,"held":{"version":7}})");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("server_info.held"), std::string::npos) << bad.status();
}

TEST(ServerInfoTest, JsonFieldsFollowTheContract) {
  ReplicaState s;
  auto v = boost::json::parse(ServerInfoJson(s));
  const auto& o = v.as_object();
  for (const char* key : {"ready", "applied", "sync_state", "reason", "run_id", "commit_mode",
                          "active_requests", "update_destination_ready", "update_destination_error",
                          "terminal_error", "metrics", "pointer"}) {
    EXPECT_TRUE(o.contains(key)) << key;
  }
  EXPECT_TRUE(o.at("applied").is_null());
  EXPECT_TRUE(o.at("pointer").is_null());
  EXPECT_EQ(o.at("sync_state").as_string(), "IDLE");
  EXPECT_EQ(o.at("commit_mode").as_string(), "in_place");
}

// The original Python Stitch answers null, not "", when there is nothing to
// explain; clients written for it test `is None`.
TEST(ServerInfoTest, EmptyExplanationsAreNullNotEmptyStrings) {
  ReplicaState s;
  s.ready = true;
  auto v = boost::json::parse(ServerInfoJson(s));
  const auto& o = v.as_object();
  for (const char* key :
       {"reason", "terminal_error", "update_destination_error", "sync_error", "pointer_notice"}) {
    ASSERT_TRUE(o.contains(key)) << key;
    EXPECT_TRUE(o.at(key).is_null()) << key << ": " << boost::json::serialize(o.at(key));
  }
  s.reason = "catching up";
  s.terminal_error = "gone";
  s.update_destination_error = "broken";
  s.sync_error = "cannot stage";
  s.pointer_notice = "moved back";
  auto w = boost::json::parse(ServerInfoJson(s));
  EXPECT_EQ(w.at("pointer_notice").as_string(), "moved back");
  auto read = ParseServerInfo(ServerInfoJson(s));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->pointer_notice, "moved back");
  EXPECT_EQ(w.at("reason").as_string(), "catching up");
  EXPECT_EQ(w.at("terminal_error").as_string(), "gone");
  EXPECT_EQ(w.at("update_destination_error").as_string(), "broken");
  EXPECT_EQ(w.at("sync_error").as_string(), "cannot stage");
}

// Readers take both forms: null (this sidecar, the original) and "" (earlier
// versions of this sidecar).
TEST(ServerInfoTest, NullAndEmptyExplanationsReadTheSame) {
  for (const char* body :
       {R"({"ready": true, "reason": null, "terminal_error": null, "sync_error": null,
            "update_destination_error": null})",
        R"({"ready": true, "reason": "", "terminal_error": "", "sync_error": "",
            "update_destination_error": ""})"}) {
    auto s = ParseServerInfo(body);
    ASSERT_TRUE(s.ok()) << body << ": " << s.status();
    EXPECT_EQ(s->reason, "");
    EXPECT_EQ(s->terminal_error, "");
    EXPECT_EQ(s->sync_error, "");
    EXPECT_EQ(s->update_destination_error, "");
  }
  PoolState one;
  one.replicas.emplace_back();
  auto pool = ParseReplicas(ReplicasJson(one));
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_EQ(pool->replicas.size(), 1u);
  EXPECT_EQ(pool->replicas[0].state.terminal_error, "");
}

TEST(ServerInfoTest, BadJsonIsRejectedWithTheField) {
  auto s = ParseServerInfo(R"({"ready": "yes"})");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("ready"), std::string::npos);
  s = ParseServerInfo(R"({"applied": "garbage"})");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("applied"), std::string::npos);
  s = ParseServerInfo(R"({"sync_state": "NAPPING"})");
  ASSERT_FALSE(s.ok());
  s = ParseServerInfo("not json");
  ASSERT_FALSE(s.ok());
}

PoolState ThreeReplicas() {
  PoolState p;
  ReplicaStatus a;
  a.url = "http://a";
  a.reachable = true;
  a.state.ready = true;
  a.state.applied = VersionRef{"r", 4};
  a.in_flight = 2;
  ReplicaStatus b = a;
  b.url = "http://b";
  b.reachable = false;
  b.last_error = "connection refused";
  ReplicaStatus c = a;
  c.url = "http://c";
  c.state.ready = false;
  c.stalled = true;
  p.replicas = {a, b, c};
  return p;
}

TEST(ReplicasTest, CountsReadyReachableReplicas) {
  PoolState p = ThreeReplicas();
  EXPECT_EQ(p.ready_count(), 1);
  auto v = boost::json::parse(ReplicasJson(p));
  EXPECT_EQ(v.at("ready").as_int64(), 1);
  EXPECT_EQ(v.at("replicas").as_array().size(), 3u);
  EXPECT_EQ(v.at("replicas").as_array()[0].at("url").as_string(), "http://a");
  EXPECT_FALSE(v.as_object().contains("pointer"));
  auto with_pointer = boost::json::parse(ReplicasJson(p, "r/weight_v000004"));
  EXPECT_EQ(with_pointer.at("pointer").as_string(), "r/weight_v000004");
}

TEST(ReplicasTest, WhatAGatewayKnowsIsReadBack) {
  const PoolState p = ThreeReplicas();
  auto back = ParseReplicas(ReplicasJson(p));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->replicas.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const ReplicaStatus& want = p.replicas[i];
    const ReplicaStatus& got = back->replicas[i];
    EXPECT_EQ(got.url, want.url);
    EXPECT_EQ(got.reachable, want.reachable);
    EXPECT_EQ(got.state.ready, want.state.ready);
    EXPECT_EQ(got.state.applied, want.state.applied);
    EXPECT_EQ(got.in_flight, want.in_flight);
    EXPECT_EQ(got.stalled, want.stalled);
    EXPECT_EQ(got.last_error, want.last_error);
  }
  EXPECT_FALSE(ParseReplicas(R"({"ready": 0})").ok());
  EXPECT_FALSE(ParseReplicas("not json").ok());
  auto lenient = ParseReplicas(R"({"replicas": [1, {"url": "http://x", "ready": "no"}]})");
  ASSERT_TRUE(lenient.ok());
  ASSERT_EQ(lenient->replicas.size(), 1u);
  EXPECT_EQ(lenient->replicas[0].url, "http://x");
}

}  // namespace
}  // namespace stitch
