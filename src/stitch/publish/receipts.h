// Upload receipts: what each host of a multi-host trainer says it put in the
// store for one version, and the check that the receipts together form that
// version before the pointer may move.
//
// A receipt is JSON:
//   {"version": 7, "host": "rank-000000",
//    "files": [{"file": "model-00001-of-00002.safetensors", "size": 123,
//               "sha256": "<64 hex>", "tensors": ["a", "b"]}, ...]}
// `tensors` lists the tensors the host found in the file when it checked it
// (the index may be on another host); it is omitted when empty.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/core/manifest.h"

namespace stitch {

struct FileReceipt {
  std::string file;  // a payload file name, relative to the version directory
  uint64_t size = 0;
  std::string sha256;  // 64 lowercase hex digits
  // The tensors the file holds, sorted (empty when the host did not say).
  std::vector<std::string> tensors;

  friend bool operator==(const FileReceipt&, const FileReceipt&) = default;
};

struct UploadReceipt {
  int64_t version = 0;
  std::string host;
  std::vector<FileReceipt> files;
};

std::string ReceiptToJson(const UploadReceipt& receipt);

// Parses and validates a receipt: a version number, a non-empty host, and
// files with safe payload names (ValidatePayloadFileName), each listed
// once, and 64-hex SHA-256s. InvalidArgument naming what is wrong.
[[nodiscard]] absl::StatusOr<UploadReceipt> ReceiptFromJson(std::string_view json);

// What the store holds for each named file (its size and recorded
// SHA-256), in the order asked; an error for a missing file.
using StatFilesFn =
    std::function<absl::StatusOr<std::vector<FileReceipt>>(const std::vector<std::string>& files)>;

// Verifies that `receipts` together are exactly version `version` as
// `manifest` (the version's index; nullopt when it is missing) describes,
// and that the store holds what they say. Checks, in order:
//   - every receipt is for `version` (InvalidArgument otherwise);
//   - no two receipts disagree about one file (FailedPrecondition naming
//     the file and both hosts);
//   - the index is present (FailedPrecondition);
//   - every weight_map file is covered by a receipt (FailedPrecondition
//     naming the missing files), and no receipt names a file the index does
//     not (FailedPrecondition naming it and its host);
//   - `stat` reports every file with the receipted size and SHA-256
//     (DataLoss of kind kChecksumMismatch otherwise: it changed after the
//     upload).
// Messages start with `where`. Returns the merged receipts, sorted by file.
// Checks that the tensors each of `files` (as VerifyReceipts returns them)
// lists are exactly those `weight_map` (the index's: tensor -> file) maps
// to that file, so that the index agrees with payload files it never saw.
// FailedPrecondition naming the tensor and the file otherwise. Messages
// start with `where`.
[[nodiscard]] absl::Status CheckReceiptTensors(std::string_view where, int64_t version,
                                               const std::map<std::string, std::string>& weight_map,
                                               std::span<const FileReceipt> files);

[[nodiscard]] absl::StatusOr<std::vector<FileReceipt>> VerifyReceipts(
    std::string_view where, int64_t version, const std::optional<VersionManifest>& manifest,
    std::span<const UploadReceipt> receipts, const StatFilesFn& stat);

}  // namespace stitch
