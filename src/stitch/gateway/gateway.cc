#include "stitch/gateway/gateway.h"

#include <iterator>

#include <optional>
#include <string>
#include <utility>

#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include "stitch/api/dispatch.h"
#include "stitch/api/server_info.h"
#include "stitch/gateway/dashboard_page.h"
#include "stitch/gateway/relay.h"
#include "stitch/gateway/replica_table.h"
#include "stitch/net/auth.h"
#include "stitch/net/client.h"
#include "stitch/net/prometheus.h"

namespace stitch {

namespace json = boost::json;
using boost::asio::awaitable;

namespace {

ClientOptions UpstreamClientOptions(const GatewayOptions& options) {
  ClientOptions c;
  c.request_timeout = options.upstream_timeout;
  c.max_idle_per_origin = 1024;
  return c;
}

ReplicaTableOptions TableOptions(const GatewayOptions& options) {
  ReplicaTableOptions t;
  t.poll_interval = options.poll_interval;
  t.waiting_wake_interval = options.waiting_wake_interval;
  t.probe_timeout = options.probe_timeout;
  t.stall_timeout = options.stall_timeout;
  t.bearer_token = options.auth_token;
  return t;
}

// How long one serialization of /ui/state serves every viewer: however many
// dashboards are open, the loop that routes serializes at most this often.
constexpr auto kUiStateReuse = std::chrono::milliseconds(250);

}  // namespace

struct Gateway::Impl {
  Impl(boost::asio::any_io_executor executor, Pool& pool, WorkerPool& workers, Clock& clock,
       GatewayOptions gateway_options)
      : options(std::move(gateway_options)),
        clock(clock),
        client(executor, UpstreamClientOptions(options)),
        table(executor, pool, workers, client, clock, TableOptions(options)),
        relay(client, table, clock, options, counters) {
    handlers.versioned = [this](HttpExchange& ex, ApiRoute) { return relay.Versioned(ex); };
    handlers.other = [this](HttpExchange& ex) { return relay.Other(ex); };
    // Replicas of any engine may stand behind the gateway: the read-only
    // routes of every dialect pass, and each sidecar judges for its engine.
    handlers.dialects.assign(std::begin(kEngineDialects), std::end(kEngineDialects));
    handlers.blocked_why =
        "only each replica's sidecar drives its engine, so the gateway refuses it";
    handlers.on_blocked = [this] { ++counters.blocked; };
  }

  const GatewayOptions options;
  Clock& clock;
  GatewayCounters counters;
  HttpClient client;
  ReplicaTable table;
  Relay relay;
  ApiHandlers handlers;
  std::unique_ptr<HttpServer> server;
  std::string ui_state;  // the last /ui/state body, and when it was made
  std::optional<Clock::TimePoint> ui_state_at;

  GatewayCounters Counters() const {
    GatewayCounters c = counters;
    c.stalls = table.counters().stalls;
    c.wakes = table.counters().wakes;
    return c;
  }

  // --- own routes ---------------------------------------------------------------
  awaitable<void> Health(HttpExchange& exchange) {
    // Replicas held for evaluation serve their exact pins only: a pool of
    // nothing else is not ready for general traffic.
    const size_t ready = table.index().routable().all().size();
    json::object body;
    body["ready"] = ready > 0;
    body["ready_replicas"] = ready;
    body["replicas"] = table.replicas().size();
    if (ready == 0) body["reason"] = "no replica of the pool is ready";
    HttpResponse response = JsonResponse(ready > 0 ? 200 : 503, json::serialize(body));
    if (ready == 0) response.headers.Set("Retry-After", "1");
    (void)co_await exchange.Respond(std::move(response));
  }

  awaitable<void> Replicas(HttpExchange& exchange) {
    HttpResponse response = JsonResponse(200, ReplicasJson(table.Snapshot()));
    (void)co_await exchange.Respond(std::move(response));
  }

  awaitable<void> Ui(HttpExchange& exchange) {
    HttpResponse response{200, {}, std::string(DashboardPage())};
    response.headers.Set("Content-Type", "text/html; charset=utf-8");
    response.headers.Set("Cache-Control", "no-store");
    (void)co_await exchange.Respond(std::move(response));
  }

  awaitable<void> UiState(HttpExchange& exchange) {
    const Clock::TimePoint now = clock.Now();
    if (!ui_state_at.has_value() || now - *ui_state_at >= kUiStateReuse) {
      ui_state = table.history().Json(table.replicas());
      ui_state_at = now;
    }
    HttpResponse response = JsonResponse(200, ui_state);
    response.headers.Set("Cache-Control", "no-store");
    (void)co_await exchange.Respond(std::move(response));
  }

  awaitable<void> Metrics(HttpExchange& exchange) {
    const GatewayCounters c = Counters();
    const SessionTable<ReplicaPtr>& sessions = relay.sessions();
    PrometheusText text("stitch_gateway_");
    text.One("requests_total", "counter", "Versioned requests received.", c.requests);
    text.One("routed_total", "counter", "Attempts sent to a replica.", c.routed);
    text.One("retried_total", "counter", "Attempts retried on another replica.", c.retried);
    text.One("waited_total", "counter", "Requests that waited for the fleet to catch up.",
             c.waited);
    text.One("rejected_total", "counter", "409s answered by the gateway itself.", c.rejected);
    text.One("unservable_total", "counter",
             "409s answered at once: an exact version every replica has moved past.", c.unservable);
    text.One("stalls_total", "counter",
             "Replicas found busy without progress for the stall timeout.", c.stalls);
    text.One("sessions", "gauge", "Sessions in the session table.", sessions.size());
    text.One("session_table_bytes", "gauge", "Memory the session table counts against its budget.",
             sessions.bytes());
    text.One("sessions_evicted_total", "counter",
             "Least recently used sessions forgotten to keep the table within its budget.",
             sessions.evictions());
    WriteBodyBudgetMetrics(server->stats(), text);
    text.One("blocked_total", "counter", "Engine control routes refused.", c.blocked);
    text.One("wakes_total", "counter", "Fleet wakes started.", c.wakes);
    text.One("replicas_ready", "gauge", "Replicas ready to serve.",
             table.index().routable().all().size());
    const ReplicaMap& replicas = table.replicas();
    text.Header("replica_in_flight", "gauge", "Requests outstanding on a replica.");
    for (const auto& [url, r] : replicas) {
      text.Sample("replica_in_flight", PromLabels("replica", url), r->in_flight);
    }
    text.Header("replica_ready", "gauge", "Whether a replica is in rotation.");
    for (const auto& [url, r] : replicas) {
      text.Sample("replica_ready", PromLabels("replica", url), r->routable() ? 1 : 0);
    }
    text.Header("replica_stalled", "gauge",
                "Whether a replica is stalled (busy, nothing received for the stall timeout).");
    for (const auto& [url, r] : replicas) {
      text.Sample("replica_stalled", PromLabels("replica", url), r->stalled ? 1 : 0);
    }
    text.Header("replica_version", "gauge", "Applied version of a replica (-1: none).");
    for (const auto& [url, r] : replicas) {
      text.Sample("replica_version", PromLabels("replica", url), r->version().value_or(-1));
    }
    HttpResponse response = PrometheusResponse(text.Take());
    (void)co_await exchange.Respond(std::move(response));
  }
};

Gateway::Gateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gateway::~Gateway() = default;

absl::StatusOr<std::unique_ptr<Gateway>> Gateway::Start(boost::asio::any_io_executor executor,
                                                        Pool& pool, WorkerPool& workers,
                                                        Clock& clock, GatewayOptions options) {
  auto impl = std::make_unique<Impl>(executor, pool, workers, clock, std::move(options));
  Impl* self = impl.get();
  HttpRouter router;
  router.Add("GET", "/health", [self](HttpExchange& ex) { return self->Health(ex); });
  router.Add(
      "GET", "/replicas", [self](HttpExchange& ex) { return self->Replicas(ex); },
      self->options.auth_token);
  router.Add("GET", "/metrics", [self](HttpExchange& ex) { return self->Metrics(ex); });
  // The page holds no data; what it draws is the fleet's, as on /replicas.
  router.Add("GET", "/ui", [self](HttpExchange& ex) { return self->Ui(ex); });
  router.Add(
      "GET", "/ui/state", [self](HttpExchange& ex) { return self->UiState(ex); },
      self->options.auth_token);
  router.SetFallback([self](HttpExchange& ex) { return DispatchApiRequest(ex, self->handlers); },
                     self->options.auth_data_plane ? self->options.auth_token : std::string());
  // Strangers are refused at the header, before their bodies are held.
  ServerOptions server_options = self->options.server;
  server_options.head_check = router.TokenCheck();
  server_options.holds_credential = HoldsBearerToken(self->options.auth_token);
  auto server = HttpServer::Start(executor, server_options, router.AsHandler());
  if (!server.ok()) return server.status();
  impl->server = *std::move(server);
  impl->table.Start();
  return std::unique_ptr<Gateway>(new Gateway(std::move(impl)));
}

std::string Gateway::url() const { return impl_->server->url(); }
uint16_t Gateway::port() const { return impl_->server->port(); }

awaitable<void> Gateway::Shutdown() {
  impl_->table.Stop();  // waiting requests return, background tasks end
  co_await impl_->server->Shutdown();
  co_await impl_->table.Stopped();
}

PoolState Gateway::Snapshot() const { return impl_->table.Snapshot(); }
GatewayCounters Gateway::counters() const { return impl_->Counters(); }

}  // namespace stitch
