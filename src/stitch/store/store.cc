#include "stitch/store/store.h"

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {

absl::StatusOr<Store::VerifiedFile> Store::OpenVerifiedFile(int64_t version,
                                                            std::string_view name) {
  return absl::NotFoundError(absl::StrCat("store ", uri(), " keeps no verified copy of ",
                                          VersionDirName(version), "/", AbslView(name),
                                          " to give peers"));
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
