#include "stitch/refengine/server.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <random>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "stitch/core/errors.h"
#include "stitch/format/index.h"
#include "stitch/net/auth.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/http.h"
#include "stitch/net/prometheus.h"
#include "stitch/net/server.h"
#include "stitch/net/sse.h"
#include "stitch/net/worker_pool.h"
#include "stitch/refengine/staging.h"
#include "stitch/refengine/weights.h"

namespace stitch {

namespace asio = boost::asio;
using asio::awaitable;

absl::Status EngineOptions::Validate() const {
  if (model_dir.empty()) return absl::InvalidArgumentError("--model is required");
  if (absl::Status s = ValidateVersionNumber(boot_version); !s.ok()) {
    return Annotate(s, "--boot-version");
  }
  if (!run_id.empty()) {
    if (absl::Status s = ValidateRunId(run_id); !s.ok()) return Annotate(s, "--run-id");
  }
  if (worker_threads < 1) return absl::InvalidArgumentError("worker_threads must be >= 1");
  if (codec_threads < 0) return absl::InvalidArgumentError("codec_threads must be >= 0");
  if (absl::Status s = scheduler.Validate(); !s.ok()) return s;
  return faults.Validate();
}

namespace {

int HttpStatusFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kPermissionDenied:
      return 400;
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kDataLoss:
      return 422;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
      return 503;
    default:
      return 500;
  }
}

std::string_view ErrorTypeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return "InvalidRequest";
    case absl::StatusCode::kNotFound:
      return "NotFound";
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      return "FailedPrecondition";
    case absl::StatusCode::kPermissionDenied:
      return "PermissionDenied";
    case absl::StatusCode::kAborted:
      return "Conflict";
    case absl::StatusCode::kDataLoss:
      return "CorruptVersion";
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
      return "EngineBusy";
    default:
      return "InternalError";
  }
}

HttpResponse ErrorResponse(const absl::Status& status) {
  const std::string_view message(status.message().data(), status.message().size());
  HttpResponse response =
      JsonResponse(HttpStatusFor(status), ErrorJson(ErrorTypeFor(status), message));
  if (response.status == 503) response.headers.Set("Retry-After", "1");
  return response;
}

HttpHeaders EventStreamHeaders() {
  HttpHeaders headers;
  headers.Add("Content-Type", "text/event-stream");
  headers.Add("Cache-Control", "no-cache");
  return headers;
}

// Generation updates for one request, delivered on its loop: the scheduler
// thread posts them, the request's coroutine awaits them.
class UpdateChannel {
 public:
  explicit UpdateChannel(const asio::any_io_executor& executor) : timer_(executor) {
    timer_.expires_at(asio::steady_timer::time_point::max());
  }

  void Push(GenerationUpdate update) {
    updates_.push_back(std::move(update));
    timer_.cancel();
  }

  // Returns once an update is queued, or when the awaiting coroutine is
  // cancelled (so that it composes with `||`).
  awaitable<void> Wait() {
    while (updates_.empty()) {
      co_await timer_.async_wait(asio::as_tuple(asio::use_awaitable));
      auto state = co_await asio::this_coro::cancellation_state;
      if (state.cancelled() != asio::cancellation_type::none) co_return;
    }
  }

  std::deque<GenerationUpdate>& updates() { return updates_; }

 private:
  asio::steady_timer timer_;
  std::deque<GenerationUpdate> updates_;
};

GenerationSink MakeSink(const asio::any_io_executor& executor,
                        const std::shared_ptr<UpdateChannel>& channel) {
  return [executor, weak = std::weak_ptr<UpdateChannel>(channel)](GenerationUpdate update) {
    asio::post(executor, [weak, update = std::move(update)]() mutable {
      if (std::shared_ptr<UpdateChannel> c = weak.lock()) c->Push(std::move(update));
    });
  };
}

// A scheduler command's completion callback, and what starts the command.
template <typename T>
using CommandDone = absl::AnyInvocable<void(T) &&>;
template <typename T>
using CommandStart = absl::AnyInvocable<void(CommandDone<T>) &&>;

// Runs `start(done)`, which hands `done` to the scheduler, and resumes on
// this coroutine's executor with the value `done` receives (from any thread).
//
// About the coroutines in this file: GCC 12 destroys the temporaries of a
// co_await expression twice when the expression suspends. So arguments of a
// co_await are named objects (moved, or bound by reference) or trivially
// destructible, never temporaries with resources; that is why the initiation
// below captures only pointers into this frame.
template <typename T>
awaitable<T> SchedulerCall(CommandStart<T> start) {
  const asio::any_io_executor executor = co_await asio::this_coro::executor;
  CommandStart<T>* start_ptr = &start;
  const asio::any_io_executor* executor_ptr = &executor;
  auto initiation = [start_ptr, executor_ptr](auto handler) {
    std::move (*start_ptr)(
        [executor = *executor_ptr, handler = std::move(handler)](T value) mutable {
          asio::post(executor, [handler = std::move(handler), value = std::move(value)]() mutable {
            std::move(handler)(std::move(value));
          });
        });
  };
  co_return co_await asio::async_initiate<decltype(asio::use_awaitable), void(T)>(
      initiation, asio::use_awaitable);
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

struct EngineServer::Impl {
  explicit Impl(EngineOptions o) : options(std::move(o)), faults(options.faults) {}

  EngineOptions options;
  ModelConfig config;
  int64_t parameters = 0;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  FaultInjector faults;

  // Destroyed in reverse: the HTTP server first (its handlers reference
  // everything), the event loop last.
  EventLoop loop;
  std::unique_ptr<WorkerPool> workers;
  std::unique_ptr<WeightStager> stager;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<HttpServer> http;

  // Loop thread only.
  std::mt19937_64 random{std::random_device{}()};
  bool committing = false;
  // Starts a weight load (committing set): Aborted with `busy` while another
  // runs, or the fault injected into commits.
  absl::Status BeginCommit(std::string_view busy) {
    if (committing) return absl::AbortedError(AbslView(busy));
    if (absl::Status fault = faults.OnCommit(); !fault.ok()) return fault;
    committing = true;
    return absl::OkStatus();
  }
  // vLLM: the label /update_weight_version set; nullopt before the first.
  std::optional<std::string> vllm_weight_version;
  // vLLM: the cache_salt of the latest generation request (for /metrics).
  std::optional<std::string> last_cache_salt;
  const std::string instance_id = absl::StrFormat("%016x%016x", random(), random());

  mutable absl::Mutex mu;
  std::optional<CommitOutcome> last_commit ABSL_GUARDED_BY(mu);

  EngineStatus Status() const;
  HttpRouter Routes();

  std::string NewRid() { return absl::StrFormat("%016x%016x", random(), random()); }

  // Callers pass named objects (see SchedulerCall's comment).
  awaitable<void> RespondError(HttpExchange& ex, const absl::Status& status) {
    HttpResponse response = ErrorResponse(status);
    if (options.api == EngineApi::kVllm) {
      response.body = VllmErrorJson(
          response.status, std::string_view(status.message().data(), status.message().size()));
    }
    (void)co_await ex.Respond(std::move(response));
  }
  static awaitable<void> RespondJson(HttpExchange& ex, int status, const std::string& body) {
    HttpResponse response = JsonResponse(status, body);
    (void)co_await ex.Respond(std::move(response));
  }

  awaitable<void> Generate(HttpExchange& ex, ApiRoute route);
  awaitable<void> Pause(HttpExchange& ex);
  awaitable<void> Continue(HttpExchange& ex);
  awaitable<void> FlushCache(HttpExchange& ex);
  awaitable<void> AbortRequests(HttpExchange& ex);
  awaitable<void> Health(HttpExchange& ex);
  awaitable<void> Stage(HttpExchange& ex);
  awaitable<void> UpdateFromDisk(HttpExchange& ex);
  awaitable<void> UpdateFromCpu(HttpExchange& ex);
  // vLLM's routes (docs/engine.md, "The vLLM dialect").
  HttpRouter VllmRoutes();
  awaitable<void> VllmPause(HttpExchange& ex);
  awaitable<void> VllmResume(HttpExchange& ex);
  awaitable<void> VllmIsPaused(HttpExchange& ex);
  awaitable<void> VllmAbort(HttpExchange& ex);
  awaitable<void> VllmCollectiveRpc(HttpExchange& ex);
  awaitable<void> VllmUpdateWeightVersion(HttpExchange& ex);
  awaitable<void> VllmWeightInfo(HttpExchange& ex);
  awaitable<void> VllmResetPrefixCache(HttpExchange& ex);
  awaitable<void> VllmHealth(HttpExchange& ex);
  awaitable<void> VllmMetrics(HttpExchange& ex);
  // Swaps `weights` in as `version` (the scheduler holds between two
  // steps), frees the old ones off the loop: what the commit did, or the
  // scheduler's error. Records nothing.
  awaitable<absl::StatusOr<CommitOutcome>> SwapIn(std::shared_ptr<const ModelWeights> weights,
                                                  VersionRef version,
                                                  std::chrono::steady_clock::time_point start);
  // The last commit, as /server_info reports it.
  void RecordCommit(const CommitOutcome& outcome);
  // SwapIn, then records and answers the commit.
  awaitable<void> Commit(HttpExchange& ex, std::shared_ptr<const ModelWeights> weights,
                         VersionRef version, std::string what,
                         std::chrono::steady_clock::time_point start);
};

EngineStatus EngineServer::Impl::Status() const {
  EngineStatus s;
  s.model_path = options.model_dir.string();
  s.served_model_name = options.served_model_name;
  s.config = config;
  s.parameters = parameters;
  s.boot_version = options.boot_version;
  s.scheduler_options = options.scheduler;
  s.scheduler = scheduler->stats();
  s.staging = stager->info();
  s.faults = options.faults;
  s.seconds_since_heartbeat = scheduler->SecondsSinceHeartbeat();
  s.healthy = scheduler->Healthy();
  s.uptime_seconds = SecondsSince(started);
  s.instance_id = instance_id;
  absl::MutexLock lock(&mu);
  s.last_commit = last_commit;
  return s;
}

awaitable<void> EngineServer::Impl::Generate(HttpExchange& ex, ApiRoute route) {
  using namespace asio::experimental::awaitable_operators;
  absl::StatusOr<ApiRequest> parsed =
      ParseApiRequest(route, ex.request().body, config, options.api);
  if (!parsed.ok()) {
    co_await RespondError(ex, parsed.status());
    co_return;
  }
  ApiRequest& request = *parsed;
  request.report_spans = options.report_spans;
  GenerationRequest& g = request.generation;
  if (options.api == EngineApi::kVllm) {
    if (request.response_rid.empty()) request.response_rid = NewRid();
    g.rid = VllmEngineRid(route, request.response_rid);
    last_cache_salt = g.extra_key;
  }
  if (g.rid.empty()) g.rid = NewRid();
  g.sampling.seed = request.seed.has_value() ? *request.seed : random();

  GenerationProgress progress;
  progress.rid = options.api == EngineApi::kVllm ? request.response_rid : g.rid;
  progress.prompt_tokens = static_cast<int64_t>(g.prompt.size());
  progress.weight_version = scheduler->weight_version();
  const ResponseContext context{options.served_model_name, UnixSeconds()};
  const auto start = std::chrono::steady_clock::now();

  auto executor = co_await asio::this_coro::executor;
  auto channel = std::make_shared<UpdateChannel>(executor);
  absl::StatusOr<uint64_t> id = scheduler->Submit(request.generation, MakeSink(executor, channel));
  if (!id.ok()) {
    co_await RespondError(ex, id.status());
    co_return;
  }
  if (request.stream) {
    HttpHeaders headers = EventStreamHeaders();
    if (!(co_await ex.BeginStream(200, std::move(headers))).ok()) {
      scheduler->Abort(*id);
      co_return;
    }
  }
  StreamCursor cursor;
  while (!progress.finish.has_value()) {
    co_await (channel->Wait() || ex.WaitDisconnected());
    if (ex.disconnected()) {
      scheduler->Abort(*id);
      co_return;
    }
    // Updates that queued while this coroutine waited each still get their
    // own events (like SGLang with stream_interval 1): a slow event loop
    // writes them in one chunk, never merges them.
    std::string chunk;
    while (!channel->updates().empty()) {
      progress.Apply(std::move(channel->updates().front()));
      channel->updates().pop_front();
      if (progress.finish.has_value()) progress.e2e_latency_seconds = SecondsSince(start);
      if (!request.stream) continue;
      for (const std::string& event : FormatStreamEvents(request, progress, &cursor, context)) {
        chunk += SseEvent(event);
      }
    }
    if (!request.stream) continue;
    if (progress.finish.has_value()) chunk += SseEvent("[DONE]");
    if (!(co_await ex.WriteChunk(std::move(chunk))).ok()) {
      scheduler->Abort(*id);
      co_return;
    }
  }
  if (request.stream) {
    (void)co_await ex.EndStream();
    co_return;
  }
  const std::string body = FormatResponse(request, progress, context);
  co_await RespondJson(ex, 200, body);
}

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

awaitable<absl::StatusOr<CommitOutcome>> EngineServer::Impl::SwapIn(
    std::shared_ptr<const ModelWeights> weights, VersionRef version,
    std::chrono::steady_clock::time_point start) {
  Scheduler* s = scheduler.get();
  FaultInjector* f = &faults;
  CommandStart<absl::StatusOr<SwapResult>> swap =
      [s, f, weights = std::move(weights),
       version](CommandDone<absl::StatusOr<SwapResult>> done) mutable {
        s->SwapWeights(
            std::move(weights), version, [f] { f->OnCommitPaused(); }, std::move(done));
      };
  absl::StatusOr<SwapResult> swapped =
      co_await SchedulerCall<absl::StatusOr<SwapResult>>(std::move(swap));
  if (!swapped.ok()) co_return swapped.status();
  // The old weights are freed off the loop and off the scheduler thread.
  std::shared_ptr<const ModelWeights> previous = std::move(swapped->previous);
  auto release = [&previous] { previous.reset(); };
  co_await RunBlocking(*workers, std::move(release));
  CommitOutcome outcome;
  outcome.weight_version = version;
  outcome.previous_version = swapped->previous_version;
  outcome.pause_seconds = swapped->pause_seconds;
  outcome.resident_requests = swapped->resident_requests;
  outcome.seconds = SecondsSince(start);
  co_return outcome;
}

void EngineServer::Impl::RecordCommit(const CommitOutcome& outcome) {
  absl::MutexLock lock(&mu);
  last_commit = outcome;
}

awaitable<void> EngineServer::Impl::Commit(HttpExchange& ex,
                                           std::shared_ptr<const ModelWeights> weights,
                                           VersionRef version, std::string what,
                                           std::chrono::steady_clock::time_point start) {
  absl::StatusOr<CommitOutcome> outcome = co_await SwapIn(std::move(weights), version, start);
  if (!outcome.ok()) {
    co_await RespondError(ex, outcome.status());
    co_return;
  }
  outcome->message =
      absl::StrCat("committed ", version.ToString(), " from ", what, "; ",
                   outcome->resident_requests, " resident requests continue on the new weights");
  RecordCommit(*outcome);
  const std::string body = FormatCommitResult(*outcome);
  co_await RespondJson(ex, 200, body);
}

awaitable<void> EngineServer::Impl::UpdateFromDisk(HttpExchange& ex) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<UpdateFromDiskRequest> parsed = ParseUpdateFromDiskRequest(ex.request().body);
  if (!parsed.ok()) {
    co_await RespondError(ex, parsed.status());
    co_return;
  }
  if (absl::Status begun = BeginCommit("another commit is in progress; retry after it");
      !begun.ok()) {
    co_await RespondError(ex, begun);
    co_return;
  }
  UpdateFromDiskRequest request = *std::move(parsed);
  struct Loaded {
    std::shared_ptr<const ModelWeights> weights;
    std::optional<int64_t> recorded_version;
  };
  auto load = [&request]() -> absl::StatusOr<Loaded> {
    absl::StatusOr<std::shared_ptr<const ModelWeights>> w = LoadCheckpoint(request.model_path);
    if (!w.ok()) return w.status();
    Loaded out;
    out.weights = *std::move(w);
    if (absl::StatusOr<CheckpointIndex> index = ReadIndex(request.model_path); index.ok()) {
      if (absl::StatusOr<std::optional<int64_t>> v = index->version(); v.ok()) {
        out.recorded_version = *v;
      }
    }
    return out;
  };
  absl::StatusOr<Loaded> loaded = co_await RunBlocking(*workers, std::move(load));
  if (loaded.ok() && !(loaded->weights->config() == config)) {
    loaded = absl::InvalidArgumentError(
        absl::StrCat(request.model_path.string(),
                     " holds another model configuration than the served one; "
                     "an engine only loads checkpoints of its own architecture"));
  }
  if (!loaded.ok()) {
    committing = false;
    const absl::Status error = Annotate(
        loaded.status(), "update_weights_from_disk failed, the serving weights are unchanged");
    co_await RespondError(ex, error);
    co_return;
  }
  if (!request.weight_version.has_value() && !loaded->recorded_version.has_value()) {
    // Keeping the old label on new weights would make every later response
    // name weights that are no longer served.
    committing = false;
    const absl::Status unlabelled = absl::InvalidArgumentError(absl::StrCat(
        request.model_path.string(),
        " records no version (its index has no metadata.version): give weight_version, the "
        "version these weights are; the serving weights are unchanged"));
    co_await RespondError(ex, unlabelled);
    co_return;
  }
  if (request.abort_all_requests) {
    Scheduler* s = scheduler.get();
    CommandStart<int64_t> abort = [s](CommandDone<int64_t> done) {
      s->AbortMatching(Scheduler::AbortScope::kAll, "", std::move(done));
    };
    (void)co_await SchedulerCall<int64_t>(std::move(abort));
  }
  const VersionRef current = scheduler->weight_version();
  VersionRef version = current;
  if (request.weight_version.has_value()) {
    version.version = request.weight_version->version;
    if (!request.weight_version->run_id.empty()) version.run_id = request.weight_version->run_id;
  } else if (loaded->recorded_version.has_value()) {
    version.version = *loaded->recorded_version;
  }
  if (version == current &&
      loaded->weights->fingerprint() != scheduler->stats().weights_fingerprint) {
    // A label names one set of weights: reusing it for others would make
    // responses under it ambiguous.
    committing = false;
    const absl::Status relabel = absl::InvalidArgumentError(absl::StrCat(
        request.model_path.string(), " holds other weights than the served ", version.ToString(),
        ", and a version names one set of weights: give the weight_version these weights are; "
        "the serving weights are unchanged"));
    co_await RespondError(ex, relabel);
    co_return;
  }
  std::string what = absl::StrCat("disk (", request.model_path.string(), ")");
  co_await Commit(ex, std::move(loaded->weights), version, std::move(what), start);
  committing = false;
}

awaitable<void> EngineServer::Impl::UpdateFromCpu(HttpExchange& ex) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<UpdateFromCpuRequest> parsed = ParseUpdateFromCpuRequest(ex.request().body);
  if (!parsed.ok()) {
    co_await RespondError(ex, parsed.status());
    co_return;
  }
  if (absl::Status begun = BeginCommit("another commit is in progress; retry after it");
      !begun.ok()) {
    co_await RespondError(ex, begun);
    co_return;
  }
  const VersionRef target = parsed->target_version;
  absl::StatusOr<PreparedWeights> prepared = stager->TakePrepared(target.version, target.run_id);
  if (!prepared.ok()) {
    committing = false;
    co_await RespondError(ex, prepared.status());
    co_return;
  }
  std::string what = "the cpu stage";
  co_await Commit(ex, std::move(prepared->weights), prepared->version, std::move(what), start);
  committing = false;
}

HttpRouter EngineServer::Impl::Routes() {
  if (options.api == EngineApi::kVllm) return VllmRoutes();
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

// The vLLM dialect ----------------------------------------------------------

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
  std::optional<int64_t> recorded;  // the checkpoint's metadata.version, when it has one
  auto load = [&dir, &recorded]() -> absl::StatusOr<std::shared_ptr<const ModelWeights>> {
    absl::StatusOr<std::shared_ptr<const ModelWeights>> w = LoadCheckpoint(dir);
    if (!w.ok()) return w;
    if (absl::StatusOr<CheckpointIndex> index = ReadIndex(dir); index.ok()) {
      if (absl::StatusOr<std::optional<int64_t>> v = index->version(); v.ok()) recorded = *v;
    }
    return w;
  };
  absl::StatusOr<std::shared_ptr<const ModelWeights>> loaded =
      co_await RunBlocking(*workers, std::move(load));
  if (loaded.ok() && !((*loaded)->config() == config)) {
    loaded = absl::InvalidArgumentError(
        absl::StrCat(dir.string(), " holds another model configuration than the served one"));
  }
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
  if (recorded.has_value()) version.version = *recorded;
  absl::StatusOr<CommitOutcome> outcome = co_await SwapIn(*std::move(loaded), version, start);
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

absl::StatusOr<std::unique_ptr<EngineServer>> EngineServer::Start(EngineOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (options.served_model_name.empty()) {
    options.served_model_name = options.model_dir.filename().string();
    if (options.served_model_name.empty()) {
      options.served_model_name = options.model_dir.parent_path().filename().string();
    }
  }
  absl::StatusOr<std::shared_ptr<const ModelWeights>> weights = LoadCheckpoint(options.model_dir);
  if (!weights.ok()) return Annotate(weights.status(), "engine: --model");

  auto impl = std::make_unique<Impl>(std::move(options));
  impl->config = (*weights)->config();
  for (const TensorSpec& spec : ExpectedTensors(impl->config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    impl->parameters += n;
  }
  impl->workers = std::make_unique<WorkerPool>(impl->options.worker_threads);
  impl->stager = std::make_unique<WeightStager>(impl->config, impl->options.codec_threads);
  impl->scheduler = std::make_unique<Scheduler>(
      *std::move(weights), VersionRef{impl->options.run_id, impl->options.boot_version},
      impl->options.scheduler);
  ServerOptions server_options;
  server_options.host = impl->options.host;
  server_options.port = impl->options.port;
  HttpHandler routes = impl->Routes().AsHandler();
  if (!impl->options.api_key.empty()) {
    // As SGLang: health checks stay open, everything else needs the key,
    // checked at the header so that strangers hold no body budget.
    server_options.head_check =
        [key = impl->options.api_key](const HttpRequest& head) -> std::optional<HttpResponse> {
      if (TargetPath(head.target) == "/health" || PresentsBearerToken(head.headers, key)) {
        return std::nullopt;
      }
      return UnauthorizedResponse(
          absl::StrCat(head.method, " ", AbslView(TargetPath(head.target))));
    };
  }
  absl::StatusOr<std::unique_ptr<HttpServer>> http =
      HttpServer::Start(impl->loop.executor(), server_options, std::move(routes));
  if (!http.ok()) return Annotate(http.status(), "engine");
  impl->http = *std::move(http);
  return std::unique_ptr<EngineServer>(new EngineServer(std::move(impl)));
}

EngineServer::EngineServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EngineServer::~EngineServer() { Shutdown(); }

uint16_t EngineServer::port() const { return impl_->http ? impl_->http->port() : 0; }

std::string EngineServer::url() const { return impl_->http ? impl_->http->url() : std::string(); }

const Scheduler& EngineServer::scheduler() const { return *impl_->scheduler; }

Scheduler& EngineServer::mutable_scheduler() { return *impl_->scheduler; }

EngineStatus EngineServer::Status() const { return impl_->Status(); }

void EngineServer::Shutdown() {
  if (impl_ == nullptr) return;
  if (impl_->http != nullptr) {
    impl_->loop.BlockOn(impl_->http->Shutdown());
    impl_->http.reset();
  }
  impl_->scheduler.reset();
  impl_->stager.reset();
  impl_->workers.reset();
}

}  // namespace stitch
