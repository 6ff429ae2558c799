#include "stitch/publish/claim.h"

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/publish/wake.h"

namespace stitch {
namespace {

// Lost compare-and-swaps re-evaluated before giving up. Each loss means
// another writer moved the pointer; a handful covers every realistic burst of
// hosts claiming the same run at start-up.
constexpr int kClaimAttempts = 5;

}  // namespace

absl::StatusOr<ClaimOutcome> ClaimRun(Store& store, int64_t boot_version, Pool* pool) {
  const std::string where = absl::StrCat("store ", store.uri());
  if (absl::Status s = ValidateRunId(store.run_id()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": cannot claim: ", s.message()));
  }
  if (absl::Status s = ValidateVersionNumber(boot_version); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": boot version: ", s.message()));
  }
  const VersionRef boot{store.run_id(), boot_version};
  absl::Status lost;
  for (int attempt = 0; attempt < kClaimAttempts; ++attempt) {
    if (absl::Status s = store.Refresh(); !s.ok()) return s;
    auto current = store.ReadPointer();
    if (!current.ok()) return current.status();
    ClaimOutcome outcome{boot, *current, false};
    if (*current && (*current)->run_id == boot.run_id) {
      const int64_t at = (*current)->version;
      if (at == boot_version) return outcome;
      if (at > boot_version) {
        return WithKind(absl::FailedPreconditionError(
                            absl::StrCat(where, ": run ", boot.run_id, " already published ",
                                         VersionDirName(at), "; a reused run id above its boot (",
                                         boot.DirName(), ") is a rewind; use a new run id")),
                        ErrorKind::kPointerRewind);
      }
    }
    lost = store.AdvancePointer(*current, boot);
    if (lost.ok()) {
      outcome.moved = true;
      WakeAfterMove(pool, boot);
      return outcome;
    }
    if (GetErrorKind(lost) != ErrorKind::kPointerConflict) return lost;
  }
  return lost;
}

}  // namespace stitch
