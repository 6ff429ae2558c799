#include "stitch/engine/local_checkpoint.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/delta/delta_apply.h"
#include "stitch/io/fileio.h"

namespace stitch {

using boost::asio::awaitable;

namespace {

// A FULL version holds only the index and the tensors, but an engine loads a
// directory that also has config.json (and tokenizer files): those come from
// the base checkpoint when the staged directory lacks them.
absl::Status CopyCheckpointExtras(const std::filesystem::path& base,
                                  const std::filesystem::path& local) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(base, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file(ec) || name.starts_with(".") || name == kIndexFileName ||
        entry.path().extension() == ".safetensors") {
      continue;
    }
    if (std::filesystem::exists(local / name, ec)) continue;
    if (absl::Status s = CopyFileDurably(entry.path(), local / name); !s.ok()) return s;
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("listing the base checkpoint ", base.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

awaitable<absl::Status> SeedLocalCheckpoint(WorkerPool& pool, const std::filesystem::path& base,
                                            const std::filesystem::path& local,
                                            const VersionRef& boot) {
  co_return co_await RunBlocking(pool, [&]() -> absl::Status {
    ApplyOptions apply;
    apply.run_id = boot.run_id;
    apply.anchor_version = boot.version;
    auto done = MaterializeCheckpoint(base, {}, local, apply);
    if (!done.ok()) {
      return Annotate(done.status(), absl::StrCat("seeding the local checkpoint ", local.string(),
                                                  " from the base checkpoint"));
    }
    return absl::OkStatus();
  });
}

awaitable<absl::Status> StageLocalCheckpoint(WorkerPool& pool, const StagePlan& plan,
                                             const std::filesystem::path& local) {
  if (plan.chain.empty()) {
    co_return absl::InvalidArgumentError(
        absl::StrCat("staging ", plan.target.ToString(), ": the plan holds no version"));
  }
  co_return co_await RunBlocking(pool, [&]() -> absl::Status {
    std::filesystem::path anchor = plan.base_checkpoint_dir;
    ApplyOptions apply;
    apply.run_id = plan.target.run_id;
    apply.anchor_version = plan.base_version;
    std::vector<std::filesystem::path> deltas;
    size_t first = 0;
    if (plan.chain.front().manifest.kind == VersionKind::kFull) {
      anchor = plan.chain.front().dir;
      apply.anchor_version = plan.chain.front().version;
      first = 1;
    }
    for (size_t i = first; i < plan.chain.size(); ++i) deltas.push_back(plan.chain[i].dir);
    auto done = MaterializeCheckpoint(anchor, deltas, local, apply);
    if (!done.ok()) {
      return Annotate(done.status(),
                      absl::StrCat("staging ", plan.target.ToString(), " into ", local.string()));
    }
    if (done->version.version != plan.target.version) {
      return absl::InternalError(absl::StrCat("staging ", plan.target.ToString(), " into ",
                                              local.string(), " produced version ",
                                              done->version.ToString()));
    }
    return Annotate(CopyCheckpointExtras(plan.base_checkpoint_dir, local),
                    absl::StrCat("staging ", plan.target.ToString()));
  });
}

awaitable<absl::Status> CheckLocalCheckpointHolds(WorkerPool& pool,
                                                  const std::filesystem::path& local,
                                                  const VersionRef& target) {
  auto held = co_await RunBlocking(pool, [&] { return ReadHeldVersion(local); });
  if (!held.ok()) co_return Annotate(held.status(), "committing");
  if (!held->has_value() || (*held)->version != target.version) {
    co_return absl::FailedPreconditionError(
        absl::StrCat("committing ", target.ToString(), ": the local checkpoint ", local.string(),
                     " holds ", held->has_value() ? (*held)->ToString() : std::string("nothing"),
                     ", not the staged target"));
  }
  co_return absl::OkStatus();
}

namespace {

// Why `plan` cannot be a patch from `request.live`, or nothing with the
// DELTA directories after it in `deltas`.
ReloadReason FindPatchBlocker(const StagePlan& plan, const LocalPatchRequest& request,
                              std::vector<std::filesystem::path>& deltas) {
  const PatchBlocker before =
      PatchBlockerBefore(true, request.live, plan.target, request.failed_before);
  switch (before) {
    case PatchBlocker::kNone:
      break;
    case PatchBlocker::kUnknownBase:
      return {before, "what the engine holds is not known"};
    case PatchBlocker::kOtherRun:
      return {before, "the engine holds another run"};
    case PatchBlocker::kNotAfter:
      return {before, "the target is not after what the engine holds"};
    case PatchBlocker::kPatchFailed:
      return {before, "its patch failed and was undone"};
    default:
      return {before, std::string(PatchBlockerName(before))};
  }
  const VersionRef& live = *request.live;
  std::vector<PatchChainLink> links;
  for (const StagedVersion& v : plan.chain) {
    links.push_back({v.version, v.manifest.kind});
    if (v.version > live.version) deltas.push_back(v.dir);
  }
  switch (PatchBlockerOfChain(links, live, plan.target)) {
    case PatchBlocker::kNone:
      return {};
    case PatchBlocker::kFullVersion:
      return {PatchBlocker::kFullVersion,
              "a FULL version lies between what the engine holds and the target"};
    default:
      return {PatchBlocker::kChainGap,
              absl::StrCat("the chain does not hold every DELTA since ", live.ToString())};
  }
}

}  // namespace

awaitable<ReloadReason> WriteLocalPatch(WorkerPool& pool, Engine& engine, const StagePlan& plan,
                                        const LocalPatchRequest& request, WeightPatchStats& stats) {
  std::vector<std::filesystem::path> deltas;
  if (ReloadReason blocker = FindPatchBlocker(plan, request, deltas);
      blocker.blocker != PatchBlocker::kNone) {
    co_return blocker;
  }
  auto report = co_await engine.Report(request.report_timeout);
  if (!report.ok() || report->held != request.live) {
    co_return ReloadReason{
        PatchBlocker::kEngineLabel,
        absl::StrCat("the engine reports ",
                     report.ok() ? absl::StrCat("\"", report->label, "\"")
                                 : std::string(report.status().message()),
                     ", not ", request.live->ToString(), ", the weights the patch starts from")};
  }
  WeightPatchOptions patch;
  patch.from = *request.live;
  patch.to = plan.target;
  patch.max_density = request.max_density;
  auto written = co_await RunBlocking(
      pool, [&] { return WriteWeightPatch(deltas, request.local, request.patch_file, patch); });
  if (!written.ok()) {
    const bool dense = written.status().code() == absl::StatusCode::kFailedPrecondition;
    co_return ReloadReason{dense ? PatchBlocker::kDense : PatchBlocker::kPatchError,
                           std::string(written.status().message())};
  }
  stats = *written;
  co_return ReloadReason{};
}

}  // namespace stitch
