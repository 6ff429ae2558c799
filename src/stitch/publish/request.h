// Attaching a version constraint to a rollout request.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "stitch/core/constraint.h"

namespace stitch {

// api/request.h WithConstraint, under the name trainers use: returns
// `json_body` (a JSON object) with its `weight_version` field set to
// `constraint`'s JSON form, replacing any previous value; an empty
// constraint removes the field. Other fields are kept. InvalidArgument when
// the body is not valid JSON or not an object.
[[nodiscard]] absl::StatusOr<std::string> ConstrainRequestBody(std::string_view json_body,
                                                               const VersionConstraint& constraint);

// The trainer's usual case: pins `exact` when given, else demands
// `latest - lag` or newer when `latest` is known (MakeRequestConstraint),
// else leaves the request unconstrained; with `max_staleness` too (served
// only by a replica at most that many versions behind the pointer it last
// read).
[[nodiscard]] absl::StatusOr<std::string> ConstrainRequestBodyToLatest(
    std::string_view json_body, std::optional<int64_t> latest, int64_t lag,
    std::optional<int64_t> exact, std::optional<int64_t> max_staleness = std::nullopt);

}  // namespace stitch
