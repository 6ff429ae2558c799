// Test-only: an in-process HTTP server that answers like SGLang, for tests
// of the engine adapters and the sidecar's proxy. It runs on its own event
// loop, records every request, and answers:
//   - a route given a scripted answer (SetAnswer): that answer;
//   - POST /generate, /v1/completions, /v1/chat/completions: a small
//     generation result echoing the request body as `request`, or, with
//     `stream: true`, server-sent events (`events` of them, then
//     `data: [DONE]`), the second one held until ReleaseStream() or until
//     the client goes away, which it records (or, stepwise, each event
//     after the first held until Step() was called once more); the events
//     carry the whole answer so far (`text`, `output_ids`), or, like
//     SGLang's --incremental-streaming-output, only what is new;
//   - a route set to hang (Hang): no answer until the client goes away,
//     which it records;
//   - like SGLang, it keeps a weight label ("default" until set): the
//     `weight_version` of POST /update_weights_from_disk and the
//     `new_version` of POST /update_weight_version set it, GET /model_info
//     (/get_model_info) reports it, and generations carry it
//     (`meta_info.weight_version` on /generate and its events, which
//     also count their tokens, one per event, in `completion_tokens`,
//     `metadata.weight_version` on non-streamed OpenAI answers);
//   - anything else: 200 {"success": true, "message": "ok"}.
// Thread-safe: tests call it from their own thread while it serves.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/synchronization/mutex.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/http.h"
#include "stitch/net/server.h"
#include "stitch/net/sse.h"

namespace stitch::testing {

class FakeSglangServer {
 public:
  FakeSglangServer()
      : loop_(std::make_unique<EventLoop>()),
        stream_gate_(std::make_unique<boost::asio::steady_timer>(loop_->executor())) {
    stream_gate_->expires_at(boost::asio::steady_timer::time_point::max());
    auto server = HttpServer::Start(loop_->executor(), ServerOptions{},
                                    [this](HttpExchange& ex) { return Handle(ex); });
    if (server.ok()) server_ = *std::move(server);
  }
  // Ends every exchange and waits for the handlers before anything they use
  // goes away.
  ~FakeSglangServer() {
    ReleaseStream();
    loop_->BlockOn(Shutdown());
    server_.reset();
    loop_.reset();
  }

  bool started() const { return server_ != nullptr; }
  std::string url() const { return server_->url(); }
  HttpOrigin origin() const { return HttpOrigin{"127.0.0.1", server_->port()}; }

  // Every later request to `path` gets `answer`.
  void SetAnswer(const std::string& path, HttpResponse answer) {
    absl::MutexLock lock(&mu_);
    answers_[path] = std::move(answer);
  }
  // Requests to `path` get no answer until their client disconnects.
  void Hang(const std::string& path) {
    absl::MutexLock lock(&mu_);
    hanging_.insert(path);
  }
  // The weight label it reports from now on (as a load naming it would).
  void SetWeightVersion(const std::string& label) {
    absl::MutexLock lock(&mu_);
    weight_version_ = label;
  }
  std::string weight_version() const {
    absl::MutexLock lock(&mu_);
    return weight_version_;
  }
  // How many events a streamed generation sends.
  void SetStreamEvents(int n) {
    absl::MutexLock lock(&mu_);
    events_ = n;
  }
  // Streams send event i (i >= 1) only once Step() was called i times.
  void SetStepwise(bool stepwise) {
    absl::MutexLock lock(&mu_);
    stepwise_ = stepwise;
  }
  void Step() {
    boost::asio::post(loop_->executor(), [this] {
      ++steps_;
      if (stream_gate_) stream_gate_->cancel();
    });
  }
  // Events carry only what is new instead of the whole answer so far.
  void SetIncrementalStreams(bool incremental) {
    absl::MutexLock lock(&mu_);
    incremental_ = incremental;
  }
  // The last event of a streamed /generate reports its tokens' spans, as
  // stock SGLang does (`meta_info.weight_versions`), each token labelled
  // with the weight version when its event was sent.
  void SetFinalSpans(bool final_spans) {
    absl::MutexLock lock(&mu_);
    final_spans_ = final_spans;
  }
  // Whether /server_info says the overlap scheduler is on (by default off,
  // as for an engine whose labels and spans place commits exactly).
  void SetOverlapSchedule(bool on) {
    absl::MutexLock lock(&mu_);
    overlap_ = on;
  }
  // Streamed events written so far, over all streams.
  int events_sent() const {
    absl::MutexLock lock(&mu_);
    return events_sent_;
  }
  // Lets held streams send the rest of their events.
  void ReleaseStream() {
    boost::asio::post(loop_->executor(), [this] {
      stream_released_ = true;
      if (stream_gate_) stream_gate_->cancel();
    });
  }

  std::vector<HttpRequest> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  std::vector<HttpRequest> RequestsTo(std::string_view path) const {
    absl::MutexLock lock(&mu_);
    std::vector<HttpRequest> out;
    for (const HttpRequest& r : requests_) {
      if (TargetPath(r.target) == path) out.push_back(r);
    }
    return out;
  }
  // Hanging requests and held streams whose client went away.
  int disconnects() const {
    absl::MutexLock lock(&mu_);
    return disconnects_;
  }
  // Requests being answered now.
  int in_flight() const {
    absl::MutexLock lock(&mu_);
    return in_flight_;
  }

 private:
  boost::asio::awaitable<void> Shutdown() {
    if (server_) co_await server_->Shutdown();
    stream_gate_.reset();
  }

  // Loads and relabels change the label, as in SGLang.
  void NoteLabel(const std::string& path, const std::string& body) {
    const char* key = path == "/update_weights_from_disk" ? "weight_version"
                      : path == "/update_weight_version"  ? "new_version"
                                                          : nullptr;
    if (key == nullptr) return;
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(body, ec);
    if (ec || !v.is_object()) return;
    const boost::json::value* label = v.get_object().if_contains(key);
    if (label != nullptr && label->is_string()) SetWeightVersion(std::string(label->get_string()));
  }

  boost::asio::awaitable<void> Handle(HttpExchange& ex) {
    std::string path(TargetPath(ex.request().target));
    std::optional<HttpResponse> answer;
    bool hang = false;
    int events = 0;
    StreamForm form;
    NoteLabel(path, ex.request().body);
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(ex.request());
      if (auto it = answers_.find(path); it != answers_.end()) answer = it->second;
      hang = hanging_.contains(path);
      events = events_;
      form = StreamForm{stepwise_, incremental_, final_spans_};
      ++in_flight_;
    }
    co_await Answer(ex, path, std::move(answer), hang, events, form);
    absl::MutexLock lock(&mu_);
    --in_flight_;
  }

  struct StreamForm {
    bool stepwise = false;
    bool incremental = false;
    bool final_spans = false;
  };

  // Waits until `event` may be sent; false when the client went away first.
  boost::asio::awaitable<bool> MaySend(HttpExchange& ex, int event, bool stepwise) {
    using namespace boost::asio::experimental::awaitable_operators;
    if (stepwise) {
      while (steps_ < event) {
        stream_gate_->expires_at(boost::asio::steady_timer::time_point::max());
        (void)co_await (
            stream_gate_->async_wait(boost::asio::as_tuple(boost::asio::use_awaitable)) ||
            ex.WaitDisconnected());
        if (ex.disconnected()) break;
      }
    } else if (event == 1 && !stream_released_) {
      (void)co_await (stream_gate_->async_wait(boost::asio::as_tuple(boost::asio::use_awaitable)) ||
                      ex.WaitDisconnected());
    }
    const bool may = stepwise ? steps_ >= event : event != 1 || stream_released_;
    if (!may) {
      absl::MutexLock lock(&mu_);
      ++disconnects_;
    }
    co_return may;
  }

  boost::asio::awaitable<void> Answer(HttpExchange& ex, const std::string& path,
                                      std::optional<HttpResponse> answer, bool hang, int events,
                                      StreamForm form) {
    if (answer.has_value()) {
      (void)co_await ex.Respond(*std::move(answer));
      co_return;
    }
    if (hang) {
      co_await ex.WaitDisconnected();
      absl::MutexLock lock(&mu_);
      ++disconnects_;
      co_return;
    }
    const bool generation =
        path == "/generate" || path == "/v1/completions" || path == "/v1/chat/completions";
    const std::string label = weight_version();
    if (path == "/server_info") {
      boost::json::object info;
      {
        absl::MutexLock lock(&mu_);
        info["disable_overlap_schedule"] = !overlap_;
      }
      HttpResponse response = JsonResponse(200, boost::json::serialize(info));
      (void)co_await ex.Respond(std::move(response));
      co_return;
    }
    if (path == "/model_info" || path == "/get_model_info") {
      boost::json::object info;
      info["model_path"] = "fake";
      info["weight_version"] = label;
      HttpResponse response = JsonResponse(200, boost::json::serialize(info));
      (void)co_await ex.Respond(std::move(response));
      co_return;
    }
    if (!generation) {
      HttpResponse ok = JsonResponse(200, R"({"success":true,"message":"ok"})");
      (void)co_await ex.Respond(std::move(ok));
      co_return;
    }
    boost::system::error_code ec;
    boost::json::value body = boost::json::parse(ex.request().body, ec);
    const bool stream = !ec && body.is_object() && body.get_object().contains("stream") &&
                        body.get_object().at("stream").is_bool() &&
                        body.get_object().at("stream").get_bool();
    if (!stream) {
      boost::json::object out;
      out["text"] = "ok";
      out["request"] = ec ? boost::json::value(ex.request().body) : body;
      if (path == "/generate") {
        boost::json::object meta;
        // SGLang answers with the request's rid.
        const boost::json::value* rid =
            !ec && body.is_object() ? body.get_object().if_contains("rid") : nullptr;
        meta["id"] = rid != nullptr && rid->is_string() ? *rid : boost::json::value("fake");
        meta["weight_version"] = label;
        out["meta_info"] = std::move(meta);
      } else {
        boost::json::object metadata;
        metadata["weight_version"] = label;
        out["metadata"] = std::move(metadata);
      }
      HttpResponse response = JsonResponse(200, boost::json::serialize(out));
      (void)co_await ex.Respond(std::move(response));
      co_return;
    }
    HttpHeaders headers;
    headers.Add("Content-Type", "text/event-stream");
    absl::Status begun = co_await ex.BeginStream(200, std::move(headers));
    if (!begun.ok()) co_return;
    boost::json::array spans;  // SGLang's {version, start, end}
    for (int i = 0; i < events; ++i) {
      if (!co_await MaySend(ex, i, form.stepwise)) co_return;
      // One token per event, its id the event's number from 1.
      boost::json::object event;
      boost::json::array ids;
      for (int id = form.incremental ? i + 1 : 1; id <= i + 1; ++id) ids.emplace_back(id);
      event["text"] = std::string(form.incremental ? 1 : static_cast<size_t>(i + 1), 'x');
      event["output_ids"] = std::move(ids);
      event["index"] = i;
      if (path == "/generate") {
        boost::json::object meta;
        meta["weight_version"] = weight_version();
        meta["completion_tokens"] = i + 1;  // the tokens so far, as counted by SGLang
        AddSpan(spans, meta.at("weight_version").as_string(), i);
        if (form.final_spans && i + 1 == events) meta["weight_versions"] = spans;
        event["meta_info"] = std::move(meta);
      }
      std::string chunk = SseEvent(boost::json::serialize(event));
      absl::Status written = co_await ex.WriteChunk(std::move(chunk));
      if (!written.ok()) co_return;
      absl::MutexLock lock(&mu_);
      ++events_sent_;
    }
    std::string done = SseEvent("[DONE]");
    (void)co_await ex.WriteChunk(std::move(done));
    (void)co_await ex.EndStream();
  }

  // Token `token` labelled `label`, added to SGLang-style spans.
  static void AddSpan(boost::json::array& spans, const boost::json::string& label, int token) {
    if (!spans.empty() && spans.back().as_object().at("version").as_string() == label) {
      spans.back().as_object()["end"] = token + 1;
      return;
    }
    spans.push_back(boost::json::object{{"version", label}, {"start", token}, {"end", token + 1}});
  }

  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<boost::asio::steady_timer> stream_gate_;  // loop thread only
  std::unique_ptr<HttpServer> server_;
  bool stream_released_ = false;  // loop thread only
  int steps_ = 0;                 // loop thread only
  mutable absl::Mutex mu_;
  std::vector<HttpRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, HttpResponse> answers_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> hanging_ ABSL_GUARDED_BY(mu_);
  int events_ ABSL_GUARDED_BY(mu_) = 3;
  bool stepwise_ ABSL_GUARDED_BY(mu_) = false;
  bool incremental_ ABSL_GUARDED_BY(mu_) = false;
  bool final_spans_ ABSL_GUARDED_BY(mu_) = false;
  bool overlap_ ABSL_GUARDED_BY(mu_) = false;
  int events_sent_ ABSL_GUARDED_BY(mu_) = 0;
  std::string weight_version_ ABSL_GUARDED_BY(mu_) = "default";
  int disconnects_ ABSL_GUARDED_BY(mu_) = 0;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stitch::testing
