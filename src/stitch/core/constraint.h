// What a request demands of the serving version.
//
// JSON form (the `weight_version` field of a request body):
//   {"min_version": 7}      version 7 or newer
//   {"exact_version": 7}    only version 7
//   {"max_staleness": 1}    at most 1 version behind the store's pointer, as
//                           the replica judging it last read the pointer;
//                           alone or with one of the above (every bound
//                           given must hold)
//   {} or null              anything
// A null field counts as absent. A field given twice is an InvalidArgument
// error (rather than one silently winning); so is an exact_version below a
// min_version given with it (no version is both). Values are integers in
// [0, kMaxVersion], also as digits in a string ("7") or a whole number
// (7.0); anything else is a clear InvalidArgument error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace stitch {

struct VersionConstraint {
  std::optional<int64_t> min_version;
  std::optional<int64_t> exact_version;
  // How many versions the served version may be behind the store's pointer.
  std::optional<int64_t> max_staleness;

  static VersionConstraint Exact(int64_t v) { return {std::nullopt, v}; }
  static VersionConstraint AtLeast(int64_t v) { return {v, std::nullopt}; }
  static VersionConstraint Fresh(int64_t max_staleness) {
    return {std::nullopt, std::nullopt, max_staleness};
  }

  bool empty() const { return !min_version && !exact_version && !max_staleness; }
  bool is_exact() const { return exact_version.has_value(); }

  // The version the constraint points at (exact, else min), if any.
  std::optional<int64_t> target() const { return exact_version ? exact_version : min_version; }

  // The bounds a constraint holds, in the order they are checked.
  enum class Bound { kExact, kMin, kStaleness };

  // The first bound a replica whose applied version is `applied` fails, when
  // the store's pointer is at `pointer` as that replica last read it;
  // nullopt when it may serve the request. A replica with no applied
  // version satisfies only the empty constraint. Without a pointer (the
  // store has none, or the judge does not know it) max_staleness holds.
  std::optional<Bound> Unmet(std::optional<int64_t> applied,
                             std::optional<int64_t> pointer = std::nullopt) const;
  bool SatisfiedBy(std::optional<int64_t> applied,
                   std::optional<int64_t> pointer = std::nullopt) const {
    return !Unmet(applied, pointer).has_value();
  }

  // The lowest version that meets min_version and, with the pointer at
  // `pointer`, max_staleness (never below 0); nullopt when neither bounds
  // anything. Ignores exact_version.
  std::optional<int64_t> Floor(std::optional<int64_t> pointer) const;

  // Parses the JSON form (an object, or null for the empty constraint).
  [[nodiscard]] static absl::StatusOr<VersionConstraint> FromJson(std::string_view json);

  // The JSON form; only the fields that matter are written ("exact_version"
  // when exact, else "min_version"; then "max_staleness"; "{}" when empty).
  std::string ToJson() const;

  // Human text: "exact v7", ">= v7", "<= 1 behind the pointer",
  // ">= v7 and <= 1 behind the pointer", "any".
  std::string ToString() const;

  friend bool operator==(const VersionConstraint&, const VersionConstraint&) = default;
};

// The JSON field name of a bound: "exact_version", "min_version",
// "max_staleness".
std::string_view BoundName(VersionConstraint::Bound bound);

// The constraint a trainer attaches to a rollout request: `exact` when given,
// else `min_version = latest - lag` when `latest` is known (never below 0),
// else empty; plus `max_staleness` when given (judged by the replica against
// the pointer it last read, so it holds even when `latest` is unknown).
// InvalidArgument for a negative lag, version or staleness.
[[nodiscard]] absl::StatusOr<VersionConstraint> MakeRequestConstraint(
    std::optional<int64_t> latest, int64_t lag, std::optional<int64_t> exact,
    std::optional<int64_t> max_staleness = std::nullopt);

// A constraint written as a flag: comma-separated `name:value` pairs of the
// JSON form's fields ("max_staleness:1", "min_version:3,max_staleness:1"),
// or the JSON form itself. The JSON form's rules hold. InvalidArgument
// saying what is wrong otherwise.
[[nodiscard]] absl::StatusOr<VersionConstraint> ParseConstraintSpec(std::string_view spec);

}  // namespace stitch
