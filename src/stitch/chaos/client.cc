#include "stitch/chaos/client.h"

#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "stitch/api/response.h"
#include "stitch/api/routes.h"
#include "stitch/chaos/schedule.h"
#include "stitch/net/client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/http.h"
#include "stitch/net/sse.h"
#include "stitch/net/worker_pool.h"

namespace stitch {
namespace {

namespace json = boost::json;
using boost::asio::awaitable;

constexpr size_t kErrorExcerpt = 240;
// The lengths of answers asked for.
constexpr int64_t kShortAnswer = 10;
constexpr int64_t kLongAnswer = 160;

// The request mix of a lane is the same on every machine.
using Rng = SplitMix64;

std::optional<int64_t> IntField(const json::object& o, std::string_view name) {
  const json::value* v = o.if_contains(json::string_view(name.data(), name.size()));
  if (v == nullptr) return std::nullopt;
  if (v->is_int64()) return v->get_int64();
  if (v->is_uint64()) return static_cast<int64_t>(v->get_uint64());
  return std::nullopt;
}

std::string Excerpt(std::string_view text) { return std::string(text.substr(0, kErrorExcerpt)); }

// One answer (a whole body or one streamed event), read.
struct Piece {
  std::optional<int64_t> start;
  std::optional<int64_t> end;
  std::vector<int32_t> tokens;  // generate: output_ids (cumulative when streamed)
  std::string text;             // completions: the text (a delta when streamed)
  std::string error;            // an error event's message
  std::string spans;            // weight_version_spans: its JSON, or "unknown"; empty: none
};

// Parses one answer of `route`; an error event (a "type" and no stamps) has
// `error` set. InvalidArgument when it is not what the route answers.
absl::StatusOr<Piece> ReadPiece(const std::string& route, std::string_view data) {
  boost::system::error_code ec;
  json::value doc = json::parse(json::string_view(data.data(), data.size()), ec);
  if (ec || !doc.is_object()) return absl::InvalidArgumentError("not a JSON object");
  const json::object& o = doc.get_object();
  Piece piece;
  const json::object* stamps = &o;
  if (route == "generate") {
    const json::value* meta = o.if_contains("meta_info");
    if (meta != nullptr && meta->is_object()) stamps = &meta->get_object();
    if (const json::value* ids = o.if_contains("output_ids"); ids != nullptr && ids->is_array()) {
      for (const json::value& id : ids->get_array()) {
        if (!id.is_int64()) return absl::InvalidArgumentError("output_ids holds a non-integer");
        piece.tokens.push_back(static_cast<int32_t>(id.get_int64()));
      }
    }
  } else if (const json::value* choices = o.if_contains("choices");
             choices != nullptr && choices->is_array() && !choices->get_array().empty()) {
    const json::value& first = choices->get_array()[0];
    if (first.is_object()) {
      if (const json::value* t = first.get_object().if_contains("text");
          t != nullptr && t->is_string()) {
        piece.text = std::string(t->get_string());
      }
      // vLLM's return_token_ids: each event's own tokens.
      if (const json::value* ids = first.get_object().if_contains("token_ids");
          ids != nullptr && ids->is_array()) {
        for (const json::value& id : ids->get_array()) {
          if (!id.is_int64()) return absl::InvalidArgumentError("token_ids holds a non-integer");
          piece.tokens.push_back(static_cast<int32_t>(id.get_int64()));
        }
      }
    }
  }
  if (const json::value* spans = stamps->if_contains("weight_version_spans"); spans != nullptr) {
    piece.spans = spans->is_string() ? std::string(spans->get_string()) : json::serialize(*spans);
  }
  piece.start = IntField(*stamps, "weight_version_start");
  piece.end = IntField(*stamps, "weight_version_end");
  // Errors come flat (a 409's {"type", ...}) or nested ({"error": {"type",
  // ...}}, what the sidecar sends when the engine's stream breaks).
  const json::object* err = &o;
  if (const json::value* nested = o.if_contains("error");
      nested != nullptr && nested->is_object()) {
    err = &nested->get_object();
  }
  if (!piece.start.has_value() && err->contains("type")) {
    const json::value* m = err->if_contains("message");
    piece.error = absl::StrCat(
        std::string(err->at("type").is_string() ? err->at("type").get_string() : "error"), ": ",
        m != nullptr && m->is_string() ? std::string(m->get_string()) : std::string());
  }
  return piece;
}

}  // namespace

absl::StatusOr<VersionSpans> ParseSpans(std::string_view text, int64_t start, int64_t end) {
  boost::system::error_code ec;
  json::value doc = json::parse(json::string_view(text.data(), text.size()), ec);
  if (ec) return absl::InvalidArgumentError("not JSON");
  // Read as the sidecar reads an engine's: pairs, offsets rising from 0.
  json::object answer;
  answer["weight_version_spans"] = std::move(doc);
  absl::StatusOr<std::optional<VersionSpans>> read = ReportedSpans(ApiRoute::kCompletions, answer);
  if (!read.ok()) return read.status();
  if (!read->has_value()) return absl::InvalidArgumentError("not a list of [offset, version]");
  const VersionSpans& spans = **read;
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].version < start || spans[i].version > end) {
      return absl::InvalidArgumentError(
          absl::StrCat("v", spans[i].version, " is outside the stamps [", start, ", ", end, "]"));
    }
    if (i > 0 && spans[i].version <= spans[i - 1].version) {
      return absl::InvalidArgumentError("offsets and versions must both rise");
    }
  }
  return spans;
}

void ReadReply(const Reply& reply, RequestRecord& record) {
  record.status = reply.status;
  record.events = static_cast<int>(reply.events.size());
  auto fail = [&](Outcome outcome, std::string why) {
    record.outcome = outcome;
    record.error = std::move(why);
  };
  if (reply.left) return fail(Outcome::kClientLeft, "the client left on purpose");
  if (reply.status == 0) {
    if (reply.timed_out) return fail(Outcome::kFailed, absl::StrCat("no answer: ", reply.error));
    return fail(Outcome::kRetryable, reply.error);
  }
  if (reply.status == 409 || reply.status == 429 || reply.status == 503) {
    return fail(Outcome::kRetryable, Excerpt(reply.event_stream ? std::string() : reply.body));
  }
  if (reply.status != 200) {
    return fail(Outcome::kFailed, absl::StrCat("HTTP ", reply.status, ": ", Excerpt(reply.body)));
  }
  if (!reply.stream || !reply.event_stream) {
    if (reply.stream) return fail(Outcome::kFailed, "a stream was answered without events");
    if (!reply.error.empty()) return fail(Outcome::kRetryable, reply.error);
    auto piece = ReadPiece(record.route, reply.body);
    if (!piece.ok()) {
      return fail(Outcome::kFailed, absl::StrCat("200 with a bad body (", piece.status().message(),
                                                 "): ", Excerpt(reply.body)));
    }
    if (!piece->start.has_value() || !piece->end.has_value()) {
      return fail(Outcome::kFailed,
                  absl::StrCat("200 without weight_version_start/end: ", Excerpt(reply.body)));
    }
    record.start = piece->start;
    record.end = piece->end;
    record.tokens = std::move(piece->tokens);
    record.text = std::move(piece->text);
    record.spans = std::move(piece->spans);
    record.outcome = Outcome::kAnswered;
    return;
  }
  bool done = false;
  std::string text;
  std::vector<int32_t> tokens;
  for (const std::string& data : reply.events) {
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    auto piece = ReadPiece(record.route, data);
    if (!piece.ok()) {
      return fail(Outcome::kFailed, absl::StrCat("a streamed event is bad (",
                                                 piece.status().message(), "): ", Excerpt(data)));
    }
    if (!piece->error.empty()) {
      return fail(Outcome::kRetryable, absl::StrCat("the stream ended with ", piece->error));
    }
    if (!piece->start.has_value() || !piece->end.has_value()) {
      return fail(
          Outcome::kFailed,
          absl::StrCat("a streamed event without weight_version_start/end: ", Excerpt(data)));
    }
    if (record.start.has_value() &&
        (*piece->start != *record.start || *piece->end < record.end.value_or(0))) {
      return fail(
          Outcome::kFailed,
          absl::StrCat("streamed events disagree: stamped [", *record.start, ", ",
                       record.end.value_or(-1), "] then [", *piece->start, ", ", *piece->end, "]"));
    }
    record.start = piece->start;
    record.end = piece->end;
    // Each event's spans are those so far: the last one's are the answer's.
    if (!piece->spans.empty()) record.spans = std::move(piece->spans);
    // /generate's output_ids are the answer's so far; /v1/completions'
    // token_ids, like its text, the event's own.
    if (record.route == "generate") {
      if (!piece->tokens.empty()) tokens = std::move(piece->tokens);
    } else {
      tokens.insert(tokens.end(), piece->tokens.begin(), piece->tokens.end());
    }
    text += piece->text;
  }
  if (reply.cut || !done) {
    record.start.reset();
    record.end.reset();
    return fail(Outcome::kRetryable, absl::StrCat("the stream broke off before [DONE]",
                                                  reply.error.empty() ? "" : ": ", reply.error));
  }
  if (!record.start.has_value()) return fail(Outcome::kFailed, "a stream without any answer");
  record.tokens = std::move(tokens);
  record.text = std::move(text);
  record.outcome = Outcome::kAnswered;
}

struct RolloutLoad::Impl {
  struct Plan {
    RequestRecord record;
    int replica = -1;
  };
  // A client that leaves: the call's abort and the timer that fires it.
  struct Leaving {
    explicit Leaving(boost::asio::any_io_executor ex) : timer(ex) {}
    boost::asio::steady_timer timer;
    HttpCallAbort abort;
  };

  Impl(RolloutLoad* owner, RolloutLoadOptions options, Oracle& oracle, HistoryWriter& history,
       Targets targets)
      : owner(owner),
        options(std::move(options)),
        oracle(oracle),
        history(history),
        targets(std::move(targets)),
        judges(1),
        client(loop.executor(), [] {
          ClientOptions c;
          c.max_idle_per_origin = 64;
          return c;
        }()) {}

  RolloutLoad* owner;
  const RolloutLoadOptions options;
  Oracle& oracle;
  HistoryWriter& history;
  const Targets targets;
  // Destroyed in reverse: the client and the pool before the loop.
  EventLoop loop;
  WorkerPool judges;
  HttpClient client;

  absl::Mutex mu;
  int lanes_running ABSL_GUARDED_BY(mu) = 0;
  int probes_running ABSL_GUARDED_BY(mu) = 0;  // the probe loop and every probe in flight
  std::atomic<bool> stop_load{false};
  std::atomic<bool> stop_probes{false};

  void Done(int* counter) {
    absl::MutexLock lock(&mu);
    --*counter;
  }

  void WaitNone(const int* counter) {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](const int* c) { return *c == 0; }, counter));
  }

  Plan Draw(Rng& rng) {
    Plan plan;
    RequestRecord& r = plan.record;
    r.id = owner->next_id_.fetch_add(1) + 1;
    const bool gateway = rng.Uniform() < 0.65;
    plan.replica = static_cast<int>(rng.Below(static_cast<uint64_t>(options.replicas)));
    r.via = gateway ? "gateway" : absl::StrCat("r", plan.replica);
    r.route = rng.Uniform() < 0.7 ? "generate" : "completions";
    if (!options.route.empty()) r.route = options.route;
    r.stream = rng.Uniform() < 0.35;
    if (gateway && rng.Uniform() < 0.3) r.session = absl::StrCat("s", rng.Below(8));
    r.prompt = static_cast<int>(rng.Below(oracle.options().prompts.size()));
    r.max_tokens = rng.Uniform() < 0.2 ? kLongAnswer : kShortAnswer;
    r.pointer = targets.pointer();
    const double kind = rng.Uniform();
    const int64_t lag = static_cast<int64_t>(rng.Below(3));
    const int64_t behind = rng.Below(4) == 0 ? 1 : 0;
    if (kind < 0.25) {
      r.constraint = VersionConstraint{};
    } else if (kind < 0.7) {
      r.constraint = VersionConstraint::AtLeast(std::max<int64_t>(0, r.pointer - lag));
    } else {
      r.constraint = VersionConstraint::Exact(std::max<int64_t>(0, r.pointer - behind));
    }
    return plan;
  }

  Plan DrawProbe(Rng& rng) {
    Plan plan;
    RequestRecord& r = plan.record;
    r.id = owner->next_id_.fetch_add(1) + 1;
    r.via = "gateway";
    r.route = options.route.empty() ? "generate" : options.route;
    r.probe = true;
    r.prompt = static_cast<int>(rng.Below(oracle.options().prompts.size()));
    r.max_tokens = kShortAnswer;
    r.pointer = targets.pointer();
    r.constraint = VersionConstraint::AtLeast(r.pointer);
    return plan;
  }

  std::string Body(const RequestRecord& r) {
    json::object body;
    json::array prompt;
    for (int32_t id : oracle.options().prompts[static_cast<size_t>(r.prompt)]) {
      prompt.emplace_back(id);
    }
    const int64_t tokens = r.max_tokens;
    if (r.route == "generate") {
      body["input_ids"] = std::move(prompt);
      json::object sampling;
      sampling["max_new_tokens"] = tokens;
      sampling["temperature"] = 0;
      sampling["ignore_eos"] = true;
      body["sampling_params"] = std::move(sampling);
      body["rid"] = absl::StrCat("chaos-", r.id);
    } else {
      body["prompt"] = std::move(prompt);
      body["max_tokens"] = tokens;
      body["temperature"] = 0;
      body["ignore_eos"] = true;
      if (options.return_token_ids) body["return_token_ids"] = true;
    }
    body["stream"] = r.stream;
    json::object constraint;
    if (r.constraint.exact_version.has_value()) {
      constraint["exact_version"] = *r.constraint.exact_version;
    } else if (r.constraint.min_version.has_value()) {
      constraint["min_version"] = *r.constraint.min_version;
    }
    if (!constraint.empty()) body["weight_version"] = std::move(constraint);
    return json::serialize(body);
  }

  static awaitable<void> FireAfter(std::shared_ptr<Leaving> leaving,
                                   std::chrono::milliseconds delay) {
    leaving->timer.expires_after(delay);
    auto [ec] =
        co_await leaving->timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    if (!ec) leaving->abort.Abort();
  }

  awaitable<Reply> Exchange(const Plan& plan, bool leave, std::chrono::milliseconds leave_after) {
    Reply reply;
    reply.stream = plan.record.stream;
    const std::string url =
        plan.record.via == "gateway" ? targets.gateway() : targets.sidecar(plan.replica);
    absl::StatusOr<HttpUrl> parsed = ParseHttpUrl(url);
    if (!parsed.ok()) {
      reply.error = absl::StrCat("no address for ", plan.record.via, ": ", url);
      co_return reply;
    }
    HttpRequest request;
    request.method = "POST";
    request.target = plan.record.route == "generate" ? "/generate" : "/v1/completions";
    request.headers.Set("Content-Type", "application/json");
    if (!plan.record.session.empty()) {
      request.headers.Set(options.session_header, plan.record.session);
    }
    if (!options.auth_token.empty()) {
      request.headers.Set("Authorization", absl::StrCat("Bearer ", options.auth_token));
    }
    request.body = Body(plan.record);
    auto leaving = std::make_shared<Leaving>(loop.executor());
    CallOptions call;
    call.timeout = options.timeout;
    call.stream_idle_timeout = options.timeout;
    if (leave) call.abort = &leaving->abort;
    if (!plan.record.stream) {
      if (leave) Spawn(loop.executor(), FireAfter(leaving, leave_after));
      absl::StatusOr<HttpResponse> response =
          co_await client.Send(parsed->origin, std::move(request), call);
      leaving->timer.cancel();
      if (!response.ok()) {
        reply.error = std::string(response.status().message());
        reply.timed_out = absl::IsDeadlineExceeded(response.status());
        reply.left = leaving->abort.aborted();
        co_return reply;
      }
      reply.status = response->status;
      reply.replica = std::string(response->headers.Get("x-stitch-replica").value_or(""));
      reply.body = std::move(response->body);
      co_return reply;
    }
    absl::StatusOr<HttpResponseStream> stream =
        co_await client.SendStreamed(parsed->origin, std::move(request), call);
    if (!stream.ok()) {
      reply.error = std::string(stream.status().message());
      reply.timed_out = absl::IsDeadlineExceeded(stream.status());
      co_return reply;
    }
    reply.status = stream->status();
    reply.replica = std::string(stream->headers().Get("x-stitch-replica").value_or(""));
    const std::optional<std::string_view> type = stream->headers().Get("content-type");
    reply.event_stream =
        type.has_value() && type->find("text/event-stream") != std::string_view::npos;
    if (!reply.event_stream) {
      absl::StatusOr<std::string> body = co_await stream->ReadAll();
      if (body.ok()) {
        reply.body = *std::move(body);
      } else {
        reply.error = std::string(body.status().message());
      }
      co_return reply;
    }
    SseEventSplitter splitter;
    for (;;) {
      absl::StatusOr<std::string> chunk = co_await stream->Read();
      if (!chunk.ok()) {
        reply.cut = true;
        reply.error = std::string(chunk.status().message());
        reply.timed_out = absl::IsDeadlineExceeded(chunk.status());
        break;
      }
      if (chunk->empty()) break;
      splitter.Append(*chunk);
      while (std::optional<std::string> event = splitter.Next()) {
        if (std::optional<std::string> data = SseData(*event)) reply.events.push_back(*data);
      }
      if (leave && !stream->finished()) {
        stream->Close();
        reply.left = true;
        break;
      }
    }
    co_return reply;
  }

  // The replica that answered: the one sent to, or the one the gateway
  // named.
  std::string ServedBy(const RequestRecord& r, const Reply& reply) {
    if (r.via != "gateway") return r.via;
    if (reply.replica.empty()) return "";
    for (int i = 0; i < options.replicas; ++i) {
      if (targets.sidecar(i) == reply.replica) return absl::StrCat("r", i);
    }
    return "";
  }

  // Judges an answer of the real engine's replica with the external judge.
  void JudgeExternally(RequestRecord& r) {
    if (r.tokens.empty() && r.max_tokens > 0) {
      r.verdict = Verdict::kUnjudged;
      r.error = "the answer carries no token ids for the judge";
      return;
    }
    std::optional<VersionSpans> spans;
    if (!r.spans.empty() && r.spans != "unknown") {
      absl::StatusOr<VersionSpans> parsed = ParseSpans(r.spans, *r.start, *r.end);
      if (!parsed.ok()) {
        r.spans_check = absl::StrCat("wrong: ", parsed.status().message());
      } else {
        spans = *std::move(parsed);
      }
    } else if (r.spans == "unknown") {
      r.spans_check = "unknown";
    }
    absl::StatusOr<ExternalJudgement> j =
        targets.judge->Judge(oracle.options().prompts[static_cast<size_t>(r.prompt)], r.tokens,
                             r.max_tokens, *r.start, *r.end, spans.has_value() ? &*spans : nullptr);
    if (!j.ok()) {
      r.verdict = Verdict::kUnjudged;
      r.error = absl::StrCat("the transformers judge: ", j.status().message());
      return;
    }
    r.verdict = j->judgement.verdict;
    r.versions = j->judgement.versions;
    r.switch_at = j->judgement.switch_at;
    r.matches = j->judgement.matches;
    if (j->spans_explain.has_value()) {
      r.spans_check = *j->spans_explain
                          ? "exact"
                          : "wrong: the versions they name, switching where they say, do not "
                            "produce the answer";
    }
  }

  void Judge(RequestRecord& r) {
    if (r.outcome != Outcome::kAnswered || !r.start.has_value() || !r.end.has_value()) return;
    if (targets.judge != nullptr && r.served_by == absl::StrCat("r", targets.judged_replica)) {
      JudgeExternally(r);
      return;
    }
    const Judgement j = r.route == "generate"
                            ? oracle.JudgeTokens(r.prompt, r.max_tokens, r.tokens, *r.start, *r.end)
                            : oracle.JudgeText(r.prompt, r.max_tokens, r.text, *r.start, *r.end);
    r.verdict = j.verdict;
    r.versions = j.versions;
    r.switch_at = j.switch_at;
    r.matches = j.matches;
    CheckSpans(r);
  }

  // Judges the answer's version spans (RequestRecord::spans_check).
  void CheckSpans(RequestRecord& r) {
    if (r.outcome != Outcome::kAnswered || r.spans.empty() || !r.start.has_value() ||
        !r.end.has_value()) {
      return;
    }
    if (r.spans == "unknown") {
      r.spans_check = "unknown";
      return;
    }
    absl::StatusOr<VersionSpans> spans = ParseSpans(r.spans, *r.start, *r.end);
    if (!spans.ok()) {
      r.spans_check = absl::StrCat("wrong: ", spans.status().message());
      return;
    }
    const bool explained = r.route == "generate"
                               ? oracle.SpansExplainTokens(r.prompt, r.max_tokens, r.tokens, *spans)
                               : oracle.SpansExplainText(r.prompt, r.max_tokens, r.text, *spans);
    r.spans_check = explained ? "exact"
                              : "wrong: the versions they name, switching where they say, do not "
                                "produce the answer";
  }

  // Returns the request's outcome.
  awaitable<Outcome> RunOne(Plan plan, std::chrono::milliseconds leave_after) {
    const bool leave = owner->leaving_.load() && !plan.record.probe;
    plan.record.sent_s = targets.now();
    Reply reply = co_await Exchange(plan, leave, leave_after);
    RequestRecord record = std::move(plan.record);
    record.done_s = targets.now();
    co_await RunBlocking(judges, [this, &record, &reply] {
      ReadReply(reply, record);
      record.served_by = ServedBy(record, reply);
      Judge(record);
      history.Write(record);
    });
    co_return record.outcome;
  }

  awaitable<void> Lane(int lane) {
    Rng rng(options.seed * 0x100000001B3ULL + static_cast<uint64_t>(lane) + 1);
    boost::asio::steady_timer timer(loop.executor());
    while (!stop_load.load()) {
      Plan plan = Draw(rng);
      const auto leave_after = std::chrono::milliseconds(2 + rng.Below(30));
      const Outcome outcome = co_await RunOne(std::move(plan), leave_after);
      // A client backs off after a refusal, as a rollout worker would.
      timer.expires_after(outcome == Outcome::kAnswered || outcome == Outcome::kClientLeft
                              ? options.pause
                              : options.backoff);
      auto [ec] = co_await timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
      (void)ec;
    }
    Done(&lanes_running);
  }

  awaitable<void> ProbeOne(Plan plan) {
    (void)co_await RunOne(std::move(plan), std::chrono::milliseconds(0));
    Done(&probes_running);
  }

  awaitable<void> ProbeLoop() {
    Rng rng(options.seed ^ 0x5DEECE66DULL);
    boost::asio::steady_timer timer(loop.executor());
    while (!stop_probes.load()) {
      bool room = false;
      {
        absl::MutexLock lock(&mu);
        room = probes_running <= options.max_probes_in_flight;
        if (room) ++probes_running;
      }
      if (room) Spawn(loop.executor(), ProbeOne(DrawProbe(rng)));
      timer.expires_after(options.probe_every);
      auto [ec] = co_await timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
      (void)ec;
    }
    Done(&probes_running);
  }
};

RolloutLoad::RolloutLoad(RolloutLoadOptions options, Oracle& oracle, HistoryWriter& history,
                         Targets targets)
    : impl_(std::make_unique<Impl>(this, std::move(options), oracle, history, std::move(targets))) {
}

RolloutLoad::~RolloutLoad() {
  StopLoad();
  StopProbes();
}

void RolloutLoad::Start() {
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->lanes_running = impl_->options.lanes;
    impl_->probes_running = 1;
  }
  for (int lane = 0; lane < impl_->options.lanes; ++lane) {
    Spawn(impl_->loop.executor(), impl_->Lane(lane));
  }
  Spawn(impl_->loop.executor(), impl_->ProbeLoop());
}

void RolloutLoad::StopLoad() {
  impl_->stop_load.store(true);
  impl_->WaitNone(&impl_->lanes_running);
}

void RolloutLoad::StopProbes() {
  impl_->stop_probes.store(true);
  impl_->WaitNone(&impl_->probes_running);
}

}  // namespace stitch
