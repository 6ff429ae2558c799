// A lineage of DELTA versions: consecutive versions of one run, each
// applying to the one before it. Shared by the directory and in-memory
// destinations (delta_apply.h, checkpoint_image.h), which check how the
// chain connects to what they start from.
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
#include "stitch/delta/delta_kernel.h"
#include "stitch/delta/delta_version.h"
#include "stitch/format/checksum.h"

namespace stitch {

struct DeltaChain {
  // The run every version belongs to: the caller's, else the one the
  // versions' metadata names; "" when nobody names one.
  std::string run_id;
  // Sorted, consecutive: deltas[i].version() == deltas[i].base_version() + 1
  // == deltas[i - 1].version() + 1.
  std::vector<DeltaVersion> deltas;

  bool empty() const { return deltas.empty(); }
  // The version the first delta applies to. REQUIRES: !empty().
  int64_t base_version() const { return deltas.front().base_version(); }
  // The version the last delta produces. REQUIRES: !empty().
  int64_t target_version() const { return deltas.back().version(); }
};

// Opens every directory as a DeltaVersion (any order), sorts them by version
// and checks the lineage: no version twice, every delta's base_version is
// the version before it, no gap, and every version that names a run names
// `run_id` (or, when `run_id` is empty, the same run as the others).
// Errors are InvalidArgument (FailedPrecondition for a version of another
// run) naming the directories involved; errors opening a version pass
// through.
[[nodiscard]] absl::StatusOr<DeltaChain> OpenDeltaChain(std::span<const std::filesystem::path> dirs,
                                                        std::string_view run_id);

// What one tensor goes through in a chain.
struct TensorChange {
  std::vector<FrameRef> frames;          // in chain order
  Checksum128 expected;                  // of the final target (from the last delta)
  std::optional<uint64_t> content_size;  // recorded by some frame header
};

// The changes made by chain.deltas[first...], by tensor name. Frames refer
// to the chain's open files: the chain must outlive the result.
std::map<std::string, TensorChange, std::less<>> PlanChanges(const DeltaChain& chain, size_t first);

// Checks every entry of every delta in `chain` against the tensors of the
// checkpoint it applies to: `size_of(name)` is the tensor's byte size, or
// nullopt when there is no such tensor. DataLoss naming the delta and
// tensor when a frame header's content size disagrees; InvalidArgument when
// a delta changes a tensor the checkpoint does not have.
[[nodiscard]] absl::Status CheckChainAgainst(
    const DeltaChain& chain,
    const std::function<std::optional<uint64_t>(std::string_view)>& size_of);

}  // namespace stitch
