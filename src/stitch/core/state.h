// Replica and pool state, as reported by a sidecar's /server_info and a
// gateway's /replicas. Plain values; their wire forms are the rollout API's
// (api/server_info.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/core/version.h"

namespace stitch {

enum class SyncState { kIdle, kFetching, kStaging, kCommitting, kError };

// "IDLE", "FETCHING", "STAGING", "COMMITTING", "ERROR".
std::string_view SyncStateName(SyncState s);
[[nodiscard]] absl::StatusOr<SyncState> ParseSyncState(std::string_view name);

enum class CommitMode { kInPlace, kQuiesce };

// "in_place", "quiesce".
std::string_view CommitModeName(CommitMode m);
[[nodiscard]] absl::StatusOr<CommitMode> ParseCommitMode(std::string_view name);

// What one sidecar reports about itself (GET /server_info).
struct ReplicaState {
  bool ready = false;
  // What the replica serves; nullopt while it has not verified which
  // weights its engine holds (it then serves nothing versioned).
  std::optional<VersionRef> applied;
  SyncState sync_state = SyncState::kIdle;
  std::string reason;
  std::string run_id;
  CommitMode commit_mode = CommitMode::kInPlace;
  int64_t active_requests = 0;
  bool update_destination_ready = false;
  std::string update_destination_error;
  std::string terminal_error;
  // Why the last reconcile pass failed (a version that cannot be staged, a
  // store that cannot be read), until a pass catches up; "" otherwise.
  std::string sync_error;
  // Timings and counters of the last reconcile pass (stage_s, commit_s, ...).
  std::map<std::string, double> metrics;
  // The store's pointer as the replica last read it; nullopt before its
  // first successful read, or when the store has no pointer. Requests with
  // max_staleness are judged against it.
  std::optional<VersionRef> pointer;
  // What the pointer did that an operator should know of, "" otherwise: it
  // moved back within the run (the replica keeps its version), or it named
  // another run (the replica switched to that run's boot version; said for
  // ten minutes).
  std::string pointer_notice;
  // Set while the replica is held for evaluation (docs/deploy.md, "Long
  // runs"): it serves this version, not the pointer's, and the gateway
  // routes it exact pins at this version only.
  struct Held {
    VersionRef version;
    std::string holder;
    friend bool operator==(const Held&, const Held&) = default;
  };
  std::optional<Held> held;

  std::optional<int64_t> pointer_version() const {
    return pointer.has_value() ? std::optional<int64_t>(pointer->version) : std::nullopt;
  }
};

// What a gateway knows about one replica.
struct ReplicaStatus {
  std::string url;
  bool reachable = false;
  ReplicaState state;
  int64_t in_flight = 0;  // requests the gateway has outstanding on it
  bool stalled = false;   // busy without sending anything back for a while
  std::string last_error;
};

struct PoolState {
  std::vector<ReplicaStatus> replicas;

  int ready_count() const;
};

}  // namespace stitch
