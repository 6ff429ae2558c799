// Retention: which versions a long run still needs, and deleting the rest.
//
// A version is needed when it is
//   - the pointer's version, or above it (still being published);
//   - one of the last K versions up to the pointer (RetentionRule);
//   - a milestone: a multiple of M (RetentionRule);
//   - held: a live hold (below) names it;
// and so is every version on the chain behind a needed one, back to its
// anchor (a FULL version, or a version with an anchor written after the
// fact: Store::anchors()): a replica materializes a version from its
// chain. Every other version is deleted, with its anchor if it has one.
//
// Holds are records in the store (Store::WriteRecord, kind "holds", one per
// holder): a version to keep until an expiry.
//
// Deleting never harms a reader. Store::DeleteVersion makes a version read
// as not published in one step, so a replica materializing it either has
// its verified bytes already or fails cleanly and goes back to the
// pointer, whose chain retention never touches. A hold and a gc taken at
// the same moment cannot lose the held version: before deleting, a gc
// writes the versions it is about to delete (a "gc" record), then reads
// the holds again and spares what they hold; a hold, once written, reads
// the "gc" records and refuses a version on one (and checks that its chain
// is still whole). Two gc runs at once are safe: deleting is idempotent.
//
// Thread-safety: functions, safe to call concurrently on stores that are.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stitch/core/manifest.h"
#include "stitch/store/store.h"

namespace stitch {

inline constexpr std::string_view kHoldRecordKind = "holds";
inline constexpr std::string_view kGcRecordKind = "gc";

struct Hold {
  std::string holder;  // the record's name: [A-Za-z0-9._-]
  int64_t version = 0;
  absl::Time expires = absl::InfinitePast();

  bool live(absl::Time now) const { return now < expires; }
};

// The record's text, and back. Parsing refuses anything malformed
// (InvalidArgument naming the holder): a hold is never guessed.
std::string HoldToJson(const Hold& hold);
[[nodiscard]] absl::StatusOr<Hold> HoldFromJson(std::string_view holder, std::string_view json);

// Every hold in the store, expired ones included, sorted by holder.
[[nodiscard]] absl::StatusOr<std::vector<Hold>> ListHolds(Store& store);

// Writes `hold` (replacing the holder's previous one), then makes sure the
// version stays: it must be published with its whole chain, and no gc
// running now may be about to delete any of it. On a refusal the record is
// removed again: FailedPrecondition naming what is missing or being
// deleted. `now` is when the hold is taken (it must expire after it).
[[nodiscard]] absl::Status PutHold(Store& store, const Hold& hold, absl::Time now);

// Removes `holder`'s hold. NotFound when it has none.
[[nodiscard]] absl::StatusOr<Hold> ReleaseHold(Store& store, std::string_view holder);

struct RetentionRule {
  int64_t keep_last = 1;   // the last K versions up to the pointer (>= 1)
  int64_t keep_every = 0;  // milestones: multiples of M; 0 for none
};
[[nodiscard]] absl::Status ValidateRetentionRule(const RetentionRule& rule);

struct RetentionPlan {
  struct Kept {
    int64_t version = 0;
    std::vector<std::string> reasons;  // "pointer", "last 10", "chain of v000012", ...
  };
  VersionRef pointer;
  std::vector<Kept> kept;        // ascending
  std::vector<int64_t> deleted;  // ascending: what nothing needs
  // Anchors (Store::anchors()) of deleted versions, and of versions below
  // the pointer the store no longer holds, ascending.
  std::vector<int64_t> anchors_deleted;
  // A needed version whose chain is broken (a link missing or incomplete):
  // what was found is kept, and said here.
  std::vector<std::string> warnings;
};

// The plan for `versions` (Store::ListVersions) under `rule`, the pointer
// and the live holds among `holds`; a chain ends at a version among
// `anchors` (the versions with an anchor). `manifest` reads a version's index;
// NotFound there means the version is incomplete. Reading is limited to
// the needed versions and their chains. Any other error reading a needed
// version stops the plan: nothing is deleted on uncertainty.
using ManifestReader = std::function<absl::StatusOr<VersionManifest>(int64_t version)>;
[[nodiscard]] absl::StatusOr<RetentionPlan> PlanRetention(const VersionRef& pointer,
                                                          const std::vector<int64_t>& versions,
                                                          const std::vector<Hold>& holds,
                                                          absl::Time now, const RetentionRule& rule,
                                                          const ManifestReader& manifest,
                                                          const std::vector<int64_t>& anchors = {});

struct RetentionReport {
  RetentionPlan plan;
  std::vector<int64_t> deleted;          // what this run deleted
  std::vector<int64_t> anchors_deleted;  // the anchors it deleted
  std::vector<std::string> failures;     // versions it could not delete, why
};

// Plans under `rule` and deletes what nothing needs (with `dry_run`, only
// plans), by the protocol in the header comment. Deleting goes on past a
// version that fails; the report says which. Errors: the store does not
// exist, cannot list or delete, or a needed version could not be read.
// `between_looks` (tests only) runs after the gc record is written and
// before the holds are read the second time.
[[nodiscard]] absl::StatusOr<RetentionReport> ApplyRetention(
    Store& store, const RetentionRule& rule, absl::Time now, bool dry_run = false,
    const std::function<void()>& between_looks = nullptr);

// Lines for people: what was deleted, and why each kept version was kept.
std::string DescribeRetention(const RetentionReport& report, bool dry_run);

}  // namespace stitch
