// The gateway against scripted replicas (HTTP servers in this process that speak
// the sidecar's /server_info, /wake and versioned /generate contract), on a
// manual clock: polls, probe timeouts, waits for the fleet and stalls happen
// only when a test moves the gateway's time.
#include "stitch/gateway/gateway.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "stitch/api/server_info.h"
#include "stitch/core/json.h"
#include "stitch/core/state.h"
#include "stitch/net/auth.h"
#include "stitch/net/client.h"
#include "stitch/net/clock.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/net_test_util.h"
#include "stitch/net/server.h"
#include "stitch/net/worker_pool.h"
#include "stitch/pool/pool.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace json = boost::json;
using boost::asio::awaitable;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr auto kDeadline = std::chrono::seconds(20);

bool Eventually(const std::function<bool()>& condition,
                std::chrono::milliseconds timeout = kDeadline) {
  return testing::Eventually(condition, timeout);
}

// The value of an unlabelled sample in Prometheus text, or -1.
int64_t MetricValue(const std::string& text, const std::string& name) {
  const std::string line = "\n" + name + " ";
  const size_t at = text.find(line);
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + line.size()));
}

json::object Parse(const std::string& text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec || !v.is_object()) return {};
  return v.get_object();
}

// A scripted replica: its readiness, version and failure mode are set by the test.
class ScriptedReplica {
 public:
  // kHold: like a frozen engine behind a live sidecar, /generate answers
  // nothing (while /server_info still does) until Release(), then serves.
  enum class Mode { kServe, kUnavailable, kDieMidRequest, kHang, kHold };

  ScriptedReplica(EventLoop& loop, bool ready, int64_t version) : loop_(loop) {
    ready_ = ready;
    version_ = version;
    HttpRouter router;
    router.Add("GET", "/server_info", [this](HttpExchange& ex) { return ServerInfo(ex); });
    router.Add("POST", "/wake", [this](HttpExchange& ex) { return Wake(ex); });
    router.Add("POST", "/generate", [this](HttpExchange& ex) { return Generate(ex); });
    router.SetFallback([this](HttpExchange& ex) { return Other(ex); });
    auto server = HttpServer::Start(loop.executor(), ServerOptions{}, router.AsHandler());
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    url_ = server_->url();
  }
  ~ScriptedReplica() {
    Release();
    loop_.BlockOn(server_->Shutdown());
  }

  const std::string& url() const { return url_; }
  void set_ready(bool ready) { ready_ = ready; }
  void set_version(int64_t v) { version_ = v; }
  // `v` is published while this replica idles in its reconcile backoff: it
  // reads the pointer, and applies `v`, only at its next wake.
  void set_applied_at_next_wake(int64_t v) { at_next_wake_ = v; }
  // The store's pointer as this replica last read it (-1: none).
  void set_pointer(int64_t v) { pointer_ = v; }
  // The constraints of the requests it was sent, in order.
  std::vector<std::string> constraints() const {
    absl::MutexLock lock(&mu_);
    return constraints_;
  }
  void set_run(std::string run) {
    absl::MutexLock lock(&mu_);
    run_ = std::move(run);
  }
  // Ends kHold: held requests, and every later one, are served.
  void Release() {
    boost::asio::post(loop_.executor(), [this] {
      released_ = true;
      for (boost::asio::steady_timer* t : holds_) t->cancel();
    });
  }
  int held() const { return held_; }
  void set_info_hangs(bool hangs) { info_hangs_ = hangs; }
  void set_mode(Mode mode) { mode_ = mode; }
  // /wake and every other route but the versioned ones then need this
  // bearer token, as a sidecar's /wake and an engine's --api-key routes do.
  void set_wake_token(std::string token) { wake_token_ = std::move(token); }
  int generates() const { return generates_; }
  int wakes() const { return wakes_; }
  int others() const { return others_; }
  int disconnects() const { return disconnects_; }

 private:
  std::string run() const {
    absl::MutexLock lock(&mu_);
    return run_;
  }
  std::string Applied() const { return VersionRef{run(), version_}.ToString(); }

  awaitable<void> ServerInfo(HttpExchange& ex) {
    if (info_hangs_) {  // a frozen sidecar: the probe gets nothing
      co_await ex.WaitDisconnected();
      co_return;
    }
    ReplicaState s;
    s.ready = ready_;
    s.applied = VersionRef{run(), version_};
    if (pointer_ >= 0) s.pointer = VersionRef{run(), pointer_.load()};
    s.run_id = run();
    std::string body = ServerInfoJson(s);
    (void)co_await ex.Respond(JsonResponse(200, std::move(body)));
  }
  awaitable<void> Wake(HttpExchange& ex) {
    if (!wake_token_.empty() && !PresentsBearerToken(ex.request().headers, wake_token_)) {
      (void)co_await ex.Respond(UnauthorizedResponse("POST /wake"));
      co_return;
    }
    ++wakes_;
    if (const int64_t v = at_next_wake_.exchange(-1); v >= 0) version_ = v;
    (void)co_await ex.Respond(JsonResponse(200, "{}"));
  }
  awaitable<void> Other(HttpExchange& ex) {
    if (!wake_token_.empty() && !PresentsBearerToken(ex.request().headers, wake_token_)) {
      (void)co_await ex.Respond(UnauthorizedResponse(ex.request().target));
      co_return;
    }
    ++others_;
    (void)co_await ex.Respond(JsonResponse(200, R"({"other":true})"));
  }
  // Returns at Release(), or when the client leaves.
  awaitable<absl::Status> Hold() {
    boost::asio::steady_timer timer(loop_.executor(), boost::asio::steady_timer::time_point::max());
    holds_.insert(&timer);
    auto [ec] = co_await timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    (void)ec;
    holds_.erase(&timer);
    co_return absl::OkStatus();
  }

  awaitable<void> Generate(HttpExchange& ex) {
    ++generates_;
    if (mode_ == Mode::kHold && !released_) {
      ++held_;
      const absl::Status held = co_await ex.CancelOnDisconnect(Hold());
      (void)held;
      --held_;
      if (ex.disconnected()) {
        ++disconnects_;
        co_return;
      }
    }
    if (mode_ == Mode::kDieMidRequest) {
      server_->Stop();  // every connection drops: the caller sees a broken exchange
      co_return;
    }
    if (mode_ == Mode::kHang) {  // never answers or ends; counts the callers that leave
      if (ex.request().body.find(R"("stream":true)") != std::string::npos) {
        HttpHeaders headers;
        headers.Set("Content-Type", "text/event-stream");
        const absl::Status begun = co_await ex.BeginStream(200, headers);
        if (!begun.ok()) co_return;
        std::string first = "data: {\"token\":0}\n\n";
        const absl::Status written = co_await ex.WriteChunk(std::move(first));
        if (!written.ok()) co_return;
      }
      co_await ex.WaitDisconnected();
      ++disconnects_;
      co_return;
    }
    if (mode_ == Mode::kUnavailable) {
      (void)co_await ex.Respond(JsonResponse(503, R"({"error":{"type":"EngineUnavailable"}})"));
      co_return;
    }
    json::object body = Parse(ex.request().body);
    VersionConstraint c;
    if (const json::value* wv = body.if_contains("weight_version"))
      c = *ConstraintFromJsonValue(*wv);
    {
      absl::MutexLock lock(&mu_);
      constraints_.push_back(c.ToJson());
    }
    const std::optional<int64_t> pointer =
        pointer_ >= 0 ? std::optional<int64_t>(pointer_.load()) : std::nullopt;
    if (!c.SatisfiedBy(version_.load(), pointer)) {
      json::object conflict;
      conflict["type"] = "WeightVersionNotReady";
      if (c.target().has_value()) {
        conflict["target_version"] = *c.target();
      } else {
        conflict["target_version"] = nullptr;
      }
      conflict["applied"] = version_.load();
      conflict["applied_identity"] = Applied();
      conflict["message"] = "not yet";
      std::string text = json::serialize(conflict);
      (void)co_await ex.Respond(JsonResponse(409, std::move(text)));
      co_return;
    }
    const json::value* stream = body.if_contains("stream");
    if (stream != nullptr && stream->is_bool() && stream->get_bool()) {
      HttpHeaders headers;
      headers.Set("Content-Type", "text/event-stream");
      const absl::Status begun = co_await ex.BeginStream(200, headers);
      if (!begun.ok()) co_return;
      for (int i = 0; i < 3; ++i) {
        std::string event = "data: {\"token\":" + std::to_string(i) + "}\n\n";
        const absl::Status w = co_await ex.WriteChunk(std::move(event));
        if (!w.ok()) co_return;
      }
      const absl::Status w = co_await ex.WriteChunk("data: [DONE]\n\n");
      (void)w;
      (void)co_await ex.EndStream();
      co_return;
    }
    json::object meta;
    meta["weight_version_start"] = version_.load();
    meta["weight_version_end"] = version_.load();
    json::object out;
    out["text"] = "ok";
    out["meta_info"] = std::move(meta);
    std::string text = json::serialize(out);
    (void)co_await ex.Respond(JsonResponse(200, std::move(text)));
  }

  EventLoop& loop_;
  std::unique_ptr<HttpServer> server_;
  std::string url_;
  std::atomic<bool> ready_{false};
  std::atomic<int64_t> version_{0};
  std::atomic<int64_t> pointer_{-1};
  std::atomic<Mode> mode_{Mode::kServe};
  std::string wake_token_;
  std::atomic<int> generates_{0};
  std::atomic<int> wakes_{0};
  std::atomic<int> others_{0};
  std::atomic<int> disconnects_{0};
  std::atomic<int64_t> at_next_wake_{-1};
  std::atomic<int> held_{0};
  std::atomic<bool> info_hangs_{false};
  mutable absl::Mutex mu_;
  std::string run_ ABSL_GUARDED_BY(mu_) = "r1";
  std::vector<std::string> constraints_ ABSL_GUARDED_BY(mu_);
  // Loop thread only.
  bool released_ = false;
  std::set<boost::asio::steady_timer*> holds_;
};

struct Answer {
  int status = 0;
  std::string replica;  // X-Stitch-Replica
  std::string retry_after;
  int64_t version = -1;
  json::object body;
  std::string text;
};

// (Designated initializers of GatewayOptions trip GCC 12's
// maybe-uninitialized warning on its std::string members.)
GatewayOptions Options(std::chrono::milliseconds admission_wait,
                       std::chrono::milliseconds poll_interval) {
  GatewayOptions options;
  options.admission_wait = admission_wait;
  options.poll_interval = poll_interval;
  return options;
}

class GatewayTest : public ::testing::Test {
 protected:
  ~GatewayTest() override { StopGateway(); }

  ScriptedReplica& AddReplica(bool ready, int64_t version) {
    replicas_.push_back(std::make_unique<ScriptedReplica>(loop_, ready, version));
    return *replicas_.back();
  }
  std::string StaticSpec() const {
    std::string spec = "static:";
    for (size_t i = 0; i < replicas_.size(); ++i) spec += (i ? "," : "") + replicas_[i]->url();
    return spec;
  }

  void StartGateway(std::string spec, GatewayOptions options = Options(30s, 50ms)) {
    auto pool = MakePool(spec, WakeOptions{.timeout = 2000ms});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    poll_interval_ = options.poll_interval;
    auto gateway = Gateway::Start(loop_.executor(), *pool_, workers_, clock_, options);
    ASSERT_TRUE(gateway.ok()) << gateway.status();
    gateway_ = *std::move(gateway);
  }
  // A fresh gateway in front of one fresh replica, ready at v1, in `mode`.
  ScriptedReplica& RestartWithOneReplica(ScriptedReplica::Mode mode,
                                         GatewayOptions options = Options(30s, 50ms)) {
    StopGateway();
    replicas_.clear();
    ScriptedReplica& replica = AddReplica(true, 1);
    replica.set_mode(mode);
    StartGateway(StaticSpec(), std::move(options));
    return replica;
  }
  void StopGateway() {
    if (gateway_ == nullptr) return;
    loop_.BlockOn(gateway_->Shutdown());
    gateway_.reset();
  }

  static awaitable<PoolState> ReadSnapshot(const Gateway* g) {
    PoolState s = g->Snapshot();
    co_return s;
  }
  static awaitable<GatewayCounters> ReadCounters(const Gateway* g) {
    GatewayCounters c = g->counters();
    co_return c;
  }
  PoolState Snapshot() { return loop_.BlockOn(ReadSnapshot(gateway_.get())); }
  GatewayCounters Counters() { return loop_.BlockOn(ReadCounters(gateway_.get())); }
  // Waits for `condition` while the gateway's clock moves `step` at a time:
  // the gateway does nothing on its own clock that the test did not allow.
  // False after the real-time safety deadline.
  bool AdvanceUntil(const std::function<bool()>& condition, Clock::Duration step) {
    return Eventually([&] {
      if (condition()) return true;
      clock_.Advance(step);
      return false;
    });
  }
  // Polls until `n` replicas are ready.
  bool ReadyCount(int n) {
    return AdvanceUntil([&] { return Snapshot().ready_count() == n; }, poll_interval_);
  }
  // The next request's answer, sent from another thread.
  std::future<Answer> GenerateAsync(const std::string& constraint, bool stream = false) {
    return std::async(std::launch::async,
                      [this, constraint, stream] { return Generate(constraint, "", stream); });
  }
  static bool Ready(const std::future<Answer>& answer) {
    return answer.wait_for(0s) == std::future_status::ready;
  }

  static std::string Body(const std::string& constraint, bool stream = false) {
    std::string body = R"({"text":"hi")";
    if (!constraint.empty()) body += R"(,"weight_version":)" + constraint;
    if (stream) body += R"(,"stream":true)";
    body += "}";
    return body;
  }

  // Sends a request without waiting for its answer (for requests a held
  // replica will not answer); closing the socket is the client leaving.
  std::unique_ptr<testing::RawSocket> SendRaw(const std::string& constraint,
                                              const std::string& session = "") {
    auto client = std::make_unique<testing::RawSocket>(gateway_->port());
    EXPECT_TRUE(client->connected());
    const std::string body = Body(constraint);
    std::string head = "POST /generate HTTP/1.1\r\nHost: x\r\n";
    if (!session.empty()) head += "X-Session-Id: " + session + "\r\n";
    client->Send(absl::StrCat(head, "Content-Length: ", body.size(), "\r\n\r\n", body));
    return client;
  }

  std::string MetricsText() {
    auto metrics = HttpFetch("GET", gateway_->url() + "/metrics");
    EXPECT_TRUE(metrics.ok()) << metrics.status();
    return metrics.ok() ? metrics->body : "";
  }

  std::optional<ReplicaStatus> StatusOf(const ScriptedReplica& replica) {
    for (ReplicaStatus& r : Snapshot().replicas) {
      if (r.url == replica.url()) return std::move(r);
    }
    return std::nullopt;
  }
  bool Stalled(const ScriptedReplica& replica) {
    std::optional<ReplicaStatus> s = StatusOf(replica);
    return s.has_value() && s->stalled;
  }

  Answer Generate(const std::string& constraint, const std::string& session = "",
                  bool stream = false) {
    const std::string body = Body(constraint, stream);
    FetchOptions options;
    options.timeout = 30s;
    if (!session.empty()) options.headers.Set("X-Session-Id", session);
    auto r = HttpFetch("POST", gateway_->url() + "/generate", body, options);
    Answer a;
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      return a;
    }
    a.status = r->status;
    a.text = r->body;
    if (auto rep = r->headers.Get("X-Stitch-Replica")) a.replica = std::string(*rep);
    if (auto retry = r->headers.Get("Retry-After")) a.retry_after = std::string(*retry);
    a.body = Parse(r->body);
    if (const json::value* meta = a.body.if_contains("meta_info")) {
      a.version = meta->at("weight_version_end").as_int64();
    }
    return a;
  }

  EventLoop loop_;
  ManualClock clock_{loop_.executor()};
  Clock::Duration poll_interval_ = 50ms;
  WorkerPool workers_{2};
  std::vector<std::unique_ptr<ScriptedReplica>> replicas_;
  std::unique_ptr<Pool> pool_;
  std::unique_ptr<Gateway> gateway_;
};

TEST_F(GatewayTest, ConstraintsLandOnlyOnSatisfyingReplicas) {
  ScriptedReplica& v1 = AddReplica(true, 1);
  ScriptedReplica& v2 = AddReplica(true, 2);
  ScriptedReplica& v3 = AddReplica(true, 3);
  StartGateway(StaticSpec());
  ASSERT_TRUE(ReadyCount(3));
  std::set<std::string> any;
  for (int i = 0; i < 30; ++i) {
    Answer exact = Generate(R"({"exact_version":2})");
    EXPECT_EQ(exact.status, 200) << exact.text;
    EXPECT_EQ(exact.version, 2);
    EXPECT_EQ(exact.replica, v2.url());
    Answer min = Generate(R"({"min_version":2})");
    EXPECT_EQ(min.status, 200) << min.text;
    EXPECT_GE(min.version, 2);
    EXPECT_NE(min.replica, v1.url());
    Answer free = Generate("");
    EXPECT_EQ(free.status, 200);
    any.insert(free.replica);
  }
  EXPECT_EQ(v1.generates() + v2.generates() + v3.generates(), 90);
  EXPECT_EQ(any.size(), 3u) << "unconstrained requests spread over the pool";
  EXPECT_EQ(Counters().retried, 0u);
}

TEST_F(GatewayTest, ASessionStaysOnItsReplicaWhileItCan) {
  for (int i = 0; i < 4; ++i) AddReplica(true, 1);
  StartGateway(StaticSpec());
  ASSERT_TRUE(ReadyCount(4));
  const std::string first = Generate("", "s-1").replica;
  ASSERT_FALSE(first.empty());
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Generate("", "s-1").replica, first);
  // Its replica leaves rotation: the session moves, then sticks again.
  ScriptedReplica* home = nullptr;
  for (auto& s : replicas_) {
    if (s->url() == first) home = s.get();
  }
  ASSERT_NE(home, nullptr);
  home->set_ready(false);
  ASSERT_TRUE(ReadyCount(3));
  const std::string second = Generate("", "s-1").replica;
  EXPECT_NE(second, first);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(Generate("", "s-1").replica, second);
}

TEST_F(GatewayTest, A503IsRetriedOnAnotherReplica) {
  ScriptedReplica& bad = AddReplica(true, 1);
  ScriptedReplica& good = AddReplica(true, 1);
  bad.set_mode(ScriptedReplica::Mode::kUnavailable);
  StartGateway(StaticSpec(), Options(30s, 60s));
  ASSERT_TRUE(ReadyCount(2));
  for (int i = 0; i < 100 && bad.generates() == 0; ++i) {
    Answer a = Generate(R"({"min_version":1})");
    EXPECT_EQ(a.status, 200) << a.text;
    EXPECT_EQ(a.replica, good.url());
  }
  EXPECT_EQ(bad.generates(), 1);
  EXPECT_EQ(Counters().retried, 1u);
}

TEST_F(GatewayTest, AReplicaDyingMidRequestIsRetriedElsewhere) {
  ScriptedReplica& dying = AddReplica(true, 1);
  ScriptedReplica& good = AddReplica(true, 1);
  dying.set_mode(ScriptedReplica::Mode::kDieMidRequest);
  StartGateway(StaticSpec(), Options(30s, 60s));
  ASSERT_TRUE(ReadyCount(2));
  for (int i = 0; i < 100 && dying.generates() == 0; ++i) {
    Answer a = Generate("");
    EXPECT_EQ(a.status, 200) << a.text;
    EXPECT_EQ(a.replica, good.url());
  }
  EXPECT_EQ(dying.generates(), 1);
  EXPECT_GE(Counters().retried, 1u);
  PoolState s = Snapshot();
  for (const auto& r : s.replicas) {
    if (r.url == dying.url()) {
      EXPECT_FALSE(r.state.ready);
    }
  }
}

// Streamed or not, the replica (a sidecar, which would abort the generation)
// must see a client that leaves go.
TEST_F(GatewayTest, AClientThatLeavesEndsTheCallToItsReplica) {
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "plain");
    ScriptedReplica& replica = RestartWithOneReplica(ScriptedReplica::Mode::kHang);
    ASSERT_TRUE(ReadyCount(1));
    {
      testing::RawSocket client(gateway_->port());
      ASSERT_TRUE(client.connected());
      const std::string body = stream ? R"({"text":"hi","stream":true})" : R"({"text":"hi"})";
      client.Send(absl::StrCat(
          "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: ", body.size(), "\r\n\r\n", body));
      if (stream) {  // the stream began and stays open
        const std::string got = client.ReadUntil("\n\n");
        EXPECT_NE(got.find(R"(data: {"token":0})"), std::string::npos) << got;
      }
      ASSERT_TRUE(Eventually([&] { return replica.generates() == 1; }));
      EXPECT_EQ(replica.disconnects(), 0);
    }  // the client goes away
    EXPECT_TRUE(Eventually([&] { return replica.disconnects() == 1; }));
    EXPECT_EQ(replica.generates(), 1);  // and nothing was retried elsewhere or again
    StopGateway();
  }
}

// With no other replica to try, a broken exchange comes back as a
// retryable 503, streamed or not.
TEST_F(GatewayTest, AnUnreachableLastReplicaIsARetryable503) {
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "plain");
    RestartWithOneReplica(ScriptedReplica::Mode::kDieMidRequest, Options(100ms, 60s));
    ASSERT_TRUE(ReadyCount(1));
    std::future<Answer> pending = GenerateAsync(R"({"min_version":1})", stream);
    ASSERT_TRUE(AdvanceUntil([&] { return Ready(pending); }, 50ms));  // the wait for another
    Answer a = pending.get();
    EXPECT_EQ(a.status, 503) << a.text;
    EXPECT_EQ(a.retry_after, "1");
    EXPECT_THAT(a.text, HasSubstr("ReplicaUnavailable"));
    StopGateway();
  }
}

TEST_F(GatewayTest, AStale409IsRetriedAndTheVersionLearned) {
  // The gateway believes both replicas serve v2; one actually fell back to
  // v1 and answers 409: the request lands on the other.
  ScriptedReplica& stale = AddReplica(true, 2);
  ScriptedReplica& good = AddReplica(true, 2);
  StartGateway(StaticSpec(), Options(30s, 60s));
  ASSERT_TRUE(ReadyCount(2));
  stale.set_version(1);
  for (int i = 0; i < 100 && stale.generates() == 0; ++i) {
    Answer a = Generate(R"({"exact_version":2})");
    EXPECT_EQ(a.status, 200) << a.text;
    EXPECT_EQ(a.replica, good.url());
  }
  EXPECT_EQ(stale.generates(), 1) << "after its 409 the gateway knows it serves v1";
  for (const auto& r : Snapshot().replicas) {
    if (r.url == stale.url()) {
      EXPECT_EQ(r.state.applied->version, 1);
    }
  }
}

TEST_F(GatewayTest, WaitsForTheFleetToCatchUp) {
  ScriptedReplica& replica = AddReplica(true, 1);
  StartGateway(StaticSpec(), Options(20s, 60s));
  ASSERT_TRUE(ReadyCount(1));
  auto pending = std::async(std::launch::async, [&] { return Generate(R"({"exact_version":2})"); });
  ASSERT_TRUE(Eventually([&] { return Counters().waited == 1; }));
  EXPECT_TRUE(Eventually([&] { return replica.wakes() >= 1; })) << "the fleet is woken";
  EXPECT_EQ(pending.wait_for(0s), std::future_status::timeout);
  replica.set_version(2);  // the publish lands; the waiting request's polls see it
  ASSERT_TRUE(AdvanceUntil([&] { return Ready(pending); }, 200ms));
  Answer a = pending.get();
  EXPECT_EQ(a.status, 200) << a.text;
  EXPECT_EQ(a.version, 2);
  EXPECT_EQ(Counters().rejected, 0u);
}

// A request waits for v2, which no replica has; v2 is published just after
// the fleet was woken for it, and the replica, idle in its backoff, reads
// the pointer only when woken again. The gateway keeps waking the fleet
// while the request waits (at most every waiting_wake_interval), so the
// request is served within seconds of the publish, not at the end of its
// wait.
TEST_F(GatewayTest, KeepsWakingTheFleetWhileARequestWaitsForAVersion) {
  ScriptedReplica& replica = AddReplica(true, 1);
  GatewayOptions options = Options(30s, 60s);
  options.waiting_wake_interval = 2s;
  StartGateway(StaticSpec(), options);
  ASSERT_TRUE(ReadyCount(1));
  std::future<Answer> pending = GenerateAsync(R"({"exact_version":2})");
  ASSERT_TRUE(Eventually([&] { return replica.wakes() == 1; })) << "the fleet is woken at once";
  replica.set_applied_at_next_wake(2);  // the publish lands after that wake
  const Clock::TimePoint published = clock_.Now();
  ASSERT_TRUE(AdvanceUntil([&] { return Ready(pending); }, 200ms));
  EXPECT_LE(clock_.Now() - published, 5s) << "served within 5 s of the publish";
  Answer a = pending.get();
  EXPECT_EQ(a.status, 200) << a.text;
  EXPECT_EQ(a.version, 2);
  // Rate-limited: the first wake, then one per interval at most.
  EXPECT_LE(replica.wakes(), 1 + (clock_.Now() - published) / 2s + 1);
}

TEST_F(GatewayTest, AnswersItsOwn409AfterTheWait) {
  AddReplica(true, 1);
  StartGateway(StaticSpec(), Options(300ms, 50ms));
  ASSERT_TRUE(ReadyCount(1));
  const Clock::TimePoint start = clock_.Now();
  std::future<Answer> pending = GenerateAsync(R"({"exact_version":5})");
  ASSERT_TRUE(AdvanceUntil([&] { return Ready(pending); }, 50ms));
  EXPECT_GE(clock_.Now() - start, 300ms) << "it waited the admission wait";
  Answer a = pending.get();
  EXPECT_EQ(a.status, 409) << a.text;
  EXPECT_EQ(a.body["type"].as_string(), "WeightVersionNotReady");
  EXPECT_EQ(a.body["target_version"].as_int64(), 5);
  EXPECT_EQ(a.body["applied"].as_int64(), 1);
  EXPECT_EQ(a.body["applied_identity"].as_string(), "r1/weight_v000001");
  EXPECT_THAT(std::string(a.body["message"].as_string()), HasSubstr("exact v5"));
  GatewayCounters c = Counters();
  EXPECT_EQ(c.waited, 1u);
  EXPECT_EQ(c.rejected, 1u);
}

TEST_F(GatewayTest, MaxStalenessLandsOnlyOnFreshEnoughReplicas) {
  ScriptedReplica& v1 = AddReplica(true, 1);
  ScriptedReplica& v2 = AddReplica(true, 2);
  ScriptedReplica& v3 = AddReplica(true, 3);
  for (ScriptedReplica* r : {&v1, &v2, &v3}) r->set_pointer(3);
  StartGateway(StaticSpec());
  ASSERT_TRUE(ReadyCount(3));
  for (int i = 0; i < 30; ++i) {
    Answer a = Generate(R"({"max_staleness":1})");
    EXPECT_EQ(a.status, 200) << a.text;
    EXPECT_GE(a.version, 2);
  }
  EXPECT_EQ(v1.generates(), 0);
  EXPECT_EQ(Counters().retried, 0u) << "routed, not found by trial and error";
}

TEST_F(GatewayTest, ADefaultConstraintIsRoutedByAndPassedOn) {
  ScriptedReplica& old = AddReplica(true, 1);
  ScriptedReplica& fresh = AddReplica(true, 3);
  old.set_pointer(3);
  fresh.set_pointer(3);
  GatewayOptions options = Options(30s, 50ms);
  options.default_constraint = VersionConstraint::Fresh(0);
  StartGateway(StaticSpec(), std::move(options));
  ASSERT_TRUE(ReadyCount(2));
  for (int i = 0; i < 10; ++i) {
    Answer a = Generate("");
    EXPECT_EQ(a.status, 200) << a.text;
    EXPECT_EQ(a.replica, fresh.url());
  }
  EXPECT_EQ(old.generates(), 0);
  ASSERT_FALSE(fresh.constraints().empty());
  EXPECT_EQ(fresh.constraints().front(), R"({"max_staleness":0})");
  // A request's own constraint wins over the default.
  Answer own = Generate(R"({"exact_version":1})");
  EXPECT_EQ(own.status, 200) << own.text;
  EXPECT_EQ(own.replica, old.url());
  EXPECT_EQ(old.constraints().back(), R"({"exact_version":1})");
}

TEST_F(GatewayTest, ItsOwn409NamesTheStalenessBound) {
  AddReplica(true, 1).set_pointer(4);
  StartGateway(StaticSpec(), Options(300ms, 50ms));
  ASSERT_TRUE(ReadyCount(1));
  std::future<Answer> pending = GenerateAsync(R"({"max_staleness":2})");
  ASSERT_TRUE(AdvanceUntil([&] { return Ready(pending); }, 50ms));
  Answer a = pending.get();
  EXPECT_EQ(a.status, 409) << a.text;
  EXPECT_EQ(a.body["failed_bound"].as_string(), "max_staleness");
  EXPECT_THAT(std::string(a.body["message"].as_string()), HasSubstr("<= 2 behind the pointer"));
}

TEST_F(GatewayTest, PrefixAffinityKeepsAPromptOnOneReplica) {
  for (int i = 0; i < 4; ++i) AddReplica(true, 1);
  GatewayOptions options = Options(30s, 50ms);
  options.affinity_prefix_bytes = 16;
  StartGateway(StaticSpec(), std::move(options));
  ASSERT_TRUE(ReadyCount(4));
  // Bodies differ after the first 16 bytes of the prompt: one group.
  std::set<std::string> group;
  for (int i = 0; i < 20; ++i) {
    auto r =
        HttpFetch("POST", gateway_->url() + "/generate",
                  absl::StrCat(R"({"text":"a shared system prompt, then sample )", i, R"("})"));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200);
    group.insert(std::string(*r->headers.Get("X-Stitch-Replica")));
  }
  EXPECT_EQ(group.size(), 1u);
  std::set<std::string> spread;
  for (int i = 0; i < 60; ++i) {
    auto r = HttpFetch("POST", gateway_->url() + "/generate",
                       absl::StrCat(R"({"text":")", i, R"( another prompt"})"));
    ASSERT_TRUE(r.ok()) << r.status();
    spread.insert(std::string(*r->headers.Get("X-Stitch-Replica")));
  }
  EXPECT_GT(spread.size(), 1u);
}

TEST_F(GatewayTest, StreamsArePassedThrough) {
  AddReplica(true, 3);
  StartGateway(StaticSpec());
  ASSERT_TRUE(ReadyCount(1));
  Answer a = Generate(R"({"exact_version":3})", "", /*stream=*/true);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.text,
            "data: {\"token\":0}\n\ndata: {\"token\":1}\n\ndata: {\"token\":2}\n\ndata: "
            "[DONE]\n\n");
}

TEST_F(GatewayTest, EngineControlRoutesAreNeverForwarded) {
  ScriptedReplica& replica = AddReplica(true, 1);
  StartGateway(StaticSpec());
  ASSERT_TRUE(ReadyCount(1));
  auto blocked = HttpFetch("POST", gateway_->url() + "/update_weights_from_disk", "{}");
  ASSERT_TRUE(blocked.ok());
  EXPECT_EQ(blocked->status, 403);
  EXPECT_THAT(blocked->body, HasSubstr("RouteBlocked"));
  auto other = HttpFetch("GET", gateway_->url() + "/get_model_info");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->status, 200);
  EXPECT_EQ(replica.others(), 1) << "only the ordinary route reached the replica";
}

TEST_F(GatewayTest, HealthReplicasAndMetrics) {
  ScriptedReplica& replica = AddReplica(false, 1);
  StartGateway(StaticSpec());
  ASSERT_TRUE(Eventually([&] { return Snapshot().replicas.size() == 1; }));
  auto health = HttpFetch("GET", gateway_->url() + "/health");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, 503);
  replica.set_ready(true);
  ASSERT_TRUE(ReadyCount(1));
  health = HttpFetch("GET", gateway_->url() + "/health");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(Generate("").status, 200);

  auto replicas = HttpFetch("GET", gateway_->url() + "/replicas");
  ASSERT_TRUE(replicas.ok());
  json::object doc = Parse(replicas->body);
  ASSERT_TRUE(doc.contains("replicas")) << replicas->body;
  const json::object& r = doc["replicas"].as_array().at(0).as_object();
  EXPECT_EQ(r.at("url").as_string(), replica.url());
  EXPECT_TRUE(r.at("ready").as_bool());
  EXPECT_EQ(r.at("applied").as_string(), "r1/weight_v000001");
  EXPECT_EQ(r.at("sync_state").as_string(), "IDLE");
  EXPECT_EQ(r.at("in_flight").as_int64(), 0);

  auto metrics = HttpFetch("GET", gateway_->url() + "/metrics");
  ASSERT_TRUE(metrics.ok());
  EXPECT_THAT(metrics->body, HasSubstr("stitch_gateway_routed_total 1\n"));
  EXPECT_THAT(metrics->body, HasSubstr("stitch_gateway_retried_total 0\n"));
  EXPECT_THAT(metrics->body, HasSubstr("stitch_gateway_waited_total 0\n"));
  EXPECT_THAT(metrics->body, HasSubstr("stitch_gateway_rejected_total 0\n"));
  EXPECT_THAT(metrics->body,
              HasSubstr("stitch_gateway_replica_version{replica=\"" + replica.url() + "\"} 1\n"));
  EXPECT_THAT(metrics->body,
              HasSubstr("stitch_gateway_replica_in_flight{replica=\"" + replica.url() + "\"} 0\n"));
}

TEST_F(GatewayTest, TheDashboardPageAndItsStateAreServed) {
  ScriptedReplica& replica = AddReplica(true, 3);
  StartGateway(StaticSpec());
  ASSERT_TRUE(ReadyCount(1));
  EXPECT_EQ(Generate("").status, 200);
  EXPECT_EQ(Generate(R"({"exact_version":1})").status, 409);  // passed: at once

  auto page = HttpFetch("GET", gateway_->url() + "/ui");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->status, 200);
  EXPECT_THAT(std::string(page->headers.Get("Content-Type").value_or("")), HasSubstr("text/html"));
  EXPECT_THAT(page->body, HasSubstr("fetch(\"/ui/state\""));
  // Self-contained: no script, style or image fetched from elsewhere.
  EXPECT_THAT(page->body, ::testing::Not(HasSubstr("src=")));
  EXPECT_THAT(page->body, ::testing::Not(HasSubstr("<link")));

  auto state = HttpFetch("GET", gateway_->url() + "/ui/state");
  ASSERT_TRUE(state.ok()) << state.status();
  json::object doc = Parse(state->body);
  ASSERT_TRUE(doc.contains("replicas")) << state->body;
  const json::object& lane = doc["replicas"].as_array().at(0).as_object();
  EXPECT_EQ(lane.at("url").as_string(), replica.url());
  EXPECT_EQ(lane.at("state").as_string(), "serving");
  EXPECT_EQ(lane.at("version").as_int64(), 3);
  int64_t served = 0, conflicts = 0;
  for (const json::value& s : doc["seconds"].as_array()) {
    if (const json::value* n = s.at("served").as_object().if_contains("3")) served += n->as_int64();
    conflicts += s.at("conflicts").as_int64();
  }
  EXPECT_EQ(served, 1);
  EXPECT_GE(conflicts, 1);
}

TEST_F(GatewayTest, TheDashboardsStateNeedsTheFleetsTokenLikeReplicas) {
  AddReplica(true, 1);
  GatewayOptions options = Options(30s, 50ms);
  options.auth_token = "s3cret";
  StartGateway(StaticSpec(), options);
  auto page = HttpFetch("GET", gateway_->url() + "/ui");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->status, 200);  // the page holds no data
  auto refused = HttpFetch("GET", gateway_->url() + "/ui/state");
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->status, 401);
  FetchOptions with_token;
  with_token.headers.Set("Authorization", "Bearer s3cret");
  auto state = HttpFetch("GET", gateway_->url() + "/ui/state", "", with_token);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->status, 200);
  EXPECT_TRUE(Parse(state->body).contains("replicas")) << state->body;
}

// Without --auth-data-plane the gateway serves strangers, but never with its
// own token: a replica's token-protected routes stay closed to them. A
// replica's /wake is not relayed at all: the gateway wakes the fleet itself.
TEST_F(GatewayTest, TheGatewayNeverLendsItsTokenToARequestItDidNotAuthenticate) {
  ScriptedReplica& replica = AddReplica(true, 1);
  replica.set_wake_token("s3cret");
  GatewayOptions options = Options(30s, 50ms);
  options.auth_token = "s3cret";
  options.auth_data_plane = false;
  StartGateway(StaticSpec(), options);
  ASSERT_TRUE(ReadyCount(1));
  auto stranger = HttpFetch("GET", gateway_->url() + "/v1/models");
  ASSERT_TRUE(stranger.ok()) << stranger.status();
  EXPECT_EQ(stranger->status, 401) << stranger->body;
  EXPECT_EQ(replica.others(), 0);
  FetchOptions with_token;
  with_token.headers.Set("Authorization", "Bearer s3cret");
  auto member = HttpFetch("GET", gateway_->url() + "/v1/models", "", with_token);
  ASSERT_TRUE(member.ok()) << member.status();
  EXPECT_EQ(member->status, 200) << member->body;
  EXPECT_EQ(replica.others(), 1);
  for (const FetchOptions& who : {FetchOptions{}, with_token}) {
    auto wake = HttpFetch("POST", gateway_->url() + "/wake", "{}", who);
    ASSERT_TRUE(wake.ok()) << wake.status();
    EXPECT_EQ(wake->status, 403) << wake->body;
    EXPECT_THAT(wake->body, HasSubstr("RouteNotForwarded"));
  }
  EXPECT_EQ(replica.wakes(), 0);
  // The open data plane still serves strangers.
  EXPECT_EQ(Generate("").status, 200);
}

TEST_F(GatewayTest, AReplicaAddedToAFilePoolEntersRotationOnlyOnceReady) {
  testing::TempDir tmp;
  ScriptedReplica& first = AddReplica(true, 1);
  ScriptedReplica& joining = AddReplica(false, 1);
  const auto file = tmp / "replicas.txt";
  { std::ofstream(file) << first.url() << "\n"; }
  StartGateway("file:" + file.string());
  ASSERT_TRUE(ReadyCount(1));
  { std::ofstream(file, std::ios::app) << joining.url() << "\n"; }
  ASSERT_TRUE(AdvanceUntil([&] { return Snapshot().replicas.size() == 2; }, 50ms));
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Generate("").replica, first.url());
  EXPECT_EQ(joining.generates(), 0);
  joining.set_ready(true);
  ASSERT_TRUE(ReadyCount(2));
  EXPECT_TRUE(Eventually([&] { return Generate("").replica == joining.url(); }));
}

TEST_F(GatewayTest, DiscoversReplicasThroughDns) {
  ScriptedReplica& replica = AddReplica(true, 4);
  const std::string port = replica.url().substr(replica.url().rfind(':') + 1);
  // localhost resolves through /etc/hosts (maybe also to ::1, where the replica
  // does not listen: that address simply never becomes ready).
  StartGateway("dns:localhost:" + port);
  ASSERT_TRUE(ReadyCount(1));
  Answer a = Generate(R"({"exact_version":4})");
  EXPECT_EQ(a.status, 200) << a.text;
  EXPECT_EQ(a.replica, replica.url());
}

TEST_F(GatewayTest, BadRequestsAreRefusedUpFront) {
  AddReplica(true, 1);
  StartGateway(StaticSpec());
  auto r = HttpFetch("POST", gateway_->url() + "/generate",
                     R"({"weight_version":{"exact_version":"x"}})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400);
  r = HttpFetch("POST", gateway_->url() + "/generate", "not json");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400);
}

GatewayOptions StallOptions(std::chrono::milliseconds stall_timeout) {
  GatewayOptions options = Options(30s, 50ms);
  options.stall_timeout = stall_timeout;
  return options;
}

// With two qualifying replicas the two random picks are both of them, so the
// less loaded one always wins: a replica whose outstanding count only grows
// (it stopped answering) never gets new work because both picks fell on it.
TEST_F(GatewayTest, TheTwoChoicesAreTwoDistinctReplicas) {
  ScriptedReplica& busy = AddReplica(true, 1);
  ScriptedReplica& idle = AddReplica(false, 1);
  busy.set_mode(ScriptedReplica::Mode::kHold);
  StartGateway(StaticSpec(), StallOptions(0ms));  // no stall watch: only the choice
  ASSERT_TRUE(ReadyCount(1));
  auto held = SendRaw("");
  ASSERT_TRUE(Eventually([&] { return busy.held() == 1; }));
  idle.set_ready(true);
  ASSERT_TRUE(ReadyCount(2));
  for (int i = 0; i < 40; ++i) {
    Answer a = Generate("");
    ASSERT_EQ(a.status, 200) << a.text;
    EXPECT_EQ(a.replica, idle.url()) << "request " << i;
  }
  EXPECT_EQ(busy.generates(), 1);
}

// A replica that keeps requests without sending anything back (a frozen
// engine behind a sidecar that still answers /server_info) is stalled after
// the stall timeout: even a session that lives there moves, until the
// replica answers again.
TEST_F(GatewayTest, AStalledReplicaGetsNoNewWorkUntilItAnswers) {
  ScriptedReplica& frozen = AddReplica(true, 1);
  ScriptedReplica& other = AddReplica(false, 1);
  StartGateway(StaticSpec(), StallOptions(300ms));
  ASSERT_TRUE(ReadyCount(1));
  ASSERT_EQ(Generate("", "s-1").replica, frozen.url());  // the session lives there
  other.set_ready(true);
  ASSERT_TRUE(ReadyCount(2));
  ASSERT_EQ(Generate("", "s-1").replica, frozen.url());

  frozen.set_mode(ScriptedReplica::Mode::kHold);
  auto stuck = SendRaw("", "s-1");
  ASSERT_TRUE(Eventually([&] { return frozen.held() == 1; }));
  ASSERT_TRUE(AdvanceUntil([&] { return Stalled(frozen); }, 60ms));
  EXPECT_TRUE(StatusOf(frozen)->state.ready) << "its /server_info still says ready";
  EXPECT_THAT(StatusOf(frozen)->last_error, HasSubstr("stalled"));
  const std::string metrics = MetricsText();
  EXPECT_THAT(metrics, HasSubstr("stitch_gateway_stalls_total 1\n"));
  EXPECT_THAT(metrics,
              HasSubstr("stitch_gateway_replica_stalled{replica=\"" + frozen.url() + "\"} 1\n"));

  // New work, the session's included, goes elsewhere at once.
  for (int i = 0; i < 20; ++i) {
    const auto start = std::chrono::steady_clock::now();
    Answer a = Generate("", i % 2 == 0 ? "s-1" : "");
    EXPECT_EQ(a.status, 200) << a.text;
    EXPECT_EQ(a.replica, other.url());
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  }
  EXPECT_EQ(frozen.generates(), 3);

  // It answers again: the stall ends and it takes work.
  frozen.Release();
  EXPECT_THAT(stuck->ReadUntil("\r\n\r\n"), HasSubstr("HTTP/1.1 200"));
  ASSERT_TRUE(Eventually([&] { return !Stalled(frozen); }));
  EXPECT_TRUE(Eventually([&] { return Generate("").replica == frozen.url(); }));
}

// Once the requests stuck on a stalled replica are gone, it gets one request
// at a time, which finds out whether it recovered.
TEST_F(GatewayTest, AStalledReplicaWithNothingOutstandingGetsOneRequestAtATime) {
  ScriptedReplica& frozen = AddReplica(true, 1);
  ScriptedReplica& other = AddReplica(false, 1);
  frozen.set_mode(ScriptedReplica::Mode::kHold);
  StartGateway(StaticSpec(), StallOptions(300ms));
  ASSERT_TRUE(ReadyCount(1));
  {
    auto stuck = SendRaw("");
    ASSERT_TRUE(Eventually([&] { return frozen.held() == 1; }));
    ASSERT_TRUE(AdvanceUntil([&] { return Stalled(frozen); }, 60ms));
  }  // its client leaves
  ASSERT_TRUE(Eventually([&] { return frozen.disconnects() == 1; }));
  other.set_ready(true);
  ASSERT_TRUE(ReadyCount(2));
  // Requests go to either until one lands on the stalled replica ...
  std::unique_ptr<testing::RawSocket> trial;
  for (int i = 0; i < 60 && frozen.held() == 0; ++i) {
    const int served = other.generates();
    auto client = SendRaw("");
    ASSERT_TRUE(Eventually([&] { return frozen.held() == 1 || other.generates() == served + 1; }));
    if (frozen.held() == 1) {
      trial = std::move(client);
    } else {
      EXPECT_THAT(client->ReadUntil("\r\n\r\n"), HasSubstr("HTTP/1.1 200"));
    }
  }
  ASSERT_EQ(frozen.held(), 1);
  EXPECT_TRUE(Stalled(frozen));
  // ... and while it holds that one, nothing more goes there.
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Generate("").replica, other.url());
  EXPECT_EQ(frozen.held(), 1);
  frozen.Release();
  EXPECT_THAT(trial->ReadUntil("\r\n\r\n"), HasSubstr("HTTP/1.1 200"));
  EXPECT_TRUE(Eventually([&] { return !Stalled(frozen); }));
}

// A replica whose /server_info stops answering (the whole replica froze)
// leaves rotation after one probe timeout.
TEST_F(GatewayTest, AReplicaWhoseProbeTimesOutLeavesRotation) {
  ScriptedReplica& frozen = AddReplica(true, 1);
  ScriptedReplica& other = AddReplica(true, 1);
  GatewayOptions options = Options(30s, 50ms);
  options.probe_timeout = 200ms;
  StartGateway(StaticSpec(), options);
  ASSERT_TRUE(ReadyCount(2));
  frozen.set_info_hangs(true);
  ASSERT_TRUE(AdvanceUntil([&] { return !StatusOf(frozen)->reachable; }, 50ms));
  EXPECT_EQ(Snapshot().ready_count(), 1);
  const int before = frozen.generates();
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Generate("").replica, other.url());
  EXPECT_EQ(frozen.generates(), before);
  frozen.set_info_hangs(false);
  EXPECT_TRUE(ReadyCount(2));
}

// Closed-loop clients against three replicas, one of which freezes: the
// clients it catches stay stuck (its share), the others keep their pace.
TEST_F(GatewayTest, AFrozenReplicaCostsOnlyItsShare) {
  ScriptedReplica& frozen = AddReplica(true, 1);
  AddReplica(true, 1);
  AddReplica(true, 1);
  StartGateway(StaticSpec(), StallOptions(300ms));
  ASSERT_TRUE(ReadyCount(3));
  constexpr int kClients = 8;
  constexpr int kBatch = 300;
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      FetchOptions options;
      options.timeout = 60s;
      while (!stop.load()) {
        auto r = HttpFetch("POST", gateway_->url() + "/generate", Body(""), options);
        if (r.ok() && r->status == 200) ++answered;
      }
    });
  }
  // The rate of `kBatch` answers, in answers per second.
  auto rate = [&] {
    const int from = answered.load();
    const auto start = std::chrono::steady_clock::now();
    if (!Eventually([&] { return answered.load() >= from + kBatch; }, 60s)) return 0.0;
    return kBatch / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const double healthy = rate();
  frozen.set_mode(ScriptedReplica::Mode::kHold);
  ASSERT_TRUE(AdvanceUntil([&] { return Stalled(frozen); }, 60ms));
  const int64_t caught = StatusOf(frozen)->in_flight;
  const double degraded = rate();
  EXPECT_EQ(StatusOf(frozen)->in_flight, caught) << "no new work after the stall was seen";
  EXPECT_EQ(frozen.held(), caught);
  EXPECT_LE(caught, kClients / 2);
  EXPECT_GT(degraded, healthy / 4) << "healthy " << healthy << "/s, degraded " << degraded << "/s";
  stop = true;
  frozen.Release();
  for (std::thread& t : clients) t.join();
}

// Versions only move forward within a run: an exact version every replica
// has passed can never be served, so the answer comes at once.
TEST_F(GatewayTest, AnExactVersionEveryReplicaPassedIs409AtOnce) {
  AddReplica(true, 3);
  AddReplica(false, 4);
  StartGateway(StaticSpec(), Options(30s, 50ms));
  ASSERT_TRUE(Eventually([&] {
    PoolState s = Snapshot();
    return s.replicas.size() == 2 && s.replicas[0].state.applied.has_value() &&
           s.replicas[1].state.applied.has_value();
  }));
  const auto start = std::chrono::steady_clock::now();
  Answer a = Generate(R"({"exact_version":2})");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_EQ(a.status, 409) << a.text;
  EXPECT_EQ(a.body["type"].as_string(), "WeightVersionNotReady");
  EXPECT_EQ(a.body["target_version"].as_int64(), 2);
  EXPECT_THAT(std::string(a.body["message"].as_string()), HasSubstr("any more"));
  GatewayCounters c = Counters();
  EXPECT_EQ(c.waited, 0u);
  EXPECT_EQ(c.unservable, 1u);
  EXPECT_EQ(c.routed, 0u);
  EXPECT_EQ(Generate(R"({"exact_version":3})").status, 200) << "the oldest is still served";
  EXPECT_THAT(MetricsText(), HasSubstr("stitch_gateway_unservable_total 1\n"));
}

// What is not known to be passed for good is still waited for: a replica
// never probed, replicas of two runs (a run change under way), a version
// some replica has not reached.
TEST_F(GatewayTest, AnExactVersionThatMayStillBeServedIsWaitedFor) {
  struct Case {
    const char* name;
    std::function<std::string()> setup;  // adds the replicas; returns the pool spec
  };
  const Case cases[] = {
      {"a replica never probed",
       [this] {
         AddReplica(true, 3);
         return StaticSpec() + ",http://127.0.0.1:" + std::to_string(testing::UnusedPort());
       }},
      {"two runs",
       [this] {
         AddReplica(true, 3);
         AddReplica(true, 4).set_run("r2");
         return StaticSpec();
       }},
      {"a replica behind",
       [this] {
         AddReplica(true, 3);
         AddReplica(false, 1);
         return StaticSpec();
       }},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    StopGateway();
    replicas_.clear();
    StartGateway(k.setup(), Options(300ms, 50ms));
    ASSERT_TRUE(Eventually([&] { return Snapshot().ready_count() >= 1; }));
    const Clock::TimePoint start = clock_.Now();
    std::future<Answer> pending = GenerateAsync(R"({"exact_version":2})");
    ASSERT_TRUE(AdvanceUntil([&] { return Ready(pending); }, 50ms));
    EXPECT_GE(clock_.Now() - start, 300ms) << "it waited the admission wait";
    Answer a = pending.get();
    EXPECT_EQ(a.status, 409) << a.text;
    EXPECT_EQ(Counters().waited, 1u);
    EXPECT_EQ(Counters().unservable, 0u);
  }
}

// A proxy's targets (CONNECT's authority, `*`, an absolute URL) never reach a
// replica, and no replica is blamed for them.
TEST_F(GatewayTest, ProxyTargetsAre400AndMarkNoReplica) {
  ScriptedReplica& replica = AddReplica(true, 1);
  StartGateway(StaticSpec());
  ASSERT_TRUE(ReadyCount(1));
  for (const std::string request : {
           "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
           "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
           "GET http://example.com/get_model_info HTTP/1.1\r\nHost: example.com\r\n\r\n",
       }) {
    testing::RawSocket client(gateway_->port());
    ASSERT_TRUE(client.connected());
    client.Send(request);
    bool closed = false;
    const std::string answer = client.ReadUntilClosed(&closed);
    EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << request << " -> " << answer;
  }
  EXPECT_EQ(replica.others(), 0);
  std::optional<ReplicaStatus> s = StatusOf(replica);
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->reachable);
  EXPECT_TRUE(s->state.ready);
  EXPECT_EQ(s->last_error, "");
  EXPECT_EQ(Generate("").status, 200);
}

TEST_F(GatewayTest, SessionIdsAreBoundedInLengthAndInTotal) {
  ScriptedReplica& replica = AddReplica(true, 1);
  GatewayOptions options = Options(30s, 50ms);
  options.max_session_id_bytes = 300;
  options.session_table_bytes = 16 << 10;
  StartGateway(StaticSpec(), options);
  ASSERT_TRUE(ReadyCount(1));

  Answer refused = Generate("", std::string(301, 's'));
  EXPECT_EQ(refused.status, 400) << refused.text;
  EXPECT_EQ(refused.body.at("error").as_object().at("type").as_string(), "BadRequest");
  EXPECT_THAT(refused.text, HasSubstr("300"));
  EXPECT_EQ(replica.generates(), 0);

  for (int i = 0; i < 200; ++i) {
    std::string id = std::to_string(i);
    id.resize(300, 'x');
    ASSERT_EQ(Generate("", id).status, 200);
  }
  std::string metrics;
  ASSERT_TRUE(Eventually([&] {  // the last session is recorded just after its answer
    metrics = MetricsText();
    return MetricValue(metrics, "stitch_gateway_sessions") +
               MetricValue(metrics, "stitch_gateway_sessions_evicted_total") ==
           200;
  }));
  const int64_t sessions = MetricValue(metrics, "stitch_gateway_sessions");
  EXPECT_GT(sessions, 0);
  EXPECT_LT(sessions, (16 << 10) / 300);
  EXPECT_LE(MetricValue(metrics, "stitch_gateway_session_table_bytes"), 16 << 10);
  EXPECT_EQ(MetricValue(metrics, "stitch_gateway_sessions_evicted_total"), 200 - sessions);
  // The newest session is kept and sticks to its replica; the oldest is gone.
  std::string newest = "199";
  newest.resize(300, 'x');
  EXPECT_EQ(Generate("", newest).status, 200);
  EXPECT_EQ(MetricValue(MetricsText(), "stitch_gateway_sessions"), sessions);
}

}  // namespace
}  // namespace stitch
