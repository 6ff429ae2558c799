// The Engine adapter for vLLM's OpenAI-compatible server (docs/engine.md,
// "vLLM"), started with VLLM_SERVER_DEV_MODE=1 so that its development
// routes exist.
//
// vLLM does not stage: the sidecar does (local_checkpoint.h), materializing
// the target into the local checkpoint directory on a worker pool while the
// engine serves. The paused moment is then
//   POST /pause?mode=keep|wait   keep: running requests stay resident and go
//                                on after /resume (an in_place commit);
//                                wait: in-flight requests finish first (a
//                                quiesce commit)
//   POST /collective_rpc         {"method": "reload_weights", "kwargs":
//                                {"weights_path": <local checkpoint>}};
//                                answers once every worker has reloaded
//   POST /reset_prefix_cache     when the commit flushes the cache
//   POST /update_weight_version  {"new_version": <the version's identity>}
//   POST /resume
// It reads what it holds from GET /weight_info (`weight_version`), probes
// GET /health, and aborts with POST /abort_requests {"request_ids": [...]}:
// for each request id the proxy gave, the ids vLLM derives from it for
// /v1/completions ("cmpl-<id>-0") and /v1/chat/completions
// ("chatcmpl-<id>"); aborting an id vLLM does not know does nothing.
//
// With `patch` on (a vLLM started with --worker-extension-cls
// stitch_vllm.WeightPatchExtension, python/src/stitch_vllm), a version that
// follows the one the engine holds by DELTAs only is committed in place
// instead: Stage also writes the weight patch (delta/weight_patch.h) and has
// the engine read it (`stitch_patch_stage`, while it serves); the paused
// moment is then `stitch_patch_apply` (new values written where they
// changed, after checking the old ones there again; every patched tensor
// hashed in the engine against the version's recorded xxh3-128). A patch
// that fails is undone by the engine and Commit answers Aborted: the old
// version serves on, labelled as before, and the next Stage of that target
// takes the full reload. Versions a patch does not fit (a FULL version since,
// another run, an engine that does not report the version the patch starts
// from, a patch denser than `patch_max_density`, an engine that refuses it)
// take the full reload, and the reason is logged and counted (CommitPaths).
//
// Errors are EngineHttp's (engine_http.h). A failed reload leaves the
// engine paused with weights nobody can name: the reconciler treats it as
// terminal, as for SGLang.
//
// Threading: bound to one event loop (the executor it was built with) and
// used only from coroutines running there.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>

#include "absl/status/statusor.h"
#include "stitch/delta/patch_rules.h"
#include "stitch/engine/engine.h"
#include "stitch/engine/engine_http.h"
#include "stitch/engine/local_checkpoint.h"
#include "stitch/net/worker_pool.h"

namespace stitch {

// The routes the adapter calls, "METHOD /path" (engine_api_drift_test
// checks them against the list taken from vLLM's source).
inline constexpr std::string_view kVllmEngineRoutes[] = {
    "POST /pause",
    "POST /resume",
    "POST /collective_rpc",
    "POST /reset_prefix_cache",
    "POST /update_weight_version",
    "GET /weight_info",
    "GET /health",
    "POST /abort_requests",
};

// How /pause treats the requests in flight (vLLM's `mode`).
enum class VllmPauseMode {
  kKeep,  // frozen in place, resumed on the new weights (commit mode in_place)
  kWait,  // run to their end before the pause completes (commit mode quiesce)
};
// "keep", "wait".
std::string_view VllmPauseModeName(VllmPauseMode mode);

struct VllmEngineOptions {
  // The engine's base URL, "http://host:port".
  std::string url;
  // The boot checkpoint the engine was started with (`vllm serve <dir>`).
  std::filesystem::path base_checkpoint_dir;
  // Where the sidecar stages versions; the engine reloads from here.
  std::filesystem::path local_checkpoint_dir;
  VllmPauseMode pause_mode = VllmPauseMode::kKeep;
  // Control calls (pause, resume, version, flush, abort).
  std::chrono::milliseconds control_timeout = std::chrono::seconds(60);
  // Reloading the staged version (the paused moment) or the boot checkpoint.
  std::chrono::milliseconds commit_timeout = std::chrono::minutes(10);
  // Sent as "Authorization: Bearer <api_key>" on every call, for a vLLM
  // started with --api-key; empty: none.
  std::string api_key;
  // Commit DELTAs as in-place patches (see above).
  bool patch = false;
  // A patch changing more of the model's values than this takes the reload.
  double patch_max_density = 0.3;
  // After a patch: "checksums" (every patched tensor hashed in the engine)
  // or "values" (the old values checked and the new ones written, no hash).
  std::string patch_verify = "checksums";
};

class VllmEngine final : public Engine {
 public:
  // Checks `options`: a URL that parses, a base checkpoint, a local
  // checkpoint. Codec work runs on `pool`, which must outlive the engine.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<VllmEngine>> Make(
      boost::asio::any_io_executor executor, VllmEngineOptions options, WorkerPool& pool);

  std::string_view name() const override { return "vllm"; }

  // Seeds the local checkpoint with the boot checkpoint.
  boost::asio::awaitable<absl::Status> InitializeDestination(const VersionRef& boot) override;
  // Materializes the target into the local checkpoint; vLLM is not called.
  boost::asio::awaitable<absl::Status> Stage(const StagePlan& plan) override;
  // Reloads the local checkpoint, flushes when asked, labels it `target`.
  boost::asio::awaitable<absl::Status> Commit(const VersionRef& target,
                                              CommitOptions options) override;
  // POST /pause in the configured mode.
  boost::asio::awaitable<absl::Status> Pause() override;
  boost::asio::awaitable<absl::Status> Resume() override;
  // POST /reset_prefix_cache.
  boost::asio::awaitable<absl::Status> FlushCache() override;
  // Reloads the base checkpoint labelled `boot`, then re-seeds the local
  // checkpoint.
  boost::asio::awaitable<absl::Status> ResetToBoot(const VersionRef& boot) override;
  boost::asio::awaitable<absl::Status> Health(std::chrono::milliseconds timeout) override;
  // GET /weight_info.
  boost::asio::awaitable<absl::StatusOr<EngineReport>> Report(
      std::chrono::milliseconds timeout) override;
  boost::asio::awaitable<void> Abort(std::vector<std::string> rids) override;
  std::vector<CommitPath> CommitPaths() const override { return commit_paths_.Paths(); }

  const VllmEngineOptions& options() const { return options_; }

 private:
  VllmEngine(boost::asio::any_io_executor executor, VllmEngineOptions options, HttpUrl url,
             WorkerPool& pool);
  // Reloads `dir` and labels the weights `version`.
  boost::asio::awaitable<absl::Status> Reload(const std::filesystem::path& dir,
                                              const VersionRef& version, bool flush_cache);

  // Writes and stages the patch to `plan.target`: nothing once the engine
  // holds it, else why the commit will reload instead.
  boost::asio::awaitable<ReloadReason> StagePatch(const StagePlan& plan);
  // Applies the staged patch and labels the weights `target`.
  boost::asio::awaitable<absl::Status> ApplyPatch(const VersionRef& target, bool flush_cache);
  boost::asio::awaitable<absl::Status> Label(const VersionRef& version, bool flush_cache);
  // Drops a patch the engine staged and will not apply (best effort).
  boost::asio::awaitable<void> DiscardPatch();

  const VllmEngineOptions options_;
  EngineHttp http_;
  WorkerPool& pool_;
  LocalPatcher patches_;
  // Whether the engine holds a staged patch not yet applied or discarded
  // (its memory is freed by stitch_patch_discard).
  bool engine_holds_patch_ = false;
  CommitPathCounter commit_paths_;
};

}  // namespace stitch
