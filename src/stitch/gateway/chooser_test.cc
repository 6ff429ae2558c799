// The chooser and the routing index on their own: no sockets, no clock.
#include "stitch/gateway/chooser.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace stitch {
namespace {

class ChooserTest : public ::testing::Test {
 protected:
  // A routable replica at `version` of run "r".
  ReplicaPtr Add(const std::string& name, int64_t version, int64_t in_flight = 0) {
    auto r = std::make_shared<ReplicaEntry>();
    r->url = "http://" + name;
    r->reachable = true;
    r->state.ready = true;
    r->state.applied = VersionRef{"r", version};
    r->in_flight = in_flight;
    replicas_[r->url] = r;
    return r;
  }
  const RoutingIndex& Index() {
    index_.Rebuild(replicas_);
    return index_;
  }
  ReplicaPtr Choose(const VersionConstraint& c, const ReplicaPtr& home = nullptr,
                    const std::vector<ReplicaPtr>& tried = {},
                    const std::optional<Affinity>& affinity = std::nullopt) {
    return chooser_.Choose(Index(), c, home, tried, affinity);
  }
  // The replicas `c` lands on over many choices.
  std::set<std::string> Spread(const VersionConstraint& c) {
    std::set<std::string> seen;
    for (int i = 0; i < 200; ++i) {
      if (ReplicaPtr r = Choose(c); r != nullptr) seen.insert(r->url);
    }
    return seen;
  }

  ReplicaMap replicas_;
  RoutingIndex index_;
  Chooser chooser_{42};
};

TEST_F(ChooserTest, ConstraintsLandOnlyOnSatisfyingReplicas) {
  Add("v1", 1);
  Add("v2", 2);
  Add("v3", 3);
  EXPECT_EQ(Spread(VersionConstraint::Exact(2)), std::set<std::string>{"http://v2"});
  EXPECT_EQ(Spread(VersionConstraint::AtLeast(2)),
            (std::set<std::string>{"http://v2", "http://v3"}));
  EXPECT_EQ(Spread(VersionConstraint{}).size(), 3u);
  EXPECT_EQ(Choose(VersionConstraint::Exact(4)), nullptr);
  EXPECT_EQ(Choose(VersionConstraint::AtLeast(4)), nullptr);
}

// A replica held for evaluation takes the exact pins at its version, first,
// and nothing else; a session homed on it does not keep it.
TEST_F(ChooserTest, AHeldReplicaTakesExactPinsAtItsVersionOnly) {
  Add("a", 5);
  Add("b", 5);
  ReplicaPtr held = Add("h", 3);
  held->state.held = ReplicaState::Held{VersionRef{"r", 3}, "eval"};
  Add("old", 3);
  EXPECT_EQ(Spread(VersionConstraint::Exact(3)), std::set<std::string>{"http://h"});
  EXPECT_EQ(Spread(VersionConstraint{}),
            (std::set<std::string>{"http://a", "http://b", "http://old"}));
  EXPECT_EQ(Spread(VersionConstraint::AtLeast(2)),
            (std::set<std::string>{"http://a", "http://b", "http://old"}));
  EXPECT_NE(Choose(VersionConstraint{}, held), held);
  // Tried already, the exact pin goes to an unheld replica at the version.
  EXPECT_EQ(Choose(VersionConstraint::Exact(3), nullptr, {held})->url, "http://old");
  // The held replica is not counted among those for general traffic.
  EXPECT_EQ(Index().routable().all().size(), 3u);
  EXPECT_EQ(Index().held().all().size(), 1u);
}

TEST_F(ChooserTest, MaxStalenessRoutesByTheNewestPointerThePoolRead) {
  Add("v1", 1);
  Add("v2", 2)->state.pointer = VersionRef{"r1", 3};
  Add("v3", 3)->state.pointer = VersionRef{"r1", 2};  // a replica that read the pointer earlier
  const VersionConstraint fresh = VersionConstraint::Fresh(1);
  EXPECT_EQ(Index().newest_pointer(), 3);
  EXPECT_EQ(Index().RoutingConstraint(fresh), VersionConstraint::AtLeast(2));
  EXPECT_EQ(Spread(Index().RoutingConstraint(fresh)),
            (std::set<std::string>{"http://v2", "http://v3"}));
  VersionConstraint both = VersionConstraint::AtLeast(3);
  both.max_staleness = 2;
  EXPECT_EQ(Index().RoutingConstraint(both), VersionConstraint::AtLeast(3));
  // A pool that reports no pointer leaves staleness to the replicas.
  replicas_.clear();
  Add("v1", 1);
  EXPECT_EQ(Index().RoutingConstraint(fresh), VersionConstraint{});
}

TEST_F(ChooserTest, ASharedPrefixAndVersionLandOnOneReplica) {
  for (int i = 0; i < 8; ++i) Add(absl::StrCat("r", i), 1);
  const Affinity group{AffinityKey(1, "the same long prompt"), 1.25};
  const ReplicaPtr first = Choose(VersionConstraint{}, nullptr, {}, group);
  ASSERT_NE(first, nullptr);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(Choose(VersionConstraint{}, nullptr, {}, group), first);
  // Another version of the same prompt is another cache entry: its own key.
  EXPECT_NE(AffinityKey(2, "the same long prompt"), group.key);
  // Different prompts spread over the pool.
  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) {
    const Affinity other{AffinityKey(1, absl::StrCat("prompt ", i)), 1.25};
    seen.insert(Choose(VersionConstraint{}, nullptr, {}, other)->url);
  }
  EXPECT_EQ(seen.size(), 8u);
}

TEST_F(ChooserTest, AffinityNeverLoadsAReplicaAboveTheBound) {
  for (int i = 0; i < 4; ++i) Add(absl::StrCat("r", i), 1);
  const Affinity group{AffinityKey(1, "one hot prompt"), 1.5};
  // Every request of one hot group, none finishing: the affine replica
  // takes them until the bound, then the ring's next ones do.
  for (int n = 1; n <= 40; ++n) {
    ReplicaPtr r = Choose(VersionConstraint{}, nullptr, {}, group);
    ASSERT_NE(r, nullptr);
    ++r->in_flight;
    int64_t max = 0;
    for (const auto& [url, each] : replicas_) max = std::max(max, each->in_flight);
    const double mean = static_cast<double>(n) / 4;
    EXPECT_LE(max, static_cast<int64_t>(std::ceil(1.5 * mean))) << "after " << n;
  }
}

TEST_F(ChooserTest, AnAffineReplicaThatCannotServeTheConstraintFallsBackToTwoChoices) {
  ReplicaPtr old = Add("old", 1);
  Add("new-a", 2);
  Add("new-b", 2);
  // A key whose affine replica is the old one.
  std::optional<Affinity> onto_old;
  for (int i = 0; i < 1000 && !onto_old; ++i) {
    const Affinity a{AffinityKey(2, absl::StrCat("p", i)), 1.25};
    if (Chooser::AffineReplica(Index(), a, {}) == old) onto_old = a;
  }
  ASSERT_TRUE(onto_old.has_value());
  EXPECT_EQ(Choose(VersionConstraint{}, nullptr, {}, onto_old), old);
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    ReplicaPtr r = Choose(VersionConstraint::AtLeast(2), nullptr, {}, onto_old);
    ASSERT_NE(r, nullptr);
    seen.insert(r->url);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"http://new-a", "http://new-b"}));
}

TEST_F(ChooserTest, AddingAReplicaMovesOnlyItsShareOfKeys) {
  for (int i = 0; i < 10; ++i) Add(absl::StrCat("r", i), 1);
  std::vector<std::string> before;
  for (int i = 0; i < 1000; ++i) {
    const Affinity a{AffinityKey(1, absl::StrCat("k", i)), 100};
    before.push_back(Chooser::AffineReplica(Index(), a, {})->url);
  }
  Add("r10", 1);
  int moved = 0;
  for (int i = 0; i < 1000; ++i) {
    const Affinity a{AffinityKey(1, absl::StrCat("k", i)), 100};
    const std::string now = Chooser::AffineReplica(Index(), a, {})->url;
    if (now != before[static_cast<size_t>(i)]) {
      ++moved;
      EXPECT_EQ(now, "http://r10") << "a key moved between old replicas";
    }
  }
  // About 1/11 of the keys; far from a reshuffle.
  EXPECT_GT(moved, 30);
  EXPECT_LT(moved, 200);
}

TEST_F(ChooserTest, OnlyRoutableReplicasAreChosen) {
  Add("ready", 1);
  Add("not-ready", 1)->state.ready = false;
  Add("unreachable", 1)->reachable = false;
  Add("dropped", 1)->discovered = false;
  EXPECT_EQ(Spread(VersionConstraint{}), std::set<std::string>{"http://ready"});
}

// With two qualifying replicas the two random picks are both of them, so
// the less loaded one always wins.
TEST_F(ChooserTest, TheTwoChoicesAreTwoDistinctReplicas) {
  Add("busy", 1, /*in_flight=*/7);
  Add("idle", 1);
  EXPECT_EQ(Spread(VersionConstraint{}), std::set<std::string>{"http://idle"});
}

TEST_F(ChooserTest, ASessionStaysHomeWhileItQualifies) {
  ReplicaPtr home = Add("home", 2, /*in_flight=*/9);
  Add("other", 2);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Choose(VersionConstraint{}, home), home);
  EXPECT_NE(Choose(VersionConstraint::Exact(3), home), home) << "it does not satisfy";
  Add("v3", 3);
  EXPECT_EQ(Choose(VersionConstraint::Exact(3), home)->url, "http://v3");
  EXPECT_NE(Choose(VersionConstraint{}, home, {home}), home) << "tried already";
  home->state.ready = false;
  EXPECT_NE(Choose(VersionConstraint{}, home), home) << "out of rotation";
}

TEST_F(ChooserTest, TriedReplicasAreNeverChosenAgain) {
  ReplicaPtr a = Add("a", 1);
  ReplicaPtr b = Add("b", 1);
  ReplicaPtr c = Add("c", 1);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(Choose(VersionConstraint{}, nullptr, {a, b}), c);
  EXPECT_EQ(Choose(VersionConstraint{}, nullptr, {a, b, c}), nullptr);
}

// A stalled replica with requests outstanding serves only what no other
// replica can; with nothing outstanding it takes its turn again.
TEST_F(ChooserTest, AStalledReplicaServesOnlyWhatNoOtherCan) {
  ReplicaPtr stalled = Add("stalled", 2, /*in_flight=*/1);
  stalled->stalled = true;
  ReplicaPtr fresh = Add("fresh", 1, /*in_flight=*/50);
  EXPECT_EQ(Spread(VersionConstraint{}), std::set<std::string>{"http://fresh"});
  EXPECT_EQ(Choose(VersionConstraint{}, stalled), fresh) << "even for its own session";
  EXPECT_EQ(Choose(VersionConstraint::Exact(2)), stalled) << "no other replica serves v2";
  stalled->in_flight = 0;
  fresh->in_flight = 0;
  EXPECT_EQ(Spread(VersionConstraint{}).size(), 2u);
}

TEST_F(ChooserTest, AnExactVersionThePoolPassedCanNeverBeServed) {
  Add("a", 3);
  Add("b", 4)->state.ready = false;  // not routable, but it has applied v4
  EXPECT_TRUE(Index().NeverServable(VersionConstraint::Exact(2)));
  EXPECT_FALSE(Index().NeverServable(VersionConstraint::Exact(3)));
  EXPECT_FALSE(Index().NeverServable(VersionConstraint::AtLeast(1)));
  EXPECT_EQ(Index().oldest_applied(), (VersionRef{"r", 3}));
  EXPECT_EQ(Index().newest_routable(), (VersionRef{"r", 3}));

  Add("other-run", 9)->state.applied = VersionRef{"r2", 9};
  EXPECT_FALSE(Index().NeverServable(VersionConstraint::Exact(2))) << "a run change under way";
  replicas_.erase("http://other-run");
  Add("unprobed", 0)->state.applied.reset();
  EXPECT_FALSE(Index().NeverServable(VersionConstraint::Exact(2))) << "one never probed";
}

}  // namespace
}  // namespace stitch
