// What a request demands of the serving version.
//
// JSON form (the `weight_version` field of a request body):
//   {"min_version": 7}      version 7 or newer
//   {"exact_version": 7}    only version 7
//   {} or null              anything
// A null field counts as absent. Both at once, or a field given twice, is an
// InvalidArgument error (rather than one silently winning). Values must be
// JSON integers in [0, kMaxVersion]; anything else is a clear InvalidArgument
// error.
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

  static VersionConstraint Exact(int64_t v) { return {std::nullopt, v}; }
  static VersionConstraint AtLeast(int64_t v) { return {v, std::nullopt}; }

  bool empty() const { return !min_version && !exact_version; }
  bool is_exact() const { return exact_version.has_value(); }

  // The version the constraint points at (exact, else min), if any.
  std::optional<int64_t> target() const { return exact_version ? exact_version : min_version; }

  // True when a replica whose applied version is `applied` may serve the
  // request. A replica with no applied version satisfies only the empty
  // constraint.
  bool SatisfiedBy(std::optional<int64_t> applied) const;

  // Parses the JSON form (an object, or null for the empty constraint).
  [[nodiscard]] static absl::StatusOr<VersionConstraint> FromJson(std::string_view json);

  // The JSON form; only the field that matters is written ("exact_version"
  // when exact, else "min_version"; "{}" when empty).
  std::string ToJson() const;

  // Human text: "exact v7", ">= v7", "any".
  std::string ToString() const;

  friend bool operator==(const VersionConstraint&, const VersionConstraint&) = default;
};

// The constraint a trainer attaches to a rollout request: `exact` when given,
// else `min_version = latest - lag` when `latest` is known (never below 0),
// else empty. REQUIRES: lag >= 0.
[[nodiscard]] absl::StatusOr<VersionConstraint> MakeRequestConstraint(std::optional<int64_t> latest,
                                                                      int64_t lag,
                                                                      std::optional<int64_t> exact);

}  // namespace stitch
