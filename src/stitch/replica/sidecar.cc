#include "stitch/replica/sidecar.h"

#include <algorithm>
#include <optional>
#include <span>
#include <utility>

#include <spdlog/spdlog.h>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "stitch/api/routes.h"
#include "stitch/api/server_info.h"
#include "stitch/core/errors.h"
#include "stitch/net/auth.h"
#include "stitch/net/prometheus.h"

namespace stitch {

namespace json = boost::json;
using boost::asio::awaitable;

namespace {

// A query value that is a plain decimal number: digits only, however it
// was encoded (no sign, no space, no "%2B"), at most 18 of them.
std::optional<int64_t> DecimalParam(const std::optional<std::string>& text) {
  if (!text.has_value() || text->empty() || text->size() > 18 ||
      !std::all_of(text->begin(), text->end(),
                   [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); })) {
    return std::nullopt;
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(*text, &value)) return std::nullopt;
  return value;
}

}  // namespace

Sidecar::~Sidecar() = default;

awaitable<absl::StatusOr<std::unique_ptr<Sidecar>>> Sidecar::Start(Settings settings, Ports ports) {
  std::unique_ptr<Sidecar> sidecar(new Sidecar());
  sidecar->on_terminal_ = std::move(settings.on_terminal);
  sidecar->store_ = ports.store;
  sidecar->pool_ = ports.pool;
  sidecar->clock_ = ports.clock;
  sidecar->peer_id_ = settings.peer_id;
  sidecar->engine_ = ports.engine;
  Sidecar* self = sidecar.get();
  // Nothing versioned is served until the reconciler verified (or loaded)
  // what the engine holds.
  sidecar->gate_ = std::make_unique<AdmissionGate>(ports.loop);
  sidecar->reconciler_ =
      std::make_unique<Reconciler>(ports.loop, settings.reconciler, *ports.store, *ports.engine,
                                   *sidecar->gate_, *ports.pool, *ports.clock);
  sidecar->reconciler_->SetTerminalListener([self](const absl::Status& why) {
    if (self->on_terminal_) self->on_terminal_(why);
  });
  Reconciler* reconciler = sidecar->reconciler_.get();
  const std::chrono::milliseconds probe_timeout = settings.watchdog.probe_timeout;
  sidecar->watchdog_ = std::make_unique<Watchdog>(
      ports.loop, settings.watchdog, *ports.clock, [reconciler] { return reconciler->may_probe(); },
      [reconciler, probe_timeout] { return reconciler->CheckEngine(probe_timeout); },
      [reconciler](absl::Status why) { reconciler->Fail(std::move(why)); });
  sidecar->watchdog_->SetAnsweredBefore([reconciler] { return reconciler->engine_answered(); });
  // Health and metrics stay open for probes and scrapers; the control route
  // needs the token, and with auth_data_plane everything else does too.
  const std::string data_token = settings.auth_data_plane ? settings.auth_token : std::string();
  struct Served {
    std::string method;
    std::string path;
    HttpHandler handler;
    std::string token;
  };
  std::vector<Served> own = {
      {"GET", "/health", [self](HttpExchange& ex) { return self->Health(ex); }, ""},
      {"GET", "/server_info", [self](HttpExchange& ex) { return self->ServerInfo(ex); },
       data_token},
      {"GET", "/metrics", [self](HttpExchange& ex) { return self->MetricsRoute(ex); }, ""},
      {"POST", "/wake", [self](HttpExchange& ex) { return self->Wake(ex); }, settings.auth_token},
      {"POST", std::string(kHoldRoute), [self](HttpExchange& ex) { return self->HoldRoute(ex); },
       settings.auth_token},
      {"POST", std::string(kReleaseRoute),
       [self](HttpExchange& ex) { return self->ReleaseRoute(ex); }, settings.auth_token},
  };
  if (settings.serve_peers) {
    own.push_back({"GET", std::string(kPeerFileRoute),
                   [self](HttpExchange& ex) { return self->PeerFile(ex); }, settings.auth_token});
  }
  // What the router does not match as spelled goes to the proxy, which
  // answers a respelling of these itself.
  for (const Served& route : own) settings.proxy.own_routes.push_back({route.method, route.path});
  sidecar->proxy_ =
      std::make_unique<VersionedProxy>(ports.loop, settings.proxy, *ports.engine, *sidecar->gate_);
  sidecar->reconciler_->SetDistrustListener([self] { self->proxy_->AbortInFlight(); });
  sidecar->proxy_->SetUnreachableListener([self](std::string_view why) {
    self->reconciler_->EngineUnreachable(why);
    self->watchdog_->ProbeNow();
  });
  sidecar->proxy_->SetMislabelListener(
      [self](std::string why) { self->reconciler_->Distrust(std::move(why)); });

  HttpRouter router;
  for (Served& route : own) {
    router.Add(std::move(route.method), std::move(route.path), std::move(route.handler),
               std::move(route.token));
  }
  router.SetFallback([self](HttpExchange& ex) { return self->proxy_->Handle(ex); }, data_token);
  // Strangers are refused at the header, before their bodies are held.
  ServerOptions server_options = settings.server;
  server_options.head_check = router.TokenCheck();
  server_options.holds_credential = HoldsBearerToken(settings.auth_token);
  if (settings.log_requests) {
    server_options.head_check = [check = std::move(server_options.head_check)](
                                    const HttpRequest& head) -> std::optional<HttpResponse> {
      spdlog::info("request: {} {}", head.method, head.target);
      return check ? check(head) : std::nullopt;
    };
  }
  auto server = HttpServer::Start(ports.loop, server_options, router.AsHandler());
  if (!server.ok()) co_return Annotate(server.status(), "sidecar");
  sidecar->server_ = *std::move(server);

  sidecar->reconciler_->Start();
  sidecar->watchdog_->Start();
  co_return sidecar;
}

awaitable<void> Sidecar::Shutdown() {
  server_->Stop();
  co_await watchdog_->Stop();
  co_await reconciler_->Stop();
  co_await server_->Shutdown();
}

SidecarMetrics Sidecar::Metrics() const {
  SidecarMetrics m;
  m.applied = gate_->known_serving();
  m.ready = reconciler_->ready();
  m.terminal = !reconciler_->terminal().ok();
  m.sync_state = reconciler_->sync_state();
  m.admitted = gate_->admitted_total();
  m.rejected_not_ready = gate_->rejected_not_ready_total();
  m.rejected_terminal = gate_->rejected_terminal_total();
  m.rejected_unverified = gate_->rejected_unverified_total();
  m.in_flight = gate_->active();
  m.proxy = proxy_->counters();
  m.reconciler = reconciler_->counters();
  m.watchdog_probes = watchdog_->probes();
  m.watchdog_failures = watchdog_->failures();
  m.store = store_->traffic();
  m.commit_paths = engine_->CommitPaths();
  m.server = server_->stats();
  return m;
}

awaitable<void> Sidecar::Health(HttpExchange& exchange) {
  json::object body;
  body["ready"] = reconciler_->ready();
  if (!reconciler_->ready()) {
    std::string reason = reconciler_->reason();
    if (reason.empty()) reason = "catching up with the store's pointer";
    body["reason"] = reason;
  }
  HttpResponse response = JsonResponse(reconciler_->ready() ? 200 : 503, json::serialize(body));
  (void)co_await exchange.Respond(std::move(response));
}

awaitable<void> Sidecar::ServerInfo(HttpExchange& exchange) {
  HttpResponse response = JsonResponse(200, ServerInfoJson(reconciler_->State()));
  (void)co_await exchange.Respond(std::move(response));
}

awaitable<void> Sidecar::Wake(HttpExchange& exchange) {
  reconciler_->Wake();
  HttpResponse response = JsonResponse(200, ServerInfoJson(reconciler_->State()));
  (void)co_await exchange.Respond(std::move(response));
}

awaitable<void> Sidecar::HoldRoute(HttpExchange& exchange) {
  const std::string& target = exchange.request().target;
  const std::optional<int64_t> version = DecimalParam(TargetQueryParam(target, "version"));
  const std::optional<std::string> holder = TargetQueryParam(target, "holder");
  absl::Status held = absl::InvalidArgumentError(
      "give ?version=N (plain digits: a version of the run this replica follows) and "
      "&holder=NAME");
  if (version.has_value() && holder.has_value() && !holder->empty()) {
    const std::string run =
        gate_->trusted() ? gate_->serving().run_id : reconciler_->State().run_id;
    held = reconciler_->HoldForEvaluation(VersionRef{run, *version}, *holder);
  }
  (void)co_await exchange.Respond(AdminAnswer(held));
}

awaitable<void> Sidecar::ReleaseRoute(HttpExchange& exchange) {
  const std::optional<std::string> holder = TargetQueryParam(exchange.request().target, "holder");
  absl::Status released = absl::InvalidArgumentError("give ?holder=NAME");
  if (holder.has_value() && !holder->empty()) {
    released = reconciler_->ReleaseEvaluationHold(*holder);
  }
  (void)co_await exchange.Respond(AdminAnswer(released));
}

HttpResponse Sidecar::AdminAnswer(const absl::Status& done) const {
  if (done.ok()) return JsonResponse(200, ServerInfoJson(reconciler_->State()));
  const int status = absl::IsInvalidArgument(done) ? 400 : absl::IsNotFound(done) ? 404 : 409;
  const char* type = status == 400 ? "BadRequest" : status == 404 ? "NotFound" : "Conflict";
  return JsonResponse(status, JsonErrorBody(type, std::string(done.message())));
}

awaitable<void> Sidecar::PeerFile(HttpExchange& exchange) {
  const std::string& target = exchange.request().target;
  const std::optional<int64_t> version = DecimalParam(TargetQueryParam(target, "version"));
  const std::optional<std::string> name = TargetQueryParam(target, "name");
  const std::optional<std::string> wait_text = TargetQueryParam(target, "wait_ms");
  const std::optional<int64_t> wait_param = DecimalParam(wait_text);
  const int64_t wait_ms = wait_param.value_or(0);
  if (!version.has_value() || !name.has_value() ||
      (wait_text.has_value() && (!wait_param.has_value() || wait_ms > kPeerMaxWaitMs))) {
    HttpResponse response = JsonResponse(
        400, JsonErrorBody("BadRequest",
                           absl::StrCat("give ?version=N&name=FILE, a file of a published version, "
                                        "and optionally &wait_ms=0..",
                                        kPeerMaxWaitMs, ", the numbers in plain digits")));
    (void)co_await exchange.Respond(std::move(response));
    co_return;
  }
  if (const std::optional<std::string_view> asker = exchange.request().headers.Get(kPeerIdHeader);
      !peer_id_.empty() && asker.has_value() && *asker == peer_id_) {
    HttpResponse response =
        JsonResponse(409, JsonErrorBody("Self", "this is the asking replica's own sidecar"));
    (void)co_await exchange.Respond(std::move(response));
    co_return;
  }
  Store* store = store_;
  auto open = [store, version = *version, name] { return store->OpenVerifiedFile(version, *name); };
  absl::StatusOr<Store::VerifiedFile> file = co_await RunBlocking(*pool_, open);
  // The owner of a file other replicas want is usually fetching it right
  // now: wait for it rather than send them to the store.
  const auto deadline = clock_->Now() + std::chrono::milliseconds(wait_ms);
  while (absl::IsNotFound(file.status()) && clock_->Now() < deadline) {
    co_await clock_->SleepFor(std::chrono::milliseconds(50));
    file = co_await RunBlocking(*pool_, open);
  }
  if (!file.ok()) {
    const bool absent = absl::IsNotFound(file.status());
    HttpResponse response = JsonResponse(
        absent ? 404 : 400,
        JsonErrorBody(absent ? "NotFound" : "BadRequest", std::string(file.status().message())));
    (void)co_await exchange.Respond(std::move(response));
    co_return;
  }
  HttpHeaders headers;
  headers.Set("Content-Type", "application/octet-stream");
  if (!(co_await exchange.BeginStream(200, std::move(headers))).ok()) co_return;
  // Read on the worker pool, a chunk at a time, so that a large file holds
  // neither the event loop nor much memory.
  constexpr size_t kChunk = size_t{1} << 20;
  const int fd = file->fd.get();
  for (uint64_t offset = 0; offset < file->size;) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, file->size - offset));
    auto read = [fd, offset, want]() -> absl::StatusOr<std::string> {
      std::string chunk(want, '\0');
      if (absl::Status s =
              ReadFully(fd, offset, std::as_writable_bytes(std::span(chunk)), "peer file");
          !s.ok()) {
        return s;
      }
      return chunk;
    };
    absl::StatusOr<std::string> chunk = co_await RunBlocking(*pool_, std::move(read));
    // A short or failed read ends the body early: the peer's SHA-256 check
    // rejects what it got.
    if (!chunk.ok() || !(co_await exchange.WriteChunk(*std::move(chunk))).ok()) co_return;
    offset += want;
  }
  (void)co_await exchange.EndStream();
}

awaitable<void> Sidecar::MetricsRoute(HttpExchange& exchange) {
  // The engine's families (SGLang's sglang:*) follow ours, so that a
  // dashboard made for the engine keeps working behind the sidecar. An
  // engine slow to answer costs a scrape at most this long.
  constexpr std::chrono::seconds kEngineMetricsTimeout(2);
  std::optional<std::string> engine = co_await proxy_->EngineMetrics(kEngineMetricsTimeout);
  SidecarMetrics metrics = Metrics();
  metrics.engine_metrics_up = engine.has_value();
  std::string text = RenderPrometheus(metrics);
  if (engine.has_value() && !engine->empty()) {
    text += *engine;
    if (text.back() != '\n') text += '\n';
  }
  HttpResponse response = PrometheusResponse(std::move(text));
  (void)co_await exchange.Respond(std::move(response));
}

}  // namespace stitch
