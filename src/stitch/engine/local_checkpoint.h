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

// What a patch is made from and where it goes.
struct LocalPatchRequest {
  // What the engine holds by the adapter's last commit or reset (nullopt:
  // unknown), and whether a patch to this target was undone before.
  std::optional<VersionRef> live;
  bool failed_before = false;
  // The local checkpoint StageLocalCheckpoint brought to the target.
  std::filesystem::path local;
  std::filesystem::path patch_file;
  double max_density = 0.3;
  std::chrono::milliseconds report_timeout = std::chrono::seconds(60);
};

// Writes the patch from `request.live` to `plan.target` into
// `request.patch_file` (delta/weight_patch.h), after the rules of
// delta/patch_rules.h and a check that `engine` still reports holding
// `live` (a patch is exact only on the weights it was made from: a
// restarted engine holds its boot weights). Kind kNone with `stats` filled
// when it was written, else why the commit must reload.
boost::asio::awaitable<ReloadReason> WriteLocalPatch(WorkerPool& pool, Engine& engine,
                                                     const StagePlan& plan,
                                                     const LocalPatchRequest& request,
                                                     WeightPatchStats& stats);

}  // namespace stitch
