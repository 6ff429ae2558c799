#include "stitch/core/manifest.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "stitch/core/errors.h"

namespace stitch {

std::string_view VersionKindName(VersionKind k) {
  return k == VersionKind::kFull ? "FULL" : "DELTA";
}

absl::Status ValidatePayloadFileName(std::string_view name_std) {
  absl::string_view name = AbslView(name_std);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsafe file name \"", absl::CEscape(name), "\": ", why));
  };
  if (name.empty()) return bad("empty");
  if (name.front() == '/') return bad("absolute path");
  if (name.find('\\') != absl::string_view::npos) return bad("contains a backslash");
  if (name.find('\0') != absl::string_view::npos) return bad("contains NUL");
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part.empty()) return bad("empty path component");
    if (part == "." || part == "..") return bad("climbs out of the version directory");
    if (part.size() > 255) return bad("path component longer than 255 bytes");
  }
  return absl::OkStatus();
}

}  // namespace stitch
