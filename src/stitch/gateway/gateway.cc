#include "stitch/gateway/gateway.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <list>
#include <map>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stitch/core/errors.h"
#include "stitch/core/json.h"
#include "stitch/engine/engine.h"
#include "stitch/net/auth.h"
#include "stitch/net/client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/prometheus.h"
#include "stitch/replica/proxy.h"

namespace stitch {

namespace json = boost::json;
using boost::asio::awaitable;
using Clock = std::chrono::steady_clock;

namespace {

// Beyond this many sessions the table is cleared: a session then lands on a
// replica by load, which is correct, only less cache-friendly.
constexpr size_t kMaxSessions = size_t{1} << 16;
constexpr auto kWaitingPollInterval = std::chrono::milliseconds(200);

struct Replica {
  std::string url;
  HttpOrigin origin;
  std::string prefix;  // the URL's path ("" for none), put before each target
  bool discovered = true;
  bool reachable = false;
  ReplicaState state;
  int64_t in_flight = 0;
  std::string last_error;
  bool probing = false;

  bool routable() const { return discovered && reachable && state.ready; }
  std::optional<int64_t> version() const {
    if (!state.applied.has_value()) return std::nullopt;
    return state.applied->version;
  }
};
// Shared: a request in flight keeps its replica alive after the pool dropped
// it, and so do the session table and the routing index.
using ReplicaPtr = std::shared_ptr<Replica>;

// Bodies pass through unchanged, so their encoding and type headers do too.
bool DropRequestHeader(std::string_view name) {
  return IsFramingHeader(name) || absl::EqualsIgnoreCase(AbslView(name), "host") ||
         absl::EqualsIgnoreCase(AbslView(name), "expect");
}

bool DropResponseHeader(std::string_view name) {
  return IsFramingHeader(name) || absl::EqualsIgnoreCase(AbslView(name), "content-length");
}

// A replica's response headers as the gateway relays them, with
// X-Stitch-Replica naming the replica.
HttpHeaders ResponseHeaders(const HttpHeaders& from, const std::string& replica) {
  HttpHeaders to = CopyHeaders(from, &DropResponseHeader);
  to.Set("X-Stitch-Replica", replica);
  return to;
}

}  // namespace

struct Gateway::Impl {
  Impl(boost::asio::any_io_executor executor, Pool& pool, WorkerPool& workers,
       GatewayOptions options)
      : executor(executor),
        pool(pool),
        workers(workers),
        options(std::move(options)),
        client(executor,
               [&] {
                 ClientOptions c;
                 c.request_timeout = this->options.upstream_timeout;
                 c.max_idle_per_origin = 1024;
                 return c;
               }()),
        poll_timer(executor),
        rng(std::random_device{}()) {}

  enum class Outcome { kDone, kRetry, kClientGone };

  // --- state --------------------------------------------------------------
  boost::asio::any_io_executor executor;
  Pool& pool;
  WorkerPool& workers;
  const GatewayOptions options;
  HttpClient client;
  std::unique_ptr<HttpServer> server;
  boost::asio::steady_timer poll_timer;
  std::minstd_rand rng;

  std::map<std::string, ReplicaPtr> replicas;  // by URL
  absl::flat_hash_map<std::string, ReplicaPtr> sessions;
  // Routable replicas, all and by applied version; rebuilt when dirty.
  bool dirty = true;
  std::vector<ReplicaPtr> routable;
  std::map<int64_t, std::vector<ReplicaPtr>> by_version;

  std::list<boost::asio::steady_timer*> waiters;
  bool wake_running = false;
  bool stopping = false;
  int tasks = 0;  // background coroutines still running
  std::string last_discover_error;
  GatewayCounters counters;

  // --- index and choice -----------------------------------------------------
  void Changed() {
    dirty = true;
    for (boost::asio::steady_timer* t : waiters) t->cancel();
  }

  void Reindex() {
    if (!dirty) return;
    dirty = false;
    routable.clear();
    by_version.clear();
    for (auto& [url, r] : replicas) {
      if (!r->routable()) continue;
      routable.push_back(r);
      if (std::optional<int64_t> v = r->version(); v.has_value()) {
        by_version[*v].push_back(r);
      }
    }
  }

  // `tried` holds its replicas alive, so that a replica dropped from the
  // pool during a retry cannot lend its address to a new one.
  static bool Tried(const std::vector<ReplicaPtr>& tried, const Replica* r) {
    return std::any_of(tried.begin(), tried.end(),
                       [r](const ReplicaPtr& t) { return t.get() == r; });
  }

  // The replica for a request, or null when none satisfies it (or all that
  // do were tried). Cost: O(distinct versions), not O(replicas).
  ReplicaPtr Choose(const VersionConstraint& c, const std::string& session,
                    const std::vector<ReplicaPtr>& tried) {
    Reindex();
    if (!session.empty()) {
      auto it = sessions.find(session);
      if (it != sessions.end()) {
        const ReplicaPtr& r = it->second;
        if (r->routable() && c.SatisfiedBy(r->version()) && !Tried(tried, r.get())) return r;
      }
    }
    // The candidates: a few contiguous groups.
    std::vector<const std::vector<ReplicaPtr>*> groups;
    if (c.is_exact()) {
      auto it = by_version.find(*c.exact_version);
      if (it != by_version.end()) groups.push_back(&it->second);
    } else if (c.min_version.has_value()) {
      for (auto it = by_version.lower_bound(*c.min_version); it != by_version.end(); ++it) {
        groups.push_back(&it->second);
      }
    } else {
      groups.push_back(&routable);
    }
    size_t total = 0;
    for (const auto* g : groups) total += g->size();
    if (total == 0) return nullptr;
    auto at = [&](size_t i) -> const ReplicaPtr* {
      for (const auto* g : groups) {
        if (i < g->size()) return &(*g)[i];
        i -= g->size();
      }
      return nullptr;
    };
    const ReplicaPtr* best = nullptr;
    for (int pick = 0; pick < 2; ++pick) {
      const ReplicaPtr* r = at(rng() % total);
      if (Tried(tried, r->get())) continue;
      if (best == nullptr || (*r)->in_flight < (*best)->in_flight) best = r;
    }
    if (best != nullptr) return *best;
    // Both picks were tried already (a small pool, or a retry): scan.
    for (size_t i = 0; i < total; ++i) {
      const ReplicaPtr* r = at(i);
      if (Tried(tried, r->get())) continue;
      if (best == nullptr || (*r)->in_flight < (*best)->in_flight) best = r;
    }
    if (best == nullptr) return nullptr;
    return *best;
  }

  // --- learning ---------------------------------------------------------------
  void MarkFailed(Replica& r, std::string why, bool unreachable) {
    r.last_error = std::move(why);
    if (unreachable) r.reachable = false;
    if (r.state.ready) {
      r.state.ready = false;
      Changed();
    }
  }

  void LearnVersion(Replica& r, int64_t version) {
    if (r.state.applied.has_value() && r.state.applied->version == version) return;
    if (r.state.applied.has_value()) {
      r.state.applied->version = version;
    } else {
      r.state.applied = VersionRef{"", version};
    }
    Changed();
  }

  void Learn409(Replica& r, const std::string& body) {
    boost::system::error_code ec;
    json::value doc = json::parse(body, ec);
    if (ec || !doc.is_object()) return;
    const json::value* applied = doc.get_object().if_contains("applied");
    if (applied == nullptr || !applied->is_string()) return;
    auto ref = VersionRef::Parse(std::string_view(applied->get_string()));
    if (!ref.ok()) return;
    if (r.state.applied != *ref) {
      r.state.applied = *ref;
      Changed();
    }
  }

  // --- polling ----------------------------------------------------------------
  awaitable<void> PollLoop() {
    while (!stopping) {
      co_await PollOnce();
      if (stopping) break;
      const auto interval = waiters.empty() ? options.poll_interval
                                            : std::min<std::chrono::milliseconds>(
                                                  options.poll_interval, kWaitingPollInterval);
      poll_timer.expires_after(interval);
      auto [ec] = co_await poll_timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
      (void)ec;
    }
    --tasks;
  }

  awaitable<void> PollOnce() {
    Pool* p = &pool;
    absl::StatusOr<std::vector<std::string>> urls =
        co_await RunBlocking(workers, [p] { return p->Discover(); });
    if (stopping) co_return;
    if (!urls.ok()) {
      std::string message(urls.status().message());
      if (message != last_discover_error) {
        spdlog::warn("gateway: discovering {}: {}; keeping the replicas known so far", pool.spec(),
                     message);
        last_discover_error = message;
      }
    } else {
      last_discover_error.clear();
      std::map<std::string, ReplicaPtr> next;
      for (const std::string& url : *urls) {
        auto it = replicas.find(url);
        if (it != replicas.end()) {
          next.emplace(url, it->second);
          continue;
        }
        auto parsed = ParseHttpUrl(url);
        if (!parsed.ok()) {
          spdlog::warn("gateway: skipping replica {}: {}", url,
                       std::string(parsed.status().message()));
          continue;
        }
        auto r = std::make_shared<Replica>();
        r->url = url;
        r->origin = parsed->origin;
        r->prefix = parsed->target == "/" ? "" : parsed->target;
        r->last_error = "not probed yet";
        next.emplace(url, std::move(r));
      }
      for (auto& [url, r] : replicas) {
        if (!next.contains(url)) r->discovered = false;
      }
      if (next.size() != replicas.size() ||
          !std::equal(next.begin(), next.end(), replicas.begin(),
                      [](const auto& a, const auto& b) { return a.first == b.first; })) {
        replicas = std::move(next);
        Changed();
      }
    }
    for (auto& [url, r] : replicas) {
      if (r->probing) continue;
      r->probing = true;
      ++tasks;
      Spawn(executor, Probe(r));
    }
  }

  awaitable<void> Probe(ReplicaPtr r) {
    HttpRequest request;
    request.method = "GET";
    request.target = r->prefix + "/server_info";
    PresentToken(request.headers);
    CallOptions call;
    call.timeout = options.probe_timeout;
    absl::StatusOr<HttpResponse> response =
        co_await client.Send(r->origin, std::move(request), call);
    r->probing = false;
    --tasks;
    if (stopping) co_return;
    std::string error;
    if (!response.ok()) {
      error = std::string(response.status().message());
    } else if (response->status != 200) {
      error = absl::StrCat("/server_info answered HTTP ", response->status);
    } else {
      auto state = ReplicaState::FromJson(response->body);
      if (!state.ok()) {
        error = absl::StrCat("/server_info: ", state.status().message());
      } else {
        const bool changed =
            !r->reachable || r->state.ready != state->ready || r->state.applied != state->applied;
        r->reachable = true;
        r->state = *std::move(state);
        r->last_error = r->state.ready ? "" : r->state.reason;
        if (changed) Changed();
        co_return;
      }
    }
    const bool was_routable = r->routable();
    r->reachable = false;
    r->state.ready = false;
    r->last_error = std::move(error);
    if (was_routable) Changed();
  }

  void StartWake() {
    if (wake_running || stopping) return;
    wake_running = true;
    ++tasks;
    ++counters.wakes;
    Spawn(executor, RunWake());
  }

  awaitable<void> RunWake() {
    Pool* p = &pool;
    const int woke = co_await RunBlocking(workers, [p] { return p->Wake(); });
    (void)woke;
    wake_running = false;
    --tasks;
    // Look at the replicas now rather than at the next poll.
    if (!stopping) poll_timer.cancel();
  }

  // Returns at the next change of the routable set, at `deadline`, or when
  // cancelled.
  awaitable<absl::Status> WaitForChange(Clock::time_point deadline) {
    boost::asio::steady_timer timer(executor);
    timer.expires_at(deadline);
    waiters.push_back(&timer);
    auto self = std::prev(waiters.end());
    if (waiters.size() == 1) poll_timer.cancel();  // poll faster from now on
    auto [ec] = co_await timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    (void)ec;
    waiters.erase(self);
    co_return absl::OkStatus();
  }

  // --- requests ---------------------------------------------------------------
  // With a token of its own, the gateway shows the replicas that token; the
  // client's Authorization was for the gateway.
  void PresentToken(HttpHeaders& headers) const {
    if (options.auth_token.empty()) return;
    headers.Set("Authorization", BearerValue(options.auth_token));
  }

  HttpHeaders UpstreamHeaders(const HttpHeaders& from) const {
    HttpHeaders headers = CopyHeaders(from, &DropRequestHeader);
    PresentToken(headers);
    return headers;
  }

  awaitable<void> Handle(HttpExchange& exchange) {
    ApiRoute route;
    const std::string_view path = TargetPath(exchange.request().target);
    switch (ClassifyRoute(path, &route)) {
      case RouteClass::kVersioned:
        if (exchange.request().method == "POST") {
          co_await HandleVersioned(exchange);
          co_return;
        }
        break;
      case RouteClass::kBlocked: {
        ++counters.blocked;
        HttpResponse response = RouteBlockedResponse(
            path, "only each replica's sidecar drives its engine, so the gateway refuses it");
        (void)co_await exchange.Respond(std::move(response));
        co_return;
      }
      case RouteClass::kOther:
        break;
    }
    co_await ForwardOther(exchange);
  }

  awaitable<void> Respond(HttpExchange& exchange, int status, std::string body) {
    HttpResponse response = JsonResponse(status, std::move(body));
    if (status == 503) response.headers.Set("Retry-After", "1");
    (void)co_await exchange.Respond(std::move(response));
  }

  awaitable<void> HandleVersioned(HttpExchange& exchange) {
    ++counters.requests;
    JsonArena arena;
    json::value parsed(arena.storage());
    absl::StatusOr<VersionedAsk> ask = ParseVersionedBody(exchange.request().body, parsed);
    if (!ask.ok()) {
      std::string error = JsonErrorBody("BadRequest", std::string(ask.status().message()));
      co_await Respond(exchange, 400, std::move(error));
      co_return;
    }
    const VersionConstraint constraint = ask->constraint;
    const bool stream = ask->stream;
    std::string session;
    if (auto s = exchange.request().headers.Get(options.session_header); s.has_value()) {
      session = std::string(*s);
    }

    const HttpHeaders headers = UpstreamHeaders(exchange.request().headers);
    const std::string& target = exchange.request().target;
    const std::string payload = std::move(exchange.request().body);

    const Clock::time_point deadline = Clock::now() + options.admission_wait;
    std::vector<ReplicaPtr> tried;
    std::optional<HttpResponse> last_failure;
    bool waited = false;
    for (;;) {
      ReplicaPtr replica = Choose(constraint, session, tried);
      if (replica == nullptr) {
        if (static_cast<int>(tried.size()) >= options.max_attempts || Clock::now() >= deadline) {
          break;
        }
        if (!waited) {
          waited = true;
          ++counters.waited;
        }
        StartWake();
        const absl::Status wait = co_await exchange.CancelOnDisconnect(WaitForChange(deadline));
        (void)wait;
        if (exchange.disconnected() || stopping) co_return;
        continue;
      }
      tried.push_back(replica);
      if (tried.size() > 1) ++counters.retried;
      ++counters.routed;
      // Each attempt takes its own copy: a retry sends the same request.
      HttpRequest upstream{"POST", replica->prefix + target, headers, payload};
      Outcome outcome = Outcome::kRetry;
      if (stream) {
        outcome = co_await AttemptStream(exchange, *replica, std::move(upstream), &last_failure);
      } else {
        outcome = co_await Attempt(exchange, *replica, std::move(upstream), &last_failure);
      }
      if (outcome == Outcome::kClientGone) co_return;
      if (outcome == Outcome::kDone) {
        if (!session.empty()) {
          if (sessions.size() >= kMaxSessions) sessions.clear();
          sessions[session] = replica;
        }
        co_return;
      }
      if (static_cast<int>(tried.size()) >= options.max_attempts) break;
    }
    if (last_failure.has_value()) {
      (void)co_await exchange.Respond(*std::move(last_failure));
      co_return;
    }
    ++counters.rejected;
    std::string conflict = NotReady(constraint);
    co_await Respond(exchange, 409, std::move(conflict));
  }

  // The 409 body when no ready replica satisfies `constraint`: `applied` is
  // the newest version any ready replica serves.
  std::string NotReady(const VersionConstraint& constraint) {
    Reindex();
    std::optional<VersionRef> newest;
    if (!by_version.empty()) newest = by_version.rbegin()->second.front()->state.applied;
    const std::string message = absl::StrFormat(
        "no ready replica serves %s after waiting %.1f s (%d of %d replicas ready); retry later "
        "or relax the constraint",
        constraint.ToString(), std::chrono::duration<double>(options.admission_wait).count(),
        static_cast<int>(routable.size()), static_cast<int>(replicas.size()));
    return NotReadyBody(constraint, newest, message);
  }

  // The 503 (with Retry-After) to relay, if no other replica answers, when
  // `r` could not be reached or broke off with `status`; marks `r`
  // unreachable.
  HttpResponse Unreachable(Replica& r, const absl::Status& status) {
    const std::string why(status.message());
    MarkFailed(r, why, /*unreachable=*/true);
    HttpResponse response = JsonResponse(
        503, JsonErrorBody("ReplicaUnavailable",
                           absl::StrCat("replica ", r.url, " failed: ", why, "; retry"), true));
    response.headers.Set("Retry-After", "1");
    return response;
  }

  // Whether `r` refused the request with `out`: a 409 (its version does not
  // satisfy the constraint) or a 503 (not ready). Learns from the refusal
  // and keeps `out` in *last_failure to relay if no other replica does
  // better.
  bool Refused(Replica& r, HttpResponse& out, std::optional<HttpResponse>* last_failure) {
    if (out.status != 409 && out.status != 503) return false;
    if (out.status == 409) {
      Learn409(r, out.body);
    } else {
      MarkFailed(r, absl::StrCat("HTTP 503: ", out.body), /*unreachable=*/false);
    }
    last_failure->emplace(std::move(out));
    return true;
  }

  // One try on one replica. kRetry leaves the answer to relay if no other
  // replica does better in *last_failure.
  awaitable<Outcome> Attempt(HttpExchange& exchange, Replica& r, HttpRequest request,
                             std::optional<HttpResponse>* last_failure) {
    ++r.in_flight;
    absl::StatusOr<HttpResponse> response =
        co_await client.Send(r.origin, std::move(request), EndedWithTheClient(exchange));
    --r.in_flight;
    if (!response.ok()) {
      if (exchange.disconnected()) co_return Outcome::kClientGone;
      last_failure->emplace(Unreachable(r, response.status()));
      co_return Outcome::kRetry;
    }
    HttpResponse out{response->status, ResponseHeaders(response->headers, r.url),
                     std::move(response->body)};
    if (Refused(r, out, last_failure)) co_return Outcome::kRetry;
    if (out.status == 200) {
      if (std::optional<int64_t> v = StampedEndVersion(out.body); v.has_value()) {
        LearnVersion(r, *v);
      }
    }
    (void)co_await exchange.Respond(std::move(out));
    co_return Outcome::kDone;
  }

  awaitable<Outcome> AttemptStream(HttpExchange& exchange, Replica& r, HttpRequest request,
                                   std::optional<HttpResponse>* last_failure) {
    ++r.in_flight;
    Outcome outcome = co_await RelayStream(exchange, r, std::move(request), last_failure);
    --r.in_flight;
    co_return outcome;
  }

  awaitable<Outcome> RelayStream(HttpExchange& exchange, Replica& r, HttpRequest request,
                                 std::optional<HttpResponse>* last_failure) {
    absl::StatusOr<HttpResponseStream> stream =
        co_await client.SendStreamed(r.origin, std::move(request), EndedWithTheClient(exchange));
    if (!stream.ok()) {
      if (exchange.disconnected()) co_return Outcome::kClientGone;
      last_failure->emplace(Unreachable(r, stream.status()));
      co_return Outcome::kRetry;
    }
    const std::optional<std::string_view> type = stream->headers().Get("content-type");
    const bool events =
        type.has_value() && type->find("text/event-stream") != std::string_view::npos;
    if (stream->status() != 200 || !events) {
      absl::StatusOr<std::string> body = co_await stream->ReadAll();
      if (!body.ok()) {
        if (exchange.disconnected()) co_return Outcome::kClientGone;
        last_failure->emplace(Unreachable(r, body.status()));
        co_return Outcome::kRetry;
      }
      HttpResponse out{stream->status(), ResponseHeaders(stream->headers(), r.url),
                       *std::move(body)};
      if (Refused(r, out, last_failure)) co_return Outcome::kRetry;
      (void)co_await exchange.Respond(std::move(out));
      co_return Outcome::kDone;
    }
    const absl::Status begun =
        co_await exchange.BeginStream(200, ResponseHeaders(stream->headers(), r.url));
    if (!begun.ok()) co_return Outcome::kClientGone;
    for (;;) {
      absl::StatusOr<std::string> chunk = co_await stream->Read();
      if (!chunk.ok()) {
        if (exchange.disconnected()) co_return Outcome::kClientGone;
        // The replica cut the stream after it began: too late to retry. End
        // the connection without a proper end of body so the client sees it.
        MarkFailed(r, std::string(chunk.status().message()), /*unreachable=*/true);
        co_return Outcome::kDone;
      }
      if (chunk->empty()) break;
      const absl::Status written = co_await exchange.WriteChunk(*std::move(chunk));
      if (!written.ok()) co_return Outcome::kClientGone;
    }
    (void)co_await exchange.EndStream();
    co_return Outcome::kDone;
  }

  awaitable<void> ForwardOther(HttpExchange& exchange) {
    ReplicaPtr r = Choose(VersionConstraint{}, "", {});
    if (r == nullptr) {
      std::string error =
          JsonErrorBody("NoReadyReplica",
                        "no replica of the pool is ready; check `stitch status` and retry", true);
      co_await Respond(exchange, 503, std::move(error));
      co_return;
    }
    HttpRequest up;
    up.method = exchange.request().method;
    up.target = r->prefix + exchange.request().target;
    up.headers = UpstreamHeaders(exchange.request().headers);
    up.body = std::move(exchange.request().body);
    ++r->in_flight;
    absl::StatusOr<HttpResponse> response =
        co_await client.Send(r->origin, std::move(up), EndedWithTheClient(exchange));
    --r->in_flight;
    if (!response.ok()) {
      if (exchange.disconnected()) co_return;
      const std::string why(response.status().message());
      MarkFailed(*r, why, /*unreachable=*/true);
      std::string body = JsonErrorBody("ReplicaUnavailable",
                                       absl::StrCat("replica ", r->url, " failed: ", why), true);
      co_await Respond(exchange, 503, std::move(body));
      co_return;
    }
    HttpResponse out{response->status, ResponseHeaders(response->headers, r->url),
                     std::move(response->body)};
    (void)co_await exchange.Respond(std::move(out));
  }

  // --- own routes ---------------------------------------------------------------
  PoolState Snapshot() const {
    PoolState state;
    state.replicas.reserve(replicas.size());
    for (const auto& [url, r] : replicas) {
      ReplicaStatus s;
      s.url = url;
      s.reachable = r->reachable;
      s.state = r->state;
      s.in_flight = r->in_flight;
      s.last_error = r->last_error;
      state.replicas.push_back(std::move(s));
    }
    return state;
  }

  awaitable<void> Health(HttpExchange& exchange) {
    Reindex();
    const bool ready = !routable.empty();
    json::object body;
    body["ready"] = ready;
    body["ready_replicas"] = routable.size();
    body["replicas"] = replicas.size();
    if (!ready) body["reason"] = "no replica of the pool is ready";
    const int status = ready ? 200 : 503;
    std::string text = json::serialize(body);
    co_await Respond(exchange, status, std::move(text));
  }

  awaitable<void> Replicas(HttpExchange& exchange) {
    std::string body = Snapshot().ToJson();
    co_await Respond(exchange, 200, std::move(body));
  }

  awaitable<void> Metrics(HttpExchange& exchange) {
    Reindex();
    PrometheusText text("stitch_gateway_");
    text.One("requests_total", "counter", "Versioned requests received.", counters.requests);
    text.One("routed_total", "counter", "Attempts sent to a replica.", counters.routed);
    text.One("retried_total", "counter", "Attempts retried on another replica.", counters.retried);
    text.One("waited_total", "counter", "Requests that waited for the fleet to catch up.",
             counters.waited);
    text.One("rejected_total", "counter", "409s answered by the gateway after waiting.",
             counters.rejected);
    text.One("blocked_total", "counter", "Engine control routes refused.", counters.blocked);
    text.One("wakes_total", "counter", "Fleet wakes started.", counters.wakes);
    text.One("replicas_ready", "gauge", "Replicas ready to serve.", routable.size());
    text.Header("replica_in_flight", "gauge", "Requests outstanding on a replica.");
    for (const auto& [url, r] : replicas) {
      text.Sample("replica_in_flight", PromLabels("replica", url), r->in_flight);
    }
    text.Header("replica_ready", "gauge", "Whether a replica is in rotation.");
    for (const auto& [url, r] : replicas) {
      text.Sample("replica_ready", PromLabels("replica", url), r->routable() ? 1 : 0);
    }
    text.Header("replica_version", "gauge", "Applied version of a replica (-1: none).");
    for (const auto& [url, r] : replicas) {
      text.Sample("replica_version", PromLabels("replica", url), r->version().value_or(-1));
    }
    HttpResponse response = PrometheusResponse(text.Take());
    (void)co_await exchange.Respond(std::move(response));
  }

  awaitable<void> Drain() {
    boost::asio::steady_timer timer(executor);
    while (tasks > 0) {
      timer.expires_after(std::chrono::milliseconds(5));
      auto [ec] = co_await timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
      (void)ec;
    }
  }
};

Gateway::Gateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gateway::~Gateway() = default;

absl::StatusOr<std::unique_ptr<Gateway>> Gateway::Start(boost::asio::any_io_executor executor,
                                                        Pool& pool, WorkerPool& workers,
                                                        GatewayOptions options) {
  auto impl = std::make_unique<Impl>(executor, pool, workers, std::move(options));
  Impl* self = impl.get();
  HttpRouter router;
  router.Add("GET", "/health", [self](HttpExchange& ex) { return self->Health(ex); });
  router.Add("GET", "/replicas",
             RequireBearerToken(self->options.auth_token,
                                [self](HttpExchange& ex) { return self->Replicas(ex); }));
  router.Add("GET", "/metrics", [self](HttpExchange& ex) { return self->Metrics(ex); });
  router.SetFallback(
      RequireBearerToken(self->options.auth_data_plane ? self->options.auth_token : std::string(),
                         [self](HttpExchange& ex) { return self->Handle(ex); }));
  auto server = HttpServer::Start(executor, self->options.server, router.AsHandler());
  if (!server.ok()) return server.status();
  impl->server = *std::move(server);
  ++impl->tasks;
  Spawn(executor, impl->PollLoop());
  return std::unique_ptr<Gateway>(new Gateway(std::move(impl)));
}

std::string Gateway::url() const { return impl_->server->url(); }
uint16_t Gateway::port() const { return impl_->server->port(); }

awaitable<void> Gateway::Shutdown() {
  impl_->stopping = true;
  impl_->poll_timer.cancel();
  for (boost::asio::steady_timer* t : impl_->waiters) t->cancel();
  co_await impl_->server->Shutdown();
  co_await impl_->Drain();
}

PoolState Gateway::Snapshot() const { return impl_->Snapshot(); }
const GatewayCounters& Gateway::counters() const { return impl_->counters; }

}  // namespace stitch
