#include "stitch/core/constraint.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "stitch/core/errors.h"
#include "stitch/core/version.h"

namespace stitch {

std::optional<VersionConstraint::Bound> VersionConstraint::Unmet(
    std::optional<int64_t> applied, std::optional<int64_t> pointer) const {
  if (exact_version && (!applied || *applied != *exact_version)) return Bound::kExact;
  if (min_version && (!applied || *applied < *min_version)) return Bound::kMin;
  if (max_staleness) {
    if (!applied) return Bound::kStaleness;
    if (pointer && *applied < *pointer - *max_staleness) return Bound::kStaleness;
  }
  return std::nullopt;
}

std::optional<int64_t> VersionConstraint::Floor(std::optional<int64_t> pointer) const {
  std::optional<int64_t> floor = min_version;
  if (max_staleness && pointer) {
    const int64_t fresh = std::max<int64_t>(0, *pointer - *max_staleness);
    floor = floor ? std::max(*floor, fresh) : fresh;
  }
  return floor;
}

std::string_view BoundName(VersionConstraint::Bound bound) {
  switch (bound) {
    case VersionConstraint::Bound::kExact:
      return "exact_version";
    case VersionConstraint::Bound::kMin:
      return "min_version";
    case VersionConstraint::Bound::kStaleness:
      return "max_staleness";
  }
  return "exact_version";
}

std::string VersionConstraint::ToJson() const {
  std::string out = "{";
  if (exact_version) {
    absl::StrAppend(&out, "\"exact_version\":", *exact_version);
  } else if (min_version) {
    absl::StrAppend(&out, "\"min_version\":", *min_version);
  }
  if (max_staleness) {
    absl::StrAppend(&out, out.size() > 1 ? "," : "", "\"max_staleness\":", *max_staleness);
  }
  return out + "}";
}

std::string VersionConstraint::ToString() const {
  std::string out;
  if (exact_version) {
    out = absl::StrCat("exact v", *exact_version);
  } else if (min_version) {
    out = absl::StrCat(">= v", *min_version);
  }
  if (max_staleness) {
    absl::StrAppend(&out, out.empty() ? "" : " and ", "<= ", *max_staleness, " behind the pointer");
  }
  return out.empty() ? "any" : out;
}

absl::StatusOr<VersionConstraint> MakeRequestConstraint(std::optional<int64_t> latest, int64_t lag,
                                                        std::optional<int64_t> exact,
                                                        std::optional<int64_t> max_staleness) {
  if (max_staleness) {
    if (absl::Status s = ValidateVersionNumber(*max_staleness); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("max_staleness: ", s.message()));
    }
    absl::StatusOr<VersionConstraint> c = MakeRequestConstraint(latest, lag, exact);
    if (c.ok()) c->max_staleness = max_staleness;
    return c;
  }
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

absl::StatusOr<VersionConstraint> ParseConstraintSpec(std::string_view spec) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(AbslView(spec));
  if (absl::StartsWith(trimmed, "{")) {
    return VersionConstraint::FromJson(std::string_view(trimmed.data(), trimmed.size()));
  }
  std::string json = "{";
  for (absl::string_view pair : absl::StrSplit(trimmed, ',')) {
    pair = absl::StripAsciiWhitespace(pair);
    const size_t colon = pair.find(':');
    const absl::string_view value =
        colon == absl::string_view::npos ? "" : absl::StripAsciiWhitespace(pair.substr(colon + 1));
    if (colon == absl::string_view::npos || value.empty() ||
        value.find_first_not_of("0123456789") != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "constraint \"", AbslView(spec), "\": \"", pair,
          "\" is not name:N; write e.g. max_staleness:1 or min_version:3,max_staleness:1"));
    }
    absl::StrAppend(&json, json.size() > 1 ? "," : "", "\"",
                    absl::StripAsciiWhitespace(pair.substr(0, colon)), "\":", value);
  }
  json += "}";
  absl::StatusOr<VersionConstraint> c = VersionConstraint::FromJson(json);
  if (!c.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("constraint \"", AbslView(spec), "\": ", c.status().message()));
  }
  return c;
}

}  // namespace stitch
