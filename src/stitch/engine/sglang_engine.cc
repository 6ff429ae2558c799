#include "stitch/engine/sglang_engine.h"

#include <system_error>
#include <utility>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "stitch/core/errors.h"
#include "stitch/engine/local_checkpoint.h"
#include "stitch/io/fileio.h"
#include "stitch/net/worker_pool.h"

namespace stitch {

namespace json = boost::json;
using boost::asio::awaitable;

namespace {

std::string PathString(const std::filesystem::path& p) { return p.string(); }

absl::StatusOr<HttpUrl> ParseEngineUrl(const SglangEngineOptions& options) {
  auto url = ParseHttpUrl(options.url);
  if (!url.ok()) return Annotate(url.status(), "--engine-url");
  return url;
}

absl::Status RequireDir(const std::filesystem::path& dir, std::string_view flag) {
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(flag), " is required: give the checkpoint directory"));
  }
  return absl::OkStatus();
}

// A file beside the local checkpoint: ".<checkpoint name><suffix>".
std::filesystem::path BesideLocal(const SglangEngineOptions& options, std::string_view suffix) {
  const std::filesystem::path& local = options.local_checkpoint_dir;
  return local.parent_path() / absl::StrCat(".", local.filename().string(), AbslView(suffix));
}

}  // namespace

std::string SglangNamedBytesPayload(std::string_view name, std::string_view bytes) {
  auto u32 = [](std::string& out, uint32_t n) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  };
  std::string p = "\x80\x02";  // PROTO 2
  p += "](";                   // EMPTY_LIST, MARK
  p += 'X';                    // BINUNICODE: the name
  u32(p, static_cast<uint32_t>(name.size()));
  p.append(name);
  p += "ctorch\nByteTensor\n";  // GLOBAL torch.ByteTensor
  p += "](";                    // its argument: a list of the bytes
  for (unsigned char c : bytes) {
    p += 'K';  // BININT1
    p.push_back(static_cast<char>(c));
  }
  p += "e\x85R";  // APPENDS, TUPLE1, REDUCE: torch.ByteTensor([...])
  p += "\x86"
       "e.";  // TUPLE2 (name, tensor), APPENDS, STOP
  return absl::Base64Escape(AbslView(p));
}

SglangHttpEngine::SglangHttpEngine(boost::asio::any_io_executor executor,
                                   SglangEngineOptions options, HttpUrl url)
    : options_(std::move(options)),
      url_(url),
      http_(std::move(executor), std::move(url), options_.api_key) {}

SglangHttpEngine::~SglangHttpEngine() = default;

awaitable<absl::Status> SglangHttpEngine::Call(std::string_view path, std::string body,
                                               std::chrono::milliseconds timeout) {
  co_return co_await http_.Post(path, std::move(body), timeout);
}

awaitable<absl::Status> SglangHttpEngine::Pause() {
  std::string body = R"({"mode":"in_place"})";
  co_return co_await Call("/pause_generation", std::move(body), options_.control_timeout);
}

awaitable<absl::Status> SglangHttpEngine::Resume() {
  std::string body = "{}";
  co_return co_await Call("/continue_generation", std::move(body), options_.control_timeout);
}

awaitable<absl::Status> SglangHttpEngine::FlushCache() {
  std::string body = "{}";
  co_return co_await Call("/flush_cache", std::move(body), options_.control_timeout);
}

awaitable<absl::StatusOr<HttpResponse>> SglangHttpEngine::Get(std::string_view path,
                                                              std::chrono::milliseconds timeout) {
  co_return co_await http_.Get(path, timeout);
}

awaitable<absl::Status> SglangHttpEngine::Health(std::chrono::milliseconds timeout) {
  co_return co_await http_.Health("/health", timeout);
}

awaitable<absl::StatusOr<EngineReport>> SglangHttpEngine::Report(
    std::chrono::milliseconds timeout) {
  auto response = co_await Get(model_info_route_, timeout);
  if (response.ok() && response->status == 404 && model_info_route_ == "/model_info") {
    model_info_route_ = "/get_model_info";
    response = co_await Get(model_info_route_, timeout);
  }
  if (!response.ok()) co_return response.status();
  absl::StatusOr<EngineReport> report =
      ReportFromAnswer(*response, http_.Where("GET", model_info_route_));
  if (report.ok() && !report->served_model_name.empty() && !IsLoadPath(report->served_model_name)) {
    served_name_ = report->served_model_name;
  }
  if (report.ok()) {
    // Not knowing (an engine without /server_info, a failed call) is "on".
    auto info = co_await Get("/server_info", timeout);
    boost::system::error_code ec;
    const json::value doc =
        info.ok() && info->status == 200 ? json::parse(info->body, ec) : json::value();
    const json::value* off =
        !ec && doc.is_object() ? doc.get_object().if_contains("disable_overlap_schedule") : nullptr;
    overlap_disabled_ = off != nullptr && off->is_bool() && off->get_bool();
    const json::value* loaders =
        !ec && doc.is_object() ? doc.get_object().if_contains("custom_weight_loader") : nullptr;
    has_patch_loader_ = false;
    if (loaders != nullptr && loaders->is_array()) {
      for (const json::value& l : loaders->get_array()) {
        has_patch_loader_ |= l.is_string() && l.get_string() == kSglangPatchLoader;
      }
    }
  }
  co_return report;
}

bool SglangHttpEngine::IsLoadPath(std::string_view name) const {
  for (const std::filesystem::path& dir :
       {options_.local_checkpoint_dir, options_.base_checkpoint_dir}) {
    if (dir.empty()) continue;
    std::string prefix = PathString(dir.lexically_normal());
    while (prefix.size() > 1 && prefix.ends_with('/')) prefix.pop_back();
    if (name.starts_with(prefix) && (name.size() == prefix.size() || name[prefix.size()] == '/')) {
      return true;
    }
  }
  return false;
}

void SglangHttpEngine::RestoreForwarded(std::string_view path, std::string& body) const {
  const bool models = path == "/v1/models";
  if (served_name_.empty() || !(models || path == "/model_info" || path == "/get_model_info")) {
    return;
  }
  boost::system::error_code ec;
  json::value doc = json::parse(body, ec);
  if (ec || !doc.is_object()) return;
  bool changed = false;
  auto restore = [&](json::object& holder, std::string_view key) {
    json::value* name = holder.if_contains(key);
    if (name != nullptr && name->is_string() && IsLoadPath(name->get_string())) {
      *name = served_name_;
      changed = true;
    }
  };
  if (!models) {
    restore(doc.get_object(), "served_model_name");
  } else if (json::value* data = doc.get_object().if_contains("data"); data && data->is_array()) {
    for (json::value& entry : data->get_array()) {
      if (!entry.is_object()) continue;
      restore(entry.get_object(), "id");
      restore(entry.get_object(), "root");
    }
  }
  if (changed) body = json::serialize(doc);
}

awaitable<void> SglangHttpEngine::Abort(std::vector<std::string> rids) {
  for (const std::string& rid : rids) {
    json::object body;
    body["rid"] = rid;
    // Best effort: the request may have finished already.
    std::string text = json::serialize(body);
    (void)co_await Call("/abort_request", std::move(text), options_.control_timeout);
  }
}

awaitable<absl::Status> SglangHttpEngine::LoadFromDisk(const std::filesystem::path& dir,
                                                       const VersionRef& version,
                                                       bool flush_cache) {
  json::object body;
  body["model_path"] = PathString(dir);
  body["load_format"] = options_.load_format;
  body["weight_version"] = version.ToString();
  body["flush_cache"] = flush_cache;
  std::string text = json::serialize(body);
  co_return co_await Call("/update_weights_from_disk", std::move(text), options_.commit_timeout);
}

// SglangEngine -------------------------------------------------------------

absl::StatusOr<std::unique_ptr<SglangEngine>> SglangEngine::Make(
    boost::asio::any_io_executor executor, SglangEngineOptions options) {
  auto url = ParseEngineUrl(options);
  if (!url.ok()) return url.status();
  if (absl::Status s = RequireDir(options.base_checkpoint_dir, "--base-checkpoint"); !s.ok()) {
    return s;
  }
  if (options.destination == UpdateDestination::kDisk) {
    if (absl::Status s = RequireDir(options.local_checkpoint_dir, "--local-checkpoint"); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--update-mode disk needs --local-checkpoint: give the directory the "
                       "engine stages versions into (or use --update-mode cpu)"));
    }
  }
  return std::unique_ptr<SglangEngine>(
      new SglangEngine(std::move(executor), std::move(options), *std::move(url)));
}

awaitable<absl::Status> SglangEngine::StageRequest(const std::string& run_id, int64_t base_version,
                                                   int64_t target_version,
                                                   const std::filesystem::path* source_dir,
                                                   const StagedVersion* anchor) {
  json::object body;
  body["base_checkpoint_dir"] = PathString(options_.base_checkpoint_dir);
  if (anchor != nullptr) {
    body["anchor_dir"] = PathString(anchor->dir);
    body["anchor_version"] = anchor->version;
  }
  body["base_version"] = base_version;
  body["target_version"] = target_version;
  if (!run_id.empty()) body["run_id"] = run_id;
  body["destination"] = std::string(UpdateDestinationName(options_.destination));
  if (source_dir != nullptr) body["checkpoint_source_dir"] = PathString(*source_dir);
  if (options_.destination == UpdateDestination::kDisk) {
    body["local_checkpoint_dir"] = PathString(options_.local_checkpoint_dir);
  }
  std::string text = json::serialize(body);
  co_return co_await Call("/stage_weight_update", std::move(text), options_.stage_timeout);
}

awaitable<absl::Status> SglangEngine::InitializeDestination(const VersionRef& boot) {
  co_return co_await StageRequest(boot.run_id, boot.version, boot.version, nullptr);
}

awaitable<absl::Status> SglangEngine::Stage(const StagePlan& plan) {
  // A chain starting from an anchor outside `source_dir` (written after the
  // fact) names it: the engine's walk back from the target stops there.
  const bool anchored = !plan.chain.empty() &&
                        plan.chain.front().manifest.kind == VersionKind::kFull &&
                        plan.chain.front().dir.parent_path() != plan.source_dir;
  co_return co_await StageRequest(plan.target.run_id, plan.base_version, plan.target.version,
                                  &plan.source_dir, anchored ? &plan.chain.front() : nullptr);
}

awaitable<absl::Status> SglangEngine::Commit(const VersionRef& target, CommitOptions options) {
  if (options_.destination == UpdateDestination::kDisk) {
    co_return co_await LoadFromDisk(options_.local_checkpoint_dir, target, options.flush_cache);
  }
  json::object body;
  body["target_version"] = target.version;
  body["flush_cache"] = options.flush_cache;
  std::string text = json::serialize(body);
  absl::StatusOr<HttpResponse> answer = co_await http_.PostForAnswer(
      "/update_weights_from_cpu", std::move(text), options_.commit_timeout);
  if (absl::IsAborted(answer.status())) commit_paths_.Count("patch-undone", "");
  if (!answer.ok()) co_return answer.status();
  // How the engine changed its weights: "patch" or "swap", and why not a
  // patch (engines before in-place patches say neither).
  boost::system::error_code ec;
  const json::value doc = json::parse(answer->body, ec);
  const json::object* o = !ec && doc.is_object() ? &doc.get_object() : nullptr;
  auto field = [o](std::string_view key) {
    const json::value* v = o != nullptr ? o->if_contains(key) : nullptr;
    return v != nullptr && v->is_string() ? std::string(v->get_string()) : std::string();
  };
  const std::string path = field("commit_path");
  if (path.empty()) co_return absl::OkStatus();
  const std::string reason = field("commit_reason");
  commit_paths_.Count(path, reason);
  if (path == "patch") {
    const json::value* n = o->if_contains("values_changed");
    spdlog::info("{} was committed in place: {} values patched", target.ToString(),
                 n != nullptr && n->is_number() ? json::serialize(*n) : std::string("?"));
  } else {
    spdlog::info("{} was committed by swapping whole weights in ({})", target.ToString(), reason);
  }
  co_return absl::OkStatus();
}

awaitable<absl::Status> SglangEngine::ResetToBoot(const VersionRef& boot) {
  absl::Status s = co_await LoadFromDisk(options_.base_checkpoint_dir, boot, false);
  if (!s.ok()) co_return s;
  co_return co_await InitializeDestination(boot);
}

// StockSglangEngine --------------------------------------------------------

StockSglangEngine::StockSglangEngine(boost::asio::any_io_executor executor,
                                     SglangEngineOptions options, HttpUrl url, WorkerPool& pool)
    : SglangHttpEngine(std::move(executor), std::move(options), std::move(url)),
      pool_(pool),
      answer_file_(BesideLocal(options_, ".patch-answer.json")),
      patches_(pool, {.enabled = options_.patch,
                      .local = options_.local_checkpoint_dir,
                      .patch_file = BesideLocal(options_, ".patch.safetensors"),
                      .max_density = options_.patch_max_density,
                      .report_timeout = options_.control_timeout}) {}

absl::StatusOr<std::unique_ptr<StockSglangEngine>> StockSglangEngine::Make(
    boost::asio::any_io_executor executor, SglangEngineOptions options, WorkerPool& pool) {
  auto url = ParseEngineUrl(options);
  if (!url.ok()) return url.status();
  if (absl::Status s = RequireDir(options.base_checkpoint_dir, "--base-checkpoint"); !s.ok()) {
    return s;
  }
  if (options.destination != UpdateDestination::kDisk) {
    return absl::InvalidArgumentError(
        "--engine sglang-stock loads versions only from disk: use --update-mode disk (or "
        "--engine sglang for --update-mode cpu)");
  }
  if (options.local_checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "--engine sglang-stock needs --local-checkpoint: give the directory the sidecar "
        "stages versions into");
  }
  return std::unique_ptr<StockSglangEngine>(
      new StockSglangEngine(std::move(executor), std::move(options), *std::move(url), pool));
}

awaitable<absl::Status> StockSglangEngine::InitializeDestination(const VersionRef& boot) {
  absl::Status s = co_await SeedLocalCheckpoint(pool_, options_.base_checkpoint_dir,
                                                options_.local_checkpoint_dir, boot);
  if (s.ok()) patches_.Reset(boot);
  co_return s;
}

awaitable<absl::Status> StockSglangEngine::Stage(const StagePlan& plan) {
  patches_.Unready();
  absl::Status s = co_await StageLocalCheckpoint(pool_, plan, options_.local_checkpoint_dir);
  if (!s.ok() || !patches_.enabled()) co_return s;
  WeightPatchStats written;
  ReloadReason reason = co_await patches_.Write(*this, plan, written);
  if (reason.blocker == PatchBlocker::kNone && !has_patch_loader_) {
    // Reported by Write's look at the engine, just now.
    reason = {PatchBlocker::kEngineRefused,
              absl::StrCat("SGLang was not started with --custom-weight-loader ",
                           AbslView(kSglangPatchLoader))};
  }
  if (reason.blocker != PatchBlocker::kNone) {
    patches_.WillReload(plan.target, std::move(reason));
    co_return absl::OkStatus();
  }
  patches_.Ready(plan.target);
  spdlog::info("wrote the in-place patch {} -> {}: {} of {} values ({:.4f}%) in {} tensors",
               patches_.live()->ToString(), plan.target.ToString(), written.values_changed,
               written.values_total, written.density() * 100, written.tensors);
  co_return absl::OkStatus();
}

awaitable<absl::Status> StockSglangEngine::Commit(const VersionRef& target, CommitOptions options) {
  co_return co_await patches_.Commit(
      target, commit_paths_,
      [&]() -> awaitable<absl::Status> {
        co_return co_await ApplyPatch(target, options.flush_cache);
      },
      [&]() -> awaitable<absl::Status> {
        co_return co_await LoadFromDisk(options_.local_checkpoint_dir, target, options.flush_cache);
      });
}

awaitable<absl::Status> StockSglangEngine::ApplyPatch(const VersionRef& target, bool flush_cache) {
  const VersionRef& live = *patches_.live();
  const std::string what = absl::StrCat("patching ", live.ToString(), " to ", target.ToString());
  // On the worker pool, off the event loop.
  co_await RunBlocking(pool_, [this] {
    std::error_code ec;
    std::filesystem::remove(answer_file_, ec);
  });
  json::object request;
  request["patch"] = PathString(patches_.patch_file());
  request["answer"] = PathString(answer_file_);
  request["verify"] = options_.patch_verify;
  request["from"] = live.ToString();
  request["to"] = target.ToString();
  json::object body;
  body["serialized_named_tensors"] = json::array{
      json::value(SglangNamedBytesPayload(kSglangPatchRequestName, json::serialize(request)))};
  body["load_format"] = std::string(kSglangPatchLoader);
  // No flush and no label with the call: SGLang would do both whatever the
  // loader did. They follow the loader's answer.
  body["flush_cache"] = false;
  if (absl::Status begun = co_await Call("/begin_weight_update", "{}", options_.control_timeout);
      !begun.ok()) {
    // Nothing was called in the engine's model: the old weights serve on.
    patches_.Undone(target, commit_paths_);
    co_return absl::AbortedError(absl::StrCat(what, ": the engine opened no weight update (",
                                              begun.message(), "): it serves ", live.ToString(),
                                              " as before"));
  }
  const absl::Status loaded =
      co_await Call("/update_weights_from_tensor", json::serialize(body), options_.commit_timeout);
  const absl::Status ended = co_await Call("/end_weight_update", "{}", options_.control_timeout);
  if (!loaded.ok()) co_return Annotate(loaded, what);
  if (!ended.ok()) co_return Annotate(ended, what);
  auto text =
      co_await RunBlocking(pool_, [this] { return ReadFileToString(answer_file_, 1 << 20); });
  if (absl::Status answer = LoaderAnswer(text, target, what); !answer.ok()) co_return answer;
  if (flush_cache) {
    if (absl::Status s = co_await FlushCache(); !s.ok()) co_return s;
  }
  json::object label;
  label["new_version"] = target.ToString();
  label["abort_all_requests"] = false;  // SGLang's default aborts them
  co_return co_await Call("/update_weight_version", json::serialize(label),
                          options_.control_timeout);
}

absl::Status StockSglangEngine::LoaderAnswer(const absl::StatusOr<std::string>& text,
                                             const VersionRef& target, const std::string& what) {
  if (!text.ok()) {
    // The weights may have changed or not: nobody can say.
    return absl::InternalError(
        absl::StrCat(what, ": the engine's loader left no answer (", text.status().message(), ")"));
  }
  boost::system::error_code ec;
  const json::value doc = json::parse(*text, ec);
  const json::object* o = ec ? nullptr : doc.if_object();
  auto flag = [o](std::string_view key) {
    const json::value* v = o != nullptr ? o->if_contains(key) : nullptr;
    return v != nullptr && v->is_bool() && v->get_bool();
  };
  if (flag("applied")) return absl::OkStatus();
  if (!flag("undone")) {
    return absl::InternalError(absl::StrCat(what,
                                            ": the loader's answer is neither applied nor "
                                            "undone: ",
                                            *text));
  }
  const json::value* error = o->if_contains("error");
  patches_.Undone(target, commit_paths_);
  return absl::AbortedError(absl::StrCat(
      what, " failed and was undone (",
      error != nullptr && error->is_string() ? std::string(error->get_string()) : *text,
      "): the engine serves ", patches_.live()->ToString(), " as before"));
}

awaitable<absl::Status> StockSglangEngine::ResetToBoot(const VersionRef& boot) {
  patches_.Reset(std::nullopt);
  absl::Status s = co_await LoadFromDisk(options_.base_checkpoint_dir, boot, false);
  if (!s.ok()) co_return s;
  co_return co_await InitializeDestination(boot);
}

}  // namespace stitch
