#include "stitch/core/constraint.h"

#include "absl/strings/str_cat.h"
#include "stitch/core/version.h"

namespace stitch {

bool VersionConstraint::SatisfiedBy(std::optional<int64_t> applied) const {
  if (empty()) return true;
  if (!applied) return false;
  if (exact_version) return *applied == *exact_version;
  return *applied >= *min_version;
}

std::string VersionConstraint::ToJson() const {
  if (exact_version) return absl::StrCat("{\"exact_version\":", *exact_version, "}");
  if (min_version) return absl::StrCat("{\"min_version\":", *min_version, "}");
  return "{}";
}

std::string VersionConstraint::ToString() const {
  if (exact_version) return absl::StrCat("exact v", *exact_version);
  if (min_version) return absl::StrCat(">= v", *min_version);
  return "any";
}

absl::StatusOr<VersionConstraint> MakeRequestConstraint(std::optional<int64_t> latest, int64_t lag,
                                                        std::optional<int64_t> exact) {
  if (lag < 0) return absl::InvalidArgumentError(absl::StrCat("lag ", lag, " is negative"));
  if (exact) {
    if (absl::Status s = ValidateVersionNumber(*exact); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("exact_version: ", s.message()));
    }
    return VersionConstraint::Exact(*exact);
  }
  if (!latest) return VersionConstraint{};
  if (absl::Status s = ValidateVersionNumber(*latest); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("latest: ", s.message()));
  }
  return VersionConstraint::AtLeast(*latest > lag ? *latest - lag : 0);
}

}  // namespace stitch
