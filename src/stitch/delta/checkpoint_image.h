// The in-memory destination of the delta codec: a checkpoint held in RAM,
// one 64-byte-aligned owned buffer per tensor, that knows which version it
// holds and can be brought to a later version by applying deltas in place.
//
// An engine that commits from memory keeps two images: it serves from one
// and stages into the other while it keeps serving, then swaps (Swap, or
// per-tensor buffer moves) during its short commit pause. The staged image
// then holds the previous version; the next ApplyDeltas folds every delta
// since that version, so no copy of the whole model is ever needed.
//
// ApplyDeltas is all or nothing: on any error (a corrupt or truncated frame,
// a checksum mismatch, a broken lineage, a missing file) the image is left
// exactly as it was. Deltas are applied in place and XOR is its own inverse:
// a failed apply re-applies the bytes it had already changed to restore
// them. Validation of the lineage and every frame header happens first, so
// that undo is rarely needed.
//
// Not thread-safe: one caller at a time; ApplyDeltas itself uses `threads`
// workers internally.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/core/version.h"
#include "stitch/delta/delta_apply.h"
#include "stitch/format/safetensors.h"
#include "stitch/io/aligned_buffer.h"

namespace stitch {

struct ImageTensor {
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  AlignedBuffer data;  // exactly numel * DTypeSize(dtype) bytes
};

struct ImageApplyResult {
  VersionRef version;  // what the image holds now
  size_t deltas_applied = 0;
  size_t tensors_changed = 0;
  uint64_t bytes_decoded = 0;
};

class CheckpointImage {
 public:
  using TensorMap = std::map<std::string, ImageTensor, std::less<>>;

  // An empty image that holds no version.
  CheckpointImage() = default;
  CheckpointImage(CheckpointImage&&) noexcept = default;
  CheckpointImage& operator=(CheckpointImage&&) noexcept = default;

  // Reads the checkpoint in `dir` (its index and payload files, validated;
  // every tensor checked against its recorded checksum when the checkpoint
  // records them, DataLoss of kind kChecksumMismatch otherwise).
  // The version it holds is the index's metadata.version, else `version`;
  // the run is the index's metadata.run_id, else `run_id`. InvalidArgument
  // when neither says which version it is.
  struct LoadOptions {
    std::string run_id;
    std::optional<int64_t> version;
    int threads = 0;
  };
  [[nodiscard]] static absl::StatusOr<CheckpointImage> Load(const std::filesystem::path& dir,
                                                            const LoadOptions& options);

  // Copies `tensors` into a new image holding `version`.
  [[nodiscard]] static absl::StatusOr<CheckpointImage> FromTensors(
      std::span<const TensorView> tensors, const VersionRef& version);

  // The version held, or nullopt for an empty image.
  const std::optional<VersionRef>& version() const { return version_; }
  const TensorMap& tensors() const { return tensors_; }
  // nullptr when absent.
  const ImageTensor* Find(std::string_view name) const;
  uint64_t total_bytes() const;

  // Views of every tensor (for EncodeDelta or WriteFullVersion), valid
  // while the image lives and is not changed.
  std::vector<TensorView> Views() const;

  // Applies the deltas in `delta_dirs` (any order) that come after the held
  // version: deltas at or before it are skipped (they are part of the image
  // already; they are still validated). The chain must continue from the
  // held version with no gap; a chain ending before the held version is
  // FailedPrecondition (reload the image from an anchor). Uses
  // options.run_id (else the run the image holds) to check the run;
  // options.anchor_version is ignored. Errors as MaterializeCheckpoint.
  [[nodiscard]] absl::StatusOr<ImageApplyResult> ApplyDeltas(
      std::span<const std::filesystem::path> delta_dirs, const ApplyOptions& options);

  // Exchanges the contents (tensors and version) of two images.
  void Swap(CheckpointImage& other) noexcept;

 private:
  TensorMap tensors_;
  std::optional<VersionRef> version_;
};

}  // namespace stitch
