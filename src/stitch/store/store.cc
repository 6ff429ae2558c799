#include "stitch/store/store.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {

absl::StatusOr<Store::VerifiedFile> Store::OpenVerifiedFile(int64_t version,
                                                            std::string_view name) {
  return absl::NotFoundError(absl::StrCat("store ", uri(), " keeps no verified copy of ",
                                          VersionDirName(version), "/", AbslView(name),
                                          " to give peers"));
}

namespace {

absl::Status CannotKeepRecords(const Store& store, std::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      "store ", store.uri(), " cannot ", AbslView(what), " (retention needs a store that can)"));
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> Store::ListVersions() {
  return CannotKeepRecords(*this, "list its versions");
}
absl::Status Store::DeleteVersion(int64_t) { return CannotKeepRecords(*this, "delete versions"); }
absl::StatusOr<std::vector<std::string>> Store::ListRecords(std::string_view) {
  return CannotKeepRecords(*this, "keep records");
}
absl::StatusOr<std::optional<std::string>> Store::ReadRecord(std::string_view, std::string_view) {
  return CannotKeepRecords(*this, "keep records");
}
absl::Status Store::WriteRecord(std::string_view, std::string_view, std::string_view) {
  return CannotKeepRecords(*this, "keep records");
}
absl::Status Store::DeleteRecord(std::string_view, std::string_view) {
  return CannotKeepRecords(*this, "keep records");
}

absl::Status CheckDeletable(std::string_view where, std::string_view run_id,
                            const std::optional<VersionRef>& pointer, int64_t version) {
  if (absl::Status s = ValidateVersionNumber(version); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(where), ": ", s.message()));
  }
  if (!pointer.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(AbslView(where), ": no run was claimed here; nothing is deleted"));
  }
  if (!run_id.empty() && pointer->run_id != run_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        AbslView(where), ": the pointer names run '", pointer->run_id, "', not '", AbslView(run_id),
        "'; versions are deleted only for the run the pointer names"));
  }
  if (version >= pointer->version) {
    return absl::FailedPreconditionError(
        absl::StrCat(AbslView(where), ": ", VersionDirName(version), " is not below the pointer (",
                     pointer->ToString(),
                     "): the pointer's version and versions being published are never deleted"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Store::PruneLocalCopies(int64_t) { return 0; }

absl::Status ValidateRecordWord(std::string_view what, std::string_view word) {
  const bool ok = !word.empty() && word.size() <= 128 && word.front() != '.' &&
                  std::all_of(word.begin(), word.end(), [](char c) {
                    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
                           c == '_' || c == '-';
                  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(AbslView(what), " '", absl::CHexEscape(AbslView(word)),
                   "' must be 1 to 128 of [A-Za-z0-9._-], not starting with '.'"));
}

absl::StatusOr<VersionRef> ReadClaimedPointer(Store& store) {
  auto pointer = store.ReadPointer();
  if (!pointer.ok()) return pointer.status();
  if (!pointer->has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "store ", store.uri(),
        " does not exist (it has no `latest` pointer: no run was ever claimed in it); check the "
        "store's path or URI, or create it by claiming a run (`stitch claim`)"));
  }
  return **pointer;
}

}  // namespace stitch
