// A version directory as a publisher hands it to a store: the Hugging Face
// index plus the payload files its weight_map names. Shared by the store
// adapters (which check it before writing anything) and by publishers (which
// check it before reading the pointer).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "absl/status/statusor.h"
#include "stitch/core/manifest.h"

namespace stitch {

struct VersionDirContents {
  std::filesystem::path dir;
  VersionManifest manifest;
  // The index as a store keeps it: the file's own bytes when it records
  // metadata.version, else the index re-serialized with metadata.version
  // added (an index without it, or the index synthesized for a lone
  // model.safetensors).
  std::string index_json;
};

// Reads and checks `dir` as version `version` without writing anything: the
// index parses (format/index.h ReadIndex), its metadata.version, if present,
// equals `version`, every weight_map file exists as a regular file, and the
// index describes a valid manifest (CheckpointIndex::ToManifest).
// Errors name the directory and the offending file: NotFound for a missing
// directory or payload file, InvalidArgument for a bad or mismatched index.
[[nodiscard]] absl::StatusOr<VersionDirContents> ReadVersionDir(const std::filesystem::path& dir,
                                                                int64_t version);

}  // namespace stitch
