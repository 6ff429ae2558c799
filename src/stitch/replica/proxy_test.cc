// The sidecar's HTTP surface in one process: the real gate, reconciler and
// proxy, a scripted engine for the control plane and a fake SGLang server
// for the data plane.
#include "stitch/replica/proxy.h"

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/api/server_info.h"
#include "stitch/engine/fake_sglang_server.h"
#include "stitch/net/client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/net_test_util.h"
#include "stitch/net/sse.h"
#include "stitch/replica/replica_test_util.h"
#include "stitch/replica/sidecar.h"
#include "stitch/store/mem_store.h"
#include "tests/support/json_object.h"
#include "tests/support/loopback_http.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace json = boost::json;
using boost::asio::awaitable;
using testing::FakeSglangServer;
using testing::RawSocket;
using testing::ScriptedEngine;
using testing::WaitUntil;

// Whether `upstream` is the id the sidecar gives the engine for a client's
// `rid`: "stitch-<8 hex>-<16 hex>-<rid>".
bool IsUpstreamRidOf(std::string_view upstream, std::string_view rid) {
  constexpr size_t kPrefix = std::string_view("stitch-01234567-0123456789abcdef").size();
  return upstream.size() == kPrefix + 1 + rid.size() && upstream.starts_with("stitch-") &&
         upstream[kPrefix] == '-' && upstream.substr(kPrefix + 1) == rid;
}

using testing::ParseObject;

class ProxyTest : public ::testing::Test {
 protected:
  ProxyTest() {
    pool_ = std::make_unique<WorkerPool>(2);
    loop_ = std::make_unique<EventLoop>();
    clock_ = std::make_unique<ManualClock>(loop_->executor());
    static std::atomic<int> counter{0};
    auto mem = MemStore::Open(absl::StrCat("proxy-test-", ++counter), "r1", tmp_ / "cache");
    EXPECT_TRUE(mem.ok()) << mem.status();
    store_ = *std::move(mem);
    engine_ = std::make_unique<ScriptedEngine>(loop_->executor());
    // The data plane labels its answers as the engine the sidecar verified.
    fake_.SetWeightVersion("r1/weight_v000000");
  }
  // I/O objects go before their loop, once nothing uses them.
  ~ProxyTest() override {
    if (sidecar_) loop_->BlockOn(sidecar_->Shutdown());
    sidecar_.reset();
    engine_.reset();
    pool_.reset();
    loop_.reset();
  }

  void Start(const std::string& engine_url,
             const std::function<void(Sidecar::Settings&)>& tweak = nullptr) {
    auto url = ParseHttpUrl(engine_url);
    ASSERT_TRUE(url.ok()) << url.status();
    Sidecar::Settings settings;
    settings.reconciler.run_id = "r1";
    settings.reconciler.base_checkpoint_dir = tmp_ / "base";
    settings.reconciler.reconcile_interval = Clock::Duration::zero();
    settings.watchdog.interval = Clock::Duration::zero();
    settings.proxy.engine = url->origin;
    settings.proxy.upstream_timeout = std::chrono::seconds(20);
    if (tweak) tweak(settings);
    Sidecar::Ports ports{loop_->executor(), pool_.get(), store_.get(), engine_.get(), clock_.get()};
    auto started = loop_->BlockOn(Sidecar::Start(settings, ports));
    ASSERT_TRUE(started.ok()) << started.status();
    sidecar_ = *std::move(started);
  }

  // Runs `fn` on the loop and returns its result.
  template <typename F>
  auto OnLoop(F fn) {
    using R = decltype(fn());
    return loop_->BlockOn([](F f) -> awaitable<R> { co_return f(); }(std::move(fn)));
  }
  bool ReadyAt(int64_t version) {
    return OnLoop([&] {
      return sidecar_->reconciler().ready() && sidecar_->gate().serving().version == version;
    });
  }
  // An in-place commit as the reconciler makes it, without an engine: the
  // gate flips to `v`, and the data plane labels what follows `v`.
  void CommitInPlace(int64_t v) {
    loop_->BlockOn([](AdmissionGate& gate, int64_t v) -> awaitable<void> {
      auto window = co_await gate.Close(DrainScope::kExactPins);
      EXPECT_TRUE(window.ok()) << window.status();
      if (window.ok()) window->Flip(VersionRef{"r1", v});
    }(sidecar_->gate(), v));
    fake_.SetWeightVersion(absl::StrCat("r1/weight_v00000", v));
  }

  // Opens a streamed request through the sidecar and returns the next
  // event's data each call (nullopt at the end).
  struct Streamed {
    EventLoop loop;
    HttpClient client{loop.executor()};
    std::optional<HttpResponseStream> stream;
    SseEventSplitter splitter;
    std::optional<std::string> Next() {
      for (;;) {
        if (auto e = splitter.Next()) return SseData(*e);
        auto chunk = loop.BlockOn(stream->Read());
        if (!chunk.ok() || chunk->empty()) return std::nullopt;
        splitter.Append(*chunk);
      }
    }
  };
  void OpenStream(Streamed& s, const std::string& path, const std::string& body) {
    auto url = ParseHttpUrl(sidecar_->url());
    HttpRequest request;
    request.method = "POST";
    request.target = path;
    request.headers.Set("Content-Type", "application/json");
    request.body = body;
    auto stream = s.loop.BlockOn(s.client.SendStreamed(url->origin, request));
    ASSERT_TRUE(stream.ok()) << stream.status();
    ASSERT_EQ(stream->status(), 200);
    s.stream.emplace(*std::move(stream));
  }

  int64_t Active() {
    return OnLoop([&] { return sidecar_->gate().active(); });
  }
  std::vector<std::string> Aborted() {
    return OnLoop([&] { return engine_->aborted; });
  }

  // A client's generation `rid` whose client left: admission is released,
  // the engine was told to abort it and saw its connection close, and the
  // metrics count the client that left.
  void ExpectTheGenerationEndedWithItsClient(const std::string& rid) {
    EXPECT_TRUE(WaitUntil([&] { return Active() == 0; }));
    EXPECT_TRUE(WaitUntil([&] {
      auto aborted = Aborted();
      return aborted.size() == 1 && IsUpstreamRidOf(aborted[0], rid);
    }));
    EXPECT_TRUE(WaitUntil([&] { return fake_.disconnects() == 1; }));
    HttpResponse metrics = Send("GET", "/metrics");
    EXPECT_NE(metrics.body.find("stitch_sidecar_client_disconnects_total 1"), std::string::npos);
  }

  // POST /generate with a JSON `body`, as raw HTTP/1.1.
  static std::string RawGenerate(const std::string& body) {
    return absl::StrCat("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
                        "Content-Length: ", body.size(), "\r\n\r\n", body);
  }

  HttpResponse Send(std::string method, std::string path, std::string body = {},
                    std::string authorization = {}) {
    FetchOptions options;
    if (!authorization.empty()) options.headers.Set("Authorization", authorization);
    auto r = HttpFetch(method, sidecar_->url() + path, std::move(body), options);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : HttpResponse{};
  }

  // Opens a streamed /generate once the replica serves version 0, checks
  // that its first event is version 0's alone, then commits version 1 in
  // place and lets the rest of the stream come.
  void StreamAcrossACommit(Streamed& s) {
    ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
    OpenStream(s, "/generate", R"({"text":"hi","stream":true})");
    std::optional<std::string> first = s.Next();
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(json::serialize(ParseObject(*first).at("meta_info").at("weight_version_spans")),
              "[[0,0]]");
    CommitInPlace(1);
    fake_.ReleaseStream();
  }

  void WholeGenerateAcrossTwoCommits(bool incremental);
  void FinalSpansAcrossACommit(bool engine_places_commits);

  stitch::testing::TempDir tmp_;
  FakeSglangServer fake_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<ManualClock> clock_;
  std::unique_ptr<MemStore> store_;
  std::unique_ptr<ScriptedEngine> engine_;
  std::unique_ptr<Sidecar> sidecar_;
};

TEST_F(ProxyTest, GenerateIsAdmittedTaggedAndStamped) {
  ASSERT_TRUE(fake_.started());
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  HttpResponse r = Send(
      "POST", "/generate",
      R"({"text":"hi","extra_key":"user","weight_version":{"min_version":0},"sampling_params":{}})");
  ASSERT_EQ(r.status, 200) << r.body;
  json::object body = ParseObject(r.body);
  const json::object& meta = body.at("meta_info").as_object();
  EXPECT_EQ(meta.at("weight_version_start").as_int64(), 0);
  EXPECT_EQ(meta.at("weight_version_end").as_int64(), 0);
  EXPECT_EQ(meta.at("weight_version").as_string(), "0");

  // What reached the engine: no constraint, a rid, the isolation tag.
  json::object sent = body.at("request").as_object();
  EXPECT_FALSE(sent.contains("weight_version"));
  EXPECT_EQ(sent.at("extra_key").as_string(), CacheIsolationPrefix({"r1", 0}) + "user");
  ASSERT_TRUE(sent.contains("rid"));
  EXPECT_TRUE(sent.at("rid").as_string().starts_with("stitch-"));
  EXPECT_EQ(meta.at("id"), sent.at("rid"));  // the sidecar's own id, as the engine named it
  EXPECT_TRUE(sent.contains("sampling_params"));
  EXPECT_EQ(Active(), 0);
}

TEST_F(ProxyTest, LargeBodiesReachTheEngineAndComeBackIntact) {
  // Far more JSON than the request's inline arena holds, in both directions
  // (the fake engine echoes the request in its answer).
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  json::object request;
  std::string prompt;
  for (int i = 0; i < 20000; ++i) absl::StrAppend(&prompt, "tok", i, " \u00e9\"");
  request["text"] = prompt;
  json::object& params = request["sampling_params"].emplace_object();
  for (int i = 0; i < 300; ++i) {
    params[absl::StrCat("a_rather_long_parameter_name_", i)] = json::array{i, "x", nullptr, 0.5};
  }
  request["weight_version"] = json::object{{"min_version", 0}};
  HttpResponse r = Send("POST", "/generate", json::serialize(request));
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 200);
  json::object body = ParseObject(r.body);
  EXPECT_EQ(body.at("meta_info").at("weight_version_end").as_int64(), 0);
  json::object sent = body.at("request").as_object();
  EXPECT_EQ(sent.at("text"), request.at("text"));
  EXPECT_EQ(sent.at("sampling_params"), request.at("sampling_params"));
  EXPECT_FALSE(sent.contains("weight_version"));
  EXPECT_TRUE(sent.contains("rid"));
  EXPECT_EQ(Active(), 0);
}

// The engine sees the caller's rid behind a prefix of the sidecar's own
// (engines abort by prefix: no two ids the sidecar sends may be prefixes of
// each other), and the caller gets its own rid back.
TEST_F(ProxyTest, CallersRidComesBackAndTheEngineSeesAPrefixFreeId) {
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  std::vector<std::string> upstream;
  for (std::string rid : {"a", "ab", "a"}) {
    HttpResponse r = Send("POST", "/generate", absl::StrCat(R"({"text":"hi","rid":")", rid, "\"}"));
    ASSERT_EQ(r.status, 200) << r.body;
    json::object body = ParseObject(r.body);
    EXPECT_EQ(body.at("meta_info").at("id").as_string(), rid);
    std::string sent(body.at("request").at("rid").as_string());
    EXPECT_TRUE(IsUpstreamRidOf(sent, rid)) << sent;
    upstream.push_back(std::move(sent));
  }
  // A batch gets one id per prompt, each the caller's behind an index.
  HttpResponse batch = Send("POST", "/generate", R"({"text":["a","b","c"],"rid":["x","xy","x"]})");
  ASSERT_EQ(batch.status, 200) << batch.body;
  const json::object batch_body = ParseObject(batch.body);
  for (const json::value& rid : batch_body.at("request").at("rid").as_array()) {
    upstream.emplace_back(rid.as_string());
  }
  HttpResponse anonymous = Send("POST", "/generate", R"({"text":["a","b"]})");
  ASSERT_EQ(anonymous.status, 200);
  const json::object anonymous_body = ParseObject(anonymous.body);
  for (const json::value& rid : anonymous_body.at("request").at("rid").as_array()) {
    upstream.emplace_back(rid.as_string());
  }
  ASSERT_EQ(upstream.size(), 8u);
  for (size_t i = 0; i < upstream.size(); ++i) {
    for (size_t j = 0; j < upstream.size(); ++j) {
      if (i != j) {
        EXPECT_FALSE(upstream[j].starts_with(upstream[i])) << upstream[i] << " " << upstream[j];
      }
    }
  }
  HttpResponse wrong = Send("POST", "/generate", R"({"text":["a","b"],"rid":"one"})");
  EXPECT_EQ(wrong.status, 400);
  HttpResponse number = Send("POST", "/generate", R"({"text":"a","rid":7})");
  EXPECT_EQ(number.status, 400);
}

TEST_F(ProxyTest, OpenAiRoutesAreSaltedAndStampedAtTheTopLevel) {
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  for (std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    HttpResponse r =
        Send("POST", path, R"({"model":"m","prompt":"hi","weight_version":{"exact_version":0}})");
    ASSERT_EQ(r.status, 200) << r.body;
    json::object body = ParseObject(r.body);
    EXPECT_EQ(body.at("weight_version_start").as_int64(), 0);
    EXPECT_EQ(body.at("weight_version_end").as_int64(), 0);
    EXPECT_FALSE(body.contains("meta_info"));
    EXPECT_EQ(body.at("request").at("cache_salt").as_string(), CacheIsolationPrefix({"r1", 0}));
    EXPECT_FALSE(body.at("request").as_object().contains("weight_version"));
  }
}

TEST_F(ProxyTest, UnmetConstraintGets409WithItsBodyAndWakesTheReconciler) {
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  const uint64_t passes = OnLoop([&] { return sidecar_->reconciler().counters().passes; });
  HttpResponse r = Send("POST", "/generate", R"({"text":"hi","weight_version":{"min_version":5}})");
  ASSERT_EQ(r.status, 409) << r.body;
  json::object body = ParseObject(r.body);
  EXPECT_EQ(body.at("type").as_string(), "WeightVersionNotReady");
  EXPECT_EQ(body.at("target_version").as_int64(), 5);
  EXPECT_EQ(body.at("applied").as_int64(), 0);
  EXPECT_EQ(body.at("applied_identity").as_string(), "r1/weight_v000000");
  EXPECT_FALSE(body.at("message").as_string().empty());
  EXPECT_TRUE(fake_.RequestsTo("/generate").empty());
  // The rejection woke a reconcile pass (no backstop runs here).
  EXPECT_TRUE(WaitUntil(
      [&] { return OnLoop([&] { return sidecar_->reconciler().counters().passes; }) > passes; }));
  HttpResponse metrics = Send("GET", "/metrics");
  EXPECT_NE(
      metrics.body.find("stitch_sidecar_requests_rejected_total{reason=\"version_not_ready\"} 1"),
      std::string::npos)
      << metrics.body;
}

// A replica whose engine is silent cannot vouch for what it holds: its 409
// names no applied version and no failed bound (docs/sidecar.md).
TEST_F(ProxyTest, ASilentEnginesReplicaAnswers409WithAppliedNull) {
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  OnLoop([&] {
    sidecar_->gate().Hold("the engine did not answer: timed out");
    return true;
  });
  HttpResponse r = Send("POST", "/generate", R"({"text":"hi","weight_version":{"min_version":0}})");
  ASSERT_EQ(r.status, 409) << r.body;
  json::object body = ParseObject(r.body);
  EXPECT_EQ(body.at("type").as_string(), "WeightVersionNotReady");
  EXPECT_TRUE(body.at("applied").is_null()) << r.body;
  EXPECT_TRUE(body.at("applied_identity").is_null()) << r.body;
  EXPECT_TRUE(!body.contains("failed_bound") || body.at("failed_bound").is_null()) << r.body;
  EXPECT_NE(r.body.find("did not answer"), std::string::npos) << r.body;
  EXPECT_TRUE(fake_.RequestsTo("/generate").empty());
}

TEST_F(ProxyTest, AStaleReplicaRefusesMaxStalenessWith409NamingTheBound) {
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  OnLoop([&] {
    sidecar_->gate().SetPointer(VersionRef{"r1", 2});
    return true;
  });
  HttpResponse r =
      Send("POST", "/generate", R"({"text":"hi","weight_version":{"max_staleness":1}})");
  ASSERT_EQ(r.status, 409) << r.body;
  json::object body = ParseObject(r.body);
  EXPECT_EQ(body.at("type").as_string(), "WeightVersionNotReady");
  EXPECT_EQ(body.at("failed_bound").as_string(), "max_staleness");
  EXPECT_TRUE(body.at("target_version").is_null());
  EXPECT_NE(r.body.find("max_staleness 1"), std::string::npos) << r.body;
  EXPECT_TRUE(fake_.RequestsTo("/generate").empty());
  HttpResponse min =
      Send("POST", "/generate", R"({"text":"hi","weight_version":{"min_version":4}})");
  ASSERT_EQ(min.status, 409) << min.body;
  EXPECT_EQ(ParseObject(min.body).at("failed_bound").as_string(), "min_version");
}

TEST_F(ProxyTest, MalformedBodyOrConstraintGets400) {
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  HttpResponse not_json = Send("POST", "/generate", "{not json");
  EXPECT_EQ(not_json.status, 400);
  EXPECT_EQ(ParseObject(not_json.body).at("error").at("type").as_string(), "BadRequest");
  HttpResponse bad =
      Send("POST", "/generate", R"({"text":"x","weight_version":{"min_version":-1}})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("weight_version"), std::string::npos) << bad.body;
  EXPECT_TRUE(fake_.RequestsTo("/generate").empty());
}

// Boost.JSON would keep one of two values silently; the sidecar refuses. So
// it does an exact version below the minimum, which no version satisfies.
TEST_F(ProxyTest, ContradictoryConstraintsOrARepeatedConstraintKeyGets400) {
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  for (const char* body : {
           R"({"text":"x","weight_version":{"min_version":1,"exact_version":0}})",
           R"({"text":"x","weight_version":{"min_version":0},"weight_version":{"min_version":5}})",
           R"({"text":"x","weight_version":{"exact_version":5,"exact_version":0}})",
       }) {
    HttpResponse r = Send("POST", "/generate", body);
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
    EXPECT_EQ(ParseObject(r.body).at("error").at("type").as_string(), "BadRequest");
    EXPECT_NE(r.body.find("weight_version"), std::string::npos) << r.body;
  }
  EXPECT_TRUE(fake_.RequestsTo("/generate").empty());
}

TEST_F(ProxyTest, EngineControlRoutesAreBlocked) {
  Start(fake_.url());
  for (std::string path : {"/pause_generation", "/update_weights_from_disk", "/stage_weight_update",
                           "/abort_request", "/flush_cache"}) {
    HttpResponse r = Send("POST", path, "{}");
    EXPECT_EQ(r.status, 403) << path;
    EXPECT_EQ(ParseObject(r.body).at("error").at("type").as_string(), "RouteBlocked");
    EXPECT_NE(r.body.find(path), std::string::npos);
  }
  EXPECT_TRUE(fake_.requests().empty());
}

TEST_F(ProxyTest, OtherRoutesAreForwardedAsIs) {
  fake_.SetAnswer("/model_info", JsonResponse(200, R"({"model_path":"/m"})"));
  Start(fake_.url());
  HttpResponse r = Send("GET", "/model_info");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(ParseObject(r.body).at("model_path").as_string(), "/m");
  ASSERT_EQ(fake_.RequestsTo("/model_info").size(), 1u);
  EXPECT_EQ(fake_.RequestsTo("/model_info")[0].method, "GET");
}

// One scrape gives the sidecar's families and then the engine's own, so that
// dashboards made for the engine keep working; without them it says so.
TEST_F(ProxyTest, MetricsCarryTheEnginesOwnFamiliesAfterTheSidecars) {
  HttpResponse engine_metrics = JsonResponse(
      200, "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"m\"} 3");
  engine_metrics.headers.Set("Content-Type", "text/plain; version=0.0.4");
  fake_.SetAnswer("/metrics", engine_metrics);
  Start(fake_.url());
  HttpResponse r = Send("GET", "/metrics");
  EXPECT_EQ(r.status, 200);
  const size_t ours = r.body.find("stitch_sidecar_ready ");
  const size_t theirs = r.body.find("sglang:num_running_reqs{model_name=\"m\"} 3\n");
  ASSERT_NE(ours, std::string::npos) << r.body;
  ASSERT_NE(theirs, std::string::npos) << r.body;
  EXPECT_LT(ours, theirs);
  EXPECT_NE(r.body.find("stitch_sidecar_engine_metrics_up 1"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.back(), '\n');

  fake_.SetAnswer("/metrics", JsonResponse(404, "{}"));
  r = Send("GET", "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("stitch_sidecar_engine_metrics_up 0"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("sglang:"), std::string::npos) << r.body;
}

TEST_F(ProxyTest, TransportFailureGivesARetryable503AndReleasesAdmission) {
  Start(stitch::testing::UnreachableUrl());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  HttpResponse r = Send("POST", "/generate", R"({"text":"hi","rid":"lost"})");
  ASSERT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.headers.Get("retry-after"), "1");
  json::object body = ParseObject(r.body).at("error").as_object();
  EXPECT_EQ(body.at("type").as_string(), "EngineUnavailable");
  EXPECT_EQ(body.at("retryable").as_bool(), true);
  EXPECT_EQ(Active(), 0);
  // The best-effort abort went out.
  EXPECT_TRUE(WaitUntil([&] {
    auto aborted = Aborted();
    return aborted.size() == 1 && IsUpstreamRidOf(aborted[0], "lost");
  }));
  HttpResponse other = Send("GET", "/model_info");
  EXPECT_EQ(other.status, 503);
}

TEST_F(ProxyTest, ClientDisconnectAbortsUpstreamAndReleasesAdmission) {
  fake_.Hang("/generate");
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  {
    RawSocket client(sidecar_->port());
    ASSERT_TRUE(client.connected());
    std::string body = R"({"text":"hi","rid":"gone-1"})";
    client.Send(RawGenerate(body));
    ASSERT_TRUE(WaitUntil([&] { return fake_.in_flight() == 1; }));
    EXPECT_EQ(Active(), 1);
  }  // the client goes away
  ExpectTheGenerationEndedWithItsClient("gone-1");
}

TEST_F(ProxyTest, StreamedEventsAreStampedAsTheyArrive) {
  fake_.SetStreamEvents(3);
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  EventLoop client_loop;
  HttpClient client(client_loop.executor());
  auto url = ParseHttpUrl(sidecar_->url());
  HttpRequest request;
  request.method = "POST";
  request.target = "/generate";
  request.headers.Set("Content-Type", "application/json");
  request.body = R"({"text":"hi","stream":true,"weight_version":{"min_version":0}})";
  auto stream = client_loop.BlockOn(client.SendStreamed(url->origin, request));
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(stream->status(), 200);

  SseEventSplitter splitter;
  std::vector<std::string> events;
  auto next_event = [&]() -> std::optional<std::string> {
    for (;;) {
      if (auto e = splitter.Next()) return e;
      auto chunk = client_loop.BlockOn(stream->Read());
      if (!chunk.ok() || chunk->empty()) return std::nullopt;
      splitter.Append(*chunk);
    }
  };
  // The first event arrives while the engine still holds the second: the
  // sidecar streams, it does not buffer.
  std::optional<std::string> first = next_event();
  ASSERT_TRUE(first.has_value());
  json::object e0 = ParseObject(*SseData(*first));
  EXPECT_EQ(e0.at("index").as_int64(), 0);
  EXPECT_EQ(e0.at("meta_info").at("weight_version_start").as_int64(), 0);
  EXPECT_EQ(e0.at("meta_info").at("weight_version_end").as_int64(), 0);
  EXPECT_EQ(Active(), 1);
  fake_.ReleaseStream();
  for (int i = 1; i < 3; ++i) {
    std::optional<std::string> e = next_event();
    ASSERT_TRUE(e.has_value());
    json::object event = ParseObject(*SseData(*e));
    EXPECT_EQ(event.at("index").as_int64(), i);
    EXPECT_EQ(event.at("meta_info").at("weight_version").as_string(), "0");
  }
  std::optional<std::string> done = next_event();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(SseData(*done), "[DONE]");
  EXPECT_FALSE(next_event().has_value());
  EXPECT_TRUE(WaitUntil([&] { return Active() == 0; }));
}

// An engine that labels each event and counts its tokens: the sidecar
// derives exact spans across a commit inside the generation.
TEST_F(ProxyTest, StreamedSpansAreDerivedFromTheEnginesLabelsAcrossACommit) {
  fake_.SetWeightVersion("r1/weight_v000000");
  fake_.SetStreamEvents(3);
  Start(fake_.url());
  Streamed s;
  ASSERT_NO_FATAL_FAILURE(StreamAcrossACommit(s));
  for (int i = 1; i < 3; ++i) {
    std::optional<std::string> e = s.Next();
    ASSERT_TRUE(e.has_value());
    const json::object meta = ParseObject(*e).at("meta_info").as_object();
    EXPECT_EQ(json::serialize(meta.at("weight_version_spans")), "[[0,0],[1,1]]") << *e;
    EXPECT_EQ(meta.at("weight_version_start").as_int64(), 0);
    EXPECT_EQ(meta.at("weight_version_end").as_int64(), 1);
  }
  EXPECT_EQ(s.Next(), "[DONE]");
}

// An engine that reports each generation's spans on its last event: across a
// commit, those are stamped. Where the engine does not place commits exactly
// (stock SGLang), every event after the commit says "unknown".
void ProxyTest::FinalSpansAcrossACommit(bool engine_places_commits) {
  fake_.SetWeightVersion("r1/weight_v000000");
  fake_.SetStreamEvents(3);
  fake_.SetFinalSpans(true);
  engine_->places_commits_exactly = engine_places_commits;
  Start(fake_.url());
  Streamed s;
  ASSERT_NO_FATAL_FAILURE(StreamAcrossACommit(s));
  std::vector<std::string> spans;
  for (int i = 1; i < 3; ++i) {
    std::optional<std::string> e = s.Next();
    ASSERT_TRUE(e.has_value());
    const json::object meta = ParseObject(*e).at("meta_info").as_object();
    spans.push_back(json::serialize(meta.at("weight_version_spans")));
    EXPECT_EQ(meta.at("weight_version_end").as_int64(), 1);
  }
  EXPECT_EQ(s.Next(), "[DONE]");
  if (engine_places_commits) {
    EXPECT_EQ(spans, (std::vector<std::string>{"[[0,0],[1,1]]", "[[0,0],[1,1]]"}));
  } else {
    EXPECT_EQ(spans, (std::vector<std::string>{R"("unknown")", R"("unknown")"}));
  }
}

TEST_F(ProxyTest, StreamedSpansComeFromTheEnginesFinalReportAcrossACommit) {
  FinalSpansAcrossACommit(/*engine_places_commits=*/true);
}

TEST_F(ProxyTest, SpansAcrossACommitAreUnknownWhereTheEngineDoesNotPlaceItExactly) {
  FinalSpansAcrossACommit(/*engine_places_commits=*/false);
}

// An engine that says nothing per event (SGLang's OpenAI streams): across a
// commit the sidecar knows only start and end, and says the spans are
// unknown rather than guess.
TEST_F(ProxyTest, SpansAreUnknownWhenACommitHappensAndTheEngineReportsNothing) {
  fake_.SetStreamEvents(3);
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  Streamed s;
  OpenStream(s, "/v1/completions", R"({"prompt":"hi","stream":true})");
  std::optional<std::string> first = s.Next();
  ASSERT_TRUE(first.has_value());
  // Nothing changed yet: everything so far came from version 0.
  EXPECT_EQ(json::serialize(ParseObject(*first).at("weight_version_spans")), "[[0,0]]");
  CommitInPlace(1);
  fake_.ReleaseStream();
  for (int i = 1; i < 3; ++i) {
    std::optional<std::string> e = s.Next();
    ASSERT_TRUE(e.has_value());
    const json::object event = ParseObject(*e);
    EXPECT_EQ(event.at("weight_version_spans").as_string(), "unknown") << *e;
    EXPECT_EQ(event.at("weight_version_start").as_int64(), 0);
    EXPECT_EQ(event.at("weight_version_end").as_int64(), 1);
  }
}

// Spans the engine reports pass through when they name weights it held, and
// make the answer unvouched (retryable) when they do not.
TEST_F(ProxyTest, ReportedSpansPassThroughOnlyWhenTheyNameWeightsTheEngineHeld) {
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  fake_.SetAnswer(
      "/v1/completions",
      JsonResponse(200, R"({"id":"cmpl-x","metadata":{"weight_version":"0"},)"
                        R"("usage":{"completion_tokens":4},"weight_version_spans":[[0,0]]})"));
  HttpResponse ok = Send("POST", "/v1/completions", R"({"prompt":"hi"})");
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(json::serialize(ParseObject(ok.body).at("weight_version_spans")), "[[0,0]]");
  fake_.SetAnswer("/v1/completions",
                  JsonResponse(200, R"({"id":"cmpl-x","metadata":{"weight_version":"0"},)"
                                    R"("weight_version_spans":[[0,0],[2,3]]})"));
  HttpResponse refused = Send("POST", "/v1/completions", R"({"prompt":"hi"})");
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_EQ(refused.body.find("weight_version_start"), std::string::npos) << refused.body;
  // A mislabelled answer withdraws trust until the engine is verified again.
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  // SGLang's form: labels, in `metadata` of a one-choice answer.
  fake_.SetAnswer("/v1/completions",
                  JsonResponse(200, R"({"choices":[{"text":"ab"}],"usage":{"completion_tokens":2},)"
                                    R"("metadata":{"weight_version":"r1/weight_v000000",)"
                                    R"("weight_versions":[{"version":"r1/weight_v000000",)"
                                    R"("start":0,"end":2}]}})"));
  ok = Send("POST", "/v1/completions", R"({"prompt":"hi"})");
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(json::serialize(ParseObject(ok.body).at("weight_version_spans")), "[[0,0]]");
  fake_.SetAnswer("/v1/completions",
                  JsonResponse(200, R"({"choices":[{"text":"ab"}],"usage":{"completion_tokens":2},)"
                                    R"("metadata":{"weight_version":"r1/weight_v000000",)"
                                    R"("weight_versions":[{"version":"r1/weight_v000000",)"
                                    R"("start":0,"end":1},{"version":"r1/weight_v000004",)"
                                    R"("start":1,"end":2}]}})"));
  refused = Send("POST", "/v1/completions", R"({"prompt":"hi"})");
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_NE(refused.body.find("weight_v000004"), std::string::npos) << refused.body;
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  // vLLM's form, on its token route: in the choice.
  fake_.SetAnswer("/inference/v1/generate",
                  JsonResponse(200, R"({"request_id":"generate-tokens-x","choices":[{"index":0,)"
                                    R"("token_ids":[5,6],"weight_versions":[{"version":)"
                                    R"("r1/weight_v000000","start":0,"end":2}]}],)"
                                    R"("usage":{"completion_tokens":2}})"));
  ok = Send("POST", "/inference/v1/generate",
            R"({"token_ids":[1,2],"sampling_params":{"max_tokens":2},)"
            R"("weight_version":{"exact_version":0}})");
  ASSERT_EQ(ok.status, 200) << ok.body;
  const json::object tokens = ParseObject(ok.body);
  EXPECT_EQ(json::serialize(tokens.at("weight_version_spans")), "[[0,0]]");
  EXPECT_EQ(tokens.at("weight_version_start").as_int64(), 0);
  const json::object sent = ParseObject(fake_.RequestsTo("/inference/v1/generate").back().body);
  EXPECT_FALSE(sent.contains("weight_version")) << json::serialize(sent);
}

// A whole /generate sent to an engine that labels each streamed event, with
// two in-place commits landing inside the generation: the sidecar streams it
// from the engine, places each commit exactly, and answers with the whole
// answer. `incremental`: the engine streams only what is new.
void ProxyTest::WholeGenerateAcrossTwoCommits(bool incremental) {
  fake_.SetStreamEvents(4);
  fake_.SetStepwise(true);
  fake_.SetIncrementalStreams(incremental);
  Start(fake_.url(), [](Sidecar::Settings& s) { s.proxy.assemble_whole_generate = true; });
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  auto whole = std::async(std::launch::async, [&] {
    return Send("POST", "/generate", R"({"text":"hi","rid":"whole-1"})");
  });
  // However this ends, the engine's stream ends and the request returns.
  struct Unblock {
    FakeSglangServer& fake;
    ~Unblock() {
      for (int i = 0; i < 4; ++i) fake.Step();
    }
  } unblock{fake_};
  ASSERT_TRUE(WaitUntil([&] { return fake_.events_sent() == 1; }));
  CommitInPlace(1);
  fake_.Step();
  ASSERT_TRUE(WaitUntil([&] { return fake_.events_sent() == 2; }));
  CommitInPlace(2);
  fake_.Step();
  fake_.Step();
  HttpResponse r = whole.get();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers.Get("content-type"), "application/json");
  const json::object answer = ParseObject(r.body);
  EXPECT_EQ(answer.at("text").as_string(), "xxxx");
  EXPECT_EQ(json::serialize(answer.at("output_ids")), "[1,2,3,4]");
  const json::object& meta = answer.at("meta_info").as_object();
  // Token 0 from version 0, token 1 from 1, the rest from 2.
  EXPECT_EQ(json::serialize(meta.at("weight_version_spans")), "[[0,0],[1,1],[2,2]]");
  EXPECT_EQ(meta.at("weight_version_start").as_int64(), 0);
  EXPECT_EQ(meta.at("weight_version_end").as_int64(), 2);
  EXPECT_EQ(meta.at("completion_tokens").as_int64(), 4);
  // The engine was asked to stream it; the client gets its own rid back.
  std::vector<HttpRequest> sent = fake_.RequestsTo("/generate");
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(ParseObject(sent[0].body).at("stream").as_bool(), true);
  EXPECT_EQ(Active(), 0);
  HttpResponse metrics = Send("GET", "/metrics");
  EXPECT_NE(metrics.body.find("stitch_sidecar_assembled_responses_total 1"), std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("stitch_sidecar_streamed_requests_total 0"), std::string::npos)
      << metrics.body;
}

TEST_F(ProxyTest, AWholeGenerateIsAssembledFromTheEnginesStreamWithExactSpans) {
  WholeGenerateAcrossTwoCommits(/*incremental=*/false);
}

TEST_F(ProxyTest, AWholeGenerateIsAssembledFromAnIncrementalStreamWithExactSpans) {
  WholeGenerateAcrossTwoCommits(/*incremental=*/true);
}

// A client that leaves while its whole answer is being assembled ends the
// engine's stream, and its generation, as any client that leaves.
TEST_F(ProxyTest, AClientThatLeavesWhileItsAnswerIsAssembledEndsTheEngineStream) {
  fake_.SetStreamEvents(3);
  fake_.SetStepwise(true);
  Start(fake_.url(), [](Sidecar::Settings& s) { s.proxy.assemble_whole_generate = true; });
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  {
    RawSocket client(sidecar_->port());
    ASSERT_TRUE(client.connected());
    client.Send(RawGenerate(R"({"text":"hi","rid":"gone-3"})"));
    ASSERT_TRUE(WaitUntil([&] { return fake_.events_sent() == 1; }));
    EXPECT_EQ(Active(), 1);
  }  // the client goes away while the engine holds the second event
  ExpectTheGenerationEndedWithItsClient("gone-3");
}

// An SSE body of the given events (each a JSON document), then [DONE].
HttpResponse EventStream(std::initializer_list<std::string_view> events) {
  std::string body;
  for (std::string_view e : events) body += SseEvent(std::string(e));
  body += SseEvent("[DONE]");
  HttpResponse r{200, {}, std::move(body)};
  r.headers.Set("Content-Type", "text/event-stream");
  return r;
}

// Streaming from the engine stops once it shows it reports spans itself
// (they are exact whole too), and is never used for a batch.
TEST_F(ProxyTest, WholeGenerateGoesWholeForABatchAndOnceTheEngineReportsSpans) {
  Start(fake_.url(), [](Sidecar::Settings& s) { s.proxy.assemble_whole_generate = true; });
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  HttpResponse batch = Send("POST", "/generate", R"({"text":["a","b"]})");
  EXPECT_EQ(batch.status, 200) << batch.body;
  fake_.SetAnswer("/generate",
                  EventStream({R"({"text":"ab","output_ids":[5,6],"meta_info":{"id":"x",)"
                               R"("weight_version":"0","completion_tokens":2,)"
                               R"("weight_version_spans":[[0,0]]}})"}));
  HttpResponse first = Send("POST", "/generate", R"({"text":"hi"})");
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_EQ(json::serialize(ParseObject(first.body).at("meta_info").at("weight_version_spans")),
            "[[0,0]]");
  fake_.SetAnswer("/generate", JsonResponse(200, R"({"text":"ab","meta_info":{"id":"x",)"
                                                 R"("weight_version":"0","completion_tokens":2,)"
                                                 R"("weight_version_spans":[[0,0]]}})"));
  HttpResponse second = Send("POST", "/generate", R"({"text":"hi"})");
  ASSERT_EQ(second.status, 200) << second.body;
  std::vector<HttpRequest> sent = fake_.RequestsTo("/generate");
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_FALSE(ParseObject(sent[0].body).contains("stream")) << sent[0].body;
  EXPECT_EQ(ParseObject(sent[1].body).at("stream").as_bool(), true);
  EXPECT_FALSE(ParseObject(sent[2].body).contains("stream")) << sent[2].body;
}

// A stream that cannot be assembled exactly is never guessed at: the answer
// is a retryable 503, and later whole requests go to the engine whole.
TEST_F(ProxyTest, AStreamThatCannotBeAssembledIsARetryable503AndLaterOnesGoWhole) {
  Start(fake_.url(), [](Sidecar::Settings& s) { s.proxy.assemble_whole_generate = true; });
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  fake_.SetAnswer("/generate",
                  EventStream({R"({"text":"a","output_ids":[5],)"
                               R"("meta_info":{"weight_version":"0","completion_tokens":1}})",
                               R"({"text":"abc","output_ids":[5,6,7],)"
                               R"("meta_info":{"weight_version":"0","completion_tokens":2}})"}));
  HttpResponse refused = Send("POST", "/generate", R"({"text":"hi"})");
  ASSERT_EQ(refused.status, 503) << refused.body;
  EXPECT_EQ(refused.headers.Get("retry-after"), "1");
  EXPECT_NE(refused.body.find("could not be assembled"), std::string::npos) << refused.body;
  EXPECT_NE(refused.body.find("event 2"), std::string::npos) << refused.body;
  EXPECT_EQ(Active(), 0);
  fake_.SetAnswer("/generate", JsonResponse(200, R"({"text":"ab","meta_info":{"id":"x",)"
                                                 R"("weight_version":"0"}})"));
  HttpResponse whole = Send("POST", "/generate", R"({"text":"hi"})");
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(json::serialize(ParseObject(whole.body).at("meta_info").at("weight_version_spans")),
            "[[0,0]]");
  std::vector<HttpRequest> sent = fake_.RequestsTo("/generate");
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_FALSE(ParseObject(sent[1].body).contains("stream")) << sent[1].body;
}

// An error the engine streams is what SGLang answers the whole request: a
// 400 with that body.
TEST_F(ProxyTest, AnErrorEventInTheEnginesStreamIsAnsweredAsTheWholeRequestsError) {
  Start(fake_.url(), [](Sidecar::Settings& s) { s.proxy.assemble_whole_generate = true; });
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  fake_.SetAnswer("/generate", EventStream({R"({"error":{"message":"prompt too long"}})"}));
  HttpResponse r = Send("POST", "/generate", R"({"text":"hi"})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.body, R"({"error":{"message":"prompt too long"}})");
  EXPECT_EQ(Active(), 0);
}

TEST_F(ProxyTest, AStreamingClientThatLeavesEndsTheEngineStreamAndReleasesAdmission) {
  fake_.SetStreamEvents(3);
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  {
    RawSocket client(sidecar_->port());
    ASSERT_TRUE(client.connected());
    std::string body = R"({"text":"hi","rid":"gone-2","stream":true})";
    client.Send(RawGenerate(body));
    // The first event came through; the engine holds the next one.
    std::string got = client.ReadUntil("\n\n");
    EXPECT_NE(got.find(R"("index":0)"), std::string::npos) << got;
    EXPECT_EQ(Active(), 1);
    EXPECT_EQ(fake_.disconnects(), 0);
  }  // the client goes away mid-stream
  ExpectTheGenerationEndedWithItsClient("gone-2");
}

// The engine labels its answer with weights the sidecar did not load (its
// weights were changed behind the sidecar's back): the answer is not
// stamped but refused as retryable, and trust in the engine is withdrawn.
TEST_F(ProxyTest, AnAnswerLabelledWithOtherWeightsIsRefusedAndWithdrawsTrust) {
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  fake_.SetWeightVersion("r1/weight_v000004");
  HttpResponse r = Send("POST", "/v1/completions", R"({"prompt":"hi"})");
  ASSERT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.headers.Get("retry-after"), "1");
  json::object body = ParseObject(r.body).at("error").as_object();
  EXPECT_EQ(body.at("type").as_string(), "EngineUnavailable");
  EXPECT_EQ(body.at("retryable").as_bool(), true);
  EXPECT_NE(r.body.find("weight_v000004"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("weight_version_start"), std::string::npos) << r.body;
  HttpResponse metrics = Send("GET", "/metrics");
  EXPECT_NE(metrics.body.find("stitch_sidecar_engine_distrusts_total 1"), std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("stitch_sidecar_unvouched_responses_total 1"), std::string::npos)
      << metrics.body;
}

// Trust withdrawn while a stream runs: what was sent was vouched for, the
// rest is not; the stream ends with an error event instead of [DONE], and
// the engine is told to abort the generation.
TEST_F(ProxyTest, AStreamWhoseWeightsAreDistrustedMidwayEndsWithAnErrorEvent) {
  fake_.SetStreamEvents(3);
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  RawSocket client(sidecar_->port());
  ASSERT_TRUE(client.connected());
  client.Send(RawGenerate(R"({"text":"hi","rid":"mid","stream":true})"));
  std::string first = client.ReadUntil("\n\n");
  EXPECT_NE(first.find(R"("weight_version_start":0)"), std::string::npos) << first;
  OnLoop([&] {
    sidecar_->reconciler().Distrust("the engine restarted (test)");
    return 0;
  });
  EXPECT_TRUE(WaitUntil([&] {
    auto aborted = Aborted();
    return aborted.size() == 1 && IsUpstreamRidOf(aborted[0], "mid");
  }));
  fake_.ReleaseStream();
  bool closed = false;
  std::string rest = client.ReadUntilClosed(&closed);
  EXPECT_TRUE(closed);
  EXPECT_NE(rest.find("EngineUnavailable"), std::string::npos) << rest;
  EXPECT_NE(rest.find("the engine restarted (test)"), std::string::npos) << rest;
  EXPECT_EQ(rest.find("[DONE]"), std::string::npos) << rest;
  EXPECT_EQ(rest.find(R"("index":1)"), std::string::npos) << rest;
}

TEST_F(ProxyTest, MetricsBypassAdmissionBeforeTheFirstPointerExists) {
  // No pointer in the store, the engine still initializing, and admission
  // closed (as during a commit): /metrics answers anyway.
  engine_->HoldNext(ScriptedEngine::kInit);
  Start(fake_.url());
  std::optional<absl::StatusOr<AdmissionGate::CommitWindow>> window;
  loop_->BlockOn([&]() -> awaitable<void> {
    window.emplace(co_await sidecar_->gate().Close(DrainScope::kAll));
  }());
  ASSERT_TRUE(window->ok());
  HttpResponse metrics = Send("GET", "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.headers.Get("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  // Nothing is verified yet: no applied version is claimed.
  EXPECT_EQ(metrics.body.find("stitch_sidecar_applied_version{"), std::string::npos)
      << metrics.body;
  for (std::string line :
       {"stitch_sidecar_engine_verified 0", "stitch_sidecar_ready 0",
        "stitch_sidecar_requests_in_flight 0", "stitch_sidecar_sync_state{state=\"IDLE\"} 1",
        "stitch_sidecar_requests_admitted_total 0",
        "# TYPE stitch_sidecar_commits_total counter"}) {
    EXPECT_NE(metrics.body.find(line), std::string::npos) << line << "\n" << metrics.body;
  }
  HttpResponse health = Send("GET", "/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(ParseObject(health.body).at("ready").as_bool(), false);
  EXPECT_NE(health.body.find("initializing"), std::string::npos) << health.body;
  HttpResponse info = Send("GET", "/server_info");
  EXPECT_EQ(info.status, 200);
  auto state = ParseServerInfo(info.body);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_FALSE(state->ready);
  EXPECT_FALSE(state->update_destination_ready);
  OnLoop([&] {
    window.reset();
    engine_->Release(ScriptedEngine::kInit);
    return 0;
  });
  EXPECT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  health = Send("GET", "/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, R"({"ready":true})");
}

TEST_F(ProxyTest, WakeAnswersWithServerInfo) {
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  HttpResponse r = Send("POST", "/wake");
  EXPECT_EQ(r.status, 200);
  auto state = ParseServerInfo(r.body);
  ASSERT_TRUE(state.ok()) << state.status() << r.body;
  EXPECT_EQ(state->run_id, "r1");
  EXPECT_EQ(state->applied, (VersionRef{"r1", 0}));
}

TEST_F(ProxyTest, TheTokenGuardsWakeAndWithTheDataPlaneEveryRouteButHealthAndMetrics) {
  fake_.SetAnswer("/model_info", JsonResponse(200, R"({"model_path":"/m"})"));
  Start(fake_.url(), [](Sidecar::Settings& s) {
    s.auth_token = "fleet-token";
    s.auth_data_plane = true;
    s.proxy.own_authorization = true;
    s.proxy.engine_token = "engine-key";
  });
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  const std::string generate = R"({"text":"hi","sampling_params":{}})";
  for (const auto& [method, path] :
       std::vector<std::pair<std::string, std::string>>{{"POST", "/wake"},
                                                        {"GET", "/server_info"},
                                                        {"POST", "/generate"},
                                                        {"GET", "/model_info"}}) {
    HttpResponse refused = Send(method, path, method == "POST" ? generate : "");
    EXPECT_EQ(refused.status, 401) << method << " " << path << ": " << refused.body;
    EXPECT_NE(refused.body.find("\"Unauthorized\""), std::string::npos) << refused.body;
    EXPECT_EQ(Send(method, path, method == "POST" ? generate : "", "Bearer wrong").status, 401);
  }
  EXPECT_EQ(Send("GET", "/health").status, 200);
  EXPECT_EQ(Send("GET", "/metrics").status, 200);
  // Only the sidecar's own scrape of the engine's metrics reached it.
  ASSERT_EQ(fake_.requests().size(), 1u) << "nothing unauthorized reached the engine";
  EXPECT_EQ(fake_.requests()[0].target, "/metrics");

  EXPECT_EQ(Send("POST", "/wake", "", "Bearer fleet-token").status, 200);
  EXPECT_EQ(Send("GET", "/server_info", "", "Bearer fleet-token").status, 200);
  EXPECT_EQ(Send("POST", "/generate", generate, "Bearer fleet-token").status, 200);
  EXPECT_EQ(Send("GET", "/model_info", "", "Bearer fleet-token").status, 200);
  // The engine sees its own key, never the fleet's token.
  ASSERT_EQ(fake_.requests().size(), 3u);
  for (const HttpRequest& r : fake_.requests()) {
    EXPECT_EQ(r.headers.Get("authorization"), "Bearer engine-key") << r.target;
  }
}

TEST_F(ProxyTest, WithoutTheDataPlaneOnlyWakeNeedsTheToken) {
  Start(fake_.url(), [](Sidecar::Settings& s) {
    s.auth_token = "fleet-token";
    s.proxy.own_authorization = true;
  });
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  EXPECT_EQ(Send("POST", "/wake").status, 401);
  EXPECT_EQ(Send("GET", "/server_info").status, 200);
  EXPECT_EQ(Send("POST", "/generate", R"({"text":"hi"})", "Bearer fleet-token").status, 200);
  // The client's credential was for the sidecar: it does not reach the engine.
  ASSERT_EQ(fake_.requests().size(), 1u);
  EXPECT_FALSE(fake_.requests()[0].headers.Has("authorization"));
}

TEST_F(ProxyTest, WithoutTokensAClientsAuthorizationReachesTheEngine) {
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  EXPECT_EQ(Send("POST", "/wake").status, 200);
  EXPECT_EQ(Send("POST", "/generate", R"({"text":"hi"})", "Bearer client-key").status, 200);
  ASSERT_EQ(fake_.requests().size(), 1u);
  EXPECT_EQ(fake_.requests()[0].headers.Get("authorization"), "Bearer client-key");
}

TEST_F(ProxyTest, RequestWaitingForACommitIsReleasedWhenItsClientLeaves) {
  Start(fake_.url());
  ASSERT_TRUE(WaitUntil([&] { return ReadyAt(0); }));
  std::optional<absl::StatusOr<AdmissionGate::CommitWindow>> window;
  loop_->BlockOn([&]() -> awaitable<void> {
    window.emplace(co_await sidecar_->gate().Close(DrainScope::kAll));
  }());
  {
    RawSocket client(sidecar_->port());
    std::string body = R"({"text":"hi"})";
    client.Send(RawGenerate(body));
    ASSERT_TRUE(WaitUntil([&] {
      return OnLoop([&] { return sidecar_->proxy().counters().versioned_requests; }) == 1;
    }));
  }
  EXPECT_TRUE(WaitUntil([&] {
    return OnLoop([&] { return sidecar_->proxy().counters().client_disconnects; }) == 1;
  }));
  OnLoop([&] {
    window.reset();
    return 0;
  });
  EXPECT_EQ(Active(), 0);
  EXPECT_TRUE(fake_.RequestsTo("/generate").empty());
}

}  // namespace
}  // namespace stitch
