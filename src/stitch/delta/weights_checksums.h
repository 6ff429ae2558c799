// The per-tensor checksums of a version's complete weights, from which
// WeightsFingerprint (checksum.h) tells what an engine should report after
// loading that version: the anchor's tensors (a FULL version's recorded
// checksums, or its bytes hashed when it records none, as a boot checkpoint
// does), then, for each DELTA after it, the target checksums it records for
// the tensors it changes.
#pragma once

#include <filesystem>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stitch/format/checksum.h"
#include "stitch/format/tensor_checksums.h"

namespace stitch {

// The xxh3-128 of every tensor's bytes in the checkpoint in `dir` (its index
// and payload files, validated as CheckpointReader::Open does). Reads each
// tensor once, in bounded chunks. Errors name the directory and file.
[[nodiscard]] absl::StatusOr<TensorChecksums> HashCheckpointTensors(
    const std::filesystem::path& dir);

// The checksums of an anchor (a FULL version or a boot checkpoint): those it
// records (ReadRecordedChecksums: headers only), else HashCheckpointTensors.
[[nodiscard]] absl::StatusOr<TensorChecksums> AnchorChecksums(const std::filesystem::path& dir);

// Applies the DELTA version in `dir` to `checksums`: every tensor it changes
// takes the target checksum the delta records. Opens the version as
// DeltaVersion::Open does (headers only, no frame is decoded).
// InvalidArgument when it changes a tensor `checksums` lacks; `checksums` is
// then unchanged.
[[nodiscard]] absl::Status FoldDeltaChecksums(const std::filesystem::path& dir,
                                              TensorChecksums& checksums);

}  // namespace stitch
