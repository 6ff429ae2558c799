// Staged weight updates for the reference engine (docs/design.md, "Engine
// protocol"): preparing a target version while the engine keeps serving, so
// that committing it later is short.
//
//   disk: materialize the target checkpoint into a local directory with the
//         delta codec (delta_apply.h); the commit then loads that directory
//         (POST /update_weights_from_disk).
//   cpu:  bring an in-memory image of the checkpoint (checkpoint_image.h) to
//         the target, then prepare what the commit needs: when the target
//         follows the serving version by DELTAs only, the weight patch
//         between them (delta/weight_patch.h), which the commit applies in
//         place (ModelWeights::ApplyPatch: a pause bounded by the values
//         that changed); otherwise, or when the patch would be dense, the
//         target's float32 weights, which the commit swaps in (a pointer
//         swap). Either way the reason is recorded.
//
// Where the bytes come from: `checkpoint_source_dir` is a store's `updates/`
// directory (one `weight_vNNNNNN` per version). From the target, the stager
// walks back through each DELTA's base version until a FULL version (an
// anchor), the base version (whose checkpoint is `base_checkpoint_dir`, the
// engine's boot checkpoint), or, for cpu, the version the image already holds
// for the same run and base. It then applies the DELTAs after that point, in
// order. Without a `checkpoint_source_dir` the target must be the base
// version: that initializes the destination.
//
// Failures leave the serving weights untouched, and leave the destination
// holding what it held before (the codec's all-or-nothing guarantees).
//
// Thread-safe. Stage() blocks (disk, codec work): call it from a worker
// thread. One staging runs at a time; another concurrent one is refused.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "stitch/api/update_destination.h"
#include "stitch/core/version.h"
#include "stitch/delta/checkpoint_image.h"
#include "stitch/refengine/config.h"
#include "stitch/refengine/weights.h"

namespace stitch {

struct StageRequest {
  // The boot checkpoint (config.json plus weights) and its version.
  std::filesystem::path base_checkpoint_dir;
  int64_t base_version = 0;
  int64_t target_version = 0;
  // The run the versions belong to; "" when the caller names none (the
  // versions' own metadata must then agree).
  std::string run_id;
  UpdateDestination destination = UpdateDestination::kDisk;
  // A store's updates/ directory; nullopt initializes at the base version.
  std::optional<std::filesystem::path> checkpoint_source_dir;
  // An anchor written after the fact (store.h Store::anchors()): a FULL copy
  // of version `anchor_version` that the walk back from the target stops
  // at, in place of that version's DELTA. nullopt: none.
  std::optional<std::filesystem::path> anchor_dir;
  int64_t anchor_version = 0;
  // disk only: the directory to materialize into.
  std::filesystem::path local_checkpoint_dir;
  // cpu only: the version the engine serves (a patch starts from it);
  // nullopt: unknown, the commit swaps whole weights in.
  std::optional<VersionRef> serving;
};

struct StageResult {
  VersionRef version;  // what was staged
  UpdateDestination destination = UpdateDestination::kDisk;
  std::filesystem::path anchor;  // the directory the chain started from ("" for the cpu image)
  int64_t anchor_version = 0;
  size_t deltas_applied = 0;
  bool reseeded = false;  // started from the anchor rather than from what was held
  double seconds = 0;
  // cpu only: how the commit will change the weights, "patch" or "swap",
  // and for a swap why not a patch (PreparedWeights::reason).
  std::string commit_path;
  std::string commit_reason;
  uint64_t values_changed = 0;  // a patch's
  uint64_t values_total = 0;
};

// Where a target's bytes come from: an anchor and the DELTAs after it.
struct WeightStagePlan {
  std::filesystem::path anchor_dir;  // "" when the anchor is the held version
  int64_t anchor_version = 0;
  bool anchor_is_held = false;
  std::vector<std::filesystem::path> deltas;  // oldest first
};

// Walks checkpoint_source_dir back from the target (see the file comment).
// `held` is a version already held in this lineage (the walk may stop there).
// Errors: InvalidArgument for a target below the base or a malformed index,
// NotFound naming the version directory the chain needs but the source
// lacks, InvalidArgument for a DELTA whose base is not the version below it.
[[nodiscard]] absl::StatusOr<WeightStagePlan> PlanStage(const StageRequest& request,
                                                        std::optional<int64_t> held);

// The cpu destination's result: whole weights to swap in, or a patch to
// apply in place to the weights of patch->from.
struct PreparedWeights {
  std::shared_ptr<const ModelWeights> weights;  // null for a patch
  std::shared_ptr<const WeightPatch> patch;     // null for whole weights
  VersionRef version;
  // Why whole weights: a PatchBlocker's name (delta/patch_rules.h; "off",
  // "unknown-base", "other-run", "not-after", "patch-failed",
  // "full-version", "chain-gap", "dense", "patch-error"); "" for a patch.
  std::string reason;
};

class WeightStager {
 public:
  // `serving_config` is the model the engine serves: staged checkpoints must
  // have the same configuration. `threads` for the codec (0: its default).
  // cpu stagings prepare a patch when it changes at most
  // `patch_max_density` of the model's values (0: never).
  WeightStager(ModelConfig serving_config, int threads, double patch_max_density = 0.3);

  // Stages `request`. Errors (one line, naming the directory, file or
  // tensor): InvalidArgument / NotFound for bad or missing inputs,
  // FailedPrecondition for versions of another run, DataLoss for corrupt
  // bytes or a checksum mismatch, Unavailable when another staging is in
  // progress.
  [[nodiscard]] absl::StatusOr<StageResult> Stage(const StageRequest& request);

  // The cpu-staged weights of `version` (and `run_id` when not empty), moved
  // out: the next call for the same version fails. InvalidArgument when that
  // version is not staged for cpu, naming what is.
  [[nodiscard]] absl::StatusOr<PreparedWeights> TakePrepared(int64_t version,
                                                             std::string_view run_id);

  // A patch to `target` failed and was undone: the next cpu staging of
  // `target` prepares whole weights.
  void PatchFailed(const VersionRef& target);

  struct Info {
    bool staging = false;                    // a Stage() is running
    std::optional<VersionRef> cpu_prepared;  // ready for update_weights_from_cpu
    std::optional<VersionRef> cpu_image;     // what the in-memory image holds
    std::optional<VersionRef> disk_staged;   // the last disk staging
    std::filesystem::path disk_dir;
    std::string last_error;  // of the last failed staging, "" after a success
  };
  Info info() const;

 private:
  absl::StatusOr<StageResult> StageDisk(const StageRequest& request);
  absl::StatusOr<StageResult> StageCpu(const StageRequest& request);
  absl::Status CheckConfig(const std::filesystem::path& dir) const;
  // The patch from request.serving to the image's version, or null with
  // `reason` saying why not (PreparedWeights::reason).
  std::shared_ptr<const WeightPatch> PatchFromServing(const StageRequest& request,
                                                      std::string& reason);

  const ModelConfig config_;
  const int threads_;
  const double patch_max_density_;

  mutable absl::Mutex mu_;
  bool staging_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<PreparedWeights> prepared_ ABSL_GUARDED_BY(mu_);
  std::optional<VersionRef> disk_staged_ ABSL_GUARDED_BY(mu_);
  std::filesystem::path disk_dir_ ABSL_GUARDED_BY(mu_);
  std::optional<VersionRef> image_version_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::optional<VersionRef> patch_failed_ ABSL_GUARDED_BY(mu_);

  // Only touched by the one running Stage() (staging_ serializes them).
  CheckpointImage image_;
  std::filesystem::path image_base_dir_;  // the lineage the image belongs to
  int64_t image_base_version_ = 0;
};

}  // namespace stitch
