#include "stitch/store/version_dir.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <set>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/version.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/io/memory.h"

namespace stitch {
namespace fs = std::filesystem;
namespace {

std::string_view FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ListOtherFiles(const fs::path& dir,
                                                        const VersionManifest& manifest) {
  std::set<std::string> taken(manifest.files.begin(), manifest.files.end());
  taken.insert(std::string(kIndexFileName));
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::file_status st = it->symlink_status(ec);
    if (ec) break;
    if (it->path().filename().string().starts_with('.')) {
      if (fs::is_directory(st)) it.disable_recursion_pending();
      continue;
    }
    if (fs::is_directory(st)) continue;
    const std::string rel = it->path().lexically_relative(dir).generic_string();
    if (taken.contains(rel)) continue;
    if (!fs::is_regular_file(st)) {
      // CheckPlainFile says what it is (a link and its target, a FIFO...).
      absl::Status plain = CheckPlainFile(dir, rel);
      if (!plain.ok()) return plain;
      return absl::InvalidArgumentError(
          absl::StrCat(dir.string(), ": \"", absl::CEscape(rel), "\" is not a regular file"));
    }
    if (absl::Status s = ValidatePayloadFileName(rel); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(dir.string(), ": ", s.message()));
    }
    if (out.size() >= kMaxOtherFiles) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir.string(), ": holds more than ", kMaxOtherFiles,
          " files besides its weights; a version directory holds one checkpoint: publish the "
          "directory the trainer wrote the version into"));
    }
    out.push_back(rel);
  }
  if (ec) {
    return absl::InternalError(absl::StrCat("list ", dir.string(), ": ", ec.message()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> VersionDirContents::StoredFiles() const {
  std::vector<std::string> out = manifest.files;
  out.insert(out.end(), other_files.begin(), other_files.end());
  return out;
}

bool IsHiddenVersionPath(std::string_view name) {
  for (const fs::path& part : fs::path(name)) {
    if (part.string().starts_with('.')) return true;
  }
  return false;
}

absl::Status CheckPlainFile(const fs::path& dir, std::string_view name) {
  const fs::path rel(name);
  fs::path at = dir;
  std::string shown;  // the components walked so far, "shards/a.safetensors"
  for (auto it = rel.begin(); it != rel.end(); ++it) {
    at /= *it;
    absl::StrAppend(&shown, shown.empty() ? "" : "/", it->string());
    const bool last = std::next(it) == rel.end();
    struct stat st;
    if (::lstat(at.c_str(), &st) != 0) {
      if (errno == ENOENT) {
        return absl::NotFoundError(
            absl::StrCat(dir.string(), ": \"", absl::CEscape(shown), "\" does not exist"));
      }
      return ErrnoStatus(errno, "stat", at);
    }
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      const fs::path target = fs::read_symlink(at, ec);
      return absl::InvalidArgumentError(absl::StrCat(
          dir.string(), ": \"", absl::CEscape(shown), "\" is a symbolic link",
          ec ? std::string() : absl::StrCat(" to ", target.string()),
          "; a version directory holds only regular files: copy the file in (stitch delta full "
          "makes a version of a checkpoint made of links)"));
    }
    if (!last && !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir.string(), ": \"", absl::CEscape(shown), "\" is not a directory"));
    }
    if (last && !S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir.string(), ": \"", absl::CEscape(shown), "\" is ", AbslView(FileTypeName(st.st_mode)),
          "; a version directory holds only regular files"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<VersionDirContents> ReadVersionDir(const fs::path& dir, int64_t version) {
  if (absl::Status s = ValidateVersionNumber(version); !s.ok()) {
    return absl::InvalidArgumentError(s.message());
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("version directory ", dir.string(), " does not exist or is not a directory"));
  }
  if (absl::Status s = CheckPlainFile(dir, kIndexFileName); !s.ok() && !absl::IsNotFound(s)) {
    return s;
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
    absl::Status plain = CheckPlainFile(dir, name);
    if (absl::IsNotFound(plain)) {
      return absl::NotFoundError(absl::StrCat(
          dir.string(), ": payload file \"", absl::CEscape(name),
          "\" named by the index's weight_map is missing; write every shard before publishing"));
    }
    if (!plain.ok()) return plain;
  }
  auto others = ListOtherFiles(dir, out.manifest);
  if (!others.ok()) return others.status();
  out.other_files = *std::move(others);
  return out;
}

namespace {

std::string BadIndexPrefix(std::string_view where, int64_t version) {
  return absl::StrCat(AbslView(where), ": version ", VersionDirName(version), " has a bad index: ");
}

absl::StatusOr<VersionManifest> ParseManifest(std::string_view where, int64_t version,
                                              std::string_view text, const IndexBounds& bounds) {
  auto corrupt = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(BadIndexPrefix(where, version), why));
  };
  auto index = CheckpointIndex::Parse(text, bounds);
  if (!index.ok()) return corrupt(index.status().message());
  auto manifest = index->ToManifest();
  if (!manifest.ok()) return corrupt(manifest.status().message());
  if (manifest->version != version) {
    return corrupt(absl::StrCat("it records metadata.version ", manifest->version));
  }
  return manifest;
}

}  // namespace

absl::StatusOr<VersionManifest> ManifestFromIndex(std::string_view where, int64_t version,
                                                  std::string_view text,
                                                  const IndexBounds& bounds) {
  // Past this size the parse's transient memory (the JSON document and the
  // weight map, several times the text) is worth handing back at once.
  constexpr size_t kLargeIndexBytes = size_t{16} << 20;
  absl::StatusOr<VersionManifest> manifest = ParseManifest(where, version, text, bounds);
  if (text.size() >= kLargeIndexBytes) ReleaseFreedMemory();
  return manifest;
}

absl::Status IndexTooLarge(std::string_view where, int64_t version, absl::string_view detail,
                           const IndexBounds& bounds) {
  return absl::DataLossError(
      absl::StrCat(BadIndexPrefix(where, version), detail, " (", bounds.why, ")"));
}

}  // namespace stitch
