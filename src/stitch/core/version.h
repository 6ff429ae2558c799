// Version identity: `<run_id>/weight_vNNNNNN` or bare `weight_vNNNNNN`.
//
// Version numbers are only comparable inside one run. The canonical text pads
// the number to six digits (more when it needs them). Parsing also accepts the
// legacy bare-digit form ("7"). Anything else non-empty is an error: a caller
// must never fall back to boot weights on a pointer it cannot read.
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace stitch {

// Largest version number accepted anywhere: 10^12 - 1. Versions of a run are
// consecutive (each publish is the pointer's version + 1), so a run that
// publishes every second would need 30,000 years to reach it: no real run
// ends at the bound, while a version near it can only be a mistake, which is
// refused. It stays far below 2^53 so that the next version, `latest - lag`
// and other sums of versions a client computes remain exact in every JSON
// implementation (JavaScript's and Python's float fallback included).
inline constexpr int64_t kMaxVersion = 999'999'999'999;

// Longest run id accepted.
inline constexpr size_t kMaxRunIdLength = 128;

// A run id names one training lineage. It is non-empty, at most
// kMaxRunIdLength bytes of [A-Za-z0-9._:+=@-], and not "." or "..".
[[nodiscard]] absl::Status ValidateRunId(std::string_view run_id);

// OK when 0 <= version <= kMaxVersion.
[[nodiscard]] absl::Status ValidateVersionNumber(int64_t version);

// A version number written as text, read as Python's int() reads a
// non-negative decimal (the original Python Stitch calls int() on versions
// it is given): surrounding ASCII whitespace, an optional leading '+',
// decimal digits with single underscores between them ("1_000"), leading
// zeros ("007"). InvalidArgument (a bare reason, for the caller to put after
// what it was parsing) for anything else, a '-' sign included; OutOfRange
// above kMaxVersion.
[[nodiscard]] absl::StatusOr<int64_t> ParseVersionText(std::string_view text);

// "weight_v000007" for 7.
std::string VersionDirName(int64_t version);

// Parses "weight_vNNNNNN" (one or more digits) into its number.
[[nodiscard]] absl::StatusOr<int64_t> ParseVersionDirName(std::string_view name);

struct VersionRef {
  std::string run_id;  // empty for a bare identity
  int64_t version = 0;

  // Parses an identity. Surrounding ASCII whitespace is ignored. Empty text is
  // an error here; callers that treat an empty pointer as "unset" check first.
  [[nodiscard]] static absl::StatusOr<VersionRef> Parse(std::string_view text);

  // The canonical identity text.
  std::string ToString() const;

  // The store directory name, "weight_vNNNNNN".
  std::string DirName() const { return VersionDirName(version); }

  friend bool operator==(const VersionRef&, const VersionRef&) = default;
};

}  // namespace stitch
