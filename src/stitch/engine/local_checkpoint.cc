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

}  // namespace stitch
