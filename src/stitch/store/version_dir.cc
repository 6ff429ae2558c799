#include "stitch/store/version_dir.h"

#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/version.h"
#include "stitch/format/fileio.h"
#include "stitch/format/index.h"

namespace stitch {
namespace fs = std::filesystem;

absl::StatusOr<VersionDirContents> ReadVersionDir(const fs::path& dir, int64_t version) {
  if (absl::Status s = ValidateVersionNumber(version); !s.ok()) {
    return absl::InvalidArgumentError(s.message());
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("version directory ", dir.string(), " does not exist or is not a directory"));
  }
  auto index = ReadIndex(dir);
  if (!index.ok()) return index.status();
  auto recorded = index->version();
  if (!recorded.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir.string(), ": ", recorded.status().message()));
  }
  VersionDirContents out;
  out.dir = dir;
  if (recorded->has_value()) {
    if (**recorded != version) {
      return absl::InvalidArgumentError(absl::StrCat((dir / kIndexFileName).string(),
                                                     " records metadata.version ", **recorded,
                                                     " but is being published as version ", version,
                                                     "; rename the directory or fix the index"));
    }
    auto bytes = ReadFileToString(dir / kIndexFileName);
    if (!bytes.ok()) return bytes.status();
    out.index_json = *std::move(bytes);
  } else {
    index->metadata["version"] = VersionMetadataString(version);
    out.index_json = index->ToJson();
  }
  auto manifest = index->ToManifest();
  if (!manifest.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat((dir / kIndexFileName).string(), ": ", manifest.status().message()));
  }
  out.manifest = *std::move(manifest);
  for (const std::string& name : out.manifest.files) {
    fs::path file = dir / name;
    if (!fs::is_regular_file(file, ec)) {
      return absl::NotFoundError(absl::StrCat(
          dir.string(), ": payload file \"", absl::CEscape(name),
          "\" named by the index's weight_map is missing; write every shard before publishing"));
    }
  }
  return out;
}

}  // namespace stitch
