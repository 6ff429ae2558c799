#include "stitch/publish/publish.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/pointer.h"
#include "stitch/publish/wake.h"
#include "stitch/store/version_dir.h"

namespace stitch {
namespace fs = std::filesystem;

absl::StatusOr<VersionRef> PublishVersion(Store& store, const fs::path& dir, Pool* pool) {
  const std::string where = absl::StrCat("store ", store.uri());
  if (absl::Status s = ValidateRunId(store.run_id()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": cannot publish: ", s.message()));
  }
  fs::path version_dir = dir.lexically_normal();
  if (!version_dir.has_filename()) version_dir = version_dir.parent_path();
  const std::string name = version_dir.filename().string();
  auto number = ParseVersionDirName(name);
  if (!number.ok() || VersionDirName(*number) != name) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": cannot publish ", dir.string(), ": \"", absl::CEscape(name),
        "\" is not a version identity; name the directory weight_vNNNNNN (six digits or more, "
        "zero padded)"));
  }
  const VersionRef ref{store.run_id(), *number};

  // Everything the store will need must be there before anything is written.
  if (auto contents = ReadVersionDir(version_dir, ref.version); !contents.ok()) {
    return Annotate(contents.status(), where);
  }

  if (absl::Status s = store.Refresh(); !s.ok()) return s;
  auto pointer = store.ReadPointer();
  if (!pointer.ok()) return pointer.status();
  if (!*pointer || (*pointer)->run_id != ref.run_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": run ", ref.run_id, " is not claimed (the pointer ",
        *pointer ? absl::StrCat("names ", (*pointer)->ToString()) : std::string("is unset"),
        "); run `stitch claim` first"));
  }
  if (auto move = CheckPointerMove(where, *pointer, ref); !move.ok()) return move.status();

  if (absl::Status s = store.PublishFiles(ref.version, version_dir); !s.ok()) return s;
  if (absl::Status s = store.AdvancePointer(*pointer, ref); !s.ok()) return s;
  WakeAfterMove(pool, ref);
  return ref;
}

}  // namespace stitch
