#include "stitch/publish/request.h"

#include "stitch/api/request.h"

namespace stitch {

absl::StatusOr<std::string> ConstrainRequestBody(std::string_view json_body,
                                                 const VersionConstraint& constraint) {
  return WithConstraint(json_body, constraint);
}

absl::StatusOr<std::string> ConstrainRequestBodyToLatest(std::string_view json_body,
                                                         std::optional<int64_t> latest, int64_t lag,
                                                         std::optional<int64_t> exact,
                                                         std::optional<int64_t> max_staleness) {
  auto constraint = MakeRequestConstraint(latest, lag, exact, max_staleness);
  if (!constraint.ok()) return constraint.status();
  return ConstrainRequestBody(json_body, *constraint);
}

}  // namespace stitch
