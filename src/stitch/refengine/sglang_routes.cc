// SGLang's dialect of the reference engine's server: its control routes,
// Stitch's staging routes and the commits from disk and from the cpu stage
// (docs/engine.md). Generation and the state both dialects share are in
// server.cc.
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
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

awaitable<void> EngineServer::Impl::Pause(HttpExchange& ex) {
  absl::StatusOr<PauseMode> mode = ParsePauseRequest(ex.request().body);
  if (!mode.ok()) {
    co_await RespondError(ex, mode.status());
    co_return;
  }
  const PauseMode m = *mode;
  Scheduler* s = scheduler.get();
  CommandStart<int64_t> pause = [s, m](CommandDone<int64_t> done) { s->Pause(m, std::move(done)); };
  const int64_t affected = co_await SchedulerCall<int64_t>(std::move(pause));
  const std::string body =
      SuccessJson(absl::StrCat("generation paused (mode ", AbslView(PauseModeName(m)), "); ",
                               affected, " requests ",
                               m == PauseMode::kAbort     ? "aborted"
                               : m == PauseMode::kRetract ? "retracted"
                                                          : "held in place"),
                  {{"affected_requests", affected}});
  co_await RespondJson(ex, 200, body);
}

awaitable<void> EngineServer::Impl::Continue(HttpExchange& ex) {
  Scheduler* s = scheduler.get();
  CommandStart<bool> resume = [s](CommandDone<bool> done) { s->Continue(std::move(done)); };
  const bool was_paused = co_await SchedulerCall<bool>(std::move(resume));
  const std::string body =
      SuccessJson(was_paused ? "generation continues" : "generation was not paused; nothing to do");
  co_await RespondJson(ex, 200, body);
}

awaitable<void> EngineServer::Impl::FlushCache(HttpExchange& ex) {
  Scheduler* s = scheduler.get();
  CommandStart<absl::Status> flush = [s](CommandDone<absl::Status> done) {
    s->FlushCache(std::move(done));
  };
  const absl::Status status = co_await SchedulerCall<absl::Status>(std::move(flush));
  if (!status.ok()) {
    co_await RespondError(ex, status);
    co_return;
  }
  const std::string body = SuccessJson("cache flushed");
  co_await RespondJson(ex, 200, body);
}

awaitable<void> EngineServer::Impl::AbortRequests(HttpExchange& ex) {
  absl::StatusOr<AbortRequest> parsed = ParseAbortRequest(ex.request().body);
  if (!parsed.ok()) {
    co_await RespondError(ex, parsed.status());
    co_return;
  }
  Scheduler* s = scheduler.get();
  AbortRequest request = *std::move(parsed);
  CommandStart<int64_t> abort = [s, request](CommandDone<int64_t> done) {
    s->AbortMatching(request.scope, request.rid_prefix, std::move(done));
  };
  const int64_t aborted = co_await SchedulerCall<int64_t>(std::move(abort));
  const std::string body =
      SuccessJson(absl::StrCat("aborted ", aborted, " requests"), {{"aborted_requests", aborted}});
  co_await RespondJson(ex, 200, body);
}

awaitable<void> EngineServer::Impl::Health(HttpExchange& ex) {
  if (faults.OnHealthCheck()) {
    // Injected: never answer; the handler ends when the client goes away.
    co_await ex.WaitDisconnected();
    co_return;
  }
  if (!scheduler->Healthy()) {
    const absl::Status status = absl::UnavailableError(
        absl::StrFormat("the scheduler has made no progress for %.1f s (stall timeout %.1f s)",
                        scheduler->SecondsSinceHeartbeat(),
                        std::chrono::duration<double>(options.scheduler.stall_timeout).count()));
    co_await RespondError(ex, status);
    co_return;
  }
  const std::string body = FormatHealth(Status());
  co_await RespondJson(ex, 200, body);
}

awaitable<void> EngineServer::Impl::Stage(HttpExchange& ex) {
  absl::StatusOr<StageRequest> parsed = ParseStageRequest(ex.request().body);
  if (!parsed.ok()) {
    co_await RespondError(ex, parsed.status());
    co_return;
  }
  if (absl::Status fault = faults.OnStaging(); !fault.ok()) {
    co_await RespondError(ex, fault);
    co_return;
  }
  StageRequest request = *std::move(parsed);
  // What a cpu stage's patch would start from (checked again when applied).
  if (request.destination == UpdateDestination::kCpu) request.serving = scheduler->weight_version();
  WeightStager* st = stager.get();
  auto stage = [st, &request] { return st->Stage(request); };
  absl::StatusOr<StageResult> result = co_await RunBlocking(*workers, std::move(stage));
  if (!result.ok()) {
    const absl::Status error =
        Annotate(result.status(), "staging failed, the serving weights are unchanged");
    co_await RespondError(ex, error);
    co_return;
  }
  const std::string body = FormatStageResult(*result);
  co_await RespondJson(ex, 200, body);
}

// --- Commits ------------------------------------------------------------------

awaitable<bool> EngineServer::Impl::BeginCommitRoute(HttpExchange& ex, const absl::Status& parsed) {
  if (!parsed.ok()) {
    co_await RespondError(ex, parsed);
    co_return false;
  }
  const absl::Status begun = BeginCommit("another commit is in progress; retry after it");
  if (!begun.ok()) {
    co_await RespondError(ex, begun);
    co_return false;
  }
  co_return true;
}

awaitable<void> EngineServer::Impl::AbandonCommit(HttpExchange& ex, const absl::Status& error) {
  committing = false;
  co_await RespondError(ex, error);
}

awaitable<void> EngineServer::Impl::FinishCommit(HttpExchange& ex,
                                                 std::shared_ptr<const ModelWeights> weights,
                                                 VersionRef version, std::string what,
                                                 std::chrono::steady_clock::time_point start) {
  absl::StatusOr<CommitOutcome> outcome = co_await SwapIn(std::move(weights), version, start);
  co_await AnswerCommit(ex, std::move(outcome), what);
}

awaitable<void> EngineServer::Impl::AnswerCommit(HttpExchange& ex,
                                                 absl::StatusOr<CommitOutcome> outcome,
                                                 std::string_view what) {
  if (!outcome.ok()) {
    co_await RespondError(ex, outcome.status());
    committing = false;
    co_return;
  }
  outcome->message =
      absl::StrCat("committed ", outcome->weight_version.ToString(), " from ", AbslView(what), "; ",
                   outcome->resident_requests, " resident requests continue on the new weights");
  RecordCommit(*outcome);
  const std::string body = FormatCommitResult(*outcome);
  co_await RespondJson(ex, 200, body);
  committing = false;
}

namespace {

// The version /update_weights_from_disk commits `loaded` as, the serving
// one being `current`: the request's weight_version, else the one the
// checkpoint records. InvalidArgument when neither names one, or when it
// would relabel other weights with the serving version.
absl::StatusOr<VersionRef> DiskCommitVersion(const UpdateFromDiskRequest& request,
                                             const LoadedCheckpoint& loaded,
                                             const VersionRef& current,
                                             const Checksum128& serving_fingerprint) {
  VersionRef version = current;
  if (request.weight_version.has_value()) {
    version.version = request.weight_version->version;
    if (!request.weight_version->run_id.empty()) version.run_id = request.weight_version->run_id;
  } else if (loaded.recorded_version.has_value()) {
    version.version = *loaded.recorded_version;
  }
  if (version == current && loaded.weights->fingerprint() != serving_fingerprint) {
    // A label names one set of weights: reusing it for others would make
    // responses under it ambiguous.
    return absl::InvalidArgumentError(absl::StrCat(
        request.model_path.string(), " holds other weights than the served ", version.ToString(),
        ", and a version names one set of weights: give the weight_version these weights are; "
        "the serving weights are unchanged"));
  }
  return version;
}

}  // namespace

awaitable<void> EngineServer::Impl::UpdateFromDisk(HttpExchange& ex) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<UpdateFromDiskRequest> parsed = ParseUpdateFromDiskRequest(ex.request().body);
  const absl::Status parse_status = parsed.status();
  const bool begun = co_await BeginCommitRoute(ex, parse_status);
  if (!begun) co_return;
  UpdateFromDiskRequest request = *std::move(parsed);
  absl::StatusOr<LoadedCheckpoint> loaded = co_await LoadForCommit(
      request.model_path, "; an engine only loads checkpoints of its own architecture");
  if (!loaded.ok()) {
    const absl::Status error = Annotate(
        loaded.status(), "update_weights_from_disk failed, the serving weights are unchanged");
    co_await AbandonCommit(ex, error);
    co_return;
  }
  if (!request.weight_version.has_value() && !loaded->recorded_version.has_value()) {
    // Keeping the old label on new weights would make every later response
    // name weights that are no longer served.
    const absl::Status unlabelled = absl::InvalidArgumentError(absl::StrCat(
        request.model_path.string(),
        " records no version (its index has no metadata.version): give weight_version, the "
        "version these weights are; the serving weights are unchanged"));
    co_await AbandonCommit(ex, unlabelled);
    co_return;
  }
  if (request.abort_all_requests) {
    Scheduler* s = scheduler.get();
    CommandStart<int64_t> abort = [s](CommandDone<int64_t> done) {
      s->AbortMatching(Scheduler::AbortScope::kAll, "", std::move(done));
    };
    (void)co_await SchedulerCall<int64_t>(std::move(abort));
  }
  absl::StatusOr<VersionRef> version = DiskCommitVersion(
      request, *loaded, scheduler->weight_version(), scheduler->stats().weights_fingerprint);
  if (!version.ok()) {
    const absl::Status relabel = version.status();
    co_await AbandonCommit(ex, relabel);
    co_return;
  }
  std::string what = absl::StrCat("disk (", request.model_path.string(), ")");
  co_await FinishCommit(ex, std::move(loaded->weights), *version, std::move(what), start);
}

awaitable<void> EngineServer::Impl::UpdateFromCpu(HttpExchange& ex) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<UpdateFromCpuRequest> parsed = ParseUpdateFromCpuRequest(ex.request().body);
  const absl::Status parse_status = parsed.status();
  const bool begun = co_await BeginCommitRoute(ex, parse_status);
  if (!begun) co_return;
  const VersionRef target = parsed->target_version;
  absl::StatusOr<PreparedWeights> prepared = stager->TakePrepared(target.version, target.run_id);
  if (!prepared.ok()) {
    const absl::Status error = prepared.status();
    co_await AbandonCommit(ex, error);
    co_return;
  }
  if (prepared->patch == nullptr) {
    absl::StatusOr<CommitOutcome> outcome =
        co_await SwapIn(std::move(prepared->weights), prepared->version, start);
    if (outcome.ok()) {
      outcome->path = "swap";
      outcome->reason = prepared->reason;
    }
    co_await AnswerCommit(ex, std::move(outcome), "the cpu stage's whole weights");
    co_return;
  }
  const VersionRef patched = prepared->version;
  absl::StatusOr<CommitOutcome> outcome = co_await PatchIn(std::move(prepared->patch), start);
  if (absl::IsDataLoss(outcome.status())) {
    // Neither the new weights nor the old: nothing may be served under any
    // label. The process ends; a sidecar sees the engine gone.
    spdlog::critical("{}; the engine exits rather than serve weights nobody can name",
                     std::string(outcome.status().message()));
    std::_Exit(kUnknownWeightsExitCode);
  }
  if (absl::IsAborted(outcome.status())) {
    // Undone: the old weights serve on, under their label. The next cpu
    // staging of this target prepares whole weights.
    stager->PatchFailed(patched);
    const std::string body = UndoneJson(outcome.status(), scheduler->weight_version());
    co_await RespondJson(ex, 409, body);
    committing = false;
    co_return;
  }
  co_await AnswerCommit(ex, std::move(outcome), "the cpu stage's patch");
}

HttpRouter EngineServer::Impl::SglangRoutes() {
  HttpRouter router;
  auto generation = [this](ApiRoute route) {
    return [this, route](HttpExchange& ex) { return Generate(ex, route); };
  };
  for (ApiRoute route : kApiRoutes) {
    router.Add("POST", std::string(RoutePath(route)), generation(route));
  }
  router.Add("POST", "/pause_generation", [this](HttpExchange& ex) { return Pause(ex); });
  router.Add("POST", "/continue_generation", [this](HttpExchange& ex) { return Continue(ex); });
  router.Add("GET", "/flush_cache", [this](HttpExchange& ex) { return FlushCache(ex); });
  router.Add("POST", "/flush_cache", [this](HttpExchange& ex) { return FlushCache(ex); });
  router.Add("POST", "/abort_request", [this](HttpExchange& ex) { return AbortRequests(ex); });
  router.Add("GET", "/health", [this](HttpExchange& ex) { return Health(ex); });
  router.Add("POST", "/stage_weight_update", [this](HttpExchange& ex) { return Stage(ex); });
  router.Add("POST", "/update_weights_from_disk",
             [this](HttpExchange& ex) { return UpdateFromDisk(ex); });
  router.Add("POST", "/update_weights_from_cpu",
             [this](HttpExchange& ex) { return UpdateFromCpu(ex); });
  auto server_info = [this](HttpExchange& ex) -> awaitable<void> {
    const std::string body = FormatServerInfo(Status());
    co_await RespondJson(ex, 200, body);
  };
  router.Add("GET", "/server_info", server_info);
  router.Add("GET", "/get_server_info", server_info);
  auto model_info = [this](HttpExchange& ex) -> awaitable<void> {
    const std::string body = FormatModelInfo(Status());
    co_await RespondJson(ex, 200, body);
  };
  router.Add("GET", "/model_info", model_info);
  router.Add("GET", "/get_model_info", model_info);
  router.Add("GET", "/metrics", [this](HttpExchange& ex) -> awaitable<void> {
    (void)co_await ex.Respond(PrometheusResponse(FormatMetrics(Status())));
  });
  router.Add("GET", "/v1/models", [this](HttpExchange& ex) -> awaitable<void> {
    const std::string body = FormatModelList(Status());
    co_await RespondJson(ex, 200, body);
  });
  return router;
}

}  // namespace stitch
