#include "stitch/core/pointer.h"

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {

absl::StatusOr<PointerMove> CheckPointerMove(std::string_view where,
                                             const std::optional<VersionRef>& current,
                                             const VersionRef& proposed) {
  if (!current) return PointerMove::kInitial;
  if (current->run_id != proposed.run_id) return PointerMove::kRunReset;
  if (proposed.version <= current->version) {
    return WithKind(absl::FailedPreconditionError(absl::StrCat(
                        AbslView(where), ": refusing to rewind the pointer from ",
                        current->ToString(), " to ", proposed.ToString(),
                        "; versions only move forward inside a run (start a new run id to "
                        "restart)")),
                    ErrorKind::kPointerRewind);
  }
  return PointerMove::kForward;
}

absl::Status PointerConflict(std::string_view where, const std::optional<VersionRef>& expected,
                             const std::optional<VersionRef>& actual, const VersionRef& proposed) {
  return ConflictError(
      where, ConflictDetails{expected ? expected->ToString() : "", actual ? actual->ToString() : "",
                             proposed.ToString()});
}

FollowAction PlanFollow(const std::optional<VersionRef>& applied, const VersionRef& pointer) {
  if (!applied || applied->run_id != pointer.run_id) return FollowAction::kRunReset;
  if (pointer.version > applied->version) return FollowAction::kAdvance;
  return FollowAction::kNothing;
}

}  // namespace stitch
