#include "stitch/store/remote_store.h"

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {

absl::StatusOr<std::filesystem::path> RemoteStore::Materialize(int64_t version) {
  return absl::FailedPreconditionError(
      absl::StrCat("store ", uri(), ": ", VersionDirName(version),
                   " cannot be materialized by the remote store alone; open it with OpenStore "
                   "(fetch/open_store.h), which puts a verified version cache in front of it"));
}

}  // namespace stitch
