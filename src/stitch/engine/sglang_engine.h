// Engine adapters for SGLang's HTTP API (and the reference engine, which
// speaks the same API).
//
//   SglangEngine       an engine that stages by itself through
//                      POST /stage_weight_update (Stitch's SGLang fork, the
//                      reference engine), into a local checkpoint directory
//                      (destination disk) or an in-memory image
//                      (destination cpu); commits with
//                      /update_weights_from_disk or /update_weights_from_cpu.
//   StockSglangEngine  an unmodified SGLang: the sidecar stages itself, on a
//                      worker pool, materializing the target into the local
//                      checkpoint directory with the delta codec, then asks
//                      the engine to load it with /update_weights_from_disk;
//                      or, for a DELTA that fits and an engine started with
//                      --custom-weight-loader stitch_sglang.apply_patch
//                      (python/src/stitch_sglang), writes the in-place patch
//                      while the engine serves and has that loader apply it
//                      inside the pause (/begin_weight_update,
//                      /update_weights_from_tensor, /end_weight_update), then
//                      labels the weights with /update_weight_version.
//
// Both pause with /pause_generation {"mode": "in_place"}, resume with
// /continue_generation, flush with /flush_cache, probe /health, read what
// they hold from /model_info and abort with /abort_request. An engine call succeeds when the engine
// answers 2xx and, for answers carrying `success`, `success` is true. Errors name the engine URL
// and the route: Unavailable when the engine did not answer (refused, reset, timed out), Internal
// with the engine's own message when it refused.
//
// Threading: an adapter is bound to one event loop (the executor it was
// built with) and used only from coroutines running there.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>

#include "absl/status/statusor.h"
#include "stitch/engine/engine.h"
#include "stitch/engine/engine_http.h"
#include "stitch/engine/local_checkpoint.h"
#include "stitch/net/client.h"
#include "stitch/net/http.h"
#include "stitch/net/worker_pool.h"

namespace stitch {

// The routes the adapters call, "METHOD /path" (engine_api_drift_test checks
// them against the list taken from SGLang's source and the fork's staging
// routes).
inline constexpr std::string_view kSglangEngineRoutes[] = {
    "POST /pause_generation",
    "POST /continue_generation",
    "POST /flush_cache",
    "GET /health",
    "GET /model_info",
    "GET /get_model_info",
    "GET /server_info",
    "POST /abort_request",
    "POST /update_weights_from_disk",
    "POST /update_weights_from_cpu",
    "POST /stage_weight_update",
    "POST /begin_weight_update",
    "POST /update_weights_from_tensor",
    "POST /end_weight_update",
    "POST /update_weight_version",
};

// The custom weight loader stock SGLang must be started with for in-place
// patches (--custom-weight-loader), and the name of the one "tensor" it is
// sent: the request, as UTF-8 JSON (python/src/stitch_sglang).
inline constexpr std::string_view kSglangPatchLoader = "stitch_sglang.apply_patch";
inline constexpr std::string_view kSglangPatchRequestName = "stitch_sglang.request";

// SGLang's `serialized_named_tensors` entry for [(name, uint8 tensor of
// `bytes`)]: a pickle (protocol 2) of that list, base64. Built by hand, so
// that it names only torch.ByteTensor, which SGLang's restricted unpickler
// allows, and carries no file descriptors or shared memory.
std::string SglangNamedBytesPayload(std::string_view name, std::string_view bytes);

struct SglangEngineOptions {
  // The engine's base URL, "http://host:port".
  std::string url;
  // The boot checkpoint the engine was started with.
  std::filesystem::path base_checkpoint_dir;
  // Where staged versions go: required for destination disk and for the
  // stock engine, ignored for destination cpu.
  std::filesystem::path local_checkpoint_dir;
  UpdateDestination destination = UpdateDestination::kDisk;
  // `load_format` of every update_weights_from_disk (SGLang's loaders:
  // auto, safetensors, fastsafetensors, ...).
  std::string load_format = "auto";
  // Control calls (pause, resume, flush, abort, reset's load).
  std::chrono::milliseconds control_timeout = std::chrono::seconds(60);
  // Staging a version; the engine keeps serving meanwhile.
  std::chrono::milliseconds stage_timeout = std::chrono::hours(1);
  // Loading the staged version (the paused moment) or the boot checkpoint.
  std::chrono::milliseconds commit_timeout = std::chrono::minutes(10);
  // Sent as "Authorization: Bearer <api_key>" on every call, for an engine
  // started with one (SGLang's --api-key); empty: none.
  std::string api_key;
  // The stock engine only: commit DELTAs as in-place patches where they fit
  // and the engine has the loader (kSglangPatchLoader); a patch changing
  // more of the model's values than `patch_max_density` reloads, and
  // `patch_verify` is "checksums" (every patched tensor hashed in the
  // engine) or "values" (old values checked, new ones written).
  bool patch = true;
  double patch_max_density = 0.3;
  std::string patch_verify = "checksums";
};

// The HTTP control surface both adapters share. Not instantiable by itself.
class SglangHttpEngine : public Engine {
 public:
  ~SglangHttpEngine() override;

  boost::asio::awaitable<absl::Status> Pause() override;
  boost::asio::awaitable<absl::Status> Resume() override;
  boost::asio::awaitable<absl::Status> FlushCache() override;
  boost::asio::awaitable<absl::Status> Health(std::chrono::milliseconds timeout) override;
  // GET /model_info (/get_model_info on engines that predate it), then
  // /server_info for whether its overlap scheduler is off and which custom
  // weight loaders it was started with.
  boost::asio::awaitable<absl::StatusOr<EngineReport>> Report(
      std::chrono::milliseconds timeout) override;
  // Only with the overlap scheduler off (`disable_overlap_schedule` in
  // /server_info, as last reported): with it on, SGLang's spans place a
  // commit a token late.
  bool PlacesCommitsExactly() const override { return overlap_disabled_; }
  boost::asio::awaitable<void> Abort(std::vector<std::string> rids) override;
  // /v1/models and /model_info name the served model as the engine was
  // started (learned from its reports before a load of the sidecar's
  // renamed it), not after the directory the sidecar last loaded.
  void RestoreForwarded(std::string_view path, std::string& body) const override;
  std::vector<CommitPath> CommitPaths() const override { return commit_paths_.Paths(); }

  const SglangEngineOptions& options() const { return options_; }

 protected:
  // REQUIRES: `url` parses (Make* checks it).
  SglangHttpEngine(boost::asio::any_io_executor executor, SglangEngineOptions options, HttpUrl url);

  // POSTs `body` (JSON) to `path` and checks the answer as described above.
  boost::asio::awaitable<absl::Status> Call(std::string_view path, std::string body,
                                            std::chrono::milliseconds timeout);
  // /update_weights_from_disk for `dir`, labelled with `version` (its
  // identity: the engine learns the run too).
  boost::asio::awaitable<absl::Status> LoadFromDisk(const std::filesystem::path& dir,
                                                    const VersionRef& version, bool flush_cache);

  // GET `path`: the answer, or Unavailable (naming the engine and route)
  // when the engine did not answer within `timeout`.
  boost::asio::awaitable<absl::StatusOr<HttpResponse>> Get(std::string_view path,
                                                           std::chrono::milliseconds timeout);

  const SglangEngineOptions options_;
  const HttpUrl url_;
  EngineHttp http_;
  std::string_view model_info_route_ = "/model_info";
  CommitPathCounter commit_paths_;
  // Whether the engine listed kSglangPatchLoader in /server_info's
  // `custom_weight_loader`, as last reported.
  bool has_patch_loader_ = false;

 private:
  // Whether `name` is a directory the sidecar loads from (SGLang's name
  // after such a load).
  bool IsLoadPath(std::string_view name) const;
  // The served model's name as the engine reported it before any load of
  // the sidecar's; "" until known.
  std::string served_name_;
  bool overlap_disabled_ = false;
};

// Checks `options` for an engine that stages by itself: a URL that parses,
// a base checkpoint, and a local checkpoint for destination disk.
class SglangEngine final : public SglangHttpEngine {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SglangEngine>> Make(
      boost::asio::any_io_executor executor, SglangEngineOptions options);

  std::string_view name() const override { return "sglang"; }

  // POST /stage_weight_update without a checkpoint source: the engine
  // prepares its destination at the boot version.
  boost::asio::awaitable<absl::Status> InitializeDestination(const VersionRef& boot) override;
  // POST /stage_weight_update with the plan's source directory.
  boost::asio::awaitable<absl::Status> Stage(const StagePlan& plan) override;
  // /update_weights_from_disk of the local checkpoint, or
  // /update_weights_from_cpu, whose answer says how the engine changed its
  // weights ("patch" in place or "swap" of whole weights, and why), counted
  // in CommitPaths; an engine that undid a patch answers Aborted.
  boost::asio::awaitable<absl::Status> Commit(const VersionRef& target,
                                              CommitOptions options) override;
  // Loads the base checkpoint, then re-initializes the destination.
  boost::asio::awaitable<absl::Status> ResetToBoot(const VersionRef& boot) override;

 private:
  using SglangHttpEngine::SglangHttpEngine;
  boost::asio::awaitable<absl::Status> StageRequest(const std::string& run_id, int64_t base_version,
                                                    int64_t target_version,
                                                    const std::filesystem::path* source_dir,
                                                    const StagedVersion* anchor = nullptr);
};

// Checks `options`: a URL that parses, a base checkpoint, a local checkpoint,
// destination disk. Codec work runs on `pool`, which must outlive the engine.
class StockSglangEngine final : public SglangHttpEngine {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StockSglangEngine>> Make(
      boost::asio::any_io_executor executor, SglangEngineOptions options, WorkerPool& pool);

  std::string_view name() const override { return "sglang-stock"; }

  // Seeds the local checkpoint with the boot checkpoint (delta codec).
  boost::asio::awaitable<absl::Status> InitializeDestination(const VersionRef& boot) override;
  // Materializes the target into the local checkpoint (delta codec): only
  // the deltas after what it holds when it holds an earlier version of the
  // run, else from the chain's anchor. With patches on, then writes the
  // in-place patch from what the engine holds, or logs why not.
  boost::asio::awaitable<absl::Status> Stage(const StagePlan& plan) override;
  // The staged patch applied by the engine's loader, or
  // /update_weights_from_disk of the local checkpoint; counted in
  // CommitPaths with the reason for a reload. A patch the loader undid
  // answers Aborted (the old version serves on, labelled as before) and
  // that target reloads at its next Stage.
  boost::asio::awaitable<absl::Status> Commit(const VersionRef& target,
                                              CommitOptions options) override;
  // Loads the base checkpoint, then re-seeds the local checkpoint.
  boost::asio::awaitable<absl::Status> ResetToBoot(const VersionRef& boot) override;

 private:
  StockSglangEngine(boost::asio::any_io_executor executor, SglangEngineOptions options, HttpUrl url,
                    WorkerPool& pool);
  // Has the loader apply the staged patch, flushes when asked, and labels
  // the weights `target`.
  boost::asio::awaitable<absl::Status> ApplyPatch(const VersionRef& target, bool flush_cache);
  // Judges `text`, what the loader wrote to answer_file_ for `what` (or why
  // it could not be read).
  absl::Status LoaderAnswer(const absl::StatusOr<std::string>& text, const VersionRef& target,
                            const std::string& what);

  WorkerPool& pool_;
  // Beside the local checkpoint: the loader's answer (the patch is beside
  // it too).
  const std::filesystem::path answer_file_;
  LocalPatcher patches_;
};

}  // namespace stitch
