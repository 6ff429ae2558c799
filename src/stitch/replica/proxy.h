// The versioned proxy: how rollout requests reach the engine through the
// sidecar (docs/sidecar.md).
//
// Versioned routes (POST /generate, /v1/completions, /v1/chat/completions):
//   - the body's `weight_version` ({"min_version"} / {"exact_version"}) is
//     consumed, not forwarded; a bad one is a 400 BadRequest;
//   - the engine sees a request id of its own, "stitch-<8 hex>-<16 hex>"
//     followed by "-<the client's rid>" when the client gave one (for each
//     prompt of a batched /generate, "-<index>" first, zero-padded): all of
//     one width up to the client's part and unique, so that no id is a
//     prefix of another (engines abort every request whose id starts with
//     the one given) and aborting one client's request never touches
//     another's. Responses name the client's own rid again;
//   - the request is admitted by the gate (409 WeightVersionNotReady with
//     `target_version`, `applied`, `message` when its constraint is unmet;
//     while a commit holds admission closed it waits);
//   - it is tagged for prefix-cache isolation (TagRequest, api/request.h);
//   - a whole (not streamed) /generate of one generation is streamed from
//     the engine and assembled into the whole answer (GenerateAssembler,
//     api/assembly.h) when ProxyOptions::assemble_whole_generate is set, so
//     that its spans can be derived per event as a stream's are; not once
//     the engine has reported spans itself (they are exact either way), nor
//     once a stream could not be assembled (that answer is a retryable 503
//     EngineUnavailable; later ones go whole). An error event in the stream
//     is answered as SGLang answers the whole request's error: 400 with its
//     body;
//   - the response, or each event of a `stream: true` response as it
//     arrives, is stamped with the start and end versions (StampResponse,
//     api/response.h) and with `weight_version_spans` (StampSpans): the
//     engine's own spans when it reports them, else spans derived from the
//     label and token count of each event (SpanDeriver), translated from
//     engine labels to served versions (AdmissionGate::ServedForLabel); when
//     neither is exact, [[0, start]] if no commit happened while the request
//     ran, else "unknown". The ticket is held until the response ends;
//   - before stamping, the weight label the engine put on the response (or
//     event) must be one the engine held while the request ran
//     (AdmissionGate::CheckEngineLabel), and the ticket must still be
//     trusted. Otherwise nothing is stamped: a response is answered 503
//     EngineUnavailable (retryable), a stream is cut after an in-band error
//     event, and a wrong label is reported to the mislabel listener (which
//     withdraws trust in the engine).
// Engine control routes are never forwarded: 403 RouteBlocked. Every other
// route is forwarded as is, without admission. Routes, bodies, refusals and
// which headers pass are the rollout API's (src/stitch/api/).
// When the engine cannot be reached or drops the connection: 503
// EngineUnavailable with `retryable: true` and `Retry-After: 1`, after a
// best-effort abort of the request, and the unreachable listener is told. When the client
// disconnects, the upstream generation is aborted (/abort_request with its rid) and admission
// released.
//
// Threading: confined to the event loop of the HTTP server it serves.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "absl/status/statusor.h"
#include "stitch/api/dispatch.h"
#include "stitch/api/request.h"
#include "stitch/api/response.h"
#include "stitch/api/routes.h"
#include "stitch/engine/engine.h"
#include "stitch/net/client.h"
#include "stitch/net/http.h"
#include "stitch/net/server.h"
#include "stitch/replica/admission_gate.h"

namespace boost::json {
class object;
class value;
}  // namespace boost::json

namespace stitch {

struct ProxyOptions {
  // The engine's data plane.
  HttpOrigin engine;
  // The body field that carries the engine's request id (`rid` for SGLang,
  // `request_id` for vLLM).
  EngineRidField rid_field = EngineRidField::kRid;
  // The engine's API dialect: which of its read-only routes are forwarded
  // (routes.h ReadOnlyRoutes); every other unversioned route is refused.
  EngineDialect dialect = EngineDialect::kSglang;
  // A non-streamed request: the whole exchange with the engine. A streamed
  // one: until the response header.
  std::chrono::milliseconds upstream_timeout = std::chrono::hours(1);
  // Idle keep-alive connections kept to the engine (one per concurrent
  // request is what a busy replica needs).
  size_t max_idle_connections = 4096;
  // Sent to the engine as "Authorization: Bearer <engine_token>" in place
  // of the client's Authorization (an engine's --api-key); empty: none.
  std::string engine_token;
  // Whether a whole /generate of one generation is streamed from the engine
  // and assembled (see above): for engines that label each streamed event
  // (SGLang) but report no spans.
  bool assemble_whole_generate = false;
  // The sidecar checks a token of its own, so the client's Authorization is
  // its credential for the sidecar and is not forwarded. Without either
  // this or an engine token, the client's Authorization passes through.
  bool own_authorization = false;
  // The sidecar's own routes (ApiHandlers::own_routes): never forwarded.
  std::vector<OwnRoute> own_routes;
};

// Counters of the proxy, for /metrics.
struct ProxyCounters {
  uint64_t versioned_requests = 0;  // versioned requests received
  uint64_t streamed = 0;            // of which `stream: true`
  uint64_t assembled = 0;           // whole /generate answers assembled from the engine's stream
  uint64_t completed = 0;           // answered by the engine, to the end
  uint64_t bad_requests = 0;        // 400: body or constraint unusable
  uint64_t route_blocked = 0;       // 403
  uint64_t engine_unavailable = 0;  // 503 EngineUnavailable (or a stream cut by the engine)
  uint64_t client_disconnects = 0;  // aborted because the client went away
  uint64_t forwarded = 0;           // other routes, forwarded as is
  uint64_t unvouched = 0;           // 503: weights changed or were mislabelled mid-request
  uint64_t spans_disagreed = 0;     // the engine's spans and its events' labels told apart
};

class VersionedProxy {
 public:
  // `engine` and `gate` must outlive the proxy.
  VersionedProxy(boost::asio::any_io_executor loop, ProxyOptions options, Engine& engine,
                 AdmissionGate& gate);
  ~VersionedProxy();
  VersionedProxy(const VersionedProxy&) = delete;
  VersionedProxy& operator=(const VersionedProxy&) = delete;

  // Handles one request (any route the sidecar does not serve itself).
  boost::asio::awaitable<void> Handle(HttpExchange& exchange);

  // Told when a request could not reach the engine (why), and when the
  // engine labelled a response with weights it should not hold (why).
  // Called on the loop, synchronously, before the request is answered.
  void SetUnreachableListener(std::function<void(std::string_view)> listener) {
    on_unreachable_ = std::move(listener);
  }
  void SetMislabelListener(std::function<void(std::string)> listener) {
    on_mislabel_ = std::move(listener);
  }

  // The engine's own GET /metrics text, or nullopt when the engine has none
  // or did not answer 200 within `timeout`.
  boost::asio::awaitable<std::optional<std::string>> EngineMetrics(
      std::chrono::milliseconds timeout);

  // Best effort: asks the engine to abort every versioned request in flight
  // (their answers can no longer be stamped).
  void AbortInFlight();

  const ProxyCounters& counters() const { return counters_; }
  const HttpClient& client() const { return client_; }

 private:
  struct Call;
  class InFlight;
  enum class Verdict { kStamped, kNotJson, kUnvouched };
  // Checks the engine's label and the ticket's trust, restores the client's
  // rids and stamps `text` (one document) in place. kUnvouched sets `why`.
  Verdict Vouch(Call& call, std::string& text, std::string* why);
  // The same for a parsed document (an object or a batch), in place.
  Verdict VouchDocument(Call& call, boost::json::value& doc, std::string* why);
  // The checks alone, and the spans of each item of `doc` (when `spans` is
  // not null); the span deriver sees `doc` as the next event.
  Verdict Judge(Call& call, const boost::json::value& doc,
                std::vector<std::optional<VersionSpans>>* spans, std::string* why);
  // The spans to stamp on `item` of response document `doc`, in served
  // versions (nullopt: unknown); an error when the engine reported spans
  // that are malformed or name weights it did not hold.
  absl::StatusOr<std::optional<VersionSpans>> Spans(Call& call, const boost::json::value& doc,
                                                    const boost::json::object& item);
  // An engine's reported spans in its labels' versions: FailedPrecondition
  // when a label names weights it did not hold while `ticket`'s request ran,
  // or the versions do not rise.
  absl::StatusOr<VersionSpans> HeldSpans(const AdmissionGate::Ticket& ticket,
                                         const LabelledSpans& reported) const;
  boost::asio::awaitable<void> HandleVersioned(HttpExchange& exchange, ApiRoute route);
  boost::asio::awaitable<void> BadRequest(HttpExchange& exchange, std::string message);
  boost::asio::awaitable<void> Forward(HttpExchange& exchange);
  // The Authorization the engine sees (ProxyOptions::engine_token).
  void PresentEngineToken(HttpHeaders& headers) const;
  boost::asio::awaitable<void> Relay(HttpExchange& exchange, Call& call);
  boost::asio::awaitable<void> RelayStream(HttpExchange& exchange, Call& call);
  boost::asio::awaitable<void> RelayAssembled(HttpExchange& exchange, Call& call);
  // Answers a call to the engine that failed (why): nothing when the client
  // left (the generation is aborted), else 503 EngineUnavailable.
  boost::asio::awaitable<void> CallFailed(HttpExchange& exchange, Call& call,
                                          const absl::Status& why);
  // Sends the call to the engine as a stream: its event stream, or nullopt
  // once the exchange is answered otherwise (CallFailed, or RelayWhole when
  // the engine answered something other than an event stream).
  boost::asio::awaitable<std::optional<HttpResponseStream>> OpenEventStream(HttpExchange& exchange,
                                                                            Call& call);
  // Answers with what the engine sent instead of an event stream (an error,
  // or a whole answer from a server that ignored `stream`), vouched for.
  boost::asio::awaitable<void> RelayWhole(HttpExchange& exchange, Call& call,
                                          HttpResponseStream& stream);
  // The answer when a stream could not be assembled (why); later whole
  // /generate requests are relayed whole.
  boost::asio::awaitable<void> NotAssembled(HttpExchange& exchange, Call& call,
                                            std::string_view why);
  boost::asio::awaitable<void> EngineUnavailable(HttpExchange& exchange, Call* call,
                                                 std::string_view why);
  void AbortUpstream(Call& call);
  boost::asio::awaitable<void> Unvouched(HttpExchange& exchange, Call& call, std::string_view why);
  std::string NextRid();

  const boost::asio::any_io_executor loop_;
  const ProxyOptions options_;
  Engine& engine_;
  AdmissionGate& gate_;
  HttpClient client_;
  ProxyCounters counters_;
  std::string rid_prefix_;
  uint64_t rid_counter_ = 0;
  std::function<void(std::string_view)> on_unreachable_;
  std::function<void(std::string)> on_mislabel_;
  std::unordered_set<Call*> in_flight_;
  // Whole /generate requests are assembled from streams while
  // options_.assemble_whole_generate holds and neither of these was seen.
  bool engine_reports_spans_ = false;
  bool assembly_failed_ = false;
  ApiHandlers handlers_;
};

}  // namespace stitch
