// The pointer's text form and the compare-and-swap decision, shared by every
// store adapter so that they refuse and report the same things.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "stitch/core/version.h"

namespace stitch {

// Parses the pointer's stored text. Empty or whitespace-only text means
// unset (nullopt). Text that is not a version identity is an error whose
// message names `where` and the text, never "unset".
[[nodiscard]] absl::StatusOr<std::optional<VersionRef>> ParsePointerText(std::string_view where,
                                                                         std::string_view text);

// Decides a compare-and-swap for a store scoped to `run_id` whose pointer
// currently holds `actual`: OK when the pointer may move to `proposed`.
// Errors, in the order checked:
//   InvalidArgument  `proposed` names another run than `run_id` (or the store
//                    was opened without a run id), or a bad version number;
//   kPointerConflict `actual` differs from `expected` (the caller's view is
//                    stale; reported before any rewind so that a pointer that
//                    changed under a publisher always reads as a conflict);
//   kPointerRewind   `proposed` is not above `actual` in the same run.
[[nodiscard]] absl::Status CheckCompareAndSwap(std::string_view where, std::string_view run_id,
                                               const std::optional<VersionRef>& expected,
                                               const std::optional<VersionRef>& actual,
                                               const VersionRef& proposed);

}  // namespace stitch
