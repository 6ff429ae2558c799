// vLLM's dialect of the reference engine's server: its OpenAI routes and
// its development and RL routes, with vLLM's bodies and error shape
// (docs/engine.md, "The vLLM dialect"). Generation and the state both
// dialects share are in server.cc.
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/net/prometheus.h"
#include "stitch/refengine/server_impl.h"

namespace stitch {

namespace asio = boost::asio;
using asio::awaitable;
using refengine_internal::CommandDone;
using refengine_internal::CommandStart;
using refengine_internal::LoadedCheckpoint;
using refengine_internal::SchedulerCall;

namespace {

absl::StatusOr<boost::json::object> VllmBody(std::string_view body) {
  if (body.empty()) return boost::json::object();
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(body, ec);
  if (ec || !v.is_object()) return absl::InvalidArgumentError("Invalid JSON format");
  return std::move(v.get_object());
}

}  // namespace

awaitable<void> EngineServer::Impl::VllmPause(HttpExchange& ex) {
  const std::string& target = ex.request().target;
  std::optional<std::string> mode_name = TargetQueryParam(target, "mode");
  const std::optional<std::string> wait_flag =
      TargetQueryParam(target, "wait_for_inflight_requests");
  PauseMode mode = PauseMode::kAbort;
  if (!mode_name.has_value() && wait_flag.has_value() && *wait_flag == "true") {
    mode_name = "wait";
  }
  const std::string name = mode_name.value_or("abort");
  if (name == "abort") {
    mode = PauseMode::kAbort;
  } else if (name == "wait") {
    mode = PauseMode::kWait;
  } else if (name == "keep") {
    mode = PauseMode::kInPlace;
  } else {
    const absl::Status bad = absl::InvalidArgumentError(
        absl::StrCat("mode must be one of abort|wait|keep, got \"", name, "\""));
    co_await RespondError(ex, bad);
    co_return;
  }
  Scheduler* s = scheduler.get();
  CommandStart<int64_t> pause = [s, mode](CommandDone<int64_t> done) {
    s->Pause(mode, std::move(done));
  };
  (void)co_await SchedulerCall<int64_t>(std::move(pause));
  co_await RespondJson(ex, 200, R"({"status":"paused"})");
}

awaitable<void> EngineServer::Impl::VllmResume(HttpExchange& ex) {
  Scheduler* s = scheduler.get();
  CommandStart<bool> resume = [s](CommandDone<bool> done) { s->Continue(std::move(done)); };
  (void)co_await SchedulerCall<bool>(std::move(resume));
  co_await RespondJson(ex, 200, R"({"status":"resumed"})");
}

awaitable<void> EngineServer::Impl::VllmIsPaused(HttpExchange& ex) {
  const SchedulerStats stats = scheduler->stats();
  const bool paused = stats.paused || stats.draining;
  co_await RespondJson(ex, 200, paused ? R"({"is_paused":true})" : R"({"is_paused":false})");
}

awaitable<void> EngineServer::Impl::VllmAbort(HttpExchange& ex) {
  absl::StatusOr<boost::json::object> body = VllmBody(ex.request().body);
  std::vector<std::string> ids;
  if (body.ok()) {
    if (const boost::json::value* v = body->if_contains("request_ids");
        v != nullptr && !v->is_null()) {
      if (!v->is_array()) {
        body = absl::InvalidArgumentError("request_ids must be a list of strings");
      } else {
        for (const boost::json::value& id : v->get_array()) {
          if (!id.is_string()) {
            body = absl::InvalidArgumentError("request_ids must be a list of strings");
            break;
          }
          ids.emplace_back(id.get_string().data(), id.get_string().size());
        }
      }
    }
  }
  if (!body.ok()) {
    co_await RespondError(ex, body.status());
    co_return;
  }
  Scheduler* s = scheduler.get();
  int64_t aborted = 0;
  if (ids.empty()) {
    CommandStart<int64_t> all = [s](CommandDone<int64_t> done) {
      s->AbortMatching(Scheduler::AbortScope::kAll, "", std::move(done));
    };
    aborted = co_await SchedulerCall<int64_t>(std::move(all));
  } else {
    for (const std::string& id : ids) {
      CommandStart<int64_t> one = [s, id](CommandDone<int64_t> done) {
        s->AbortMatching(Scheduler::AbortScope::kRidExact, id, std::move(done));
      };
      aborted += co_await SchedulerCall<int64_t>(std::move(one));
    }
  }
  boost::json::object answer;
  answer["status"] = "aborted";
  answer["aborted"] = ids.empty() ? aborted : static_cast<int64_t>(ids.size());
  const std::string text = boost::json::serialize(answer);
  co_await RespondJson(ex, 200, text);
}

awaitable<void> EngineServer::Impl::VllmCollectiveRpc(HttpExchange& ex) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<boost::json::object> body = VllmBody(ex.request().body);
  std::filesystem::path dir = options.model_dir;
  if (body.ok()) {
    const boost::json::value* method = body->if_contains("method");
    if (method == nullptr || method->is_null()) {
      body = absl::InvalidArgumentError("Missing 'method' in request body");
    } else if (!method->is_string() || method->get_string() != "reload_weights") {
      body = absl::NotFoundError(absl::StrCat("the reference engine's workers have no method ",
                                              boost::json::serialize(*method),
                                              "; the one they have is reload_weights"));
    } else if (const boost::json::value* kwargs = body->if_contains("kwargs");
               kwargs != nullptr && kwargs->is_object()) {
      if (const boost::json::value* path = kwargs->get_object().if_contains("weights_path");
          path != nullptr && path->is_string()) {
        dir = std::string(path->get_string().data(), path->get_string().size());
      }
    }
  }
  if (!body.ok()) {
    co_await RespondError(ex, body.status());
    co_return;
  }
  if (absl::Status begun = BeginCommit("another weight load is in progress"); !begun.ok()) {
    co_await RespondError(ex, begun);
    co_return;
  }
  absl::StatusOr<LoadedCheckpoint> loaded = co_await LoadForCommit(dir, "");
  if (!loaded.ok()) {
    committing = false;
    const absl::Status error = Annotate(loaded.status(), "reload_weights failed");
    co_await RespondError(ex, error);
    co_return;
  }
  // vLLM's reload keeps the label: /update_weight_version names the new
  // weights afterwards. Internally the scheduler tags them with the version
  // the checkpoint records (else the label as it stands), so that its own
  // accounting and the version spans of what it generates from now on name
  // the weights that generate it.
  VersionRef version = scheduler->weight_version();
  if (vllm_weight_version.has_value()) {
    if (absl::StatusOr<VersionRef> named = VersionRef::Parse(*vllm_weight_version); named.ok()) {
      version = *named;
    }
  }
  if (loaded->recorded_version.has_value()) version.version = *loaded->recorded_version;
  absl::StatusOr<CommitOutcome> outcome =
      co_await SwapIn(std::move(loaded->weights), version, start);
  committing = false;
  if (!outcome.ok()) {
    co_await RespondError(ex, outcome.status());
    co_return;
  }
  outcome->message = absl::StrCat("reloaded ", dir.string());
  RecordCommit(*outcome);
  co_await RespondJson(ex, 200, R"({"results":[null]})");
}

awaitable<void> EngineServer::Impl::VllmUpdateWeightVersion(HttpExchange& ex) {
  absl::StatusOr<boost::json::object> body = VllmBody(ex.request().body);
  std::string label;
  if (body.ok()) {
    const boost::json::value* v = body->if_contains("new_version");
    if (v == nullptr || !v->is_string()) {
      body = absl::InvalidArgumentError("new_version is required and must be a string");
    } else {
      label = std::string(v->get_string().data(), v->get_string().size());
    }
  }
  if (!body.ok()) {
    co_await RespondError(ex, body.status());
    co_return;
  }
  vllm_weight_version = label;
  boost::json::object answer;
  answer["success"] = true;
  answer["new_version"] = label;
  const std::string text = boost::json::serialize(answer);
  co_await RespondJson(ex, 200, text);
}

awaitable<void> EngineServer::Impl::VllmWeightInfo(HttpExchange& ex) {
  boost::json::object answer;
  if (vllm_weight_version.has_value()) {
    answer["weight_version"] = *vllm_weight_version;
  } else {
    answer["weight_version"] = nullptr;
  }
  const std::string text = boost::json::serialize(answer);
  co_await RespondJson(ex, 200, text);
}

awaitable<void> EngineServer::Impl::VllmResetPrefixCache(HttpExchange& ex) {
  Scheduler* s = scheduler.get();
  CommandStart<absl::Status> flush = [s](CommandDone<absl::Status> done) {
    s->FlushCache(std::move(done));
  };
  // Like vLLM, a cache that cannot be reset now (requests hold it) is not
  // an error of the route.
  (void)co_await SchedulerCall<absl::Status>(std::move(flush));
  HttpResponse response;
  response.status = 200;
  (void)co_await ex.Respond(std::move(response));
}

awaitable<void> EngineServer::Impl::VllmHealth(HttpExchange& ex) {
  if (faults.OnHealthCheck()) {
    co_await ex.WaitDisconnected();
    co_return;
  }
  HttpResponse response;
  response.status = scheduler->Healthy() ? 200 : 503;
  (void)co_await ex.Respond(std::move(response));
}

awaitable<void> EngineServer::Impl::VllmMetrics(HttpExchange& ex) {
  const SchedulerStats stats = scheduler->stats();
  const std::string model = options.served_model_name;
  std::string text = absl::StrCat(
      "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"", model,
      "\"} ", stats.running, "\n# TYPE vllm:num_requests_waiting gauge\n",
      "vllm:num_requests_waiting{model_name=\"", model, "\"} ", stats.queued, "\n");
  if (last_cache_salt.has_value()) {
    // The reference engine's own: what isolated the latest request's prefix
    // cache, so that a test can see what a sidecar sent.
    std::string salt;
    for (char c : *last_cache_salt) {
      if (c == '\n') {
        salt += "\\n";
        continue;
      }
      if (c == '\\' || c == '"') salt += '\\';
      salt += c;
    }
    absl::StrAppend(&text,
                    "# TYPE stitch_engine_last_cache_salt gauge\nstitch_engine_last_cache_salt{"
                    "cache_salt=\"",
                    salt, "\"} 1\n");
  }
  HttpResponse response = PrometheusResponse(std::move(text));
  (void)co_await ex.Respond(std::move(response));
}

HttpRouter EngineServer::Impl::VllmRoutes() {
  HttpRouter router;
  for (ApiRoute route : {ApiRoute::kCompletions, ApiRoute::kChatCompletions}) {
    router.Add("POST", std::string(RoutePath(route)),
               [this, route](HttpExchange& ex) { return Generate(ex, route); });
  }
  router.Add("POST", "/pause", [this](HttpExchange& ex) { return VllmPause(ex); });
  router.Add("POST", "/resume", [this](HttpExchange& ex) { return VllmResume(ex); });
  router.Add("GET", "/is_paused", [this](HttpExchange& ex) { return VllmIsPaused(ex); });
  router.Add("POST", "/abort_requests", [this](HttpExchange& ex) { return VllmAbort(ex); });
  router.Add("POST", "/collective_rpc", [this](HttpExchange& ex) { return VllmCollectiveRpc(ex); });
  router.Add("POST", "/update_weight_version",
             [this](HttpExchange& ex) { return VllmUpdateWeightVersion(ex); });
  router.Add("GET", "/weight_info", [this](HttpExchange& ex) { return VllmWeightInfo(ex); });
  router.Add("POST", "/reset_prefix_cache",
             [this](HttpExchange& ex) { return VllmResetPrefixCache(ex); });
  router.Add("GET", "/health", [this](HttpExchange& ex) { return VllmHealth(ex); });
  router.Add("GET", "/metrics", [this](HttpExchange& ex) { return VllmMetrics(ex); });
  router.Add("GET", "/v1/models", [this](HttpExchange& ex) -> awaitable<void> {
    const std::string body = FormatModelList(Status());
    co_await RespondJson(ex, 200, body);
  });
  return router;
}

}  // namespace stitch
