// Rules for moving the `latest` pointer.
//
// Inside a run the pointer only moves forward: a lower or equal version is a
// rewind and is refused. Moving to another run is allowed and means "reset to
// that run's boot checkpoint, then follow it". Advancing is a compare-and-swap
// against the value the publisher read; losing it is a conflict.
#pragma once

#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "stitch/core/version.h"

namespace stitch {

enum class PointerMove {
  kInitial,  // the pointer was unset
  kForward,  // same run, higher version
  kRunReset  // another run: reset to its boot version, then follow it
};

// Classifies moving the pointer from `current` to `proposed`. A lower or equal
// version of the same run is a FailedPrecondition error of kind
// kPointerRewind. `where` prefixes the message (a store URI, say).
[[nodiscard]] absl::StatusOr<PointerMove> CheckPointerMove(std::string_view where,
                                                           const std::optional<VersionRef>& current,
                                                           const VersionRef& proposed);

// The Aborted error of kind kPointerConflict for a compare-and-swap that
// expected `expected` and found `actual` while proposing `proposed`.
absl::Status PointerConflict(std::string_view where, const std::optional<VersionRef>& expected,
                             const std::optional<VersionRef>& actual, const VersionRef& proposed);

// What a replica must do to follow a pointer from what it has applied.
enum class FollowAction {
  kNothing,   // already at (or, impossibly, past) the pointer of this run
  kAdvance,   // same run, newer version: stage and commit
  kRunReset,  // another run: drain, reset to the run's boot checkpoint, follow
};

// `applied` is the replica's applied identity (nullopt before the first
// catch-up), `pointer` the store's.
FollowAction PlanFollow(const std::optional<VersionRef>& applied, const VersionRef& pointer);

}  // namespace stitch
