#include "stitch/store/pointer_cas.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/pointer.h"

namespace stitch {

absl::StatusOr<std::optional<VersionRef>> ParsePointerText(std::string_view where,
                                                           std::string_view text) {
  if (absl::StripAsciiWhitespace(AbslView(text)).empty()) return std::nullopt;
  auto ref = VersionRef::Parse(text);
  if (!ref.ok()) {
    // VersionRef's message quotes the text; say which file it came from and
    // that nothing was assumed.
    return WithKind(
        absl::Status(ref.status().code(),
                     absl::StrCat(AbslView(where), ": pointer: ", ref.status().message(),
                                  "; fix or rewrite the pointer (it is not treated as unset)")),
        ErrorKind::kPointerMalformed);
  }
  return std::optional<VersionRef>(*std::move(ref));
}

absl::Status CheckCompareAndSwap(std::string_view where, std::string_view run_id,
                                 const std::optional<VersionRef>& expected,
                                 const std::optional<VersionRef>& actual,
                                 const VersionRef& proposed) {
  if (run_id.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(where),
                     ": opened without a run id, so it cannot move the pointer; open it with one"));
  }
  if (proposed.run_id != run_id) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(where), ": refusing to point at ", proposed.ToString(),
                     ": this store is scoped to run \"", AbslView(run_id), "\""));
  }
  if (absl::Status s = ValidateVersionNumber(proposed.version); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(where), ": ", s.message()));
  }
  if (actual != expected) return PointerConflict(where, expected, actual, proposed);
  return CheckPointerMove(where, actual, proposed).status();
}

}  // namespace stitch
