// The manifest of one published version: what kind it is and which payload
// files it holds. Built from a version's Hugging Face index (format/index.h);
// this header is pure vocabulary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace stitch {

enum class VersionKind {
  kFull,   // a complete checkpoint: an anchor
  kDelta,  // XOR+zstd difference against the previous version of the same run
};

std::string_view VersionKindName(VersionKind k);  // "FULL" / "DELTA"

// The name of a version's index file.
inline constexpr std::string_view kIndexFileName = "model.safetensors.index.json";

struct VersionManifest {
  int64_t version = 0;
  VersionKind kind = VersionKind::kFull;
  // DELTA only: the version this one applies to (always version - 1 in a
  // valid lineage; checked by the codec, recorded as found).
  std::optional<int64_t> base_version;
  // Payload file names (the distinct values of weight_map), sorted. Empty for
  // a DELTA that changes nothing.
  std::vector<std::string> files;
  // What the index records of the weights (format/index.h): the fingerprint
  // of the version's complete weights and, for a DELTA, of the weights it
  // was encoded against; 32 lowercase hex digits, or empty where the index
  // records none (versions written by other tools, or before Stitch
  // recorded them).
  std::string weights_fingerprint;
  std::string base_weights_fingerprint;

  bool is_empty_delta() const { return kind == VersionKind::kDelta && files.empty(); }
};

// OK when `name` is a safe payload file name: relative, non-empty, no "."
// or ".." component, no backslash or NUL, at most 255 bytes per component.
// Payload names may contain subdirectories ("shards/a.safetensors").
[[nodiscard]] absl::Status ValidatePayloadFileName(std::string_view name);

}  // namespace stitch
