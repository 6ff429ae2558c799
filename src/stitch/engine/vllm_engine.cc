#include "stitch/engine/vllm_engine.h"

#include <utility>

#include <spdlog/spdlog.h>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/delta/weight_patch.h"
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
      pool_(pool),
      patches_(pool,
               {.enabled = options_.patch,
                .local = options_.local_checkpoint_dir,
                .patch_file = options_.local_checkpoint_dir.parent_path() /
                              absl::StrCat(".", options_.local_checkpoint_dir.filename().string(),
                                           ".patch.safetensors"),
                .max_density = options_.patch_max_density,
                .report_timeout = options_.control_timeout}) {}

awaitable<absl::Status> VllmEngine::InitializeDestination(const VersionRef& boot) {
  absl::Status s = co_await SeedLocalCheckpoint(pool_, options_.base_checkpoint_dir,
                                                options_.local_checkpoint_dir, boot);
  if (s.ok()) patches_.Reset(boot);
  co_return s;
}

awaitable<absl::Status> VllmEngine::Stage(const StagePlan& plan) {
  patches_.Unready();
  absl::Status s = co_await StageLocalCheckpoint(pool_, plan, options_.local_checkpoint_dir);
  if (!s.ok() || !patches_.enabled()) co_return s;
  if (ReloadReason reason = co_await StagePatch(plan); reason.blocker != PatchBlocker::kNone) {
    patches_.WillReload(plan.target, std::move(reason));
    // An earlier target's patch will not be applied: free it while serving.
    co_await DiscardPatch();
  } else {
    patches_.Ready(plan.target);
  }
  co_return absl::OkStatus();
}

awaitable<void> VllmEngine::DiscardPatch() {
  if (!engine_holds_patch_) co_return;
  engine_holds_patch_ = false;
  (void)co_await http_.Post("/collective_rpc", R"({"method": "stitch_patch_discard"})",
                            options_.control_timeout);
}

awaitable<ReloadReason> VllmEngine::StagePatch(const StagePlan& plan) {
  WeightPatchStats written;
  if (ReloadReason blocker = co_await patches_.Write(*this, plan, written);
      blocker.blocker != PatchBlocker::kNone) {
    co_return blocker;
  }
  json::object rpc;
  rpc["method"] = "stitch_patch_stage";
  rpc["args"] = json::array{json::value(patches_.patch_file().string())};
  std::string body = json::serialize(rpc);
  // The engine replaces whatever it staged before, or drops it on failure.
  engine_holds_patch_ = false;
  if (absl::Status s =
          co_await http_.Post("/collective_rpc", std::move(body), options_.commit_timeout);
      !s.ok()) {
    co_return ReloadReason{PatchBlocker::kEngineRefused,
                           absl::StrCat("the engine did not stage the patch: ", s.message())};
  }
  engine_holds_patch_ = true;
  spdlog::info("staged the in-place patch {} -> {}: {} of {} values ({:.4f}%) in {} tensors",
               patches_.live()->ToString(), plan.target.ToString(), written.values_changed,
               written.values_total, written.density() * 100, written.tensors);
  co_return ReloadReason{};
}

awaitable<absl::Status> VllmEngine::Reload(const std::filesystem::path& dir,
                                           const VersionRef& version, bool flush_cache) {
  // Whatever the engine staged belongs to the weights being replaced.
  co_await DiscardPatch();
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
  co_return co_await Label(version, flush_cache);
}

awaitable<absl::Status> VllmEngine::Label(const VersionRef& version, bool flush_cache) {
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
  co_return co_await patches_.Commit(
      target, commit_paths_,
      [&]() -> awaitable<absl::Status> {
        engine_holds_patch_ = false;  // applied or undone, the engine drops it
        co_return co_await ApplyPatch(target, options.flush_cache);
      },
      [&]() -> awaitable<absl::Status> {
        co_return co_await Reload(options_.local_checkpoint_dir, target, options.flush_cache);
      });
}

awaitable<absl::Status> VllmEngine::ApplyPatch(const VersionRef& target, bool flush_cache) {
  json::object kwargs;
  kwargs["verify"] = options_.patch_verify;
  json::object rpc;
  rpc["method"] = "stitch_patch_apply";
  rpc["kwargs"] = std::move(kwargs);
  std::string body = json::serialize(rpc);
  const std::string what =
      absl::StrCat("patching ", patches_.live()->ToString(), " to ", target.ToString());
  auto answer =
      co_await http_.PostForAnswer("/collective_rpc", std::move(body), options_.commit_timeout);
  if (!answer.ok()) co_return Annotate(answer.status(), what);
  // {"results": [one answer per worker]}: each says applied, or undone.
  boost::system::error_code ec;
  const json::value v = json::parse(answer->body, ec);
  const json::object* top = ec ? nullptr : v.if_object();
  const json::array* results = top == nullptr             ? nullptr
                               : top->contains("results") ? top->at("results").if_array()
                                                          : nullptr;
  if (results == nullptr || results->empty()) {
    co_return absl::InternalError(
        absl::StrCat(what, ": the engine's answer is not the extension's: ", answer->body));
  }
  for (const json::value& r : *results) {
    const json::object* o = r.if_object();
    const json::value* applied = o == nullptr ? nullptr : o->if_contains("applied");
    if (applied != nullptr && applied->is_bool() && applied->get_bool()) continue;
    const json::value* undone = o == nullptr ? nullptr : o->if_contains("undone");
    const json::value* error = o == nullptr ? nullptr : o->if_contains("error");
    const std::string why = error != nullptr && error->is_string()
                                ? std::string(error->get_string())
                                : json::serialize(r);
    if (undone != nullptr && undone->is_bool() && undone->get_bool()) {
      patches_.Undone(target, commit_paths_);
      co_return absl::AbortedError(absl::StrCat(what, " failed and was undone (", why,
                                                "): the engine serves ",
                                                patches_.live()->ToString(), " as before"));
    }
    co_return absl::InternalError(absl::StrCat(what, ": ", why));
  }
  co_return co_await Label(target, flush_cache);
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
  patches_.Reset(std::nullopt);
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
