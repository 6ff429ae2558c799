// Over ~600 lines on purpose: the versioned proxy's request paths (whole,
// streamed, assembled, unversioned) share the Call state and the answers
// they build.

#include "stitch/replica/proxy.h"

#include <optional>
#include <random>
#include <utility>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stitch/api/answers.h"
#include "stitch/api/assembly.h"
#include "stitch/api/dispatch.h"
#include "stitch/api/headers.h"
#include "stitch/api/request.h"
#include "stitch/api/response.h"
#include "stitch/core/errors.h"
#include "stitch/core/json.h"
#include "stitch/net/auth.h"
#include "stitch/net/sse.h"
#include "stitch/net/upstream.h"

namespace stitch {

namespace json = boost::json;
using boost::asio::awaitable;

namespace {

// Replaces the data of one server-sent event, keeping its other fields.
std::string WithData(const std::string& event, const std::string& data) {
  std::string out;
  size_t start = 0;
  while (start < event.size()) {
    size_t end = event.find('\n', start);
    if (end == std::string::npos) end = event.size() - 1;
    std::string_view line(event.data() + start, end + 1 - start);
    if (!line.starts_with("data")) out.append(line);
    start = end + 1;
  }
  out += SseEvent(data);
  return out;
}

// Applies `fn` to the response object, or to each object of a batch.
template <typename F>
void ForEachItem(json::value& doc, F fn) {
  if (doc.is_object()) {
    fn(doc.get_object(), size_t{0});
  } else if (doc.is_array()) {
    size_t i = 0;
    for (json::value& item : doc.get_array()) {
      if (item.is_object()) fn(item.get_object(), i);
      ++i;
    }
  }
}

}  // namespace

struct VersionedProxy::Call {
  ApiRoute route = ApiRoute::kGenerate;
  std::optional<AdmissionGate::Ticket> ticket;
  // The ids the engine was given, and the client's own (empty when the
  // client gave none), per prompt.
  std::vector<std::string> rids;
  std::vector<std::string> client_rids;
  HttpRequest upstream;
  // Spans from the engine's labels, event by event (set once admitted).
  std::optional<SpanDeriver> deriver;
};

// Registers a call as in flight for as long as it lives.
class VersionedProxy::InFlight {
 public:
  InFlight(std::unordered_set<Call*>& set, Call* call) : set_(set), call_(call) {
    set_.insert(call_);
  }
  ~InFlight() { set_.erase(call_); }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::unordered_set<Call*>& set_;
  Call* call_;
};

VersionedProxy::VersionedProxy(boost::asio::any_io_executor loop, ProxyOptions options,
                               Engine& engine, AdmissionGate& gate)
    : loop_(loop), options_(std::move(options)), engine_(engine), gate_(gate), client_(loop, [&] {
        ClientOptions client;
        client.request_timeout = options_.upstream_timeout;
        client.max_idle_per_origin = options_.max_idle_connections;
        return client;
      }()) {
  std::random_device seed;
  rid_prefix_ = absl::StrFormat("stitch-%08x-", seed());
  handlers_.versioned = [this](HttpExchange& ex, ApiRoute route) {
    return HandleVersioned(ex, route);
  };
  handlers_.other = [this](HttpExchange& ex) { return Forward(ex); };
  handlers_.dialects = {options_.dialect};
  handlers_.blocked_why = "the sidecar alone drives the engine, so it is not forwarded";
  handlers_.on_blocked = [this] { ++counters_.route_blocked; };
  handlers_.own_routes = options_.own_routes;
}

VersionedProxy::~VersionedProxy() = default;

std::string VersionedProxy::NextRid() {
  return absl::StrCat(rid_prefix_, absl::StrFormat("%016x", ++rid_counter_));
}

void VersionedProxy::AbortInFlight() {
  std::vector<std::string> rids;
  for (Call* call : in_flight_) rids.insert(rids.end(), call->rids.begin(), call->rids.end());
  if (rids.empty()) return;
  boost::asio::co_spawn(loop_, engine_.Abort(std::move(rids)), boost::asio::detached);
}

VersionedProxy::Verdict VersionedProxy::Vouch(Call& call, std::string& text, std::string* why) {
  JsonArena arena;
  boost::system::error_code ec;
  json::value doc = json::parse(text, ec, arena.storage());
  if (ec || !(doc.is_object() || doc.is_array())) return Verdict::kNotJson;
  const Verdict verdict = VouchDocument(call, doc, why);
  if (verdict == Verdict::kStamped) text = json::serialize(doc);
  return verdict;
}

VersionedProxy::Verdict VersionedProxy::VouchDocument(Call& call, json::value& doc,
                                                      std::string* why) {
  std::vector<std::optional<VersionSpans>> spans;
  if (Judge(call, doc, &spans, why) == Verdict::kUnvouched) return Verdict::kUnvouched;
  const VersionStamp stamp = call.ticket->Stamp();
  ForEachItem(doc, [&](json::object& item, size_t i) {
    if (i < call.client_rids.size() && !call.client_rids[i].empty()) {
      RestoreRid(call.route, item, call.rids[i], call.client_rids[i]);
    }
    StampResponse(call.route, item, stamp);
    if (i < spans.size()) StampSpans(call.route, item, spans[i]);
  });
  return Verdict::kStamped;
}

VersionedProxy::Verdict VersionedProxy::Judge(Call& call, const json::value& doc,
                                              std::vector<std::optional<VersionSpans>>* spans,
                                              std::string* why) {
  if (!call.ticket->trusted()) {
    *why = absl::StrCat(
        "the sidecar stopped vouching for the engine's weights while this request "
        "ran (",
        gate_.last_distrust_reason(), ")");
    return Verdict::kUnvouched;
  }
  if (std::optional<std::string> label = ResponseWeightLabel(doc); label.has_value()) {
    if (absl::Status agrees = gate_.CheckEngineLabel(*call.ticket, *label); !agrees.ok()) {
      *why = std::string(agrees.message());
      if (on_mislabel_) on_mislabel_(*why);
      return Verdict::kUnvouched;
    }
  }
  absl::Status spans_ok;
  auto judge_item = [&](const json::object& item) {
    absl::StatusOr<std::optional<VersionSpans>> s = Spans(call, doc, item);
    if (!s.ok()) {
      if (spans_ok.ok()) spans_ok = s.status();
      return;
    }
    if (spans != nullptr) spans->push_back(*std::move(s));
  };
  if (doc.is_object()) {
    judge_item(doc.get_object());
  } else if (doc.is_array()) {
    for (const json::value& item : doc.get_array()) {
      if (item.is_object()) judge_item(item.get_object());
    }
  }
  if (!spans_ok.ok()) {
    *why = std::string(spans_ok.message());
    if (on_mislabel_) on_mislabel_(*why);
    return Verdict::kUnvouched;
  }
  return Verdict::kStamped;
}

absl::StatusOr<std::optional<VersionSpans>> VersionedProxy::Spans(Call& call,
                                                                  const json::value& doc,
                                                                  const json::object& item) {
  const AdmissionGate::Ticket& ticket = *call.ticket;
  const std::optional<int64_t> tokens = ReportedCompletionTokens(call.route, item);
  // In the engine's labels first: derived event by event, and as the engine
  // reports them.
  std::optional<VersionSpans> derived;
  if (doc.is_object() && call.deriver.has_value()) {
    // One generation (batches are never streamed).
    std::optional<int64_t> label;
    if (std::optional<std::string> text = ResponseWeightLabel(doc)) {
      if (std::optional<VersionRef> ref = ParseEngineLabel(*text)) label = ref->version;
    }
    call.deriver->Observe(label, tokens);
    derived = call.deriver->spans();
  }
  absl::StatusOr<std::optional<LabelledSpans>> reported = EngineReportedSpans(call.route, item);
  if (!reported.ok()) return reported.status();
  std::optional<VersionSpans> labelled;
  if (reported->has_value()) {
    absl::StatusOr<VersionSpans> held = HeldSpans(ticket, **reported);
    if (!held.ok()) return held.status();
    labelled = *std::move(held);
    engine_reports_spans_ = true;
    if (derived.has_value() && *derived != *labelled) {
      // The engine's record of each token wins over what its events' labels
      // suggested, which is counted: an engine whose labels run ahead of or
      // behind its tokens.
      ++counters_.spans_disagreed;
    }
  } else {
    labelled = std::move(derived);
  }
  // An engine that does not place commits exactly (Engine::
  // PlacesCommitsExactly) gets "unknown" across a commit; its labels were
  // still checked.
  if (!engine_.PlacesCommitsExactly()) labelled.reset();
  // Then in served versions.
  std::optional<VersionSpans> served;
  if (labelled.has_value()) {
    served.emplace();
    for (const VersionSpan& span : *labelled) {
      std::optional<int64_t> version = gate_.ServedForLabel(ticket, span.version);
      if (!version.has_value()) {
        served.reset();
        break;
      }
      if (served->empty() || served->back().version != *version) {
        served->push_back({span.offset, *version});
      }
    }
  }
  if (!served.has_value() && !gate_.ChangedSince(ticket)) {
    // Nothing changed while it ran: every token came from the start version.
    served.emplace();
    if (tokens.value_or(1) > 0) served->push_back({0, ticket.start().version});
  }
  return served;
}

absl::StatusOr<VersionSpans> VersionedProxy::HeldSpans(const AdmissionGate::Ticket& ticket,
                                                       const LabelledSpans& reported) const {
  VersionSpans spans;
  for (const LabelledSpan& span : reported) {
    // Every label must be one the engine held while the request ran, in
    // the order the sidecar made them.
    if (absl::Status held = gate_.CheckEngineLabel(ticket, span.label); !held.ok()) return held;
    const int64_t version = ParseEngineLabel(span.label)->version;
    if (!spans.empty() && version <= spans.back().version) {
      return absl::FailedPreconditionError(
          absl::StrCat("the engine's spans name version ", version, " after ", spans.back().version,
                       " within one generation, which the sidecar never did"));
    }
    spans.push_back({span.offset, version});
  }
  return spans;
}

awaitable<void> VersionedProxy::Handle(HttpExchange& exchange) {
  return DispatchApiRequest(exchange, handlers_);
}

void VersionedProxy::AbortUpstream(Call& call) {
  if (call.rids.empty()) return;
  boost::asio::co_spawn(loop_, engine_.Abort(call.rids), boost::asio::detached);
}

awaitable<void> VersionedProxy::EngineUnavailable(HttpExchange& exchange, Call* call,
                                                  std::string_view why) {
  if (call != nullptr) {
    AbortUpstream(*call);
    call->ticket.reset();
  }
  if (on_unreachable_) on_unreachable_(why);
  ++counters_.engine_unavailable;
  HttpResponse response = UnavailableResponse(
      Unavailable::kEngine, absl::StrCat("the engine behind this replica is unavailable (",
                                         AbslView(why), "); retry, possibly on another replica"));
  (void)co_await exchange.Respond(std::move(response));
}

awaitable<void> VersionedProxy::Unvouched(HttpExchange& exchange, Call& call,
                                          std::string_view why) {
  call.ticket.reset();
  ++counters_.unvouched;
  HttpResponse response = UnavailableResponse(
      Unavailable::kEngine, absl::StrCat("this response cannot be labelled with a version: ",
                                         AbslView(why), "; retry, possibly on another replica"));
  (void)co_await exchange.Respond(std::move(response));
}

awaitable<void> VersionedProxy::BadRequest(HttpExchange& exchange, std::string message) {
  ++counters_.bad_requests;
  HttpResponse response = BadRequestResponse(message);
  (void)co_await exchange.Respond(std::move(response));
}

awaitable<void> VersionedProxy::HandleVersioned(HttpExchange& exchange, ApiRoute route) {
  ++counters_.versioned_requests;
  // (Messages are built before co_await: GCC 12 mishandles temporaries of
  // conditional expressions inside co_await expressions.)
  JsonArena arena;
  json::value parsed(arena.storage());
  absl::StatusOr<VersionedAsk> ask = ParseVersionedBody(exchange.request().body, parsed);
  if (!ask.ok()) {
    std::string message(ask.status().message());
    co_await BadRequest(exchange, std::move(message));
    co_return;
  }
  json::object& body = parsed.get_object();
  const VersionConstraint constraint = ask->constraint;
  StripConstraint(body);

  Call call;
  call.route = route;
  absl::StatusOr<EngineRids> rids = AssignEngineRids(route, body, NextRid(), options_.rid_field);
  if (!rids.ok()) {
    std::string message(rids.status().message());
    co_await BadRequest(exchange, std::move(message));
    co_return;
  }
  call.rids = std::move(rids->engine);
  call.client_rids = std::move(rids->client);

  // Admission: decided at once unless a commit holds it closed.
  std::optional<absl::StatusOr<AdmissionGate::Ticket>> admitted = gate_.TryAdmit(constraint);
  if (!admitted.has_value()) {
    admitted.emplace(co_await exchange.CancelOnDisconnect(gate_.Admit(constraint)));
  }
  if (!admitted->ok()) {
    const absl::Status& s = admitted->status();
    if (GetErrorKind(s) == ErrorKind::kVersionNotReady) {
      // Nothing is named as served while the engine's weights are not
      // vouched for: not verified, or the engine silent (held), when what
      // it holds by the time it answers again is not known.
      const bool vouched = gate_.trusted() && !gate_.held();
      HttpResponse response = NotReadyResponse(
          constraint, vouched ? gate_.known_serving() : std::nullopt, std::string(s.message()),
          vouched ? gate_.Unmet(constraint) : std::nullopt);
      (void)co_await exchange.Respond(std::move(response));
    } else if (absl::IsCancelled(s) || exchange.disconnected()) {
      ++counters_.client_disconnects;
    } else {
      HttpResponse response = UnavailableResponse(Unavailable::kReplica, std::string(s.message()));
      (void)co_await exchange.Respond(std::move(response));
    }
    co_return;
  }
  call.ticket.emplace(**std::move(admitted));
  call.deriver.emplace(call.ticket->start_label().version);
  const InFlight registered(in_flight_, &call);

  TagRequest(route, body, call.ticket->start());
  HttpRequest& up = call.upstream;
  up.method = "POST";
  up.target = exchange.request().target;
  up.headers = RequestHeadersToForward(exchange.request().headers, BodyRelay::kRewritten);
  PresentEngineToken(up.headers);
  up.headers.Set("Content-Type", "application/json");
  // A whole /generate is streamed from the engine, so that its spans can be
  // derived per event, while that is asked for and can help.
  const bool assemble = !ask->stream && route == ApiRoute::kGenerate &&
                        options_.assemble_whole_generate && !engine_reports_spans_ &&
                        !assembly_failed_ && IsSingleGeneration(body);
  if (assemble) body["stream"] = true;
  up.body = json::serialize(parsed);

  if (ask->stream) {
    ++counters_.streamed;
    co_await RelayStream(exchange, call);
  } else if (assemble) {
    co_await RelayAssembled(exchange, call);
  } else {
    co_await Relay(exchange, call);
  }
}

awaitable<void> VersionedProxy::Relay(HttpExchange& exchange, Call& call) {
  auto response = co_await client_.Send(options_.engine, std::move(call.upstream),
                                        EndedWithTheClient(exchange));
  if (!response.ok()) {
    co_await CallFailed(exchange, call, response.status());
    co_return;
  }
  HttpResponse out{response->status,
                   ResponseHeadersToRelay(std::move(response->headers), BodyRelay::kRewritten),
                   std::move(response->body)};
  if (out.status == 200) {
    std::string why;
    switch (Vouch(call, out.body, &why)) {
      case Verdict::kStamped:
        out.headers.Set("Content-Type", "application/json");
        break;
      case Verdict::kNotJson:
        break;
      case Verdict::kUnvouched:
        co_await Unvouched(exchange, call, why);
        co_return;
    }
  }
  // The generation is over: a slow client reading the answer must not hold
  // up a commit.
  call.ticket.reset();
  ++counters_.completed;
  (void)co_await exchange.Respond(std::move(out));
}

awaitable<void> VersionedProxy::RelayStream(HttpExchange& exchange, Call& call) {
  std::optional<HttpResponseStream> stream = co_await OpenEventStream(exchange, call);
  if (!stream.has_value()) co_return;

  if (absl::Status begun = co_await exchange.BeginStream(
          200, ResponseHeadersToRelay(stream->headers(), BodyRelay::kRewritten));
      !begun.ok()) {
    AbortUpstream(call);
    ++counters_.client_disconnects;
    co_return;
  }
  SseEventSplitter splitter;
  for (;;) {
    auto chunk = co_await stream->Read();
    if (!chunk.ok()) {
      AbortUpstream(call);
      if (exchange.disconnected()) {
        ++counters_.client_disconnects;
        co_return;
      }
      // The engine cut the stream: say so in-band, then end the connection
      // without a proper end of body, so that the client sees the stream as
      // incomplete.
      ++counters_.engine_unavailable;
      std::string event =
          UnavailableEvent(Unavailable::kEngine,
                           absl::StrCat("the engine stream broke: ", chunk.status().message()));
      (void)co_await exchange.WriteChunk(std::move(event));
      co_return;
    }
    if (chunk->empty()) break;
    splitter.Append(*chunk);
    std::string out;
    std::string why;
    while (std::optional<std::string> event = splitter.Next()) {
      std::optional<std::string> data = SseData(*event);
      if (!data.has_value() || *data == "[DONE]") {
        absl::StrAppend(&out, *event, "\n");
        continue;
      }
      const Verdict verdict = Vouch(call, *data, &why);
      if (verdict == Verdict::kUnvouched) break;
      out += verdict == Verdict::kStamped ? WithData(*event, *data) : absl::StrCat(*event, "\n");
    }
    if (!why.empty()) {
      // What was sent so far was vouched for; the rest cannot be. Say so
      // in-band and end the stream without a proper end of body.
      AbortUpstream(call);
      call.ticket.reset();
      ++counters_.unvouched;
      absl::StrAppend(&out,
                      UnavailableEvent(Unavailable::kEngine,
                                       absl::StrCat("the rest of this stream cannot be "
                                                    "labelled with a version: ",
                                                    why, "; retry, possibly on another replica")));
      (void)co_await exchange.WriteChunk(std::move(out));
      co_return;
    }
    if (out.empty()) continue;
    if (absl::Status written = co_await exchange.WriteChunk(std::move(out)); !written.ok()) {
      AbortUpstream(call);
      ++counters_.client_disconnects;
      co_return;
    }
  }
  if (!splitter.pending().empty()) {
    std::string rest(splitter.pending());
    (void)co_await exchange.WriteChunk(std::move(rest));
  }
  ++counters_.completed;
  (void)co_await exchange.EndStream();
}

awaitable<void> VersionedProxy::CallFailed(HttpExchange& exchange, Call& call,
                                           const absl::Status& why) {
  if (exchange.disconnected()) {
    AbortUpstream(call);
    ++counters_.client_disconnects;
    co_return;
  }
  std::string message(why.message());
  co_await EngineUnavailable(exchange, &call, message);
}

awaitable<std::optional<HttpResponseStream>> VersionedProxy::OpenEventStream(HttpExchange& exchange,
                                                                             Call& call) {
  auto stream = co_await client_.SendStreamed(options_.engine, std::move(call.upstream),
                                              EndedWithTheClient(exchange));
  if (!stream.ok()) {
    co_await CallFailed(exchange, call, stream.status());
    co_return std::nullopt;
  }
  if (stream->status() != 200 || !IsEventStream(stream->headers())) {
    co_await RelayWhole(exchange, call, *stream);
    co_return std::nullopt;
  }
  co_return *std::move(stream);
}

awaitable<void> VersionedProxy::RelayWhole(HttpExchange& exchange, Call& call,
                                           HttpResponseStream& stream) {
  auto body = co_await stream.ReadAll();
  if (!body.ok()) {
    co_await CallFailed(exchange, call, body.status());
    co_return;
  }
  HttpResponse out{stream.status(), ResponseHeadersToRelay(stream.headers(), BodyRelay::kRewritten),
                   *std::move(body)};
  std::string why;
  if (out.status == 200 && Vouch(call, out.body, &why) == Verdict::kUnvouched) {
    co_await Unvouched(exchange, call, why);
    co_return;
  }
  call.ticket.reset();
  ++counters_.completed;
  (void)co_await exchange.Respond(std::move(out));
}

awaitable<void> VersionedProxy::NotAssembled(HttpExchange& exchange, Call& call,
                                             std::string_view why) {
  assembly_failed_ = true;
  AbortUpstream(call);
  call.ticket.reset();
  ++counters_.engine_unavailable;
  HttpResponse response = UnavailableResponse(
      Unavailable::kEngine,
      absl::StrCat("the engine's stream of this /generate could not be assembled into a whole "
                   "answer (",
                   AbslView(why), "); later whole /generate requests are sent to it whole; retry"));
  (void)co_await exchange.Respond(std::move(response));
}

// Long on purpose: reading the engine's event stream and judging and
// assembling each event share one state (the assembler, why the answer
// cannot be vouched for or placed, an error event) from the first event to
// the answer.
awaitable<void> VersionedProxy::RelayAssembled(HttpExchange& exchange, Call& call) {
  std::optional<HttpResponseStream> stream = co_await OpenEventStream(exchange, call);
  if (!stream.has_value()) co_return;
  GenerateAssembler assembler;
  SseEventSplitter splitter;
  std::string unvouched;   // why the answer cannot be vouched for
  std::string not_placed;  // why the stream cannot be assembled
  std::optional<std::string> error_event;
  // One event's data; false once the stream is settled either way.
  auto take = [&](std::string_view data) {
    if (data == "[DONE]") return true;
    // Parsed where the assembler keeps it: the event moves in, uncopied.
    boost::system::error_code ec;
    json::value doc = json::parse(data, ec);
    if (ec || !doc.is_object()) {
      not_placed = absl::StrCat("event ", assembler.events() + 1, " is not a JSON object");
      return false;
    }
    if (doc.get_object().contains("error") && !doc.get_object().contains("output_ids")) {
      error_event = std::string(data);
      return false;
    }
    if (Judge(call, doc, nullptr, &unvouched) == Verdict::kUnvouched) return false;
    if (absl::Status added = assembler.Add(std::move(doc.get_object())); !added.ok()) {
      not_placed = std::string(added.message());
      return false;
    }
    return true;
  };
  bool open = true;
  while (open) {
    auto chunk = co_await stream->Read();
    if (!chunk.ok()) {
      co_await CallFailed(exchange, call,
                          absl::UnavailableError(
                              absl::StrCat("the engine stream broke: ", chunk.status().message())));
      co_return;
    }
    if (chunk->empty()) {
      // A final event the engine ended without a blank line counts too.
      if (std::optional<std::string> data = SseData(splitter.pending())) open = take(*data);
      break;
    }
    splitter.Append(*chunk);
    while (open) {
      std::optional<std::string> event = splitter.Next();
      if (!event.has_value()) break;
      if (std::optional<std::string> data = SseData(*event)) open = take(*data);
    }
  }
  if (!unvouched.empty()) {
    AbortUpstream(call);
    co_await Unvouched(exchange, call, unvouched);
    co_return;
  }
  if (!not_placed.empty()) {
    co_await NotAssembled(exchange, call, not_placed);
    co_return;
  }
  if (error_event.has_value()) {
    // What SGLang answers a whole request that fails so.
    AbortUpstream(call);
    call.ticket.reset();
    ++counters_.completed;
    HttpResponse out = JsonResponse(400, *std::move(error_event));
    (void)co_await exchange.Respond(std::move(out));
    co_return;
  }
  absl::StatusOr<json::object> answer = std::move(assembler).Finish();
  if (!answer.ok()) {
    std::string why(answer.status().message());
    co_await NotAssembled(exchange, call, why);
    co_return;
  }
  json::value doc(*std::move(answer));
  std::string why;
  if (VouchDocument(call, doc, &why) == Verdict::kUnvouched) {
    co_await Unvouched(exchange, call, why);
    co_return;
  }
  // The generation is over: a slow client reading the answer must not hold
  // up a commit.
  call.ticket.reset();
  ++counters_.completed;
  ++counters_.assembled;
  HttpResponse out = JsonResponse(200, json::serialize(doc));
  (void)co_await exchange.Respond(std::move(out));
}

void VersionedProxy::PresentEngineToken(HttpHeaders& headers) const {
  // A client's Authorization was for the sidecar (when it checks one) and
  // never reaches the engine; the engine gets its own token, if any.
  if (options_.own_authorization || !options_.engine_token.empty()) {
    headers.Remove("authorization");
  }
  if (!options_.engine_token.empty()) {
    headers.Set("Authorization", BearerValue(options_.engine_token));
  }
}

awaitable<void> VersionedProxy::Forward(HttpExchange& exchange) {
  ++counters_.forwarded;
  // Held while a commit holds admission closed and drained by the commits
  // that drain everything, as the original sidecar does.
  absl::StatusOr<AdmissionGate::Ticket> admitted =
      co_await exchange.CancelOnDisconnect(gate_.AdmitUnversioned());
  if (!admitted.ok()) {
    if (absl::IsCancelled(admitted.status()) || exchange.disconnected()) co_return;
    HttpResponse response =
        UnavailableResponse(Unavailable::kReplica, std::string(admitted.status().message()));
    (void)co_await exchange.Respond(std::move(response));
    co_return;
  }
  std::optional<AdmissionGate::Ticket> ticket(*std::move(admitted));
  HttpRequest up;
  up.method = exchange.request().method;
  up.target = exchange.request().target;
  up.headers = RequestHeadersToForward(exchange.request().headers, BodyRelay::kRewritten);
  PresentEngineToken(up.headers);
  if (std::optional<std::string_view> type = exchange.request().headers.Get("content-type")) {
    up.headers.Set("Content-Type", *type);
  }
  up.body = std::move(exchange.request().body);
  auto response =
      co_await client_.Send(options_.engine, std::move(up), EndedWithTheClient(exchange));
  ticket.reset();  // the engine has answered; a slow reader holds up no commit
  if (!response.ok()) {
    if (exchange.disconnected()) co_return;
    std::string why(response.status().message());
    co_await EngineUnavailable(exchange, nullptr, why);
    co_return;
  }
  HttpResponse out{response->status,
                   ResponseHeadersToRelay(std::move(response->headers), BodyRelay::kRewritten),
                   std::move(response->body)};
  if (out.status == 200) engine_.RestoreForwarded(TargetPath(exchange.request().target), out.body);
  (void)co_await exchange.Respond(std::move(out));
}

awaitable<std::optional<std::string>> VersionedProxy::EngineMetrics(
    std::chrono::milliseconds timeout) {
  HttpRequest request;
  request.target = "/metrics";
  PresentEngineToken(request.headers);
  CallOptions call;
  call.timeout = timeout;
  auto response = co_await client_.Send(options_.engine, std::move(request), call);
  if (!response.ok() || response->status != 200) co_return std::nullopt;
  co_return std::move(response->body);
}

}  // namespace stitch
