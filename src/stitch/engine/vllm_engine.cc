#include "stitch/engine/vllm_engine.h"

#include <utility>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/engine/local_checkpoint.h"

namespace stitch {

namespace json = boost::json;
using boost::asio::awaitable;

std::string_view VllmPauseModeName(VllmPauseMode mode) {
  return mode == VllmPauseMode::kKeep ? "keep" : "wait";
}

absl::StatusOr<std::unique_ptr<VllmEngine>> VllmEngine::Make(boost::asio::any_io_executor executor,
                                                             VllmEngineOptions options,
                                                             WorkerPool& pool) {
  auto url = ParseHttpUrl(options.url);
  if (!url.ok()) return Annotate(url.status(), "--engine-url");
  if (options.base_checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "--base-checkpoint is required: give the checkpoint directory vLLM was started with");
  }
  if (options.local_checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "--engine vllm needs --local-checkpoint: give the directory the sidecar stages versions "
        "into");
  }
  return std::unique_ptr<VllmEngine>(
      new VllmEngine(std::move(executor), std::move(options), *std::move(url), pool));
}

VllmEngine::VllmEngine(boost::asio::any_io_executor executor, VllmEngineOptions options,
                       HttpUrl url, WorkerPool& pool)
    : options_(std::move(options)),
      http_(std::move(executor), std::move(url), options_.api_key),
      pool_(pool) {}

awaitable<absl::Status> VllmEngine::InitializeDestination(const VersionRef& boot) {
  co_return co_await SeedLocalCheckpoint(pool_, options_.base_checkpoint_dir,
                                         options_.local_checkpoint_dir, boot);
}

awaitable<absl::Status> VllmEngine::Stage(const StagePlan& plan) {
  co_return co_await StageLocalCheckpoint(pool_, plan, options_.local_checkpoint_dir);
}

awaitable<absl::Status> VllmEngine::Reload(const std::filesystem::path& dir,
                                           const VersionRef& version, bool flush_cache) {
  json::object kwargs;
  kwargs["weights_path"] = dir.string();
  json::object rpc;
  rpc["method"] = "reload_weights";
  rpc["kwargs"] = std::move(kwargs);
  std::string body = json::serialize(rpc);
  if (absl::Status s =
          co_await http_.Post("/collective_rpc", std::move(body), options_.commit_timeout);
      !s.ok()) {
    co_return Annotate(s, absl::StrCat("reloading ", dir.string(), " as ", version.ToString()));
  }
  if (flush_cache) {
    if (absl::Status s = co_await FlushCache(); !s.ok()) co_return s;
  }
  json::object label;
  label["new_version"] = version.ToString();
  std::string text = json::serialize(label);
  co_return co_await http_.Post("/update_weight_version", std::move(text),
                                options_.control_timeout);
}

awaitable<absl::Status> VllmEngine::Commit(const VersionRef& target, CommitOptions options) {
  const std::filesystem::path local = options_.local_checkpoint_dir;
  if (absl::Status held = co_await CheckLocalCheckpointHolds(pool_, local, target); !held.ok()) {
    co_return held;
  }
  co_return co_await Reload(local, target, options.flush_cache);
}

awaitable<absl::Status> VllmEngine::Pause() {
  const std::string target =
      absl::StrCat("/pause?mode=", AbslView(VllmPauseModeName(options_.pause_mode)));
  co_return co_await http_.Post(target, std::string(), options_.control_timeout);
}

awaitable<absl::Status> VllmEngine::Resume() {
  co_return co_await http_.Post("/resume", std::string(), options_.control_timeout);
}

awaitable<absl::Status> VllmEngine::FlushCache() {
  co_return co_await http_.Post("/reset_prefix_cache", std::string(), options_.control_timeout);
}

awaitable<absl::Status> VllmEngine::ResetToBoot(const VersionRef& boot) {
  absl::Status s = co_await Reload(options_.base_checkpoint_dir, boot, false);
  if (!s.ok()) co_return s;
  co_return co_await InitializeDestination(boot);
}

awaitable<absl::Status> VllmEngine::Health(std::chrono::milliseconds timeout) {
  co_return co_await http_.Health("/health", timeout);
}

awaitable<absl::StatusOr<EngineReport>> VllmEngine::Report(std::chrono::milliseconds timeout) {
  auto response = co_await http_.Get("/weight_info", timeout);
  if (!response.ok()) co_return response.status();
  co_return ReportFromAnswer(*response, http_.Where("GET", "/weight_info"));
}

awaitable<void> VllmEngine::Abort(std::vector<std::string> rids) {
  if (rids.empty()) co_return;
  json::array ids;
  for (const std::string& rid : rids) {
    ids.emplace_back(absl::StrCat("cmpl-", rid, "-0"));
    ids.emplace_back(absl::StrCat("chatcmpl-", rid));
    ids.emplace_back(absl::StrCat("generate-tokens-", rid));
  }
  json::object body;
  body["request_ids"] = std::move(ids);
  std::string text = json::serialize(body);
  // Best effort: the requests may have finished already.
  (void)co_await http_.Post("/abort_requests", std::move(text), options_.control_timeout);
}

}  // namespace stitch
