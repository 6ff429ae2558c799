// The dashboard's history on a manual clock: transitions, the pointer and
// publish-to-fleet times, per-second counters and their bounds.
#include "stitch/gateway/fleet_history.h"

#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "stitch/net/event_loop.h"

namespace stitch {
namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

class FleetHistoryTest : public ::testing::Test {
 protected:
  ReplicaPtr Add(const std::string& url, int64_t version) {
    auto r = std::make_shared<ReplicaEntry>();
    r->url = url;
    r->reachable = true;
    r->state.ready = true;
    r->state.applied = VersionRef{"r1", version};
    replicas_[url] = r;
    return r;
  }
  static void SetPointer(ReplicaEntry& r, int64_t version) {
    r.state.pointer = VersionRef{"r1", version};
  }
  json::object State() { return json::parse(history_.Json(replicas_)).as_object(); }
  json::array EventsOf(const std::string& url) {
    const json::object state = State();
    for (const json::value& r : state.at("replicas").as_array()) {
      if (r.at("url").as_string() == url) return r.at("events").as_array();
    }
    return {};
  }

  EventLoop loop_;
  ManualClock clock_{loop_.executor()};
  FleetHistory history_{clock_, FleetHistoryOptions{.window = std::chrono::seconds(60),
                                                    .events_per_replica = 4,
                                                    .fleet_events = 6,
                                                    .rollouts = 4}};
  ReplicaMap replicas_;
};

TEST_F(FleetHistoryTest, RecordsAJoinThenOnlyChangesOfStateVersionOrMessage) {
  ReplicaPtr a = Add("http://a", 1);
  history_.Observe(*a);
  history_.Observe(*a);  // nothing changed: no event
  a->state.sync_state = SyncState::kStaging;
  clock_.Advance(1s);
  history_.Observe(*a);
  a->reachable = false;
  a->last_error = "connection refused";
  clock_.Advance(1s);
  history_.Observe(*a);
  const json::array events = EventsOf("http://a");
  ASSERT_EQ(events.size(), 4u) << json::serialize(events);
  EXPECT_EQ(events[0].at(1).as_string(), "joined");
  EXPECT_EQ(events[1].at(1).as_string(), "serving");
  EXPECT_EQ(events[2].at(1).as_string(), "staging");
  EXPECT_EQ(events[3].at(1).as_string(), "unreachable");
  EXPECT_EQ(events[3].at(3).as_string(), "connection refused");
  const json::object state = State();
  const json::object& lane = state.at("replicas").as_array().at(0).as_object();
  EXPECT_EQ(lane.at("last_error").as_string(), "connection refused");
  EXPECT_DOUBLE_EQ(lane.at("last_stage").as_double(), 1.0);
}

// What a replica says its store's pointer did (moved back, changed run)
// reaches the dashboard's table with the replica.
TEST_F(FleetHistoryTest, AReplicasPointerNoticeIsShownWithIt) {
  ReplicaPtr a = Add("http://a", 3);
  history_.Observe(*a);
  EXPECT_EQ(State().at("replicas").as_array().at(0).at("pointer_notice").as_string(), "");
  a->state.pointer_notice = "the store's pointer moved back to r1/weight_v000001";
  history_.Observe(*a);
  EXPECT_EQ(State().at("replicas").as_array().at(0).at("pointer_notice").as_string(),
            "the store's pointer moved back to r1/weight_v000001");
}

TEST_F(FleetHistoryTest, EachLaneAndTheFleetEventListAreBounded) {
  ReplicaPtr a = Add("http://a", 1);
  for (int v = 1; v <= 20; ++v) {
    a->state.applied = VersionRef{"r1", v};
    history_.Observe(*a);
  }
  EXPECT_EQ(EventsOf("http://a").size(), 4u);
  EXPECT_EQ(State().at("events").as_array().size(), 6u);
  EXPECT_EQ(EventsOf("http://a").back().at(2).as_int64(), 20);
}

TEST_F(FleetHistoryTest, PublishToFleetRunsFromTheFirstReportUntilEveryReachableReplicaApplied) {
  ReplicaPtr a = Add("http://a", 1);
  ReplicaPtr b = Add("http://b", 1);
  ReplicaPtr c = Add("http://c", 1);
  history_.Observe(*a);
  history_.Observe(*b);
  history_.Observe(*c);
  SetPointer(*a, 2);
  history_.Observe(*a);
  EXPECT_EQ(history_.pointer(), 2);
  clock_.Advance(2s);
  a->state.applied = VersionRef{"r1", 2};
  history_.Observe(*a);
  c->reachable = false;  // an unreachable replica does not hold the rollout back
  history_.Observe(*c);
  clock_.Advance(1s);
  EXPECT_TRUE(State().at("rollouts").as_array().at(0).at(2).is_null());
  b->state.applied = VersionRef{"r1", 2};
  history_.Observe(*b);
  const json::array rollout = State().at("rollouts").as_array().at(0).as_array();
  EXPECT_EQ(rollout.at(0).as_int64(), 2);
  EXPECT_DOUBLE_EQ(rollout.at(2).as_double(), 3.0);
}

// One bad pointer (fixed in the store since) must not leave the fleet
// "behind" for ever: the pointer is what the replicas last read.
TEST_F(FleetHistoryTest, APointerThatComesDownInTheStoreComesDownOnTheDashboard) {
  ReplicaPtr a = Add("http://a", 5);
  ReplicaPtr b = Add("http://b", 5);
  SetPointer(*a, 5);
  SetPointer(*b, 5);
  history_.Observe(*a);
  history_.Observe(*b);
  SetPointer(*a, 999999999999);
  history_.Observe(*a);
  EXPECT_EQ(history_.pointer(), 999999999999);
  SetPointer(*a, 5);
  history_.Observe(*a);
  EXPECT_EQ(history_.pointer(), 5);
  history_.Sample(replicas_);
  const json::object state = State();
  EXPECT_EQ(state.at("pointer").as_int64(), 5);
  for (const json::value& r : state.at("rollouts").as_array()) {
    EXPECT_LE(r.at(0).as_int64(), 5) << json::serialize(r);
  }
  history_.Served(5);
  EXPECT_EQ(State().at("seconds").as_array().back().at("staleness").as_array()[0].as_int64(), 1);
}

TEST_F(FleetHistoryTest, StalenessIsThePointerMinusTheServedVersionPerSecond) {
  ReplicaPtr a = Add("http://a", 5);
  SetPointer(*a, 5);
  history_.Observe(*a);
  history_.Served(5);
  history_.Served(3);
  history_.Served(std::nullopt);
  history_.Conflict();
  history_.Retried();
  clock_.Advance(1s);
  history_.Unavailable();
  const json::array seconds = State().at("seconds").as_array();
  ASSERT_EQ(seconds.size(), 2u);
  const json::object& first = seconds[0].as_object();
  EXPECT_EQ(first.at("served").at("5").as_int64(), 1);
  EXPECT_EQ(first.at("served").at("3").as_int64(), 1);
  EXPECT_EQ(first.at("served").at("?").as_int64(), 1);
  const json::array& staleness = first.at("staleness").as_array();
  EXPECT_EQ(staleness[0].as_int64(), 1);  // v5 at pointer v5
  EXPECT_EQ(staleness[2].as_int64(), 1);  // v3: two behind
  EXPECT_EQ(staleness[6].as_int64(), 1);  // unknown
  EXPECT_EQ(first.at("conflicts").as_int64(), 1);
  EXPECT_EQ(first.at("retries").as_int64(), 1);
  EXPECT_EQ(seconds[1].at("unavailable").as_int64(), 1);
}

TEST_F(FleetHistoryTest, CountersOlderThanTheWindowAreForgotten) {
  history_.Served(1);
  clock_.Advance(61s);
  history_.Served(1);
  const json::array seconds = State().at("seconds").as_array();
  ASSERT_EQ(seconds.size(), 1u);
  EXPECT_EQ(seconds[0].at("t").as_int64(), 61);
}

// What one dashboard poll costs does not grow with uptime: 256 replicas
// that each changed version every second for longer than the window still
// make a bounded state.
TEST(FleetHistoryBounds, AFleetOf256ThatChangedForLongStaysSmall) {
  EventLoop loop;
  ManualClock clock(loop.executor());
  FleetHistory history(clock);  // the gateway's defaults
  ReplicaMap replicas;
  for (int i = 0; i < 256; ++i) {
    auto r = std::make_shared<ReplicaEntry>();
    r->url = "http://10.0.0." + std::to_string(i) + ":30000";
    r->reachable = true;
    r->state.ready = true;
    replicas[r->url] = r;
  }
  for (int64_t v = 1; v <= 400; ++v) {  // past the 300 s window
    clock.Advance(1s);
    for (auto& [url, r] : replicas) {
      r->state.applied = VersionRef{"r1", v};
      r->state.pointer = VersionRef{"r1", v};
      history.Observe(*r);
      history.Served(v);
    }
    history.Sample(replicas);
  }
  const std::string state = history.Json(replicas);
  EXPECT_LT(state.size(), size_t{600} << 10) << state.size() << " bytes";
  const json::object doc = json::parse(state).as_object();
  EXPECT_EQ(doc.at("replicas").as_array().size(), 256u);
  EXPECT_EQ(doc.at("replicas").as_array().at(0).at("events").as_array().size(), 16u);
  EXPECT_LE(doc.at("seconds").as_array().size(), 300u);
  EXPECT_LE(doc.at("samples").as_array().size(), 301u);
}

TEST_F(FleetHistoryTest, AReplicaThePoolDroppedIsGone) {
  ReplicaPtr a = Add("http://a", 1);
  history_.Observe(*a);
  history_.Gone("http://a");
  history_.Gone("http://a");
  const json::array events = EventsOf("http://a");
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events.back().at(1).as_string(), "gone");
}

}  // namespace
}  // namespace stitch
