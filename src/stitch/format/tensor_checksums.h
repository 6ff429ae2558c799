// The per-tensor checksums a version directory records, for code that
// identifies weights without reading them (a weights fingerprint, say).
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "stitch/format/checksum.h"

namespace stitch {

// Tensor name -> xxh3-128 of the tensor's bytes (checksum.h).
using TensorChecksums = std::map<std::string, Checksum128, std::less<>>;

// Contract: the complete per-tensor checksums the checkpoint in `dir`
// records, exactly as recorded.
//   - A FULL version whose index metadata has `checksum_format: "xxh3-128"`
//     (every FULL version Stitch writes): one entry for every tensor of the
//     index's weight_map, read from the `__metadata__` of the payload file
//     holding it (the tensor's name maps to the 32-hex canonical xxh3-128 of
//     its bytes, the form deltas use).
//   - nullopt for a checkpoint that records none: an index without
//     checksum_format (a FULL version written before Stitch recorded them, a
//     boot checkpoint, a directory `stitch delta apply` materialized) or a
//     single model.safetensors without an index.
// Errors: InvalidArgument for a DELTA version (it records checksums only of
// the tensors it changes, and of their target bytes: apply it to a
// checkpoint first), for an unsupported checksum_format, and for a recorded
// checksum that is missing or not 32 hex digits (naming the file and
// tensor); NotFound for a missing directory, index or payload file; the
// reader's other errors (CheckpointReader::Open) pass through.
// Reads only the index and the payload files' headers, never the tensor
// bytes, so it neither costs a pass over the weights nor checks them
// against the checksums (VerifyVersion does). Thread-safe.
[[nodiscard]] absl::StatusOr<std::optional<TensorChecksums>> ReadRecordedChecksums(
    const std::filesystem::path& dir);

}  // namespace stitch
