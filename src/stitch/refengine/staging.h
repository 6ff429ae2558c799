// Staged weight updates for the reference engine (docs/design.md, "Engine
// protocol"): preparing a target version while the engine keeps serving, so
// that committing it later is short.
//
//   disk: materialize the target checkpoint into a local directory with the
//         delta codec (delta_apply.h); the commit then loads that directory
//         (POST /update_weights_from_disk).
//   cpu:  bring an in-memory image of the checkpoint (checkpoint_image.h) to
//         the target and build the float32 weights from it; the commit swaps
//         those prepared weights in (a pointer swap, whatever the size).
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
#include "stitch/core/version.h"
#include "stitch/delta/checkpoint_image.h"
#include "stitch/refengine/config.h"
#include "stitch/refengine/weights.h"

namespace stitch {

enum class StageDestination { kDisk, kCpu };

std::string_view StageDestinationName(StageDestination d);  // "disk" / "cpu"
[[nodiscard]] absl::StatusOr<StageDestination> ParseStageDestination(std::string_view name);

struct StageRequest {
  // The boot checkpoint (config.json plus weights) and its version.
  std::filesystem::path base_checkpoint_dir;
  int64_t base_version = 0;
  int64_t target_version = 0;
  // The run the versions belong to; "" when the caller names none (the
  // versions' own metadata must then agree).
  std::string run_id;
  StageDestination destination = StageDestination::kDisk;
  // A store's updates/ directory; nullopt initializes at the base version.
  std::optional<std::filesystem::path> checkpoint_source_dir;
  // disk only: the directory to materialize into.
  std::filesystem::path local_checkpoint_dir;
};

struct StageResult {
  VersionRef version;  // what was staged
  StageDestination destination = StageDestination::kDisk;
  std::filesystem::path anchor;  // the directory the chain started from ("" for the cpu image)
  int64_t anchor_version = 0;
  size_t deltas_applied = 0;
  bool reseeded = false;  // started from the anchor rather than from what was held
  double seconds = 0;
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

// The cpu destination's result, ready to swap in.
struct PreparedWeights {
  std::shared_ptr<const ModelWeights> weights;
  VersionRef version;
};

class WeightStager {
 public:
  // `serving_config` is the model the engine serves: staged checkpoints must
  // have the same configuration. `threads` for the codec (0: its default).
  WeightStager(ModelConfig serving_config, int threads);

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

  const ModelConfig config_;
  const int threads_;

  mutable absl::Mutex mu_;
  bool staging_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<PreparedWeights> prepared_ ABSL_GUARDED_BY(mu_);
  std::optional<VersionRef> disk_staged_ ABSL_GUARDED_BY(mu_);
  std::filesystem::path disk_dir_ ABSL_GUARDED_BY(mu_);
  std::optional<VersionRef> image_version_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);

  // Only touched by the one running Stage() (staging_ serializes them).
  CheckpointImage image_;
  std::filesystem::path image_base_dir_;  // the lineage the image belongs to
  int64_t image_base_version_ = 0;
};

}  // namespace stitch
