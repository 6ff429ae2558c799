// A version directory as a publisher hands it to a store: the Hugging Face
// index plus the payload files its weight_map names. Shared by the store
// adapters (which check it before writing anything) and by publishers (which
// check it before reading the pointer).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/core/manifest.h"
#include "stitch/format/index.h"

namespace stitch {

struct VersionDirContents {
  std::filesystem::path dir;
  VersionManifest manifest;
  // The index as a store keeps it: the file's own bytes when it records
  // metadata.version, else the index re-serialized with metadata.version
  // added (an index without it, or the index synthesized for a lone
  // model.safetensors).
  std::string index_json;
  // Every other file of the directory, sorted, relative generic paths: what
  // an engine loading the directory needs besides the weights (config.json,
  // generation_config.json, tokenizer files, custom model code). A store
  // publishes them with the version, as it publishes the payload.
  std::vector<std::string> other_files;

  // The payload files and the other files: every file a store copies
  // besides the index.
  std::vector<std::string> StoredFiles() const;
};

// At most this many other files in a version directory: a checkpoint has a
// handful; thousands mean the wrong directory.
inline constexpr size_t kMaxOtherFiles = 10000;

// Reads and checks `dir` as version `version` without writing anything: the
// index parses (format/index.h ReadIndex), its metadata.version, if present,
// equals `version`, the index and every weight_map file are plain files
// (CheckPlainFile), and the index describes a valid manifest
// (CheckpointIndex::ToManifest). Every other entry of the directory tree is
// a directory or a regular file (an other file, with a safe name:
// format/index.h ValidatePayloadFileName), at most kMaxOtherFiles of them;
// entries whose name starts with '.' (and everything below such a
// directory) are not part of the version and are skipped: stores keep
// their own bookkeeping under such names, and tools leave caches and locks
// there (`.cache/huggingface/`).
// Errors name the directory and the offending file: NotFound for a missing
// directory or payload file, InvalidArgument for a bad or mismatched index,
// a link, a special file or too many files.
// The payload's contents are not read (delta/delta_verify.h does that).
[[nodiscard]] absl::StatusOr<VersionDirContents> ReadVersionDir(const std::filesystem::path& dir,
                                                                int64_t version);

// The manifest of published version `version` from the text of its stored
// index. DataLoss "<where>: version weight_vNNNNNN has a bad index: <why>"
// when the index does not parse, passes `bounds`, describes no valid
// manifest, or records another metadata.version. Shared by every store's
// ReadManifest. After a large index the memory its parse took is handed
// back to the system (ReleaseFreedMemory).
[[nodiscard]] absl::StatusOr<VersionManifest> ManifestFromIndex(std::string_view where,
                                                                int64_t version,
                                                                std::string_view text,
                                                                const IndexBounds& bounds = {});

// The DataLoss error for an index refused before it was read because it is
// larger than `bounds` (`detail` says how large).
absl::Status IndexTooLarge(std::string_view where, int64_t version, absl::string_view detail,
                           const IndexBounds& bounds);

// OK when `name` (relative, a safe payload file name) names a regular file
// inside `dir` reached through real directories: no component below `dir`
// is a symbolic link, and the file is no FIFO, socket, device or directory.
// A store copies what a version directory's names lead to, so a link would
// publish whatever it points at (a file outside the checkpoint) and a FIFO
// would hang the publisher. InvalidArgument naming the file and what it is
// otherwise; NotFound when it is missing. `dir` itself may be reached
// through links. Hard links are regular files and are accepted.
[[nodiscard]] absl::Status CheckPlainFile(const std::filesystem::path& dir, std::string_view name);

// True when some component of the relative path `name` starts with '.': not
// part of a version (ReadVersionDir).
bool IsHiddenVersionPath(std::string_view name);

// The other files of `dir` for a version described by `manifest`, as
// ReadVersionDir finds them, without requiring the payload files to be
// there (a multi-host publisher's rank holds only its own shards).
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ListOtherFiles(
    const std::filesystem::path& dir, const VersionManifest& manifest);

}  // namespace stitch
