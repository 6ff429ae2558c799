// Claiming a run: the first thing a trainer does, before publishing.
//
// Claiming points the store's pointer at `<run_id>/weight_v<boot>` (the
// boot checkpoint the run starts from):
//   pointer unset or naming another run   move it (a run change: replicas
//                                         reset to this run's boot weights)
//   this run, at the boot version         nothing to do (claim is idempotent)
//   this run, below the boot version      move it forward to the boot version
//   this run, above the boot version      refused (kPointerRewind): the run id
//                                         was reused; start a new one
// A compare-and-swap lost to a concurrent writer is re-evaluated against the
// new pointer (a few times), so concurrent claims of the same run and boot
// all succeed.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "stitch/core/version.h"
#include "stitch/pool/pool.h"
#include "stitch/store/store.h"

namespace stitch {

struct ClaimOutcome {
  VersionRef pointer;                  // where the pointer stands now
  std::optional<VersionRef> previous;  // what it named before (nullopt: unset)
  bool moved = false;                  // false when the run was already claimed
};

// Claims `store.run_id()` at `boot_version` as described above, then, if the
// pointer moved and `pool` is not null, wakes the pool (best effort).
// Errors name the store: a rewind (kPointerRewind), an unreadable pointer,
// a conflict that persisted, I/O failures.
[[nodiscard]] absl::StatusOr<ClaimOutcome> ClaimRun(Store& store, int64_t boot_version, Pool* pool);

}  // namespace stitch
