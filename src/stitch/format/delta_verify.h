// Verifying a version directory on its own, and a DELTA against its base.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "stitch/core/manifest.h"
#include "stitch/format/delta_kernel.h"

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

}  // namespace stitch
