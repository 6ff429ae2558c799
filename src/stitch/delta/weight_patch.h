// Weight patches: what an engine needs to bring its loaded weights from one
// version to a later one in place, with nothing read from disk or the store
// while it is paused (docs/engine.md, "In-place patches").
//
// A patch is a safetensors file. For every tensor the deltas change, over
// the elements (not bytes) that differ:
//   "<tensor>::idx"  I64 [k]  flat element positions, ascending
//   "<tensor>::xor"  [k]      old XOR new, as the unsigned integer of the
//                             element's width (U8, I16, I32 or I64: the bits,
//                             not a number)
//   "<tensor>::new"  [k]      the new elements, same dtype as ::xor
// and its `__metadata__` key "stitch_patch" holds JSON:
//   {"format": "stitch-weight-patch/1", "from": "<run>/weight_vNNNNNN",
//    "to": "...", "values_changed": N, "values_total": N,
//    "tensors": {"<tensor>": {"dtype": "BF16", "shape": [...],
//                             "checksum": "<xxh3-128 of the whole new tensor>"}},
//    "shapes": {"<every tensor of the checkpoint>": [...]}}
// `shapes` lets an engine place a checkpoint tensor inside a fused
// parameter (q/k/v rows in one qkv projection) without reading anything
// else. An engine applies a patch by checking that the elements at ::idx
// are ::new XOR ::xor (the old version's), writing ::new there, and reading
// them back; XOR being its own inverse, the old elements are ::new XOR
// ::xor, which is how a part-way failure is undone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/core/version.h"
#include "stitch/format/checksum.h"
#include "stitch/format/safetensors.h"

namespace stitch {

inline constexpr std::string_view kWeightPatchFormat = "stitch-weight-patch/1";
inline constexpr std::string_view kWeightPatchMetadataKey = "stitch_patch";

struct WeightPatchOptions {
  VersionRef from;  // what the engine holds; the first delta applies to it
  VersionRef to;    // the last delta's version, held by `target_dir`
  // A patch changing more than this share of the model's elements is not
  // written (FailedPrecondition): a full reload is the better path.
  double max_density = 0.3;
};

struct WeightPatchStats {
  size_t tensors = 0;           // tensors the patch changes
  uint64_t values_changed = 0;  // elements that differ
  uint64_t values_total = 0;    // elements of the whole checkpoint
  uint64_t file_bytes = 0;
  double density() const {
    return values_total == 0
               ? 0.0
               : static_cast<double>(values_changed) / static_cast<double>(values_total);
  }
};

// One changed tensor of a patch, in memory.
struct TensorPatch {
  std::string name;
  DType dtype = DType::kU8;  // the tensor's own
  std::vector<int64_t> shape;
  Checksum128 checksum;             // xxh3-128 of the whole new tensor
  std::vector<int64_t> idx;         // flat element positions, ascending
  std::vector<std::byte> xor_bits;  // DTypeSize(dtype) bytes per position
  std::vector<std::byte> new_bits;  // likewise
};

// A patch in memory: what the file holds, minus the shapes of the tensors
// it leaves alone.
struct WeightPatch {
  VersionRef from;
  VersionRef to;
  WeightPatchStats stats;            // file_bytes is 0
  std::vector<TensorPatch> tensors;  // by name
};

// One tensor of the version a patch leads to, where its bytes come from.
struct PatchTargetTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  // Copies the tensor's `nbytes` bytes into `out` (out.size() == nbytes).
  // Called from several threads at once.
  std::function<absl::Status(std::span<std::byte> out)> read;
};

// Builds the patch from `options.from` to `options.to` out of the DELTA
// versions in `delta_dirs` (any order; consecutive, the first applying to
// `from`, the last producing `to`) and the tensors of `to` (`target`, all
// of them; `where` names them in errors). Every changed tensor's folded
// result is checked against the checksum the last delta records. Errors:
// InvalidArgument for a chain that does not run from `from` to `to` or a
// delta changing a tensor `target` lacks or sizes otherwise; DataLoss (kind
// kChecksumMismatch) when the target's bytes are not the deltas' target;
// FailedPrecondition, saying how dense, when the patch would exceed
// options.max_density; codec errors pass through.
[[nodiscard]] absl::StatusOr<WeightPatch> BuildWeightPatch(
    std::span<const std::filesystem::path> delta_dirs, std::span<const PatchTargetTensor> target,
    std::string_view where, const WeightPatchOptions& options);

// Writes the patch from `options.from` to `options.to` into `out` (a
// temporary sibling renamed into place; temporary siblings a crashed writer
// left are removed first: one writer per `out` at a time), from the DELTA versions in
// `delta_dirs` (any order; consecutive, the first applying to from, the
// last producing to) and the checkpoint `target_dir` materialized at `to`
// (its tensors' new bytes, dtypes and shapes): BuildWeightPatch over that
// checkpoint, whose errors it returns; I/O errors pass through.
[[nodiscard]] absl::StatusOr<WeightPatchStats> WriteWeightPatch(
    std::span<const std::filesystem::path> delta_dirs, const std::filesystem::path& target_dir,
    const std::filesystem::path& out, const WeightPatchOptions& options);

}  // namespace stitch
