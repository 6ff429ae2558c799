#include "stitch/engine/local_checkpoint.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
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

// Why `plan` cannot be a patch from `live`, or nothing with the DELTA
// directories after it in `deltas`.
ReloadReason FindPatchBlocker(const StagePlan& plan, const std::optional<VersionRef>& live,
                              bool failed_before, std::vector<std::filesystem::path>& deltas) {
  const PatchBlocker before = PatchBlockerBefore(true, live, plan.target, failed_before);
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
  std::vector<PatchChainLink> links;
  for (const StagedVersion& v : plan.chain) {
    links.push_back({v.version, v.manifest.kind});
    if (v.version > live->version) deltas.push_back(v.dir);
  }
  switch (PatchBlockerOfChain(links, *live, plan.target)) {
    case PatchBlocker::kNone:
      return {};
    case PatchBlocker::kFullVersion:
      return {PatchBlocker::kFullVersion,
              "a FULL version lies between what the engine holds and the target"};
    default:
      return {PatchBlocker::kChainGap,
              absl::StrCat("the chain does not hold every DELTA since ", live->ToString())};
  }
}

}  // namespace

LocalPatcher::LocalPatcher(WorkerPool& pool, Options options)
    : pool_(pool), options_(std::move(options)) {}

void LocalPatcher::Reset(std::optional<VersionRef> version) {
  live_ = std::move(version);
  ready_.reset();
}

awaitable<ReloadReason> LocalPatcher::Write(Engine& engine, const StagePlan& plan,
                                            WeightPatchStats& stats) {
  Unready();
  std::vector<std::filesystem::path> deltas;
  const bool failed_before = failed_.has_value() && *failed_ == plan.target;
  if (ReloadReason blocker = FindPatchBlocker(plan, live_, failed_before, deltas);
      blocker.blocker != PatchBlocker::kNone) {
    co_return blocker;
  }
  auto report = co_await engine.Report(options_.report_timeout);
  if (!report.ok() || report->held != live_) {
    co_return ReloadReason{
        PatchBlocker::kEngineLabel,
        absl::StrCat("the engine reports ",
                     report.ok() ? absl::StrCat("\"", report->label, "\"")
                                 : std::string(report.status().message()),
                     ", not ", live_->ToString(), ", the weights the patch starts from")};
  }
  WeightPatchOptions patch;
  patch.from = *live_;
  patch.to = plan.target;
  patch.max_density = options_.max_density;
  auto written = co_await RunBlocking(
      pool_, [&] { return WriteWeightPatch(deltas, options_.local, options_.patch_file, patch); });
  if (!written.ok()) {
    const bool dense = written.status().code() == absl::StatusCode::kFailedPrecondition;
    co_return ReloadReason{dense ? PatchBlocker::kDense : PatchBlocker::kPatchError,
                           std::string(written.status().message())};
  }
  stats = *written;
  co_return ReloadReason{};
}

void LocalPatcher::Ready(const VersionRef& target) {
  ready_ = target;
  reason_ = {};
}

void LocalPatcher::WillReload(const VersionRef& target, ReloadReason reason) {
  ready_.reset();
  spdlog::info("{} will be committed by a full reload ({}): {}", target.ToString(),
               PatchBlockerName(reason.blocker), reason.detail);
  reason_ = std::move(reason);
}

void LocalPatcher::Undone(const VersionRef& target, CommitPathCounter& paths) {
  failed_ = target;
  paths.Count("patch-undone", "");
}

awaitable<absl::Status> LocalPatcher::Commit(
    const VersionRef& target, CommitPathCounter& paths,
    const std::function<awaitable<absl::Status>()>& apply,
    const std::function<awaitable<absl::Status>()>& reload) {
  absl::Status committed;
  if (ready_.has_value() && *ready_ == target) {
    ready_.reset();
    committed = co_await apply();
    if (committed.ok()) paths.Count("patch", "");
  } else {
    if (absl::Status held = co_await CheckLocalCheckpointHolds(pool_, options_.local, target);
        !held.ok()) {
      co_return held;
    }
    committed = co_await reload();
    if (committed.ok()) {
      paths.Count("reload", std::string(PatchBlockerName(options_.enabled ? reason_.blocker
                                                                          : PatchBlocker::kOff)));
    }
  }
  if (committed.ok()) live_ = target;
  co_return committed;
}

}  // namespace stitch
