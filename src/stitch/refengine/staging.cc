#include "stitch/refengine/staging.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "stitch/core/errors.h"
#include "stitch/core/manifest.h"
#include "stitch/delta/delta_apply.h"
#include "stitch/delta/delta_version.h"
#include "stitch/delta/patch_rules.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"

namespace stitch {

namespace fs = std::filesystem;

namespace {

bool IsDirectory(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

}  // namespace

absl::StatusOr<WeightStagePlan> PlanStage(const StageRequest& request,
                                          std::optional<int64_t> held) {
  const int64_t base = request.base_version;
  const int64_t target = request.target_version;
  if (target < base) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_version ", target, " is below base_version ", base,
                     "; a checkpoint only moves forward from its base"));
  }
  WeightStagePlan plan;
  if (!request.checkpoint_source_dir.has_value()) {
    if (target != base) {
      return absl::InvalidArgumentError(
          absl::StrCat("target_version ", target,
                       " needs checkpoint_source_dir; without it only the base "
                       "version ",
                       base, " can be staged (that initializes the destination)"));
    }
    plan.anchor_dir = request.base_checkpoint_dir;
    plan.anchor_version = base;
    return plan;
  }
  const fs::path& source = *request.checkpoint_source_dir;
  if (!IsDirectory(source)) {
    return absl::NotFoundError(absl::StrCat("checkpoint_source_dir ", source.string(),
                                            " is not a directory; pass a store's updates/ "
                                            "directory"));
  }
  for (int64_t v = target;; --v) {
    if (held.has_value() && v == *held) {
      plan.anchor_is_held = true;
      plan.anchor_version = v;
      break;
    }
    if (v == base) {
      plan.anchor_dir = request.base_checkpoint_dir;
      plan.anchor_version = base;
      break;
    }
    const bool anchored = request.anchor_dir.has_value() && v == request.anchor_version;
    const fs::path dir = anchored ? *request.anchor_dir : source / VersionDirName(v);
    if (!IsDirectory(dir)) {
      return absl::NotFoundError(absl::StrCat(
          "checkpoint_source_dir ", source.string(), " has no ", VersionDirName(v),
          v == target ? std::string()
                      : absl::StrCat(", which the delta chain of ", VersionDirName(target),
                                     " needs to reach a FULL version or base_version ", base)));
    }
    absl::StatusOr<CheckpointIndex> index = ReadIndex(dir);
    if (!index.ok()) return index.status();
    absl::StatusOr<VersionManifest> manifest = index->ToManifest();
    if (!manifest.ok()) return Annotate(manifest.status(), dir.string());
    if (auto run = index->metadata.find(std::string(kRunIdMetadataKey));
        !request.run_id.empty() && run != index->metadata.end() && run->second != request.run_id) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir.string(), " belongs to run \"", run->second, "\", not \"", request.run_id,
          "\"; stage versions of the run being followed (a run change restarts from its boot "
          "checkpoint)"));
    }
    if (manifest->version != v) {
      return absl::InvalidArgumentError(absl::StrCat(dir.string(), ": its index records version ",
                                                     manifest->version, ", not ", v));
    }
    if (manifest->kind == VersionKind::kFull) {
      plan.anchor_dir = dir;
      plan.anchor_version = v;
      break;
    }
    if (anchored) {
      return absl::InvalidArgumentError(
          absl::StrCat("anchor_dir ", dir.string(), " is not a FULL version"));
    }
    if (manifest->base_version != v - 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir.string(), ": DELTA with base_version ",
          manifest->base_version ? absl::StrCat(*manifest->base_version) : std::string("<none>"),
          " instead of ", v - 1, "; the lineage is broken"));
    }
    plan.deltas.push_back(dir);
  }
  std::reverse(plan.deltas.begin(), plan.deltas.end());
  return plan;
}

WeightStager::WeightStager(ModelConfig serving_config, int threads, double patch_max_density)
    : config_(std::move(serving_config)),
      threads_(threads),
      patch_max_density_(patch_max_density) {}

absl::Status WeightStager::CheckConfig(const fs::path& dir) const {
  if (!IsDirectory(dir)) {
    return absl::NotFoundError(
        absl::StrCat("base_checkpoint_dir ", dir.string(), " is not a directory"));
  }
  absl::StatusOr<ModelConfig> config = ReadModelConfig(dir);
  if (!config.ok()) return config.status();
  if (!(*config == config_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        (dir / kModelConfigFileName).string(),
        " describes another model than the one this engine serves; stage checkpoints of the "
        "served model (restart the engine with --model to change models)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<StageResult> WeightStager::Stage(const StageRequest& request) {
  {
    absl::MutexLock lock(&mu_);
    if (staging_) {
      return absl::UnavailableError("another staging is in progress; retry when it has finished");
    }
    staging_ = true;
  }
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<StageResult> result =
      request.destination == UpdateDestination::kCpu ? StageCpu(request) : StageDisk(request);
  if (result.ok()) {
    result->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  absl::MutexLock lock(&mu_);
  staging_ = false;
  last_error_ = result.ok() ? std::string() : std::string(result.status().message());
  if (result.ok() && request.destination == UpdateDestination::kDisk) {
    disk_staged_ = result->version;
    disk_dir_ = request.local_checkpoint_dir;
  }
  return result;
}

absl::StatusOr<StageResult> WeightStager::StageDisk(const StageRequest& request) {
  if (request.local_checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("destination disk needs local_checkpoint_dir");
  }
  if (absl::Status s = CheckConfig(request.base_checkpoint_dir); !s.ok()) return s;
  absl::StatusOr<WeightStagePlan> plan = PlanStage(request, std::nullopt);
  if (!plan.ok()) return plan.status();

  ApplyOptions options;
  options.run_id = request.run_id;
  options.anchor_version = plan->anchor_version;
  options.threads = threads_;
  absl::StatusOr<MaterializeResult> applied =
      MaterializeCheckpoint(plan->anchor_dir, plan->deltas, request.local_checkpoint_dir, options);
  if (!applied.ok()) return applied.status();
  // A FULL anchor from a store holds only weights; the engine that loads the
  // directory also needs the model's configuration.
  const fs::path config = request.local_checkpoint_dir / kModelConfigFileName;
  std::error_code ec;
  if (!fs::exists(config, ec)) {
    if (absl::Status s =
            CopyFileDurably(request.base_checkpoint_dir / kModelConfigFileName, config);
        !s.ok()) {
      return s;
    }
  }
  StageResult result;
  result.version = applied->version;
  result.destination = UpdateDestination::kDisk;
  result.anchor = plan->anchor_dir;
  result.anchor_version = plan->anchor_version;
  result.deltas_applied = applied->deltas_applied;
  result.reseeded = applied->reseeded;
  return result;
}

absl::StatusOr<StageResult> WeightStager::StageCpu(const StageRequest& request) {
  if (absl::Status s = CheckConfig(request.base_checkpoint_dir); !s.ok()) return s;
  std::optional<int64_t> held;
  const std::optional<VersionRef>& image_version = image_.version();
  if (image_version.has_value() && image_base_dir_ == request.base_checkpoint_dir &&
      image_base_version_ == request.base_version &&
      (request.run_id.empty() || image_version->run_id == request.run_id) &&
      image_version->version >= request.base_version &&
      image_version->version <= request.target_version) {
    held = image_version->version;
  }
  absl::StatusOr<WeightStagePlan> plan = PlanStage(request, held);
  if (!plan.ok()) return plan.status();

  ApplyOptions apply;
  apply.run_id = request.run_id;
  apply.threads = threads_;
  StageResult result;
  result.destination = UpdateDestination::kCpu;
  result.anchor = plan->anchor_dir;
  result.anchor_version = plan->anchor_version;
  if (plan->anchor_is_held) {
    // ApplyDeltas is all or nothing: on error the image still holds `held`.
    if (!plan->deltas.empty()) {
      absl::StatusOr<ImageApplyResult> applied = image_.ApplyDeltas(plan->deltas, apply);
      if (!applied.ok()) return applied.status();
      result.deltas_applied = applied->deltas_applied;
    }
  } else {
    CheckpointImage::LoadOptions load;
    load.run_id = request.run_id;
    load.version = plan->anchor_version;
    load.threads = threads_;
    absl::StatusOr<CheckpointImage> fresh = CheckpointImage::Load(plan->anchor_dir, load);
    if (!fresh.ok()) return fresh.status();
    if (!plan->deltas.empty()) {
      absl::StatusOr<ImageApplyResult> applied = fresh->ApplyDeltas(plan->deltas, apply);
      if (!applied.ok()) return applied.status();
      result.deltas_applied = applied->deltas_applied;
    }
    if (absl::Status valid = ValidateTensors(config_, fresh->Views()); !valid.ok()) {
      return Annotate(valid, plan->anchor_dir.string());
    }
    image_ = *std::move(fresh);
    image_base_dir_ = request.base_checkpoint_dir;
    image_base_version_ = request.base_version;
    result.reseeded = true;
  }
  if (!image_.version().has_value() || image_.version()->version != request.target_version) {
    return absl::InternalError(
        absl::StrCat("the staged image holds ",
                     image_.version() ? image_.version()->ToString() : std::string("nothing"),
                     " instead of ", VersionDirName(request.target_version)));
  }
  result.version = *image_.version();
  PreparedWeights prepared;
  prepared.version = result.version;
  prepared.patch = PatchFromServing(request, prepared.reason);
  if (prepared.patch != nullptr) {
    result.commit_path = "patch";
    result.values_changed = prepared.patch->stats.values_changed;
    result.values_total = prepared.patch->stats.values_total;
  } else {
    absl::StatusOr<std::shared_ptr<const ModelWeights>> built =
        ModelWeights::FromTensors(config_, image_.Views());
    if (!built.ok()) {
      // The image holds the target all the same.
      absl::MutexLock lock(&mu_);
      image_version_ = result.version;
      return built.status();
    }
    prepared.weights = *std::move(built);
    result.commit_path = "swap";
    result.commit_reason = prepared.reason;
  }
  absl::MutexLock lock(&mu_);
  prepared_ = std::move(prepared);
  image_version_ = result.version;
  return result;
}

std::shared_ptr<const WeightPatch> WeightStager::PatchFromServing(const StageRequest& request,
                                                                  std::string& reason) {
  const VersionRef& target = *image_.version();
  bool failed_before = false;
  {
    absl::MutexLock lock(&mu_);
    failed_before = patch_failed_.has_value() && *patch_failed_ == target;
  }
  auto blocked = [&reason](PatchBlocker blocker) {
    reason = std::string(PatchBlockerName(blocker));
    return nullptr;
  };
  if (const PatchBlocker before =
          PatchBlockerBefore(patch_max_density_ > 0, request.serving, target, failed_before);
      before != PatchBlocker::kNone) {
    return blocked(before);
  }
  absl::StatusOr<WeightStagePlan> chain = PlanStage(request, request.serving->version);
  if (!chain.ok()) {
    spdlog::warn("no patch from {} to {}: {}", request.serving->ToString(), target.ToString(),
                 std::string(chain.status().message()));
    return blocked(PatchBlocker::kChainGap);
  }
  // The walk stopped at a FULL version (or the boot checkpoint) before it
  // reached the served one.
  if (!chain->anchor_is_held) return blocked(PatchBlocker::kFullVersion);
  std::vector<PatchTargetTensor> tensors;
  for (const auto& [name, t] : image_.tensors()) {
    const ImageTensor* held = &t;
    tensors.push_back({name, t.dtype, t.shape, t.data.size(), [held](std::span<std::byte> out) {
                         std::memcpy(out.data(), held->data.data(), out.size());
                         return absl::OkStatus();
                       }});
  }
  WeightPatchOptions options;
  options.from = *request.serving;
  options.to = target;
  options.max_density = patch_max_density_;
  absl::StatusOr<WeightPatch> patch =
      BuildWeightPatch(chain->deltas, tensors, "the staged image", options);
  if (!patch.ok()) {
    spdlog::info("no patch from {} to {}: {}", request.serving->ToString(), target.ToString(),
                 std::string(patch.status().message()));
    return blocked(absl::IsFailedPrecondition(patch.status()) ? PatchBlocker::kDense
                                                              : PatchBlocker::kPatchError);
  }
  return std::make_shared<const WeightPatch>(*std::move(patch));
}

void WeightStager::PatchFailed(const VersionRef& target) {
  absl::MutexLock lock(&mu_);
  patch_failed_ = target;
  if (prepared_.has_value() && prepared_->version == target && prepared_->patch != nullptr) {
    prepared_.reset();
  }
}

absl::StatusOr<PreparedWeights> WeightStager::TakePrepared(int64_t version,
                                                           std::string_view run_id) {
  absl::MutexLock lock(&mu_);
  const bool match = prepared_.has_value() && prepared_->version.version == version &&
                     (run_id.empty() || prepared_->version.run_id == run_id);
  if (!match) {
    VersionRef wanted{std::string(run_id), version};
    return absl::InvalidArgumentError(
        absl::StrCat("version ", wanted.ToString(), " was never staged for cpu (staged: ",
                     prepared_ ? prepared_->version.ToString() : std::string("nothing"),
                     "); POST /stage_weight_update with destination \"cpu\" first"));
  }
  PreparedWeights out = *std::move(prepared_);
  prepared_.reset();
  return out;
}

WeightStager::Info WeightStager::info() const {
  absl::MutexLock lock(&mu_);
  Info i;
  i.staging = staging_;
  if (prepared_) i.cpu_prepared = prepared_->version;
  i.cpu_image = image_version_;
  i.disk_staged = disk_staged_;
  i.disk_dir = disk_dir_;
  i.last_error = last_error_;
  return i;
}

}  // namespace stitch
