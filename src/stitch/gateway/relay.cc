#include "stitch/gateway/relay.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stitch/api/answers.h"
#include "stitch/api/headers.h"
#include "stitch/api/request.h"
#include "stitch/api/response.h"
#include "stitch/net/auth.h"
#include "stitch/net/upstream.h"

namespace stitch {

using boost::asio::awaitable;

namespace {

// A replica's response headers as the gateway relays them (bodies pass
// unchanged), with X-Stitch-Replica naming the replica.
HttpHeaders ResponseHeaders(const HttpHeaders& from, const std::string& replica) {
  HttpHeaders to = ResponseHeadersToRelay(from, BodyRelay::kUnchanged);
  to.Set("X-Stitch-Replica", replica);
  return to;
}

// The 400 when the client library refused to send a request on
// (InvalidArgument: a target or field it cannot carry): the request is at
// fault, not the replica, so nothing is marked.
HttpResponse Unsendable(const absl::Status& status) {
  return BadRequestResponse(absl::StrCat("the request cannot be passed on: ", status.message()));
}

// Counts a request as outstanding on a replica while it lives.
class Outstanding {
 public:
  Outstanding(ReplicaTable& table, ReplicaEntry& r) : table_(table), r_(r) { table_.Begin(r_); }
  ~Outstanding() { table_.End(r_); }
  Outstanding(const Outstanding&) = delete;
  Outstanding& operator=(const Outstanding&) = delete;

 private:
  ReplicaTable& table_;
  ReplicaEntry& r_;
};

}  // namespace

Relay::Relay(HttpClient& client, ReplicaTable& table, Clock& clock, const GatewayOptions& options,
             GatewayCounters& counters)
    : client_(client),
      table_(table),
      clock_(clock),
      options_(options),
      counters_(counters),
      chooser_(std::random_device{}()),
      sessions_(options.session_table_bytes) {}

HttpHeaders Relay::UpstreamHeaders(const HttpHeaders& from) const {
  HttpHeaders headers = RequestHeadersToForward(from, BodyRelay::kUnchanged);
  // The gateway's token goes only with a request that presented it here:
  // a request the gateway did not authenticate (its data plane open) goes
  // on with whatever the caller sent, so that it cannot borrow the
  // gateway's credential for a replica's token-protected routes.
  if (!options_.auth_token.empty() && PresentsBearerToken(from, options_.auth_token)) {
    headers.Set("Authorization", BearerValue(options_.auth_token));
  }
  return headers;
}

// Long on purpose: one versioned request's path through the gateway, in
// order (read the constraint and session, wait for a replica, try up to
// max_attempts, answer); the steps that stand alone (Attempt,
// AttemptStream, RelayStream, the chooser) are functions of their own.
awaitable<void> Relay::Versioned(HttpExchange& exchange) {
  ++counters_.requests;
  absl::StatusOr<VersionedAsk> ask = ReadVersionedAsk(exchange.request().body);
  if (!ask.ok()) {
    HttpResponse refused = BadRequestResponse(std::string(ask.status().message()));
    (void)co_await exchange.Respond(std::move(refused));
    co_return;
  }
  const bool defaulted = ask->constraint.empty() && !options_.default_constraint.empty();
  const VersionConstraint constraint = defaulted ? options_.default_constraint : ask->constraint;
  const bool stream = ask->stream;
  std::string session;
  if (auto s = exchange.request().headers.Get(options_.session_header); s.has_value()) {
    if (s->size() > options_.max_session_id_bytes) {
      HttpResponse refused = BadRequestResponse(
          absl::StrCat("the ", options_.session_header, " header is ", s->size(),
                       " bytes, over the gateway's limit of ", options_.max_session_id_bytes,
                       "; send a shorter session id"));
      (void)co_await exchange.Respond(std::move(refused));
      co_return;
    }
    session = std::string(*s);
  }

  const HttpHeaders headers = UpstreamHeaders(exchange.request().headers);
  const std::string& target = exchange.request().target;
  std::string payload = std::move(exchange.request().body);
  if (defaulted) {
    // The replica enforces the default as if the client had sent it.
    absl::StatusOr<std::string> with = WithConstraint(payload, constraint);
    if (!with.ok()) {
      HttpResponse refused = BadRequestResponse(std::string(with.status().message()));
      (void)co_await exchange.Respond(std::move(refused));
      co_return;
    }
    payload = *std::move(with);
  }

  const std::string prompt_prefix = options_.affinity_prefix_bytes > 0
                                        ? PromptPrefix(payload, options_.affinity_prefix_bytes)
                                        : std::string();
  const Clock::TimePoint deadline = clock_.Now() + options_.admission_wait;
  std::vector<ReplicaPtr> tried;
  std::optional<HttpResponse> last_failure;
  bool waited = false;
  NotServed why = NotServed::kAfterWaiting;
  for (;;) {
    ReplicaPtr home;
    if (!session.empty()) {
      if (const ReplicaPtr* h = sessions_.Find(session); h != nullptr) home = *h;
    }
    const VersionConstraint routed = table_.index().RoutingConstraint(constraint);
    std::optional<Affinity> affinity;
    if (options_.affinity_prefix_bytes > 0) {
      // The version it will be served on: its pin, else what the pool serves.
      std::optional<int64_t> version = routed.exact_version;
      if (!version.has_value()) {
        if (std::optional<VersionRef> newest = table_.index().newest_routable()) {
          version = newest->version;
        }
      }
      affinity = Affinity{AffinityKey(version, prompt_prefix), options_.affinity_load_factor};
    }
    ReplicaPtr replica = chooser_.Choose(table_.index(), routed, home, tried, affinity);
    if (replica == nullptr) {
      if (static_cast<int>(tried.size()) >= options_.max_attempts) break;
      if (table_.index().NeverServable(routed)) {
        why = NotServed::kNeverServable;
        break;
      }
      if (clock_.Now() >= deadline) break;
      if (!waited) {
        waited = true;
        ++counters_.waited;
      }
      table_.Wake();
      const absl::Status wait =
          co_await exchange.CancelOnDisconnect(table_.WaitForChange(deadline));
      (void)wait;
      if (exchange.disconnected() || table_.stopping()) co_return;
      continue;
    }
    tried.push_back(replica);
    if (tried.size() > 1) {
      ++counters_.retried;
      table_.history().Retried();
    }
    ++counters_.routed;
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
      if (!session.empty()) sessions_.Put(session, replica);
      co_return;
    }
    if (static_cast<int>(tried.size()) >= options_.max_attempts) break;
  }
  if (last_failure.has_value()) {
    (void)co_await exchange.Respond(*std::move(last_failure));
    co_return;
  }
  ++counters_.rejected;
  table_.history().Conflict();
  if (why == NotServed::kNeverServable) ++counters_.unservable;
  HttpResponse conflict = NotReady(constraint, why);
  (void)co_await exchange.Respond(std::move(conflict));
}

HttpResponse Relay::NotReady(const VersionConstraint& constraint, NotServed why) {
  const RoutingIndex& index = table_.index();
  std::string message;
  if (why == NotServed::kNeverServable) {
    const std::optional<VersionRef>& oldest = index.oldest_applied();
    message = absl::StrFormat(
        "no replica can serve %s any more: every replica of the pool has moved past it (the "
        "oldest has applied %s, and versions only move forward within a run); ask for a "
        "version the fleet serves, or for a min_version",
        constraint.ToString(), oldest.has_value() ? oldest->ToString() : "?");
  } else {
    message = absl::StrFormat(
        "no ready replica serves %s after waiting %.1f s (%d of %d replicas ready); retry later "
        "or relax the constraint",
        constraint.ToString(), std::chrono::duration<double>(options_.admission_wait).count(),
        static_cast<int>(index.routable().all().size()),
        static_cast<int>(table_.replicas().size()));
  }
  std::optional<VersionConstraint::Bound> failed;
  if (std::optional<VersionRef> newest = index.newest_routable(); newest.has_value()) {
    failed = constraint.Unmet(newest->version, index.newest_pointer());
  }
  return NotReadyResponse(constraint, index.newest_routable(), message, failed);
}

HttpResponse Relay::Unreachable(ReplicaEntry& r, const absl::Status& status) {
  const std::string why(status.message());
  table_.MarkFailed(r, why, Reachability::kUnreachable);
  table_.history().Unavailable();
  return UnavailableResponse(Unavailable::kReplica,
                             absl::StrCat("replica ", r.url, " failed: ", why, "; retry"));
}

// Whether `r` refused the request with `out`: a 409 (its version does not
// satisfy the constraint) or a 503 (not ready). Learns from the refusal and
// keeps `out` in *last_failure to relay if no other replica does better.
bool Relay::Refused(ReplicaEntry& r, HttpResponse& out, std::optional<HttpResponse>* last_failure) {
  if (out.status != 409 && out.status != 503) return false;
  if (out.status == 409) {
    table_.history().Conflict();
    if (std::optional<VersionRef> applied = NotReadyApplied(out.body); applied.has_value()) {
      table_.LearnApplied(r, *applied);
    }
  } else {
    table_.history().Unavailable();
    table_.MarkFailed(r, absl::StrCat("HTTP 503: ", out.body), Reachability::kReached);
  }
  last_failure->emplace(std::move(out));
  return true;
}

awaitable<Relay::Outcome> Relay::Attempt(HttpExchange& exchange, ReplicaEntry& r,
                                         HttpRequest request,
                                         std::optional<HttpResponse>* last_failure) {
  absl::StatusOr<HttpResponse> response;
  {
    const Outstanding outstanding(table_, r);
    response =
        co_await client_.Send(r.endpoint.origin, std::move(request), EndedWithTheClient(exchange));
  }
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
  table_.Progress(r);
  HttpResponse out{response->status, ResponseHeaders(response->headers, r.url),
                   std::move(response->body)};
  if (Refused(r, out, last_failure)) co_return Outcome::kRetry;
  if (out.status == 200) {
    std::optional<int64_t> served = StampedEndVersion(out.body);
    if (served.has_value()) table_.LearnVersion(r, *served);
    table_.history().Served(served.has_value() ? served : r.version());
  }
  (void)co_await exchange.Respond(std::move(out));
  co_return Outcome::kDone;
}

awaitable<Relay::Outcome> Relay::AttemptStream(HttpExchange& exchange, ReplicaEntry& r,
                                               HttpRequest request,
                                               std::optional<HttpResponse>* last_failure) {
  const Outstanding outstanding(table_, r);
  Outcome outcome = co_await RelayStream(exchange, r, std::move(request), last_failure);
  co_return outcome;
}

awaitable<Relay::Outcome> Relay::RelayStream(HttpExchange& exchange, ReplicaEntry& r,
                                             HttpRequest request,
                                             std::optional<HttpResponse>* last_failure) {
  absl::StatusOr<HttpResponseStream> stream = co_await client_.SendStreamed(
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
  table_.Progress(r);
  if (stream->status() != 200 || !IsEventStream(stream->headers())) {
    absl::StatusOr<std::string> body = co_await stream->ReadAll();
    if (!body.ok()) {
      if (exchange.disconnected()) co_return Outcome::kClientGone;
      last_failure->emplace(Unreachable(r, body.status()));
      co_return Outcome::kRetry;
    }
    table_.Progress(r);
    HttpResponse out{stream->status(), ResponseHeaders(stream->headers(), r.url), *std::move(body)};
    if (Refused(r, out, last_failure)) co_return Outcome::kRetry;
    (void)co_await exchange.Respond(std::move(out));
    co_return Outcome::kDone;
  }
  table_.history().Served(r.version());
  const absl::Status begun =
      co_await exchange.BeginStream(200, ResponseHeaders(stream->headers(), r.url));
  if (!begun.ok()) co_return Outcome::kClientGone;
  for (;;) {
    absl::StatusOr<std::string> chunk = co_await stream->Read();
    if (!chunk.ok()) {
      if (exchange.disconnected()) co_return Outcome::kClientGone;
      // The replica cut the stream after it began: too late to retry. End
      // the connection without a proper end of body so the client sees it.
      table_.MarkFailed(r, std::string(chunk.status().message()), Reachability::kUnreachable);
      co_return Outcome::kDone;
    }
    table_.Progress(r);
    if (chunk->empty()) break;
    const absl::Status written = co_await exchange.WriteChunk(*std::move(chunk));
    if (!written.ok()) co_return Outcome::kClientGone;
  }
  (void)co_await exchange.EndStream();
  co_return Outcome::kDone;
}

awaitable<void> Relay::Other(HttpExchange& exchange) {
  const VersionConstraint any;
  ReplicaPtr r = chooser_.Choose(table_.index(), any, nullptr, {});
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
  up.headers = UpstreamHeaders(exchange.request().headers);
  up.body = std::move(exchange.request().body);
  absl::StatusOr<HttpResponse> response;
  {
    const Outstanding outstanding(table_, *r);
    response =
        co_await client_.Send(r->endpoint.origin, std::move(up), EndedWithTheClient(exchange));
  }
  if (!response.ok()) {
    if (exchange.disconnected()) co_return;
    if (absl::IsInvalidArgument(response.status())) {
      HttpResponse refused = Unsendable(response.status());
      (void)co_await exchange.Respond(std::move(refused));
      co_return;
    }
    const std::string why(response.status().message());
    table_.MarkFailed(*r, why, Reachability::kUnreachable);
    HttpResponse unavailable = UnavailableResponse(
        Unavailable::kReplica, absl::StrCat("replica ", r->url, " failed: ", why));
    (void)co_await exchange.Respond(std::move(unavailable));
    co_return;
  }
  table_.Progress(*r);
  HttpResponse out{response->status, ResponseHeaders(response->headers, r->url),
                   std::move(response->body)};
  (void)co_await exchange.Respond(std::move(out));
}

}  // namespace stitch
