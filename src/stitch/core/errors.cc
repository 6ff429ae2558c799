#include "stitch/core/errors.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace stitch {
namespace {

constexpr absl::string_view kKindUrl = "stitch/error-kind";
constexpr absl::string_view kExpectedUrl = "stitch/conflict-expected";
constexpr absl::string_view kActualUrl = "stitch/conflict-actual";
constexpr absl::string_view kProposedUrl = "stitch/conflict-proposed";

absl::string_view KindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kPointerRewind:
      return "pointer_rewind";
    case ErrorKind::kPointerConflict:
      return "pointer_conflict";
    case ErrorKind::kChecksumMismatch:
      return "checksum_mismatch";
    case ErrorKind::kVersionNotReady:
      return "version_not_ready";
    case ErrorKind::kPointerMalformed:
      return "pointer_malformed";
    case ErrorKind::kOther:
      break;
  }
  return "other";
}

}  // namespace

absl::Status WithKind(absl::Status status, ErrorKind kind) {
  if (status.ok()) return status;
  status.SetPayload(kKindUrl, absl::Cord(KindName(kind)));
  return status;
}

ErrorKind GetErrorKind(const absl::Status& status) {
  auto payload = status.GetPayload(kKindUrl);
  if (!payload) return ErrorKind::kOther;
  std::string name(*payload);
  for (ErrorKind kind :
       {ErrorKind::kPointerRewind, ErrorKind::kPointerConflict, ErrorKind::kChecksumMismatch,
        ErrorKind::kVersionNotReady, ErrorKind::kPointerMalformed}) {
    if (name == KindName(kind)) return kind;
  }
  return ErrorKind::kOther;
}

absl::Status ConflictError(std::string_view where, const ConflictDetails& d) {
  auto show = [](const std::string& v) { return v.empty() ? std::string("<unset>") : v; };
  absl::Status status = absl::AbortedError(absl::StrCat(
      AbslView(where), ": pointer changed concurrently (expected ", show(d.expected), ", found ",
      show(d.actual), ", proposed ", show(d.proposed), "); re-read the pointer and retry"));
  status.SetPayload(kExpectedUrl, absl::Cord(d.expected));
  status.SetPayload(kActualUrl, absl::Cord(d.actual));
  status.SetPayload(kProposedUrl, absl::Cord(d.proposed));
  return WithKind(std::move(status), ErrorKind::kPointerConflict);
}

std::optional<ConflictDetails> GetConflictDetails(const absl::Status& status) {
  if (GetErrorKind(status) != ErrorKind::kPointerConflict) return std::nullopt;
  ConflictDetails d;
  if (auto p = status.GetPayload(kExpectedUrl)) d.expected = std::string(*p);
  if (auto p = status.GetPayload(kActualUrl)) d.actual = std::string(*p);
  if (auto p = status.GetPayload(kProposedUrl)) d.proposed = std::string(*p);
  return d;
}

absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(AbslView(context), ": ", status.message()));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

}  // namespace stitch
