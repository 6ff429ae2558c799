#include "stitch/replica/sidecar.h"

#include <cmath>
#include <utility>

#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/net/auth.h"
#include "stitch/net/prometheus.h"

namespace stitch {

namespace json = boost::json;
using boost::asio::awaitable;

namespace {

absl::Status Refuse(std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("sidecar: ", AbslView(message)));
}

absl::StatusOr<Clock::Duration> Seconds(double seconds, std::string_view flag) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e7) {
    return Refuse(absl::StrCat(AbslView(flag), " must be a number of seconds >= 0 (got ", seconds,
                               "); 0 disables it"));
  }
  return std::chrono::duration_cast<Clock::Duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

absl::StatusOr<SidecarConfig> CheckSidecarFlags(const SidecarFlags& flags) {
  SidecarConfig config;
  if (flags.store.empty()) {
    return Refuse("--store is required: give the store URI the trainer publishes to");
  }
  config.store_uri = flags.store;
  if (flags.run_id.empty()) {
    return Refuse("--run-id must not be empty: give the run the base checkpoint belongs to");
  }
  if (absl::Status s = ValidateRunId(flags.run_id); !s.ok()) {
    return Refuse(absl::StrCat("--run-id: ", s.message()));
  }
  if (flags.boot_version < 0 || flags.boot_version > kMaxVersion) {
    return Refuse(absl::StrCat("--boot-version must be between 0 and ", kMaxVersion, " (got ",
                               flags.boot_version,
                               "): give the version the base checkpoint holds"));
  }
  if (flags.engine == "sglang") {
    config.engine = EngineKind::kSglang;
  } else if (flags.engine == "sglang-stock") {
    config.engine = EngineKind::kSglangStock;
  } else {
    return Refuse(
        absl::StrCat("--engine must be sglang or sglang-stock (got \"", flags.engine, "\")"));
  }
  auto url = ParseHttpUrl(flags.engine_url);
  if (!url.ok()) return Refuse(absl::StrCat("--engine-url: ", url.status().message()));
  config.engine_url = flags.engine_url;
  config.engine_http = *url;
  if (flags.base_checkpoint.empty()) {
    return Refuse(
        "--base-checkpoint is required: give the checkpoint directory the engine was started "
        "with");
  }
  auto mode = ParseUpdateDestination(flags.update_mode);
  if (!mode.ok()) return Refuse(absl::StrCat("--update-mode: ", mode.status().message()));
  config.update_mode = *mode;
  if (config.engine == EngineKind::kSglangStock && config.update_mode == UpdateDestination::kCpu) {
    return Refuse(
        "--update-mode cpu needs an engine that stages by itself: --engine sglang-stock loads "
        "versions only from disk (use --update-mode disk, or --engine sglang)");
  }
  if (flags.local_checkpoint.empty()) {
    if (config.engine == EngineKind::kSglangStock) {
      return Refuse(
          "--engine sglang-stock needs --local-checkpoint: give the directory the sidecar stages "
          "versions into");
    }
    if (config.update_mode == UpdateDestination::kDisk) {
      return Refuse(
          "--update-mode disk needs --local-checkpoint: give the directory the engine stages "
          "versions into (or use --update-mode cpu)");
    }
  }
  config.local_checkpoint = flags.local_checkpoint;
  auto commit = ParseCommitMode(flags.commit_mode);
  if (!commit.ok()) return Refuse(absl::StrCat("--commit-mode: ", commit.status().message()));

  auto reconcile = Seconds(flags.reconcile_interval_s, "--reconcile-interval");
  if (!reconcile.ok()) return reconcile.status();
  auto watchdog = Seconds(flags.watchdog_interval_s, "--watchdog-interval");
  if (!watchdog.ok()) return watchdog.status();
  if (flags.watchdog_threshold < 1 || flags.watchdog_threshold > 1000000) {
    return Refuse(absl::StrCat("--watchdog-threshold must be at least 1 (got ",
                               flags.watchdog_threshold,
                               "): it is how many failed health checks in a row end the replica"));
  }
  if (flags.port < 0 || flags.port > 65535) {
    return Refuse(absl::StrCat("--port must be between 0 and 65535 (got ", flags.port,
                               "); 0 picks a free port"));
  }
  if (flags.host.empty()) return Refuse("--host must not be empty: give an address to listen on");

  config.reconciler.run_id = flags.run_id;
  config.reconciler.boot_version = flags.boot_version;
  config.reconciler.base_checkpoint_dir = flags.base_checkpoint;
  config.reconciler.commit_mode = *commit;
  config.reconciler.flush_cache_on_commit = flags.flush_cache_on_commit;
  config.reconciler.reconcile_interval = *reconcile;
  config.watchdog.interval = *watchdog;
  config.watchdog.threshold = static_cast<int>(flags.watchdog_threshold);
  config.watchdog.probe_timeout = std::max<std::chrono::milliseconds>(
      std::chrono::milliseconds(100),
      std::min<std::chrono::milliseconds>(
          std::chrono::duration_cast<std::chrono::milliseconds>(*watchdog),
          std::chrono::seconds(5)));
  config.reconciler.report_timeout =
      std::max<std::chrono::milliseconds>(config.watchdog.probe_timeout, std::chrono::seconds(5));
  config.server.host = flags.host;
  config.server.port = static_cast<uint16_t>(flags.port);
  return config;
}

// Sidecar ------------------------------------------------------------------------

Sidecar::~Sidecar() = default;

awaitable<absl::StatusOr<std::unique_ptr<Sidecar>>> Sidecar::Start(Settings settings, Ports ports) {
  std::unique_ptr<Sidecar> sidecar(new Sidecar());
  sidecar->on_terminal_ = std::move(settings.on_terminal);
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
  sidecar->proxy_ =
      std::make_unique<VersionedProxy>(ports.loop, settings.proxy, *ports.engine, *sidecar->gate_);
  sidecar->reconciler_->SetDistrustListener([self] { self->proxy_->AbortInFlight(); });
  sidecar->proxy_->SetUnreachableListener([self](std::string_view why) {
    self->reconciler_->EngineUnreachable(why);
    self->watchdog_->ProbeNow();
  });
  sidecar->proxy_->SetMislabelListener(
      [self](std::string why) { self->reconciler_->Distrust(std::move(why)); });

  // Health and metrics stay open for probes and scrapers; the control route
  // needs the token, and with auth_data_plane everything else does too.
  const std::string data_token = settings.auth_data_plane ? settings.auth_token : std::string();
  HttpRouter router;
  router.Add("GET", "/health", [self](HttpExchange& ex) { return self->Health(ex); });
  router.Add("GET", "/server_info", RequireBearerToken(data_token, [self](HttpExchange& ex) {
               return self->ServerInfo(ex);
             }));
  router.Add("GET", "/metrics", [self](HttpExchange& ex) { return self->MetricsRoute(ex); });
  router.Add("POST", "/wake", RequireBearerToken(settings.auth_token, [self](HttpExchange& ex) {
               return self->Wake(ex);
             }));
  router.SetFallback(RequireBearerToken(
      data_token, [self](HttpExchange& ex) { return self->proxy_->Handle(ex); }));
  auto server = HttpServer::Start(ports.loop, settings.server, router.AsHandler());
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
  HttpResponse response = JsonResponse(200, reconciler_->State().ToJson());
  (void)co_await exchange.Respond(std::move(response));
}

awaitable<void> Sidecar::Wake(HttpExchange& exchange) {
  reconciler_->Wake();
  HttpResponse response = JsonResponse(200, reconciler_->State().ToJson());
  (void)co_await exchange.Respond(std::move(response));
}

awaitable<void> Sidecar::MetricsRoute(HttpExchange& exchange) {
  HttpResponse response = PrometheusResponse(RenderPrometheus(Metrics()));
  (void)co_await exchange.Respond(std::move(response));
}

}  // namespace stitch
