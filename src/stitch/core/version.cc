#include "stitch/core/version.h"

#include <charconv>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "stitch/core/errors.h"

namespace stitch {
namespace {

constexpr absl::string_view kDirPrefix = "weight_v";

bool IsRunIdChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
         c == ':' || c == '+' || c == '=' || c == '@';
}

absl::StatusOr<int64_t> ParseDigits(absl::string_view digits, absl::string_view whole) {
  if (digits.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", whole, "\" is not a version identity: no version digits"));
  }
  for (char c : digits) {
    if (c < '0' || c > '9') {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", whole,
          "\" is not a version identity (expected [<run_id>/]weight_vNNNNNN or bare digits)"));
    }
  }
  // Leading zeros beyond what fits are fine; the value must be in range.
  size_t first = digits.find_first_not_of('0');
  absl::string_view significant = first == absl::string_view::npos ? "0" : digits.substr(first);
  if (significant.size() > 16) {
    return absl::OutOfRangeError(
        absl::StrCat("\"", whole, "\" names a version above the maximum ", kMaxVersion));
  }
  int64_t value = 0;
  std::from_chars(significant.data(), significant.data() + significant.size(), value);
  if (value > kMaxVersion) {
    return absl::OutOfRangeError(
        absl::StrCat("\"", whole, "\" names a version above the maximum ", kMaxVersion));
  }
  return value;
}

}  // namespace

absl::Status ValidateRunId(std::string_view run_id_std) {
  absl::string_view run_id = AbslView(run_id_std);
  if (run_id.empty()) return absl::InvalidArgumentError("run id is empty");
  if (run_id.size() > kMaxRunIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("run id is ", run_id.size(), " bytes long; the limit is ", kMaxRunIdLength));
  }
  if (run_id == "." || run_id == "..") {
    return absl::InvalidArgumentError(absl::StrCat("run id \"", run_id, "\" is reserved"));
  }
  for (char c : run_id) {
    if (!IsRunIdChar(c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "run id \"", absl::CEscape(run_id), "\" contains '", absl::CEscape(std::string(1, c)),
          "'; allowed are letters, digits and . _ - : + = @"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateVersionNumber(int64_t version) {
  if (version < 0) {
    return absl::OutOfRangeError(absl::StrCat("version ", version, " is negative"));
  }
  if (version > kMaxVersion) {
    return absl::OutOfRangeError(
        absl::StrCat("version ", version, " is above the maximum ", kMaxVersion));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParseVersionText(std::string_view text) {
  absl::string_view rest = absl::StripAsciiWhitespace(AbslView(text));
  absl::ConsumePrefix(&rest, "+");
  int64_t v = 0;
  bool too_large = false;
  bool after_digit = false;  // the previous character was a digit
  for (size_t i = 0; i < rest.size(); ++i) {
    const char c = rest[i];
    if (c == '_' && after_digit && i + 1 < rest.size() && absl::ascii_isdigit(rest[i + 1])) {
      after_digit = false;
      continue;
    }
    if (!absl::ascii_isdigit(c)) {
      return absl::InvalidArgumentError(
          "expected a non-negative decimal integer (digits, with an optional '+', '_' between "
          "digits and surrounding whitespace)");
    }
    after_digit = true;
    // Past the maximum the value no longer matters, only that it is too large.
    if (!too_large) v = v * 10 + (c - '0');
    if (v > kMaxVersion) too_large = true;
  }
  if (!after_digit) {
    return absl::InvalidArgumentError(
        "expected a non-negative decimal integer (digits, with an optional '+', '_' between "
        "digits and surrounding whitespace)");
  }
  if (too_large) {
    return absl::OutOfRangeError(absl::StrCat("above the maximum version ", kMaxVersion));
  }
  return v;
}

std::string VersionDirName(int64_t version) {
  return absl::StrFormat("%s%06d", kDirPrefix, version);
}

absl::StatusOr<int64_t> ParseVersionDirName(std::string_view name_std) {
  absl::string_view name = AbslView(name_std);
  if (!absl::StartsWith(name, kDirPrefix)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", absl::CEscape(name), "\" is not a version directory name (weight_vNNNNNN)"));
  }
  return ParseDigits(name.substr(kDirPrefix.size()), name);
}

absl::StatusOr<VersionRef> VersionRef::Parse(std::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(AbslView(text));
  if (t.empty()) return absl::InvalidArgumentError("empty version identity");
  std::string shown = absl::CEscape(t);
  VersionRef ref;
  size_t slash = t.rfind('/');
  absl::string_view tail = t;
  if (slash != absl::string_view::npos) {
    absl::string_view run = t.substr(0, slash);
    if (absl::Status s = ValidateRunId(std::string_view(run.data(), run.size())); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", shown, "\" is not a version identity: ", s.message()));
    }
    ref.run_id = std::string(run);
    tail = t.substr(slash + 1);
    if (!absl::StartsWith(tail, kDirPrefix)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", shown, "\" is not a version identity (expected <run_id>/weight_vNNNNNN)"));
    }
  }
  if (absl::StartsWith(tail, kDirPrefix)) {
    auto v = ParseDigits(tail.substr(kDirPrefix.size()), shown);
    if (!v.ok()) return v.status();
    ref.version = *v;
    return ref;
  }
  // Legacy bare digits.
  auto v = ParseDigits(tail, shown);
  if (!v.ok()) return v.status();
  ref.version = *v;
  return ref;
}

std::string VersionRef::ToString() const {
  if (run_id.empty()) return VersionDirName(version);
  return absl::StrCat(run_id, "/", VersionDirName(version));
}

}  // namespace stitch
