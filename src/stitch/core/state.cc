#include "stitch/core/state.h"

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {

std::string_view SyncStateName(SyncState s) {
  switch (s) {
    case SyncState::kIdle:
      return "IDLE";
    case SyncState::kFetching:
      return "FETCHING";
    case SyncState::kStaging:
      return "STAGING";
    case SyncState::kCommitting:
      return "COMMITTING";
    case SyncState::kError:
      return "ERROR";
  }
  return "ERROR";
}

absl::StatusOr<SyncState> ParseSyncState(std::string_view name) {
  for (SyncState s : {SyncState::kIdle, SyncState::kFetching, SyncState::kStaging,
                      SyncState::kCommitting, SyncState::kError}) {
    if (name == SyncStateName(s)) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown sync state \"", AbslView(name),
                   "\" (expected IDLE|FETCHING|STAGING|COMMITTING|ERROR)"));
}

std::string_view CommitModeName(CommitMode m) {
  return m == CommitMode::kInPlace ? "in_place" : "quiesce";
}

absl::StatusOr<CommitMode> ParseCommitMode(std::string_view name) {
  if (name == "in_place") return CommitMode::kInPlace;
  if (name == "quiesce") return CommitMode::kQuiesce;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown commit mode \"", AbslView(name), "\" (expected in_place|quiesce)"));
}

int PoolState::ready_count() const {
  int n = 0;
  for (const ReplicaStatus& r : replicas) n += (r.reachable && r.state.ready) ? 1 : 0;
  return n;
}

}  // namespace stitch
