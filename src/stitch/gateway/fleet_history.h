// What the gateway's dashboard (/ui) shows: a bounded history of the fleet
// as this gateway saw it.
//   - each replica's state over time: a lane of transitions (joined,
//     serving, staging, committing, paused, stalled, error with its message,
//     unreachable, gone), each with the version it served then; the last
//     `events_per_replica` per replica and the last `fleet_events` of the
//     whole fleet are kept;
//   - the store's pointer (the newest that the replicas last read, from
//     /server_info) and, for each version it moved to, the time from the
//     first report of it until every reachable replica applied it;
//   - per second of the last `window`: answers served by version, their
//     staleness (pointer minus served version), 409s, 503s and retries;
//   - one fleet sample per poll (pointer, oldest and newest applied, how
//     many serve the pointer, how many are ready), so a fleet of hundreds is
//     drawn as an aggregate.
// Everything is bounded: memory does not grow with uptime.
//
// Cost: the relay's calls (Served, Conflict, Unavailable, Retried) are O(1)
// and allocate nothing once a second's bucket has been used; the probe
// path's (Observe, Gone, Sample) are O(events) at most. Json() serializes
// (O(replicas * events_per_replica)); the gateway caches its output briefly
// so that viewers cannot load the loop that routes.
//
// Threading: not thread-safe; the gateway's event loop owns it, like the
// rest of the replica table, so nothing here takes a lock.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "stitch/gateway/chooser.h"
#include "stitch/net/clock.h"

namespace stitch {

struct FleetHistoryOptions {
  // How far back the per-second counters and the fleet samples reach.
  std::chrono::seconds window{300};
  size_t events_per_replica = 16;
  size_t fleet_events = 100;
  size_t rollouts = 32;
};

class FleetHistory {
 public:
  // `clock` must outlive the history; its Now() at construction is time 0.
  explicit FleetHistory(Clock& clock, FleetHistoryOptions options = {});

  // --- from the replica table (discovery, probes, stalls) ----------------------
  // `r` as it is now; records a transition when its state, version or
  // message changed, and updates the pointer and the publish-to-fleet times.
  void Observe(const ReplicaEntry& r);
  // The pool dropped `url`.
  void Gone(const std::string& url);
  // One fleet sample of `replicas` (after each poll).
  void Sample(const ReplicaMap& replicas);

  // --- from the relay ------------------------------------------------------------
  // A 200 answered from `version` (nullopt: unknown).
  void Served(std::optional<int64_t> version);
  void Conflict();     // a 409 relayed or answered
  void Unavailable();  // a 503 relayed or answered
  void Retried();      // an attempt after the first

  // The state label of `r` ("serving", "staging", ...) and its message.
  static std::pair<std::string, std::string> Label(const ReplicaEntry& r);

  // Everything, as the JSON /ui/state serves (docs/gateway.md).
  std::string Json(const ReplicaMap& replicas) const;

  std::optional<int64_t> pointer() const { return pointer_; }

 private:
  struct Event {
    double t = 0;
    std::string state;
    std::optional<int64_t> version;
    std::string message;
  };
  struct Lane {
    std::deque<Event> events;
    std::string state;
    std::optional<int64_t> version;
    std::string message;
    double joined = 0;
    std::optional<double> last_stage;   // when it was last seen staging
    std::optional<double> last_commit;  // when it was last seen committing or moved version
    std::string last_error;
    std::optional<double> last_error_at;
  };
  // Staleness buckets: 0, 1, 2, 3, 4, 5 or more, unknown.
  static constexpr size_t kStalenessBuckets = 7;
  struct Second {
    int64_t second = -1;
    std::vector<std::pair<int64_t, uint32_t>> served;  // version, answers
    uint32_t unknown_version = 0;
    std::array<uint32_t, kStalenessBuckets> staleness{};
    uint32_t conflicts = 0;
    uint32_t unavailable = 0;
    uint32_t retries = 0;
  };
  struct FleetSample {
    double t = 0;
    std::optional<int64_t> pointer;
    std::optional<int64_t> oldest;
    std::optional<int64_t> newest;
    int at_pointer = 0;
    int ready = 0;
    int replicas = 0;
  };
  struct Rollout {
    int64_t version = 0;
    double seen = 0;
    std::optional<double> fleet;  // seconds from seen until the whole fleet applied it
  };

  double Now() const;
  Second& Current();
  void Record(const std::string& url, Lane& lane, Event event);
  void CheckRollouts();

  Clock& clock_;
  const FleetHistoryOptions options_;
  const Clock::TimePoint start_;
  std::map<std::string, Lane> lanes_;
  std::deque<std::pair<std::string, Event>> fleet_events_;
  std::vector<Second> seconds_;  // a ring indexed by second % size
  std::deque<FleetSample> samples_;
  std::optional<int64_t> pointer_;
  std::deque<std::pair<double, int64_t>> pointer_moves_;
  std::deque<Rollout> rollouts_;
  // A version per replica and how many replicas are at each, so that the
  // oldest and newest are known in O(log n).
  class Census {
   public:
    // Sets (or, with nullopt, forgets) `url`'s version.
    void Set(const std::string& url, std::optional<int64_t> version);
    bool empty() const { return counts_.empty(); }
    int64_t oldest() const { return counts_.begin()->first; }   // REQUIRES: !empty()
    int64_t newest() const { return counts_.rbegin()->first; }  // REQUIRES: !empty()

   private:
    std::map<std::string, int64_t> by_url_;
    std::map<int64_t, int> counts_;
  };
  // The pointer: the newest that the replicas report as last read. A
  // pointer that came down (a bad one fixed in the store) comes down here.
  void UpdatePointer(double now);

  // What the last Observe saw of every reachable replica's applied version
  // (-1: none), to tell when the whole fleet caught up with a rollout.
  Census applied_;
  // Each reachable replica's last read of the pointer.
  Census pointers_;
};

}  // namespace stitch
