// The Hugging Face sharded-checkpoint index, `model.safetensors.index.json`:
//   {"metadata": {"version": "000007", ...}, "weight_map": {"<tensor>": "<file>"}}
// Stitch's metadata keys: `version` (the version number as a string, zero
// padded to six digits), and for DELTA versions `delta_encoding: "xor"`,
// `compression_format: "zstd"`, `checksum_format: "xxh3-128"` and
// `base_version`. A FULL version Stitch writes records `checksum_format:
// "xxh3-128"` too: its payload files' `__metadata__` then hold every
// tensor's checksum (checksum.h, ReadRecordedChecksums). Stitch's writers
// also record `weights_fingerprint`, the WeightsFingerprint (checksum.h) of
// the version's complete weights, and a DELTA `base_weights_fingerprint`,
// that of the weights it was encoded against: a publisher compares the two
// to refuse a delta made against other weights than the version it would
// follow, without reading either's bytes. Other metadata keys are preserved.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "stitch/core/manifest.h"

namespace stitch {

// Bounds on one version's index, checked wherever an index is read
// (publishers and replicas alike). The largest open checkpoints are
// mixture-of-experts models with about 100,000 tensors (DeepSeek-V3 about
// 92,000; Kimi K2 about 140,000 with its FP8 scales), so ten times that
// leaves room for models with many more experts. An index beyond it is a
// generator gone wrong, and every replica would parse and index it again on
// each reconcile. The byte bound allows a million entries with long names
// (about 250 bytes each) and keeps a corrupt index from being read whole.
inline constexpr size_t kMaxIndexTensors = 1'000'000;
inline constexpr uint64_t kMaxIndexBytes = uint64_t{256} << 20;

struct CheckpointIndex;

// How large an index may be where it is read: every index is held to the
// defaults above; a replica holds the versions it reads to what its base
// checkpoint can hold (IndexBoundsFor), so that an index written to fill its
// memory is refused before it is read.
struct IndexBounds {
  size_t max_tensors = kMaxIndexTensors;
  uint64_t max_bytes = kMaxIndexBytes;
  // Why these bounds, for the error that names them.
  std::string why = "ten times the largest mixture-of-experts checkpoints";
};

// The bounds for a version of the checkpoint whose index is `base`: twice its
// tensors and 16 more (room for a writer that stores a tied weight apart),
// each entry at most as long as the base's longest name written with every
// character escaped, plus a file name, and 1 MiB of metadata; never above
// the defaults.
IndexBounds IndexBoundsFor(const CheckpointIndex& base);

inline constexpr std::string_view kWeightsFingerprintKey = "weights_fingerprint";
inline constexpr std::string_view kBaseFingerprintKey = "base_weights_fingerprint";

struct CheckpointIndex {
  // String-valued metadata. Non-string metadata values (HF's "total_size" is
  // a number) are kept as their JSON text in `other_metadata` and written
  // back unchanged.
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::string> other_metadata;
  std::map<std::string, std::string> weight_map;  // tensor name -> payload file

  // metadata.version parsed, if present, as the original Python Stitch reads
  // it (int()): a string of decimal digits ("000007"; surrounding whitespace,
  // a leading '+' and '_' between digits as int() takes them) or a JSON
  // integer or whole number (7, 7.0), no larger than kMaxVersion. Anything
  // else is an InvalidArgument error. base_version is read the same way.
  [[nodiscard]] absl::StatusOr<std::optional<int64_t>> version() const;
  // Whether metadata has a `delta_encoding` key (of any type).
  bool is_delta() const;

  // The manifest this index describes. Requires metadata.version; a DELTA
  // needs the four delta keys with the supported values; every weight_map
  // value must be a safe payload file name. InvalidArgument errors name the
  // missing key or the unsupported value.
  [[nodiscard]] absl::StatusOr<VersionManifest> ToManifest() const;

  // Parses and validates: at most bounds.max_bytes of text, an object with
  // an optional object `metadata` and an object `weight_map` of at most
  // bounds.max_tensors string values, each a safe payload file name
  // (ValidatePayloadFileName). A key repeated inside any object is an error;
  // other top-level keys are ignored.
  [[nodiscard]] static absl::StatusOr<CheckpointIndex> Parse(std::string_view json,
                                                             const IndexBounds& bounds = {});
  // Compact JSON with keys in sorted order (deterministic). `other_metadata`
  // text that is not JSON is written as a string; a key in both maps is
  // written from `metadata`.
  std::string ToJson() const;
};

// Reads `<dir>/model.safetensors.index.json` (InvalidArgument, before
// reading it, when it is larger than kMaxIndexBytes). When the directory has no index
// but a `model.safetensors`, returns a synthesized index mapping its tensors
// to it (single-file checkpoints), with no metadata. NotFound, naming `dir`,
// when it has neither; errors in the files name the file.
[[nodiscard]] absl::StatusOr<CheckpointIndex> ReadIndex(const std::filesystem::path& dir);

// Writes the index into `dir` durably (temp file, fsync, rename, fsync dir).
// Refuses (InvalidArgument) an index with an unsafe payload file name.
[[nodiscard]] absl::Status WriteIndex(const std::filesystem::path& dir,
                                      const CheckpointIndex& index);

// The zero-padded metadata form of a version number: "000007".
std::string VersionMetadataString(int64_t version);

}  // namespace stitch
