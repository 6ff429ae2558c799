// `stitch gateway`: the version-aware router in front of a pool of replicas.
// Exit status: 0 after SIGINT or SIGTERM, 1 when it could not start, 2 for
// refused flags.

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <iostream>
#include <memory>

#include <boost/asio/signal_set.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "stitch/cli/commands.h"
#include "stitch/cli/report.h"
#include "stitch/cli/server_args.h"
#include "stitch/core/constraint.h"
#include "stitch/core/errors.h"
#include "stitch/gateway/gateway.h"
#include "stitch/net/auth.h"
#include "stitch/net/clock.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/server.h"
#include "stitch/net/worker_pool.h"
#include "stitch/pool/pool.h"

namespace stitch {
namespace {

constexpr int kExitRefused = 2;

struct GatewayFlags {
  std::string pool;
  std::string host = kDefaultListenHost;
  int port = 8080;
  std::string session_header = "X-Session-Id";
  std::string default_constraint;
  uint64_t affinity_prefix_bytes = 0;
  double affinity_load_factor = 1.25;
  double admission_wait_s = 30;
  double poll_interval_s = 1;
  double wake_interval_s =
      std::chrono::duration<double>(GatewayOptions{}.waiting_wake_interval).count();
  int max_attempts = 3;
  double stall_timeout_s = 5;
  double probe_timeout_s = 2;
  uint64_t max_session_id_bytes = 0;  // GatewayOptions' defaults, set with the options
  uint64_t session_table_bytes = 0;
  BodyLimitArgs body_limits;
  std::string auth_token_file;
  bool auth_data_plane = false;
};

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// Long on purpose: one process's wiring, in the order it happens (flags,
// token, pool, gateway, signals, shutdown).
int RunGateway(const GatewayFlags& flags) {
  if (flags.port < 0 || flags.port > 65535) {
    ReportFailure(absl::InvalidArgumentError(
        absl::StrCat("gateway: --port ", flags.port, " is not a TCP port (0 picks a free one)")));
    return kExitRefused;
  }
  if (flags.admission_wait_s < 0 || flags.poll_interval_s <= 0 || !(flags.wake_interval_s > 0) ||
      flags.max_attempts < 1 || flags.session_header.empty() || !(flags.stall_timeout_s >= 0) ||
      !(flags.probe_timeout_s > 0) || flags.max_session_id_bytes == 0 ||
      flags.session_table_bytes == 0) {
    ReportFailure(absl::InvalidArgumentError(
        "gateway: --admission-wait and --stall-timeout must be >= 0, --poll-interval, "
        "--wake-interval and --probe-timeout > 0, --max-attempts >= 1, --max-session-id-bytes and "
        "--session-table-bytes above 0 and --session-header non-empty"));
    return kExitRefused;
  }
  absl::StatusOr<ServerOptions> server =
      WithBodyLimits(ServerOptions{}, flags.body_limits, "gateway");
  if (!server.ok()) {
    ReportFailure(server.status());
    return kExitRefused;
  }
  auto token = LoadBearerToken(flags.auth_token_file, kAuthTokenEnv, "--auth-token-file");
  if (!token.ok()) {
    ReportFailure(Annotate(token.status(), "gateway"));
    return kExitRefused;
  }
  if (flags.auth_data_plane && token->empty()) {
    ReportFailure(absl::InvalidArgumentError(
        "gateway: --auth-data-plane needs a token: give --auth-token-file or set "
        "STITCH_AUTH_TOKEN"));
    return kExitRefused;
  }
  WakeOptions wake;
  wake.bearer_token = *token;
  auto pool = MakePool(flags.pool, wake);
  if (!pool.ok()) {
    ReportFailure(Annotate(pool.status(), "gateway: --pool"));
    return kExitRefused;
  }
  // Each relayed request holds two sockets.
  RaiseOpenFileLimit();

  GatewayOptions options;
  options.server = *std::move(server);
  options.server.host = flags.host;
  options.server.port = static_cast<uint16_t>(flags.port);
  options.session_header = flags.session_header;
  if (!(flags.affinity_load_factor >= 1)) {
    ReportFailure(absl::InvalidArgumentError(
        absl::StrCat("gateway: --affinity-load-factor ", flags.affinity_load_factor,
                     " is below 1; no replica could then take its share")));
    return kExitRefused;
  }
  options.affinity_prefix_bytes = flags.affinity_prefix_bytes;
  options.affinity_load_factor = flags.affinity_load_factor;
  if (!flags.default_constraint.empty()) {
    absl::StatusOr<VersionConstraint> c = ParseConstraintSpec(flags.default_constraint);
    if (!c.ok()) {
      ReportFailure(Annotate(c.status(), "gateway: --default-constraint"));
      return kExitRefused;
    }
    options.default_constraint = *c;
  }
  options.admission_wait = Millis(flags.admission_wait_s);
  options.poll_interval = Millis(flags.poll_interval_s);
  options.waiting_wake_interval = Millis(flags.wake_interval_s);
  options.max_attempts = flags.max_attempts;
  options.stall_timeout = Millis(flags.stall_timeout_s);
  options.probe_timeout = Millis(flags.probe_timeout_s);
  options.max_session_id_bytes = flags.max_session_id_bytes;
  options.session_table_bytes = flags.session_table_bytes;
  options.auth_token = *token;
  options.auth_data_plane = flags.auth_data_plane;

  WorkerPool workers(2);
  SteadyClock clock;
  auto loop = std::make_unique<EventLoop>();
  auto gateway = Gateway::Start(loop->executor(), **pool, workers, clock, options);
  if (!gateway.ok()) return ReportFailure(Annotate(gateway.status(), "gateway"));
  absl::Notification stop;
  auto signals = std::make_unique<boost::asio::signal_set>(loop->executor(), SIGINT, SIGTERM);
  signals->async_wait([&](const boost::system::error_code& ec, int) {
    if (!ec && !stop.HasBeenNotified()) stop.Notify();
  });
  std::cout << "stitch gateway: listening on " << (*gateway)->url() << " (pool " << (*pool)->spec()
            << ")" << std::endl;
  stop.WaitForNotification();
  loop->BlockOn([&]() -> boost::asio::awaitable<void> {
    signals.reset();
    co_await (*gateway)->Shutdown();
  }());
  gateway->reset();
  loop.reset();
  return 0;
}

}  // namespace

void AddGatewayCommand(CLI::App& app, int* exit_code) {
  static GatewayFlags flags;
  const GatewayOptions defaults;
  flags.max_session_id_bytes = defaults.max_session_id_bytes;
  flags.session_table_bytes = defaults.session_table_bytes;
  CLI::App* cmd = app.add_subcommand(
      "gateway",
      "Route versioned rollout requests to the replicas of a pool that satisfy their version "
      "constraint, keeping sessions on their replica and waiting briefly for the fleet to catch "
      "up");
  cmd->add_option("--pool", flags.pool,
                  "Replica pool: static:URL,URL,..., file:PATH (one URL per line, re-read when "
                  "it changes) or dns:NAME:PORT")
      ->required();
  AddHostOption(cmd, &flags.host);
  cmd->add_option("--port", flags.port, "Port to listen on (0 picks a free one)")
      ->capture_default_str();
  cmd->add_option("--session-header", flags.session_header,
                  "Requests with the same value of this header stay on one replica")
      ->capture_default_str();
  cmd->add_option("--default-constraint", flags.default_constraint,
                  "Constraint of requests that carry none, e.g. max_staleness:1 or "
                  "min_version:3,max_staleness:1 (or its JSON form); routed by and passed on");
  cmd->add_option("--affinity-prefix-bytes", flags.affinity_prefix_bytes,
                  "Route requests whose version and first N bytes of prompt agree to one "
                  "replica (its prefix cache), within the load bound; 0 turns affinity off")
      ->capture_default_str();
  cmd->add_option("--affinity-load-factor", flags.affinity_load_factor,
                  "Prefix affinity never gives a replica more than this factor above the mean "
                  "outstanding requests (>= 1)")
      ->capture_default_str();
  cmd->add_option("--admission-wait", flags.admission_wait_s,
                  "Seconds a request waits for a replica that satisfies its constraint before "
                  "the gateway answers 409")
      ->capture_default_str();
  cmd->add_option("--poll-interval", flags.poll_interval_s,
                  "Seconds between discoveries and /server_info polls of every replica")
      ->capture_default_str();
  cmd->add_option("--wake-interval", flags.wake_interval_s,
                  "While requests wait for a version no replica serves, seconds between wakes "
                  "of the fleet (POST /wake to every replica)")
      ->capture_default_str();
  cmd->add_option("--auth-token-file", flags.auth_token_file,
                  "File holding the fleet's bearer token: GET /replicas needs it, and the "
                  "gateway presents it to the replicas (default: $STITCH_AUTH_TOKEN when set)");
  cmd->add_flag("--auth-data-plane", flags.auth_data_plane,
                "Require the token on every route but /health and /metrics");
  cmd->add_option("--max-attempts", flags.max_attempts,
                  "Replicas tried per request after a 409, a 503 or a connection failure")
      ->capture_default_str();
  cmd->add_option("--stall-timeout", flags.stall_timeout_s,
                  "Seconds a replica may keep requests outstanding while sending nothing back "
                  "before new requests go to other replicas (0 disables the watch)")
      ->capture_default_str();
  cmd->add_option("--probe-timeout", flags.probe_timeout_s,
                  "Seconds a replica's /server_info may take before it leaves rotation")
      ->capture_default_str();
  cmd->add_option("--max-session-id-bytes", flags.max_session_id_bytes,
                  "Longest session id accepted (400 beyond)")
      ->capture_default_str();
  cmd->add_option("--session-table-bytes", flags.session_table_bytes,
                  "Memory for remembered sessions; the least recently used are forgotten first "
                  "(bytes, or with a unit: 64MiB)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  AddBodyLimitOptions(cmd, &flags.body_limits);
  cmd->callback([exit_code] { *exit_code = RunGateway(flags); });
}

}  // namespace stitch
