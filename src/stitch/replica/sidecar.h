// The replica sidecar: one HTTP server beside one inference engine that
// converges the engine to the store's pointer (Reconciler), keeps checking
// that the engine answers and holds the weights it loaded (Watchdog), and
// serves the versioned rollout API (VersionedProxy) through one admission
// gate that serves nothing until the engine's weights are verified.
// docs/sidecar.md has the HTTP contract.
//
// Routes it serves itself (never held by admission):
//   GET  /health       200 {"ready": true} once caught up; else 503
//                      {"ready": false, "reason": "..."}
//   GET  /server_info  ReplicaState as JSON (core/state.h)
//   POST /wake         asks for a reconcile pass; answers like /server_info
//   GET  /metrics      Prometheus text: the sidecar's (metrics.h), then the engine's own
// These match only as spelled: a path whose canonical form (api/routes.h:
// decoded, normalized, trailing slashes and letter case aside) names one of
// them, such as /%77ake, //wake or /wake/, is answered 404 and never
// forwarded, since the engine would read it as that route with the
// engine's key; another method is answered 405. Everything else goes to the proxy (proxy.h). With a
// bearer token (Settings::auth_token), /wake needs it, and with auth_data_plane every route but
// /health and /metrics does (docs/sidecar.md, "Bearer tokens").
//
// Threading: everything runs on one event loop; store and codec work on a
// worker pool.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "absl/status/statusor.h"
#include "stitch/engine/engine.h"
#include "stitch/net/clock.h"
#include "stitch/net/server.h"
#include "stitch/net/worker_pool.h"
#include "stitch/replica/admission_gate.h"
#include "stitch/replica/metrics.h"
#include "stitch/replica/proxy.h"
#include "stitch/replica/reconciler.h"
#include "stitch/replica/watchdog.h"
#include "stitch/store/store.h"

namespace stitch {

class Sidecar {
 public:
  // The ports the sidecar drives; each must outlive it.
  struct Ports {
    boost::asio::any_io_executor loop;
    WorkerPool* pool = nullptr;
    Store* store = nullptr;
    Engine* engine = nullptr;
    Clock* clock = nullptr;
  };
  struct Settings {
    ReconcilerOptions reconciler;
    WatchdogOptions watchdog;
    ProxyOptions proxy;
    ServerOptions server;
    // Called once, on the loop, when the replica turns terminal (the process
    // should then exit non-zero).
    std::function<void(const absl::Status&)> on_terminal;
    // When not empty, POST /wake needs "Authorization: Bearer <auth_token>",
    // and with auth_data_plane so does every route but /health and /metrics.
    std::string auth_token;
    bool auth_data_plane = false;
    // Logs every request's method and target at info level as its header
    // arrives (the original's --debug-requests).
    bool log_requests = false;
    // Serve the store's verified version files to peers (GET
    // kPeerFileRoute): only in a fleet that fetches from peers (--peers).
    bool serve_peers = false;
    // This sidecar's id among its peers (Store::peer_id).
    std::string peer_id;
  };

  // Starts listening, reconciling and watching. Must run on `ports.loop`.
  // Errors: the server's (a port in use, a host that does not resolve).
  [[nodiscard]] static boost::asio::awaitable<absl::StatusOr<std::unique_ptr<Sidecar>>> Start(
      Settings settings, Ports ports);

  ~Sidecar();
  Sidecar(const Sidecar&) = delete;
  Sidecar& operator=(const Sidecar&) = delete;

  // Stops the server (connections close, handlers finish), the reconciler
  // and the watchdog. Must run on the loop; call before destroying.
  boost::asio::awaitable<void> Shutdown();

  std::string url() const { return server_->url(); }
  uint16_t port() const { return server_->port(); }

  AdmissionGate& gate() { return *gate_; }
  Reconciler& reconciler() { return *reconciler_; }
  Watchdog& watchdog() { return *watchdog_; }
  VersionedProxy& proxy() { return *proxy_; }

  SidecarMetrics Metrics() const;

 private:
  Sidecar() = default;
  boost::asio::awaitable<void> Health(HttpExchange& exchange);
  boost::asio::awaitable<void> ServerInfo(HttpExchange& exchange);
  boost::asio::awaitable<void> Wake(HttpExchange& exchange);
  boost::asio::awaitable<void> MetricsRoute(HttpExchange& exchange);
  // kHoldRoute and kReleaseRoute (api/routes.h): 200 with /server_info's
  // body; 400 for malformed parameters; 409 for a hold the reconciler
  // refuses; 404 for a release by a holder that holds nothing here.
  boost::asio::awaitable<void> HoldRoute(HttpExchange& exchange);
  boost::asio::awaitable<void> ReleaseRoute(HttpExchange& exchange);
  // /server_info's body when `done` is OK; else 400 (InvalidArgument), 404
  // (NotFound) or 409 with its message.
  HttpResponse AdminAnswer(const absl::Status& done) const;
  // GET kPeerFileRoute?version=N&name=FILE[&wait_ms=T]: a version file the
  // store verified (Store::OpenVerifiedFile), streamed; 404 when it holds
  // none (after waiting up to wait_ms for it); 409 when the request is this
  // sidecar's own (kPeerIdHeader).
  boost::asio::awaitable<void> PeerFile(HttpExchange& exchange);

  std::function<void(const absl::Status&)> on_terminal_;
  Store* store_ = nullptr;
  WorkerPool* pool_ = nullptr;
  Clock* clock_ = nullptr;
  std::string peer_id_;
  Engine* engine_ = nullptr;
  std::unique_ptr<AdmissionGate> gate_;
  std::unique_ptr<Reconciler> reconciler_;
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<VersionedProxy> proxy_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace stitch
