// Verifying a version directory on its own, and a DELTA against its base.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/core/manifest.h"
#include "stitch/delta/delta_kernel.h"

namespace stitch {

struct VerifyOptions {
  int threads = 0;                   // 0: DefaultThreads()
  ProgressMeter::Callback progress;  // may be called from any worker thread
};

struct VerifyReport {
  VersionKind kind = VersionKind::kFull;
  std::optional<int64_t> version;       // absent for a checkpoint whose index records none
  std::optional<int64_t> base_version;  // DELTA only
  size_t files = 0;
  size_t tensors = 0;          // FULL: all tensors; DELTA: the changed ones
  uint64_t bytes = 0;          // FULL: tensor bytes; DELTA: decoded bytes of the changed tensors
  uint64_t payload_bytes = 0;  // size of the payload files
  // DELTA: checked against its base. FULL: the checksums it records were
  // checked (false when it records none).
  bool checksums_verified = false;
};

// Checks the version in `dir`.
//   FULL (or any checkpoint): the index, every payload file's presence and
//   header, and that the weight_map agrees with the files; when it records
//   checksums (checkpoint_reader.h), every tensor's bytes against its
//   checksum (DataLoss of kind kChecksumMismatch otherwise).
//   DELTA: everything DeltaVersion::Open checks, then decodes every frame in
//   full: it must be intact, decode to its recorded content size, and have
//   nothing after it. With `base_dir` (the complete checkpoint of the
//   version the delta applies to), also that every changed tensor exists in
//   the base with the size its frame decodes to, and that base XOR frame
//   hashes to the recorded checksum (DataLoss of kind kChecksumMismatch
//   otherwise). A base whose index records a version must record
//   base_version.
// `base_dir` with a FULL version is InvalidArgument. Errors are one line
// naming the file and tensor.
[[nodiscard]] absl::StatusOr<VerifyReport> VerifyVersion(
    const std::filesystem::path& dir, const std::optional<std::filesystem::path>& base_dir,
    const VerifyOptions& options);

// What the index says about the payload files of one version.
struct PayloadFileKind {
  VersionKind kind = VersionKind::kFull;
  int64_t version = 0;             // labels DELTA frames in messages
  bool records_checksums = false;  // FULL: the index says checksum_format "xxh3-128"
};

// Checks the payload file `name` of the version directory `dir` on its own,
// without the index or the other files (a host of a multi-host trainer holds
// only its own): the safetensors header (bounds, overlaps, shapes); for a
// DELTA, every entry as DeltaVersion::Open checks it and every frame decoded
// whole to its recorded size; for a FULL version that records checksums,
// every tensor against the checksum in the file's `__metadata__`. Returns
// the names of the tensors the file holds (in file order), for the holder
// of the index to check against its weight_map. Errors as VerifyVersion.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> VerifyPayloadFile(
    const std::filesystem::path& dir, const std::string& name, const PayloadFileKind& kind,
    const VerifyOptions& options);

}  // namespace stitch
