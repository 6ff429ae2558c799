#include "stitch/refengine/server.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "stitch/core/errors.h"
#include "stitch/format/index.h"
#include "stitch/net/auth.h"
#include "stitch/net/http.h"
#include "stitch/net/sse.h"
#include "stitch/refengine/server_impl.h"

namespace stitch {

namespace asio = boost::asio;
using asio::awaitable;
using refengine_internal::CommandDone;
using refengine_internal::CommandStart;
using refengine_internal::LoadedCheckpoint;
using refengine_internal::SchedulerCall;
using refengine_internal::SecondsSince;
using refengine_internal::UnixSeconds;

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
  if (!(patch_max_density >= 0 && patch_max_density <= 1)) {
    return absl::InvalidArgumentError("--patch-max-density must be between 0 and 1");
  }
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

}  // namespace

namespace refengine_internal {

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace refengine_internal

awaitable<void> EngineServer::Impl::RespondError(HttpExchange& ex, const absl::Status& status) {
  HttpResponse response = ErrorResponse(status);
  if (options.api == EngineApi::kVllm) {
    response.body = VllmErrorJson(
        response.status, std::string_view(status.message().data(), status.message().size()));
  }
  (void)co_await ex.Respond(std::move(response));
}

awaitable<void> EngineServer::Impl::RespondJson(HttpExchange& ex, int status,
                                                const std::string& body) {
  HttpResponse response = JsonResponse(status, body);
  (void)co_await ex.Respond(std::move(response));
}

HttpRouter EngineServer::Impl::Routes() {
  return options.api == EngineApi::kVllm ? VllmRoutes() : SglangRoutes();
}

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

// --- Commits ----------------------------------------------------------------

absl::Status EngineServer::Impl::BeginCommit(std::string_view busy) {
  if (committing) return absl::AbortedError(AbslView(busy));
  if (absl::Status fault = faults.OnCommit(); !fault.ok()) return fault;
  committing = true;
  return absl::OkStatus();
}

awaitable<absl::StatusOr<LoadedCheckpoint>> EngineServer::Impl::LoadForCommit(
    std::filesystem::path dir, std::string_view mismatch_hint) {
  auto load = [&dir]() -> absl::StatusOr<LoadedCheckpoint> {
    absl::StatusOr<std::shared_ptr<const ModelWeights>> w = LoadCheckpoint(dir);
    if (!w.ok()) return w.status();
    LoadedCheckpoint out;
    out.weights = *std::move(w);
    if (absl::StatusOr<CheckpointIndex> index = ReadIndex(dir); index.ok()) {
      if (absl::StatusOr<std::optional<int64_t>> v = index->version(); v.ok()) {
        out.recorded_version = *v;
      }
    }
    return out;
  };
  absl::StatusOr<LoadedCheckpoint> loaded = co_await RunBlocking(*workers, std::move(load));
  if (loaded.ok() && !(loaded->weights->config() == config)) {
    loaded = absl::InvalidArgumentError(
        absl::StrCat(dir.string(), " holds another model configuration than the served one",
                     AbslView(mismatch_hint)));
  }
  co_return loaded;
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

awaitable<absl::StatusOr<CommitOutcome>> EngineServer::Impl::PatchIn(
    std::shared_ptr<const WeightPatch> patch, std::chrono::steady_clock::time_point start) {
  Scheduler* s = scheduler.get();
  FaultInjector* f = &faults;
  const int64_t fail_after = faults.OnPatch(patch->tensors.size());
  const WeightPatchStats stats = patch->stats;
  CommandStart<absl::StatusOr<SwapResult>> apply =
      [s, f, fail_after, patch = std::move(patch)](CommandDone<absl::StatusOr<SwapResult>> done) {
        s->PatchWeights(
            patch, fail_after, [f] { f->OnCommitPaused(); }, std::move(done));
      };
  absl::StatusOr<SwapResult> patched =
      co_await SchedulerCall<absl::StatusOr<SwapResult>>(std::move(apply));
  if (!patched.ok()) co_return patched.status();
  CommitOutcome outcome;
  outcome.weight_version = scheduler->weight_version();
  outcome.previous_version = patched->previous_version;
  outcome.pause_seconds = patched->pause_seconds;
  outcome.resident_requests = patched->resident_requests;
  outcome.seconds = SecondsSince(start);
  outcome.path = "patch";
  outcome.values_changed = stats.values_changed;
  co_return outcome;
}

void EngineServer::Impl::RecordCommit(const CommitOutcome& outcome) {
  absl::MutexLock lock(&mu);
  last_commit = outcome;
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
  impl->stager = std::make_unique<WeightStager>(impl->config, impl->options.codec_threads,
                                                impl->options.patch_max_density);
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
