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

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stitch/core/errors.h"
#include "stitch/core/json.h"
#include "stitch/net/auth.h"
#include "stitch/net/sse.h"

namespace stitch {

namespace json = boost::json;
using boost::asio::awaitable;

namespace {

constexpr std::string_view kBlockedRoutes[] = {
    "/abort_request",
    "/continue_generation",
    "/flush_cache",
    "/init_weights_update_group",
    "/load_lora_adapter",
    "/pause_generation",
    "/release_memory_occupation",
    "/resume_memory_occupation",
    "/set_internal_state",
    "/stage_weight_update",
    "/start_profile",
    "/stop_profile",
    "/unload_lora_adapter",
    "/update_weight_version",
    "/update_weights_from_cpu",
    "/update_weights_from_disk",
    "/update_weights_from_distributed",
    "/update_weights_from_ipc",
    "/update_weights_from_tensor",
};

// Request headers that must not reach the engine: the library owns framing,
// the engine's Host is not the client's, and a compressed answer could not
// be stamped.
bool DropRequestHeader(std::string_view name) {
  return IsFramingHeader(name) || absl::EqualsIgnoreCase(AbslView(name), "host") ||
         absl::EqualsIgnoreCase(AbslView(name), "accept-encoding") ||
         absl::EqualsIgnoreCase(AbslView(name), "content-type") ||
         absl::EqualsIgnoreCase(AbslView(name), "expect");
}

bool DropResponseHeader(std::string_view name) {
  return IsFramingHeader(name) || absl::EqualsIgnoreCase(AbslView(name), "content-length") ||
         absl::EqualsIgnoreCase(AbslView(name), "content-encoding");
}

// Whether a /generate body asks for a batch (a list of prompts).
size_t BatchSize(const json::object& body) {
  if (const json::value* text = body.if_contains("text"); text != nullptr && text->is_array()) {
    return text->get_array().size();
  }
  if (const json::value* ids = body.if_contains("input_ids"); ids != nullptr && ids->is_array()) {
    const json::array& a = ids->get_array();
    if (!a.empty() && a.front().is_array()) return a.size();
  }
  return 0;
}

// Gives a response object the client's own request id back: `meta_info.id`
// (/generate) or the OpenAI `id` ("cmpl-<rid>", "chatcmpl-<rid>"), when it
// names the id the engine was given.
void RestoreRid(ApiRoute route, json::object& item, const std::string& upstream,
                const std::string& client) {
  if (route == ApiRoute::kGenerate) {
    json::value* meta = item.if_contains("meta_info");
    if (meta == nullptr || !meta->is_object()) return;
    json::value* id = meta->get_object().if_contains("id");
    if (id != nullptr && id->is_string() && id->get_string() == upstream) *id = client;
    return;
  }
  json::value* id = item.if_contains("id");
  if (id == nullptr || !id->is_string()) return;
  std::string_view text(id->get_string().data(), id->get_string().size());
  if (!text.ends_with(upstream)) return;
  *id = absl::StrCat(AbslView(text.substr(0, text.size() - upstream.size())), client);
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

size_t Digits(size_t n) {
  size_t digits = 1;
  while (n >= 10) {
    n /= 10;
    ++digits;
  }
  return digits;
}

}  // namespace

RouteClass ClassifyRoute(std::string_view path, ApiRoute* route) {
  if (path == "/generate") {
    *route = ApiRoute::kGenerate;
    return RouteClass::kVersioned;
  }
  if (path == "/v1/completions") {
    *route = ApiRoute::kCompletions;
    return RouteClass::kVersioned;
  }
  if (path == "/v1/chat/completions") {
    *route = ApiRoute::kChatCompletions;
    return RouteClass::kVersioned;
  }
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  for (std::string_view blocked : kBlockedRoutes) {
    if (path == blocked) return RouteClass::kBlocked;
  }
  return RouteClass::kOther;
}

absl::StatusOr<VersionedAsk> ParseVersionedBody(std::string_view body, json::value& doc) {
  boost::system::error_code ec;
  doc = json::parse(body, ec, doc.storage());
  if (ec || !doc.is_object()) {
    std::string message = "the request body must be a JSON object";
    if (ec) absl::StrAppend(&message, " (", ec.message(), ")");
    return absl::InvalidArgumentError(message);
  }
  const json::object& o = doc.get_object();
  VersionedAsk ask;
  if (const json::value* wv = o.if_contains("weight_version"); wv != nullptr) {
    auto c = ConstraintFromJsonValue(*wv);
    if (!c.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("weight_version: ", c.status().message()));
    }
    ask.constraint = *c;
  }
  const json::value* stream = o.if_contains("stream");
  ask.stream = stream != nullptr && stream->is_bool() && stream->get_bool();
  return ask;
}

std::string NotReadyBody(const VersionConstraint& constraint,
                         const std::optional<VersionRef>& applied, std::string_view message) {
  json::object conflict;
  conflict["type"] = "WeightVersionNotReady";
  if (std::optional<int64_t> t = constraint.target(); t.has_value()) {
    conflict["target_version"] = *t;
  } else {
    conflict["target_version"] = nullptr;
  }
  if (applied.has_value()) {
    conflict["applied"] = applied->ToString();
    conflict["applied_version"] = applied->version;
  } else {
    conflict["applied"] = nullptr;
    conflict["applied_version"] = nullptr;
  }
  conflict["message"] = message;
  return json::serialize(conflict);
}

HttpResponse RouteBlockedResponse(std::string_view path, std::string_view why) {
  return JsonResponse(
      403,
      JsonErrorBody("RouteBlocked",
                    absl::StrCat(AbslView(path), " is an engine control route: ", AbslView(why))));
}

struct VersionedProxy::Call {
  ApiRoute route = ApiRoute::kGenerate;
  std::optional<AdmissionGate::Ticket> ticket;
  // The ids the engine was given, and the client's own (empty when the
  // client gave none), per prompt.
  std::vector<std::string> rids;
  std::vector<std::string> client_rids;
  HttpRequest upstream;
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
  const VersionStamp stamp = call.ticket->Stamp();
  ForEachItem(doc, [&](json::object& item, size_t i) {
    if (i < call.client_rids.size() && !call.client_rids[i].empty()) {
      RestoreRid(call.route, item, call.rids[i], call.client_rids[i]);
    }
    engine_.StampResponse(call.route, item, stamp);
  });
  text = json::serialize(doc);
  return Verdict::kStamped;
}

awaitable<void> VersionedProxy::Handle(HttpExchange& exchange) {
  ApiRoute route;
  switch (ClassifyRoute(TargetPath(exchange.request().target), &route)) {
    case RouteClass::kVersioned:
      if (exchange.request().method == "POST") {
        co_await HandleVersioned(exchange, route);
        co_return;
      }
      break;
    case RouteClass::kBlocked: {
      ++counters_.route_blocked;
      HttpResponse response =
          RouteBlockedResponse(TargetPath(exchange.request().target),
                               "the sidecar alone drives the engine, so it is not forwarded");
      (void)co_await exchange.Respond(std::move(response));
      co_return;
    }
    case RouteClass::kOther:
      break;
  }
  co_await Forward(exchange);
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
  HttpResponse response = JsonResponse(
      503, JsonErrorBody("EngineUnavailable",
                         absl::StrCat("the engine behind this replica is unavailable (",
                                      AbslView(why), "); retry, possibly on another replica"),
                         true));
  response.headers.Set("Retry-After", "1");
  (void)co_await exchange.Respond(std::move(response));
}

awaitable<void> VersionedProxy::Unvouched(HttpExchange& exchange, Call& call,
                                          std::string_view why) {
  call.ticket.reset();
  ++counters_.unvouched;
  HttpResponse response = JsonResponse(
      503, JsonErrorBody("EngineUnavailable",
                         absl::StrCat("this response cannot be labelled with a version: ",
                                      AbslView(why), "; retry, possibly on another replica"),
                         true));
  response.headers.Set("Retry-After", "1");
  (void)co_await exchange.Respond(std::move(response));
}

awaitable<void> VersionedProxy::BadRequest(HttpExchange& exchange, std::string message) {
  ++counters_.bad_requests;
  HttpResponse response = JsonResponse(400, JsonErrorBody("BadRequest", message));
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
  body.erase("weight_version");

  Call call;
  call.route = route;
  const size_t batch = route == ApiRoute::kGenerate ? BatchSize(body) : 0;
  const json::value* given = body.if_contains("rid");
  if (given != nullptr && given->is_null()) given = nullptr;
  if (batch > 0) {
    if (given != nullptr) {
      if (!given->is_array() || given->get_array().size() != batch) {
        std::string message =
            absl::StrCat("rid must be a list of ", batch, " strings, one per prompt of the batch");
        co_await BadRequest(exchange, std::move(message));
        co_return;
      }
      for (const json::value& r : given->get_array()) {
        if (!r.is_string()) {
          std::string message = "rid must be a list of strings, one per prompt of the batch";
          co_await BadRequest(exchange, std::move(message));
          co_return;
        }
        call.client_rids.emplace_back(r.get_string().data(), r.get_string().size());
      }
    } else {
      call.client_rids.resize(batch);
    }
    const std::string base = NextRid();
    const size_t width = Digits(batch - 1);
    json::array rids(body.storage());
    for (size_t i = 0; i < batch; ++i) {
      std::string index = std::to_string(i);
      std::string rid = absl::StrCat(base, "-", std::string(width - index.size(), '0'), index);
      if (!call.client_rids[i].empty()) absl::StrAppend(&rid, "-", call.client_rids[i]);
      rids.emplace_back(rid);
      call.rids.push_back(std::move(rid));
    }
    body["rid"] = std::move(rids);
  } else {
    if (given != nullptr && !given->is_string()) {
      std::string message = "rid must be a string";
      co_await BadRequest(exchange, std::move(message));
      co_return;
    }
    std::string client = given != nullptr
                             ? std::string(given->get_string().data(), given->get_string().size())
                             : std::string();
    std::string rid = NextRid();
    if (!client.empty()) absl::StrAppend(&rid, "-", client);
    body["rid"] = rid;
    call.rids.push_back(std::move(rid));
    call.client_rids.push_back(std::move(client));
  }

  // Admission: decided at once unless a commit holds it closed.
  std::optional<absl::StatusOr<AdmissionGate::Ticket>> admitted = gate_.TryAdmit(constraint);
  if (!admitted.has_value()) {
    admitted.emplace(co_await exchange.CancelOnDisconnect(gate_.Admit(constraint)));
  }
  if (!admitted->ok()) {
    const absl::Status& s = admitted->status();
    if (GetErrorKind(s) == ErrorKind::kVersionNotReady) {
      HttpResponse response =
          JsonResponse(409, NotReadyBody(constraint, gate_.serving(), std::string(s.message())));
      (void)co_await exchange.Respond(std::move(response));
    } else if (absl::IsCancelled(s) || exchange.disconnected()) {
      ++counters_.client_disconnects;
    } else {
      HttpResponse response =
          JsonResponse(503, JsonErrorBody("ReplicaUnavailable", std::string(s.message()), true));
      response.headers.Set("Retry-After", "1");
      (void)co_await exchange.Respond(std::move(response));
    }
    co_return;
  }
  call.ticket.emplace(**std::move(admitted));
  const InFlight registered(in_flight_, &call);

  engine_.TagRequest(route, body, call.ticket->start());
  HttpRequest& up = call.upstream;
  up.method = "POST";
  up.target = exchange.request().target;
  up.headers = CopyHeaders(exchange.request().headers, &DropRequestHeader);
  PresentEngineToken(up.headers);
  up.headers.Set("Content-Type", "application/json");
  up.body = json::serialize(parsed);

  if (ask->stream) {
    ++counters_.streamed;
    co_await RelayStream(exchange, call);
  } else {
    co_await Relay(exchange, call);
  }
}

awaitable<void> VersionedProxy::Relay(HttpExchange& exchange, Call& call) {
  auto response = co_await client_.Send(options_.engine, std::move(call.upstream),
                                        EndedWithTheClient(exchange));
  if (!response.ok()) {
    if (exchange.disconnected()) {
      AbortUpstream(call);
      ++counters_.client_disconnects;
      co_return;
    }
    std::string why(response.status().message());
    co_await EngineUnavailable(exchange, &call, why);
    co_return;
  }
  HttpResponse out{response->status, CopyHeaders(std::move(response->headers), &DropResponseHeader),
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
  auto stream = co_await client_.SendStreamed(options_.engine, std::move(call.upstream),
                                              EndedWithTheClient(exchange));
  if (!stream.ok()) {
    if (exchange.disconnected()) {
      AbortUpstream(call);
      ++counters_.client_disconnects;
      co_return;
    }
    std::string why(stream.status().message());
    co_await EngineUnavailable(exchange, &call, why);
    co_return;
  }
  const std::optional<std::string_view> type = stream->headers().Get("content-type");
  const bool events = type.has_value() && type->find("text/event-stream") != std::string_view::npos;
  if (stream->status() != 200 || !events) {
    // An error answer (or a server that ignored `stream`): relay it whole.
    auto body = co_await stream->ReadAll();
    if (!body.ok()) {
      if (exchange.disconnected()) {
        AbortUpstream(call);
        ++counters_.client_disconnects;
        co_return;
      }
      std::string why(body.status().message());
      co_await EngineUnavailable(exchange, &call, why);
      co_return;
    }
    HttpResponse out{stream->status(), CopyHeaders(stream->headers(), &DropResponseHeader),
                     *std::move(body)};
    std::string why;
    if (out.status == 200 && Vouch(call, out.body, &why) == Verdict::kUnvouched) {
      co_await Unvouched(exchange, call, why);
      co_return;
    }
    call.ticket.reset();
    ++counters_.completed;
    (void)co_await exchange.Respond(std::move(out));
    co_return;
  }

  if (absl::Status begun =
          co_await exchange.BeginStream(200, CopyHeaders(stream->headers(), &DropResponseHeader));
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
      std::string event = SseEvent(
          JsonErrorBody("EngineUnavailable",
                        absl::StrCat("the engine stream broke: ", chunk.status().message()), true));
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
      absl::StrAppend(&out, SseEvent(JsonErrorBody(
                                "EngineUnavailable",
                                absl::StrCat("the rest of this stream cannot be labelled with a "
                                             "version: ",
                                             why, "; retry, possibly on another replica"),
                                true)));
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
  HttpRequest up;
  up.method = exchange.request().method;
  up.target = exchange.request().target;
  up.headers = CopyHeaders(exchange.request().headers, &DropRequestHeader);
  PresentEngineToken(up.headers);
  if (std::optional<std::string_view> type = exchange.request().headers.Get("content-type")) {
    up.headers.Set("Content-Type", *type);
  }
  up.body = std::move(exchange.request().body);
  auto response =
      co_await client_.Send(options_.engine, std::move(up), EndedWithTheClient(exchange));
  if (!response.ok()) {
    if (exchange.disconnected()) co_return;
    std::string why(response.status().message());
    co_await EngineUnavailable(exchange, nullptr, why);
    co_return;
  }
  HttpResponse out{response->status, CopyHeaders(std::move(response->headers), &DropResponseHeader),
                   std::move(response->body)};
  (void)co_await exchange.Respond(std::move(out));
}

}  // namespace stitch
