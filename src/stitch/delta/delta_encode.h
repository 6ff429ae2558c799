// Writing versions: DELTA versions from a base and a target checkpoint, and
// FULL versions (anchors). See docs/design.md, "Delta format".
//
// A DELTA directory holds the index and payload files. Each payload entry is
// named after a changed target tensor and holds, as U8 [n], the zstd frame
// of target XOR base; the file's __metadata__ maps the tensor to the
// xxh3-128 (canonical hex) of the complete target tensor. Unchanged tensors
// are left out; an unchanged model gives an index and no payload files.
// Payload entries are sorted by tensor name and spread over shards of at
// most `max_shard_bytes` (a frame larger than that gets a shard of its own).
//
// How memory stays bounded: tensors are encoded in parallel, each streamed
// in chunks; compressed sizes are only known at the end, so each worker
// appends its frames to a scratch file in the output's temporary directory,
// and the shards are assembled from those files (header first) once every
// tensor is done. Compressed bytes are therefore written twice; they are a
// small fraction of the checkpoint for the deltas this format is for.
//
// Output directories appear atomically and durably: everything is written
// to a temporary sibling, fsync'ed and renamed into place. `out_dir` must not
// exist or be an empty directory. On error nothing is left behind.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/delta/delta_kernel.h"
#include "stitch/format/safetensors.h"

namespace stitch {

inline constexpr uint64_t kDefaultMaxShardBytes = uint64_t{2} << 30;

struct EncodeOptions {
  int64_t version = 0;  // the version the delta produces
  // The version it applies to. Default: the base directory's metadata.version
  // when it records one; required for a base that records none (a boot
  // checkpoint, tensors in memory): the encoder never assumes it
  // (InvalidArgument). When both are known they must agree, and it must be
  // version - 1: a delta always applies to the version just before it.
  std::optional<int64_t> base_version;
  // zstd level: up to kZeroRunMaxLevel the codec's zero-run parser
  // (delta_kernel.h), above it zstd's match finders.
  int level = kDefaultZstdLevel;
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  std::string run_id;                // recorded as metadata.run_id when non-empty
  int threads = 0;                   // 0: DefaultThreads()
  ProgressMeter::Callback progress;  // may be called from any worker thread
};

struct EncodeResult {
  int64_t version = 0;
  int64_t base_version = 0;
  size_t tensors = 0;
  size_t changed_tensors = 0;
  uint64_t checkpoint_bytes = 0;   // bytes of the target's tensors
  uint64_t payload_bytes = 0;      // bytes of the payload files written
  std::vector<std::string> files;  // payload file names
};

// Encodes the delta from the checkpoint in `base_dir` to the one in
// `target_dir` into `out_dir`. Both must hold the same tensor names with the
// same dtypes and shapes: otherwise InvalidArgument naming the tensor (a
// delta cannot add, remove or reshape tensors; write a FULL version).
[[nodiscard]] absl::StatusOr<EncodeResult> EncodeDelta(const std::filesystem::path& base_dir,
                                                       const std::filesystem::path& target_dir,
                                                       const std::filesystem::path& out_dir,
                                                       const EncodeOptions& options);

// The same from tensors in memory (live arrays of a trainer). The spans must
// stay valid and unchanged during the call. Tensor names must be unique.
[[nodiscard]] absl::StatusOr<EncodeResult> EncodeDelta(std::span<const TensorView> base,
                                                       std::span<const TensorView> target,
                                                       const std::filesystem::path& out_dir,
                                                       const EncodeOptions& options);

// The same, where the base is the caller's own writable copy of the
// previous version (a trainer's snapshot of the weights it last published),
// and it advances to the target in the same pass: each base tensor is
// overwritten with its target's bytes chunk by chunk as it is encoded, so on
// success `base` equals `target` without a second copy. The base's memory
// must be writable and must not overlap the target's. Invalid input (names,
// dtypes, shapes, the output directory) is refused before any byte is
// written; an error after that says so (BaseWasAdvanced): the base is then
// partly advanced, no version at all, and must not be the base of another
// delta.
[[nodiscard]] absl::StatusOr<EncodeResult> EncodeDeltaAdvancingBase(
    std::span<const TensorView> base, std::span<const TensorView> target,
    const std::filesystem::path& out_dir, const EncodeOptions& options);

// Whether an error of EncodeDeltaAdvancingBase left the base partly advanced.
bool BaseWasAdvanced(const absl::Status& status);

struct FullVersionOptions {
  int64_t version = 0;
  std::string run_id;                                // recorded as metadata.run_id when non-empty
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;  // for the in-memory writer
};

struct FullVersionResult {
  int64_t version = 0;
  size_t tensors = 0;
  uint64_t checkpoint_bytes = 0;
  std::vector<std::string> files;
};

// Writes a FULL version: a copy of the checkpoint in `checkpoint_dir` (its
// index and payload files, validated first) whose index records
// metadata.version (and run_id). Delta metadata keys are dropped.
// Checksums: each payload file's `__metadata__` maps every tensor of that
// file to the xxh3-128 of its bytes (32 hex, checksum.h; other metadata
// keys are kept), and the index records `checksum_format: "xxh3-128"`, so
// every reader can check the bytes (checkpoint_reader.h). A source that
// records checksums already is checked against them (DataLoss of kind
// kChecksumMismatch).
[[nodiscard]] absl::StatusOr<FullVersionResult> WriteFullVersion(
    const std::filesystem::path& checkpoint_dir, const std::filesystem::path& out_dir,
    const FullVersionOptions& options);

// The same from tensors in memory, written as shards
// "model-00001-of-0000N.safetensors" of at most max_shard_bytes each, with
// the same checksums.
[[nodiscard]] absl::StatusOr<FullVersionResult> WriteFullVersion(
    std::span<const TensorView> tensors, const std::filesystem::path& out_dir,
    const FullVersionOptions& options);

}  // namespace stitch
