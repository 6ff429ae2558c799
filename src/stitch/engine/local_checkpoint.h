// Staging done by the sidecar itself, for engines that only load a
// checkpoint directory (stock SGLang, vLLM): the target version is
// materialized into a local checkpoint with the delta codec (anchor plus
// deltas, every checksum verified) while the engine keeps serving, and the
// engine is then asked to load that directory.
//
// Each call runs its codec work on `pool` and never blocks the calling
// event loop. Errors name the directory and the version.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include <boost/asio/awaitable.hpp>

#include "absl/status/status.h"
#include "stitch/core/version.h"
#include "stitch/delta/patch_rules.h"
#include "stitch/delta/weight_patch.h"
#include "stitch/engine/engine.h"
#include "stitch/net/worker_pool.h"

namespace stitch {

// Seeds `local` with the boot checkpoint `base`, labelled `boot`.
boost::asio::awaitable<absl::Status> SeedLocalCheckpoint(WorkerPool& pool,
                                                         const std::filesystem::path& base,
                                                         const std::filesystem::path& local,
                                                         const VersionRef& boot);

// Materializes `plan.target` into `local`: only the deltas after what it
// holds when it holds an earlier version of the run, else from the chain's
// anchor; then copies the base checkpoint's other files (config, tokenizer)
// that `local` lacks. InvalidArgument for a plan without versions.
boost::asio::awaitable<absl::Status> StageLocalCheckpoint(WorkerPool& pool, const StagePlan& plan,
                                                          const std::filesystem::path& local);

// OK when `local` holds `target`'s version; FailedPrecondition naming what
// it holds otherwise.
boost::asio::awaitable<absl::Status> CheckLocalCheckpointHolds(WorkerPool& pool,
                                                               const std::filesystem::path& local,
                                                               const VersionRef& target);

// In-place patches written by the sidecar (vLLM's worker extension and
// stock SGLang's custom weight loader apply them in the engine's process).

// Why a commit reloads whole weights instead of patching: a code (a
// /metrics label) and the details (for the log); kNone: it patches.
struct ReloadReason {
  PatchBlocker blocker = PatchBlocker::kNone;  // delta/patch_rules.h
  std::string detail;
};

// The in-place patches of an adapter whose sidecar writes them: what the
// engine holds, the target whose patch is ready, why a target reloads
// instead, and the commit that takes one path or the other, counted.
// Threading: used only from its adapter's event loop.
class LocalPatcher {
 public:
  struct Options {
    bool enabled = false;
    // The local checkpoint StageLocalCheckpoint brings to each target.
    std::filesystem::path local;
    std::filesystem::path patch_file;
    double max_density = 0.3;
    std::chrono::milliseconds report_timeout = std::chrono::seconds(60);
  };
  // `pool` must outlive the patcher.
  LocalPatcher(WorkerPool& pool, Options options);

  bool enabled() const { return options_.enabled; }
  const std::filesystem::path& patch_file() const { return options_.patch_file; }
  // What the engine holds by the adapter's last commit or reset (nullopt:
  // not known).
  const std::optional<VersionRef>& live() const { return live_; }
  // The engine now holds `version` (seeded at boot) or weights not known
  // (nullopt: a reset under way); nothing is ready.
  void Reset(std::optional<VersionRef> version);

  // A new staging begins: no patch is ready until Ready.
  void Unready() { ready_.reset(); }
  // After StageLocalCheckpoint brought the local checkpoint to
  // `plan.target`: writes the patch from live() to it, after the rules of
  // delta/patch_rules.h and a check that `engine` still reports holding
  // live() (a patch is exact only on the weights it was made from: a
  // restarted engine holds its boot weights). Kind kNone with `stats`
  // filled when it was written, else why the commit must reload.
  boost::asio::awaitable<ReloadReason> Write(Engine& engine, const StagePlan& plan,
                                             WeightPatchStats& stats);
  // The adapter's verdict after Write: `target`'s patch is ready, or
  // `reason` makes it reload (logged, and counted at the commit).
  void Ready(const VersionRef& target);
  void WillReload(const VersionRef& target, ReloadReason reason);
  // `target`'s patch was undone by the engine: counted, and the target
  // reloads from now on.
  void Undone(const VersionRef& target, CommitPathCounter& paths);

  // Commits `target`: `apply()` when its patch is ready; else, once the
  // local checkpoint is checked to hold the target, `reload()`. Either is
  // counted in `paths` when it succeeds, and live() moves with it.
  boost::asio::awaitable<absl::Status> Commit(
      const VersionRef& target, CommitPathCounter& paths,
      const std::function<boost::asio::awaitable<absl::Status>()>& apply,
      const std::function<boost::asio::awaitable<absl::Status>()>& reload);

 private:
  WorkerPool& pool_;
  const Options options_;
  std::optional<VersionRef> live_;
  std::optional<VersionRef> ready_;
  ReloadReason reason_{PatchBlocker::kNoPatchStaged, "no patch was staged"};
  std::optional<VersionRef> failed_;
};

}  // namespace stitch
