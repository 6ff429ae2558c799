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
#include "stitch/api/answers.h"
#include "stitch/api/headers.h"
#include "stitch/api/replica_client.h"
#include "stitch/api/request.h"
#include "stitch/api/response.h"
#include "stitch/api/routes.h"
#include "stitch/api/server_info.h"
#include "stitch/core/errors.h"
#include "stitch/core/json.h"
#include "stitch/gateway/session_table.h"
#include "stitch/net/client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/prometheus.h"

namespace stitch {

namespace json = boost::json;
using boost::asio::awaitable;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kWaitingPollInterval = std::chrono::milliseconds(200);
// How often the progress watch looks, as a fraction of the stall timeout: a
// stall is seen between 1 and 1.2 stall timeouts after the quiet began.
constexpr int kWatchTicksPerStall = 5;

struct Replica {
  std::string url;
  ReplicaEndpoint endpoint;
  bool discovered = true;
  bool reachable = false;
  ReplicaState state;
  int64_t in_flight = 0;
  std::string last_error;
  bool probing = false;
  // The progress watch (Impl::WatchProgress): answers and stream bytes
  // received (and busy spells begun), its value at the last look, since when
  // the replica has been busy without any, and whether that lasted too long.
  uint64_t progress = 0;
  uint64_t progress_seen = 0;
  Clock::time_point quiet_since;
  bool stalled = false;

  bool routable() const { return discovered && reachable && state.ready; }
  // Whether new work may go to it while another replica would do: not
  // stalled, or stalled with nothing outstanding (one request at a time then
  // finds out whether it recovered).
  bool preferred() const { return !stalled || in_flight == 0; }
  std::optional<int64_t> version() const {
    if (!state.applied.has_value()) return std::nullopt;
    return state.applied->version;
  }
};
// Shared: a request in flight keeps its replica alive after the pool dropped
// it, and so do the session table and the routing index.
using ReplicaPtr = std::shared_ptr<Replica>;

// Replicas a request may go to: all, and by applied version.
struct RoutingIndex {
  std::vector<ReplicaPtr> all;
  std::map<int64_t, std::vector<ReplicaPtr>> by_version;

  void Clear() {
    all.clear();
    by_version.clear();
  }
  void Add(const ReplicaPtr& r) {
    all.push_back(r);
    if (std::optional<int64_t> v = r->version(); v.has_value()) by_version[*v].push_back(r);
  }
};

// A replica's response headers as the gateway relays them (bodies pass
// unchanged), with X-Stitch-Replica naming the replica.
HttpHeaders ResponseHeaders(const HttpHeaders& from, const std::string& replica) {
  HttpHeaders to = ResponseHeadersToRelay(from, BodyRelay::kUnchanged);
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
        watch_timer(executor),
        rng(std::random_device{}()),
        sessions(this->options.session_table_bytes) {}

  enum class Outcome { kDone, kRetry, kClientGone };
  // Why the gateway answers 409 itself.
  enum class NotServed { kAfterWaiting, kNeverServable };

  // --- state --------------------------------------------------------------
  boost::asio::any_io_executor executor;
  Pool& pool;
  WorkerPool& workers;
  const GatewayOptions options;
  HttpClient client;
  std::unique_ptr<HttpServer> server;
  boost::asio::steady_timer poll_timer;
  boost::asio::steady_timer watch_timer;
  std::minstd_rand rng;

  std::map<std::string, ReplicaPtr> replicas;  // by URL
  SessionTable<ReplicaPtr> sessions;
  // Rebuilt when dirty: the routable replicas, those of them preferred
  // (`all_preferred` when that is every one, and `preferred` is then left
  // empty), and the oldest version applied when every replica has applied
  // one of the same run.
  bool dirty = true;
  RoutingIndex routable;
  RoutingIndex preferred;
  bool all_preferred = true;
  std::optional<VersionRef> oldest_applied;

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
    routable.Clear();
    preferred.Clear();
    all_preferred = true;
    oldest_applied.reset();
    bool one_run = !replicas.empty();
    for (auto& [url, r] : replicas) {
      const std::optional<VersionRef>& applied = r->state.applied;
      if (!applied.has_value() ||
          (oldest_applied.has_value() && applied->run_id != oldest_applied->run_id)) {
        one_run = false;
      } else if (!oldest_applied.has_value() || applied->version < oldest_applied->version) {
        oldest_applied = applied;
      }
      if (!r->routable()) continue;
      routable.Add(r);
      if (r->preferred()) {
        preferred.Add(r);
      } else {
        all_preferred = false;
      }
    }
    if (!one_run) oldest_applied.reset();
    if (all_preferred) preferred.Clear();
  }

  // Whether no replica can serve `c` any more: an exact version below every
  // replica's applied version, all of one run. Versions only move forward
  // within a run, and a replica that joins or restarts catches up to the
  // pointer, which is past it too. A replica not probed yet (no applied
  // version) or a mix of runs (a run change under way) leaves it open.
  bool NeverServable(const VersionConstraint& c) {
    if (!c.is_exact()) return false;
    Reindex();
    return oldest_applied.has_value() && *c.exact_version < oldest_applied->version;
  }

  // `tried` holds its replicas alive, so that a replica dropped from the
  // pool during a retry cannot lend its address to a new one.
  static bool Tried(const std::vector<ReplicaPtr>& tried, const Replica* r) {
    return std::any_of(tried.begin(), tried.end(),
                       [r](const ReplicaPtr& t) { return t.get() == r; });
  }

  // The replica for a request, or null when none satisfies it (or all that
  // do were tried): the session's replica while it satisfies the request and
  // is preferred, else a choice among the preferred replicas, else among all
  // routable ones (a stalled replica still serves what no other one can).
  // Cost: O(distinct versions), not O(replicas).
  ReplicaPtr Choose(const VersionConstraint& c, const std::string& session,
                    const std::vector<ReplicaPtr>& tried) {
    Reindex();
    if (!session.empty()) {
      if (const ReplicaPtr* home = sessions.Find(session); home != nullptr) {
        const ReplicaPtr& r = *home;
        if (r->routable() && r->preferred() && c.SatisfiedBy(r->version()) &&
            !Tried(tried, r.get())) {
          return r;
        }
      }
    }
    if (!all_preferred) {
      if (ReplicaPtr r = ChooseFrom(preferred, c, tried); r != nullptr) return r;
    }
    return ChooseFrom(routable, c, tried);
  }

  // The less loaded of two distinct random replicas of `index` that satisfy
  // `c` and were not tried (fewest requests outstanding from this gateway).
  ReplicaPtr ChooseFrom(const RoutingIndex& index, const VersionConstraint& c,
                        const std::vector<ReplicaPtr>& tried) {
    // The candidates: a few contiguous groups.
    std::vector<const std::vector<ReplicaPtr>*> groups;
    if (c.is_exact()) {
      auto it = index.by_version.find(*c.exact_version);
      if (it != index.by_version.end()) groups.push_back(&it->second);
    } else if (c.min_version.has_value()) {
      for (auto it = index.by_version.lower_bound(*c.min_version); it != index.by_version.end();
           ++it) {
        groups.push_back(&it->second);
      }
    } else {
      groups.push_back(&index.all);
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
    auto consider = [&](size_t i) {
      const ReplicaPtr* r = at(i);
      if (Tried(tried, r->get())) return;
      if (best == nullptr || (*r)->in_flight < (*best)->in_flight) best = r;
    };
    // Two picks, never the same replica twice: otherwise a replica that
    // stopped answering (its outstanding count only grows) would still win
    // every time both picks fell on it.
    const size_t first = rng() % total;
    consider(first);
    if (total > 1) {
      size_t second = rng() % (total - 1);
      if (second >= first) ++second;
      consider(second);
    }
    if (best != nullptr) return *best;
    // Both picks were tried already (a small pool, or a retry): scan.
    for (size_t i = 0; i < total; ++i) consider(i);
    if (best == nullptr) return nullptr;
    return *best;
  }

  // --- outstanding requests and progress ----------------------------------------
  void Begin(Replica& r) {
    if (r.in_flight++ == 0) {
      ++r.progress;              // a busy spell begins: its quiet counts from now
      if (r.stalled) Changed();  // its one request at a time is taken
    }
  }

  void End(Replica& r) {
    if (--r.in_flight == 0 && r.stalled) Changed();
  }

  // An answer, a response header or stream bytes arrived from `r`.
  void Progress(Replica& r) {
    ++r.progress;
    if (r.stalled) {
      r.stalled = false;
      spdlog::info("gateway: replica {} answers again; it takes new requests", r.url);
      Changed();
    }
  }

  // Looks at every replica a few times per stall timeout: one that stayed
  // busy without progress for the whole timeout is stalled.
  awaitable<void> WatchProgress() {
    const auto period = std::max<std::chrono::milliseconds>(
        options.stall_timeout / kWatchTicksPerStall, std::chrono::milliseconds(1));
    while (!stopping) {
      watch_timer.expires_after(period);
      auto [ec] =
          co_await watch_timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
      (void)ec;
      if (stopping) break;
      const Clock::time_point now = Clock::now();
      for (auto& [url, r] : replicas) {
        if (r->in_flight == 0 || r->progress != r->progress_seen) {
          r->progress_seen = r->progress;
          r->quiet_since = now;
          continue;
        }
        if (r->stalled || !r->routable() || now - r->quiet_since < options.stall_timeout) continue;
        r->stalled = true;
        ++counters.stalls;
        spdlog::warn(
            "gateway: replica {} sent nothing for {:.1f} s with {} requests outstanding; new "
            "requests go to other replicas until it answers",
            r->url, std::chrono::duration<double>(now - r->quiet_since).count(), r->in_flight);
        Changed();
      }
    }
    --tasks;
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
    std::optional<VersionRef> applied = NotReadyApplied(body);
    if (!applied.has_value()) return;
    if (r.state.applied != applied) {
      r.state.applied = *std::move(applied);
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
        auto parsed = ReplicaEndpoint::Parse(url);
        if (!parsed.ok()) {
          spdlog::warn("gateway: skipping replica {}: {}", url,
                       std::string(parsed.status().message()));
          continue;
        }
        auto r = std::make_shared<Replica>();
        r->url = url;
        r->endpoint = *std::move(parsed);
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
    CallOptions call;
    call.timeout = options.probe_timeout;
    absl::StatusOr<ReplicaState> state = co_await FetchServerInfo(client, r->endpoint, call);
    r->probing = false;
    --tasks;
    if (stopping) co_return;
    if (state.ok()) {
      const bool changed =
          !r->reachable || r->state.ready != state->ready || r->state.applied != state->applied;
      r->reachable = true;
      r->state = *std::move(state);
      r->last_error = r->state.ready ? "" : r->state.reason;
      if (changed) Changed();
      co_return;
    }
    const bool was_routable = r->routable();
    r->reachable = false;
    r->state.ready = false;
    r->last_error = std::string(state.status().message());
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
  awaitable<void> Handle(HttpExchange& exchange) {
    const std::string_view path = TargetPath(exchange.request().target);
    switch (ClassifyRoute(path).kind) {
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
    absl::StatusOr<VersionedAsk> ask = ReadVersionedAsk(exchange.request().body);
    if (!ask.ok()) {
      HttpResponse refused = BadRequestResponse(std::string(ask.status().message()));
      (void)co_await exchange.Respond(std::move(refused));
      co_return;
    }
    const VersionConstraint constraint = ask->constraint;
    const bool stream = ask->stream;
    std::string session;
    if (auto s = exchange.request().headers.Get(options.session_header); s.has_value()) {
      if (s->size() > options.max_session_id_bytes) {
        HttpResponse refused = BadRequestResponse(
            absl::StrCat("the ", options.session_header, " header is ", s->size(),
                         " bytes, over the gateway's limit of ", options.max_session_id_bytes,
                         "; send a shorter session id"));
        (void)co_await exchange.Respond(std::move(refused));
        co_return;
      }
      session = std::string(*s);
    }

    const HttpHeaders headers =
        RequestHeadersToForward(exchange.request().headers, BodyRelay::kUnchanged);
    const std::string& target = exchange.request().target;
    const std::string payload = std::move(exchange.request().body);

    const Clock::time_point deadline = Clock::now() + options.admission_wait;
    std::vector<ReplicaPtr> tried;
    std::optional<HttpResponse> last_failure;
    bool waited = false;
    NotServed why = NotServed::kAfterWaiting;
    for (;;) {
      ReplicaPtr replica = Choose(constraint, session, tried);
      if (replica == nullptr) {
        if (static_cast<int>(tried.size()) >= options.max_attempts) break;
        if (NeverServable(constraint)) {
          why = NotServed::kNeverServable;
          break;
        }
        if (Clock::now() >= deadline) break;
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
      HttpRequest upstream{"POST", replica->endpoint.prefix + target, headers, payload};
      Outcome outcome = Outcome::kRetry;
      if (stream) {
        outcome = co_await AttemptStream(exchange, *replica, std::move(upstream), &last_failure);
      } else {
        outcome = co_await Attempt(exchange, *replica, std::move(upstream), &last_failure);
      }
      if (outcome == Outcome::kClientGone) co_return;
      if (outcome == Outcome::kDone) {
        if (!session.empty()) sessions.Put(session, replica);
        co_return;
      }
      if (static_cast<int>(tried.size()) >= options.max_attempts) break;
    }
    if (last_failure.has_value()) {
      (void)co_await exchange.Respond(*std::move(last_failure));
      co_return;
    }
    ++counters.rejected;
    if (why == NotServed::kNeverServable) ++counters.unservable;
    HttpResponse conflict = NotReady(constraint, why);
    (void)co_await exchange.Respond(std::move(conflict));
  }

  // The 409 when no ready replica satisfies `constraint`, for `why`:
  // `applied` is the newest version any ready replica serves.
  HttpResponse NotReady(const VersionConstraint& constraint, NotServed why) {
    Reindex();
    std::optional<VersionRef> newest;
    if (!routable.by_version.empty()) {
      newest = routable.by_version.rbegin()->second.front()->state.applied;
    }
    std::string message;
    if (why == NotServed::kNeverServable) {
      message = absl::StrFormat(
          "no replica can serve %s any more: every replica of the pool has moved past it (the "
          "oldest has applied %s, and versions only move forward within a run); ask for a "
          "version the fleet serves, or for a min_version",
          constraint.ToString(), oldest_applied.has_value() ? oldest_applied->ToString() : "?");
    } else {
      message = absl::StrFormat(
          "no ready replica serves %s after waiting %.1f s (%d of %d replicas ready); retry later "
          "or relax the constraint",
          constraint.ToString(), std::chrono::duration<double>(options.admission_wait).count(),
          static_cast<int>(routable.all.size()), static_cast<int>(replicas.size()));
    }
    return NotReadyResponse(constraint, newest, message);
  }

  // The 400 when the client library refused to send a request on
  // (InvalidArgument: a target or field it cannot carry): the request is at
  // fault, not the replica, so nothing is marked.
  static HttpResponse Unsendable(const absl::Status& status) {
    return BadRequestResponse(absl::StrCat("the request cannot be passed on: ", status.message()));
  }

  // The 503 (with Retry-After) to relay, if no other replica answers, when
  // `r` could not be reached or broke off with `status`; marks `r`
  // unreachable.
  HttpResponse Unreachable(Replica& r, const absl::Status& status) {
    const std::string why(status.message());
    MarkFailed(r, why, /*unreachable=*/true);
    return UnavailableResponse(Unavailable::kReplica,
                               absl::StrCat("replica ", r.url, " failed: ", why, "; retry"));
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
    Begin(r);
    absl::StatusOr<HttpResponse> response =
        co_await client.Send(r.endpoint.origin, std::move(request), EndedWithTheClient(exchange));
    End(r);
    if (!response.ok()) {
      if (exchange.disconnected()) co_return Outcome::kClientGone;
      if (absl::IsInvalidArgument(response.status())) {
        HttpResponse refused = Unsendable(response.status());
        (void)co_await exchange.Respond(std::move(refused));
        co_return Outcome::kDone;
      }
      last_failure->emplace(Unreachable(r, response.status()));
      co_return Outcome::kRetry;
    }
    Progress(r);
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
    Begin(r);
    Outcome outcome = co_await RelayStream(exchange, r, std::move(request), last_failure);
    End(r);
    co_return outcome;
  }

  awaitable<Outcome> RelayStream(HttpExchange& exchange, Replica& r, HttpRequest request,
                                 std::optional<HttpResponse>* last_failure) {
    absl::StatusOr<HttpResponseStream> stream = co_await client.SendStreamed(
        r.endpoint.origin, std::move(request), EndedWithTheClient(exchange));
    if (!stream.ok()) {
      if (exchange.disconnected()) co_return Outcome::kClientGone;
      if (absl::IsInvalidArgument(stream.status())) {
        HttpResponse refused = Unsendable(stream.status());
        (void)co_await exchange.Respond(std::move(refused));
        co_return Outcome::kDone;
      }
      last_failure->emplace(Unreachable(r, stream.status()));
      co_return Outcome::kRetry;
    }
    Progress(r);
    if (stream->status() != 200 || !IsEventStream(stream->headers())) {
      absl::StatusOr<std::string> body = co_await stream->ReadAll();
      if (!body.ok()) {
        if (exchange.disconnected()) co_return Outcome::kClientGone;
        last_failure->emplace(Unreachable(r, body.status()));
        co_return Outcome::kRetry;
      }
      Progress(r);
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
      Progress(r);
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
      HttpResponse unavailable =
          UnavailableResponse(Unavailable::kNoReadyReplica,
                              "no replica of the pool is ready; check `stitch status` and retry");
      (void)co_await exchange.Respond(std::move(unavailable));
      co_return;
    }
    HttpRequest up;
    up.method = exchange.request().method;
    up.target = r->endpoint.prefix + exchange.request().target;
    up.headers = RequestHeadersToForward(exchange.request().headers, BodyRelay::kUnchanged);
    up.body = std::move(exchange.request().body);
    Begin(*r);
    absl::StatusOr<HttpResponse> response =
        co_await client.Send(r->endpoint.origin, std::move(up), EndedWithTheClient(exchange));
    End(*r);
    if (!response.ok()) {
      if (exchange.disconnected()) co_return;
      if (absl::IsInvalidArgument(response.status())) {
        HttpResponse refused = Unsendable(response.status());
        (void)co_await exchange.Respond(std::move(refused));
        co_return;
      }
      const std::string why(response.status().message());
      MarkFailed(*r, why, /*unreachable=*/true);
      HttpResponse unavailable = UnavailableResponse(
          Unavailable::kReplica, absl::StrCat("replica ", r->url, " failed: ", why));
      (void)co_await exchange.Respond(std::move(unavailable));
      co_return;
    }
    Progress(*r);
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
      s.stalled = r->stalled;
      s.last_error = r->stalled ? "stalled: requests outstanding and nothing received from it; "
                                  "new requests go to other replicas until it answers"
                                : r->last_error;
      state.replicas.push_back(std::move(s));
    }
    return state;
  }

  awaitable<void> Health(HttpExchange& exchange) {
    Reindex();
    const bool ready = !routable.all.empty();
    json::object body;
    body["ready"] = ready;
    body["ready_replicas"] = routable.all.size();
    body["replicas"] = replicas.size();
    if (!ready) body["reason"] = "no replica of the pool is ready";
    const int status = ready ? 200 : 503;
    std::string text = json::serialize(body);
    co_await Respond(exchange, status, std::move(text));
  }

  awaitable<void> Replicas(HttpExchange& exchange) {
    std::string body = ReplicasJson(Snapshot());
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
    text.One("rejected_total", "counter", "409s answered by the gateway itself.",
             counters.rejected);
    text.One("unservable_total", "counter",
             "409s answered at once: an exact version every replica has moved past.",
             counters.unservable);
    text.One("stalls_total", "counter",
             "Replicas found busy without progress for the stall timeout.", counters.stalls);
    text.One("sessions", "gauge", "Sessions in the session table.", sessions.size());
    text.One("session_table_bytes", "gauge", "Memory the session table counts against its budget.",
             sessions.bytes());
    text.One("sessions_evicted_total", "counter",
             "Least recently used sessions forgotten to keep the table within its budget.",
             sessions.evictions());
    const ServerStats server_stats = server->stats();
    text.One("request_body_bytes", "gauge", "Request bodies held now, against the server's budget.",
             server_stats.body_bytes_held);
    text.One("overloaded_total", "counter",
             "Requests refused (503) because their body would pass the server's budget.",
             server_stats.refused_over_budget);
    text.One("blocked_total", "counter", "Engine control routes refused.", counters.blocked);
    text.One("wakes_total", "counter", "Fleet wakes started.", counters.wakes);
    text.One("replicas_ready", "gauge", "Replicas ready to serve.", routable.all.size());
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
  router.Add("GET", "/replicas", [self](HttpExchange& ex) { return self->Replicas(ex); });
  router.Add("GET", "/metrics", [self](HttpExchange& ex) { return self->Metrics(ex); });
  router.SetFallback([self](HttpExchange& ex) { return self->Handle(ex); });
  auto server = HttpServer::Start(executor, self->options.server, router.AsHandler());
  if (!server.ok()) return server.status();
  impl->server = *std::move(server);
  ++impl->tasks;
  Spawn(executor, impl->PollLoop());
  if (impl->options.stall_timeout > std::chrono::milliseconds::zero()) {
    ++impl->tasks;
    Spawn(executor, impl->WatchProgress());
  }
  return std::unique_ptr<Gateway>(new Gateway(std::move(impl)));
}

std::string Gateway::url() const { return impl_->server->url(); }
uint16_t Gateway::port() const { return impl_->server->port(); }

awaitable<void> Gateway::Shutdown() {
  impl_->stopping = true;
  impl_->poll_timer.cancel();
  impl_->watch_timer.cancel();
  for (boost::asio::steady_timer* t : impl_->waiters) t->cancel();
  co_await impl_->server->Shutdown();
  co_await impl_->Drain();
}

PoolState Gateway::Snapshot() const { return impl_->Snapshot(); }
const GatewayCounters& Gateway::counters() const { return impl_->counters; }

}  // namespace stitch
