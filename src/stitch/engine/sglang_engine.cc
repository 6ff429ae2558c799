#include "stitch/engine/sglang_engine.h"

#include <utility>

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/format/delta_apply.h"
#include "stitch/format/fileio.h"
#include "stitch/net/auth.h"

namespace stitch {

namespace json = boost::json;
using boost::asio::awaitable;

namespace {

std::string PathString(const std::filesystem::path& p) { return p.string(); }

// The engine's own explanation in a refusal: `message` (or `error`, or
// `detail`) of a JSON answer, else the body itself, shortened.
std::string EngineMessage(const HttpResponse& r) {
  boost::system::error_code ec;
  json::value v = json::parse(r.body, ec);
  if (!ec && v.is_object()) {
    for (std::string_view key : {"message", "error", "detail"}) {
      if (const json::value* m = v.get_object().if_contains(key); m != nullptr) {
        if (m->is_string()) return std::string(m->get_string().data(), m->get_string().size());
        if (m->is_object()) {
          if (const json::value* inner = m->get_object().if_contains("message");
              inner != nullptr && inner->is_string()) {
            return std::string(inner->get_string().data(), inner->get_string().size());
          }
        }
        return json::serialize(*m);
      }
    }
  }
  constexpr size_t kMax = 300;
  return r.body.size() <= kMax ? r.body : absl::StrCat(r.body.substr(0, kMax), "...");
}

// False when the answer carries `"success": false`.
bool AnswerSucceeded(const HttpResponse& r) {
  boost::system::error_code ec;
  json::value v = json::parse(r.body, ec);
  if (ec || !v.is_object()) return true;
  const json::value* success = v.get_object().if_contains("success");
  return success == nullptr || !success->is_bool() || success->get_bool();
}

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

SglangHttpEngine::SglangHttpEngine(boost::asio::any_io_executor executor,
                                   SglangEngineOptions options, HttpUrl url)
    : options_(std::move(options)), url_(std::move(url)), client_(std::move(executor)) {}

SglangHttpEngine::~SglangHttpEngine() = default;

awaitable<absl::Status> SglangHttpEngine::Call(std::string_view path, std::string body,
                                               std::chrono::milliseconds timeout) {
  HttpRequest request;
  request.method = "POST";
  request.target = std::string(path);
  request.headers.Set("Content-Type", "application/json");
  if (!options_.api_key.empty())
    request.headers.Set("Authorization", BearerValue(options_.api_key));
  request.body = std::move(body);
  CallOptions call;
  call.timeout = timeout;
  auto response = co_await client_.Send(url_.origin, std::move(request), call);
  std::string where = absl::StrCat("engine ", url_.origin.ToString(), ": POST ", AbslView(path));
  if (!response.ok()) {
    absl::Status s = response.status();
    if (absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s)) {
      co_return absl::UnavailableError(absl::StrCat(where, ": ", s.message()));
    }
    co_return Annotate(s, where);
  }
  if (response->status < 200 || response->status >= 300 || !AnswerSucceeded(*response)) {
    co_return absl::InternalError(
        absl::StrCat(where, " refused (HTTP ", response->status, "): ", EngineMessage(*response)));
  }
  co_return absl::OkStatus();
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
  HttpRequest request;
  request.target = std::string(path);
  if (!options_.api_key.empty())
    request.headers.Set("Authorization", BearerValue(options_.api_key));
  CallOptions call;
  call.timeout = timeout;
  auto response = co_await client_.Send(url_.origin, std::move(request), call);
  if (!response.ok()) {
    co_return absl::UnavailableError(absl::StrCat("engine ", url_.origin.ToString(), ": GET ",
                                                  AbslView(path), ": ",
                                                  response.status().message()));
  }
  co_return response;
}

awaitable<absl::Status> SglangHttpEngine::Health(std::chrono::milliseconds timeout) {
  auto response = co_await Get("/health", timeout);
  if (!response.ok()) co_return response.status();
  if (response->status != 200) {
    co_return absl::UnavailableError(absl::StrCat("engine ", url_.origin.ToString(),
                                                  ": GET /health: HTTP ", response->status, ": ",
                                                  EngineMessage(*response)));
  }
  co_return absl::OkStatus();
}

awaitable<absl::StatusOr<EngineReport>> SglangHttpEngine::Report(
    std::chrono::milliseconds timeout) {
  auto response = co_await Get(model_info_route_, timeout);
  if (response.ok() && response->status == 404 && model_info_route_ == "/model_info") {
    model_info_route_ = "/get_model_info";
    response = co_await Get(model_info_route_, timeout);
  }
  if (!response.ok()) co_return response.status();
  const std::string where =
      absl::StrCat("engine ", url_.origin.ToString(), ": GET ", AbslView(model_info_route_));
  if (response->status != 200) {
    co_return absl::UnavailableError(
        absl::StrCat(where, ": HTTP ", response->status, ": ", EngineMessage(*response)));
  }
  absl::StatusOr<EngineReport> report = ParseEngineReport(response->body);
  if (!report.ok()) co_return Annotate(report.status(), where);
  co_return report;
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
                                                   const std::filesystem::path* source_dir) {
  json::object body;
  body["base_checkpoint_dir"] = PathString(options_.base_checkpoint_dir);
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
  co_return co_await StageRequest(plan.target.run_id, plan.base_version, plan.target.version,
                                  &plan.source_dir);
}

awaitable<absl::Status> SglangEngine::Commit(const VersionRef& target, CommitOptions options) {
  if (options_.destination == UpdateDestination::kDisk) {
    co_return co_await LoadFromDisk(options_.local_checkpoint_dir, target, options.flush_cache);
  }
  json::object body;
  body["target_version"] = target.version;
  body["flush_cache"] = options.flush_cache;
  std::string text = json::serialize(body);
  co_return co_await Call("/update_weights_from_cpu", std::move(text), options_.commit_timeout);
}

awaitable<absl::Status> SglangEngine::ResetToBoot(const VersionRef& boot) {
  absl::Status s = co_await LoadFromDisk(options_.base_checkpoint_dir, boot, false);
  if (!s.ok()) co_return s;
  co_return co_await InitializeDestination(boot);
}

// StockSglangEngine --------------------------------------------------------

StockSglangEngine::StockSglangEngine(boost::asio::any_io_executor executor,
                                     SglangEngineOptions options, HttpUrl url, WorkerPool& pool)
    : SglangHttpEngine(std::move(executor), std::move(options), std::move(url)), pool_(pool) {}

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
  const std::filesystem::path base = options_.base_checkpoint_dir;
  const std::filesystem::path local = options_.local_checkpoint_dir;
  co_return co_await RunBlocking(pool_, [&]() -> absl::Status {
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

awaitable<absl::Status> StockSglangEngine::Stage(const StagePlan& plan) {
  if (plan.chain.empty()) {
    co_return absl::InvalidArgumentError(
        absl::StrCat("staging ", plan.target.ToString(), ": the plan holds no version"));
  }
  const std::filesystem::path local = options_.local_checkpoint_dir;
  co_return co_await RunBlocking(pool_, [&]() -> absl::Status {
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

awaitable<absl::Status> StockSglangEngine::Commit(const VersionRef& target, CommitOptions options) {
  const std::filesystem::path local = options_.local_checkpoint_dir;
  auto held = co_await RunBlocking(pool_, [&] { return ReadHeldVersion(local); });
  if (!held.ok()) co_return Annotate(held.status(), "committing");
  if (!held->has_value() || (*held)->version != target.version) {
    co_return absl::FailedPreconditionError(
        absl::StrCat("committing ", target.ToString(), ": the local checkpoint ", local.string(),
                     " holds ", held->has_value() ? (*held)->ToString() : std::string("nothing"),
                     ", not the staged target"));
  }
  co_return co_await LoadFromDisk(local, target, options.flush_cache);
}

awaitable<absl::Status> StockSglangEngine::ResetToBoot(const VersionRef& boot) {
  absl::Status s = co_await LoadFromDisk(options_.base_checkpoint_dir, boot, false);
  if (!s.ok()) co_return s;
  co_return co_await InitializeDestination(boot);
}

}  // namespace stitch
