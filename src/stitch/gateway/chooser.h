// The gateway's choice of replica, as pure logic: the replicas it knows
// (ReplicaEntry), the routing index built from them, and the chooser that
// picks one for a request. No I/O and no clock: the replica table
// (replica_table.h) keeps the entries current, the relay (relay.h) asks.
//
// A choice costs the same whatever the pool's size: ready replicas are
// indexed by applied version, and the index is rebuilt only when a
// replica's readiness, version or preference changes.
//
// Not thread-safe: the gateway's event loop owns all of it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stitch/api/replica_client.h"
#include "stitch/core/constraint.h"
#include "stitch/core/state.h"
#include "stitch/core/version.h"

namespace stitch {

// One replica as the gateway knows it: what its /server_info said, what
// the answers relayed from it taught, and what this gateway has
// outstanding on it.
struct ReplicaEntry {
  std::string url;
  ReplicaEndpoint endpoint;
  bool discovered = true;  // false once the pool dropped it
  bool reachable = false;
  ReplicaState state;
  int64_t in_flight = 0;  // requests outstanding from this gateway
  std::string last_error;
  bool probing = false;
  // When it last sent anything back (an answer, a response header, stream
  // bytes), or began a busy spell; and whether it stayed busy without doing
  // so for the stall timeout.
  std::chrono::steady_clock::time_point last_progress;
  bool stalled = false;

  bool routable() const { return discovered && reachable && state.ready; }
  // Held for evaluation (ReplicaState::held): routed exact pins at the held
  // version only.
  bool held() const { return state.held.has_value(); }
  // Whether new work may go to it while another replica would do: not
  // stalled, or stalled with nothing outstanding (one request at a time then
  // finds out whether it recovered).
  bool preferred() const { return !stalled || in_flight == 0; }
  std::optional<int64_t> version() const {
    if (!state.applied.has_value()) return std::nullopt;
    return state.applied->version;
  }
};

// Shared: a request in flight keeps its replica alive after the pool
// dropped it, and so do the session table and the routing index.
using ReplicaPtr = std::shared_ptr<ReplicaEntry>;
// The replicas of the pool, by URL.
using ReplicaMap = std::map<std::string, ReplicaPtr>;

// Some replicas: all of them, and by applied version.
class ReplicaIndex {
 public:
  void Clear();
  void Add(const ReplicaPtr& r);

  const std::vector<ReplicaPtr>& all() const { return all_; }
  const std::map<int64_t, std::vector<ReplicaPtr>>& by_version() const { return by_version_; }

 private:
  std::vector<ReplicaPtr> all_;
  std::map<int64_t, std::vector<ReplicaPtr>> by_version_;
};

// What requests may be routed to: the routable replicas, those of them
// preferred, and the oldest version applied across the pool.
class RoutingIndex {
 public:
  // Indexes `replicas` as they are now.
  void Rebuild(const ReplicaMap& replicas);

  // The routable replicas not held for evaluation: what requests go to.
  const ReplicaIndex& routable() const { return routable_; }
  // The routable replicas held for evaluation, by the version they hold.
  const ReplicaIndex& held() const { return held_; }
  // The preferred routable replicas; null when that is every one of them.
  const ReplicaIndex* preferred() const { return all_preferred_ ? nullptr : &preferred_; }
  // The newest version a routable replica has applied.
  std::optional<VersionRef> newest_routable() const;
  // The oldest version applied, when every replica of the pool has applied
  // one and all of one run; nullopt otherwise.
  const std::optional<VersionRef>& oldest_applied() const { return oldest_applied_; }
  // The newest store pointer a replica of the pool reported reading.
  std::optional<int64_t> newest_pointer() const { return newest_pointer_; }

  // The constraint to route `c` by: its max_staleness turned into the
  // min_version it implies with the pointer at newest_pointer() (a replica
  // judges by its own view, never newer than that, so it accepts what this
  // admits). A pool that reports no pointer routes by min and exact alone
  // and leaves staleness to the replicas.
  VersionConstraint RoutingConstraint(const VersionConstraint& c) const;

  // Whether no replica can serve `c` any more: an exact version below every
  // replica's applied version, all of one run. Versions only move forward
  // within a run, and a replica that joins or restarts catches up to the
  // pointer, which is past it too. A replica not probed yet (no applied
  // version) or a mix of runs (a run change under way) leaves it open.
  bool NeverServable(const VersionConstraint& c) const;

  // The routable replicas on a consistent-hash ring (kRingPoints points
  // each, by a hash of the URL), sorted by point: prefix-affine routing.
  static constexpr int kRingPoints = 64;
  const std::vector<std::pair<uint64_t, ReplicaPtr>>& ring() const { return ring_; }

 private:
  ReplicaIndex routable_;
  ReplicaIndex held_;
  ReplicaIndex preferred_;
  bool all_preferred_ = true;
  std::optional<VersionRef> oldest_applied_;
  std::optional<int64_t> newest_pointer_;
  std::vector<std::pair<uint64_t, ReplicaPtr>> ring_;
};

// The affinity key of a request: the version it will be served on and the
// first bytes of its prompt.
uint64_t AffinityKey(std::optional<int64_t> version, std::string_view prompt_prefix);

// Prefix-affine routing of one request.
struct Affinity {
  uint64_t key = 0;
  // Bounded load: no replica is given a request that would put its
  // outstanding count above load_factor × the mean over the routable
  // replicas (rounded up, this request counted). >= 1.
  double load_factor = 1.25;
};

class Chooser {
 public:
  explicit Chooser(uint32_t seed) : rng_(seed) {}

  // The replica for a request with constraint `c`, or null when none
  // satisfies it. An exact pin goes first to a replica held for evaluation
  // at that version (the less loaded of two, as below); held replicas take
  // nothing else. Then (or when all that satisfy it are in `tried`, which holds its replicas
  // alive so that one dropped from the pool during a retry cannot lend its
  // address to a new one): the session's `home` (may be null) while it is
  // routable, preferred and satisfies `c`; else a choice among the
  // preferred replicas; else among all routable ones (a stalled replica
  // still serves what no other one can). A choice is the less loaded of two
  // distinct random replicas that satisfy `c` (fewest requests outstanding
  // from this gateway), or of all of them when both picks were tried.
  // Cost: O(distinct versions), not O(replicas).
  //
  // With `affinity`, after the session's home and before the two choices:
  // the replica the key lands on by consistent hashing with bounded load
  // (walking the ring from the key, the first routable, preferred replica
  // not in `tried` whose load stays within the bound), when it satisfies
  // `c`; otherwise the two choices as above. Requests sharing a prompt
  // prefix and a version so meet the prefix cache of one replica while it
  // is not overloaded. The bound costs O(replicas) per choice.
  ReplicaPtr Choose(const RoutingIndex& index, const VersionConstraint& c, const ReplicaPtr& home,
                    std::span<const ReplicaPtr> tried,
                    const std::optional<Affinity>& affinity = std::nullopt);

  // The replica `affinity` lands on, whatever the constraint; null when
  // none is within the load bound (never while some routable, preferred,
  // untried replica is: the mean is below the bound).
  static ReplicaPtr AffineReplica(const RoutingIndex& index, const Affinity& affinity,
                                  std::span<const ReplicaPtr> tried);

 private:
  ReplicaPtr ChooseFrom(const ReplicaIndex& index, const VersionConstraint& c,
                        std::span<const ReplicaPtr> tried);

  std::minstd_rand rng_;
};

}  // namespace stitch
