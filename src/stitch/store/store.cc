#include "stitch/store/store.h"

#include "absl/strings/str_cat.h"

namespace stitch {

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
