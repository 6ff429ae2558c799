// The gateway end to end: three reference engines, each with its sidecar
// following its own filesystem store (so that they serve different
// versions), behind one `stitch gateway` process over a `file:` pool.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>

#include "absl/strings/match.h"
#include "stitch/api/server_info.h"
#include "stitch/core/state.h"
#include "stitch/core/version.h"
#include "stitch/net/client.h"
#include "stitch/net/net_test_util.h"
#include "tests/sidecar_process.h"
#include "tests/support/cli_expect.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace json = boost::json;
using ::stitch::testing::ExpectOk;
using ::stitch::testing::ProcessResult;
using ::stitch::testing::RunStitch;
using ::stitch::testing::ServerProcess;
using ::stitch::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

constexpr auto kStartTimeout = std::chrono::seconds(60);
constexpr auto kConverge = std::chrono::seconds(60);
constexpr int kAdmissionWaitSeconds = 15;

json::object Parse(const std::string& text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  return !ec && v.is_object() ? v.get_object() : json::object();
}

bool Eventually(const std::function<bool()>& condition,
                std::chrono::milliseconds timeout = kConverge) {
  return testing::Eventually(condition, timeout);
}

struct Reply {
  int status = 0;
  int64_t end = -1;
  std::string replica;
  std::string body;
};

Reply Post(const std::string& url, const std::string& constraint, const std::string& session = "",
           int tokens = 4) {
  std::string body = R"({"text":"The policy","sampling_params":{"max_new_tokens":)" +
                     std::to_string(tokens) + R"(,"temperature":0})";
  if (!constraint.empty()) body += R"(,"weight_version":)" + constraint;
  body += "}";
  FetchOptions options;
  options.timeout = 60s;
  if (!session.empty()) options.headers.Set("X-Session-Id", session);
  auto r = HttpFetch("POST", url + "/generate", body, options);
  Reply reply;
  if (!r.ok()) {
    reply.body = std::string(r.status().message());
    return reply;
  }
  reply.status = r->status;
  reply.body = r->body;
  if (auto h = r->headers.Get("X-Stitch-Replica")) reply.replica = std::string(*h);
  json::object o = Parse(r->body);
  if (const json::value* meta = o.if_contains("meta_info"); meta && meta->is_object()) {
    if (const json::value* end = meta->get_object().if_contains("weight_version_end")) {
      reply.end = end->as_int64();
    }
  }
  return reply;
}

// One replica: an engine and its sidecar, following its own store.
struct Replica {
  std::string store;
  std::string engine_url;
  std::unique_ptr<ServerProcess> engine;
  std::unique_ptr<ServerProcess> sidecar;
  std::string url;
};

class GatewayIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
    base_ = (tmp_ / "base").string();
    ExpectOk(RunStitch({"engine", "init-model", base_, "--layers", "1", "--hidden", "32", "--heads",
                        "2", "--seed", "1", "--max-positions", "512"}),
             "init-model");
    std::filesystem::create_directories(tmp_ / "out");
    // Versions 1..3: the base weights republished (what is served does not
    // matter here, only which version serves it).
    for (int v = 1; v <= 3; ++v) {
      const std::string dir = (tmp_ / "out" / VersionDirName(v)).string();
      ExpectOk(RunStitch({"delta", "full", "--checkpoint", base_, "--out", dir, "--version",
                          std::to_string(v), "--run-id", "r1"}),
               "delta full");
    }
  }

  void Publish(Replica& r, int64_t version) {
    ExpectOk(RunStitch({"publish", "--store", r.store, "--run-id", "r1", "--pool",
                        "static:" + r.url, (tmp_ / "out" / VersionDirName(version)).string()}),
             "publish");
  }

  // Starts replica `i` on its own store and brings it to `version`.
  Replica& StartReplica(int i, int64_t version) {
    const std::string store = (tmp_ / ("store" + std::to_string(i))).string();
    ExpectOk(RunStitch({"claim", "--store", store, "--run-id", "r1", "--boot-version", "0"}),
             "claim");
    Replica& r = StartReplicaOn(i, store);
    for (int64_t v = 1; v <= version; ++v) Publish(r, v);
    EXPECT_TRUE(Serves(r, version)) << r.sidecar->err();
    return r;
  }

  // Starts replica `i` (an engine and its sidecar) following `store`.
  Replica& StartReplicaOn(int i, const std::string& store) {
    auto r = std::make_unique<Replica>();
    r->store = store;
    r->engine = std::make_unique<ServerProcess>(std::vector<std::string>{
        testing::StitchBinary(), "engine", "--model", base_, "--port", "0", "--run-id", "r1"});
    auto engine_url = r->engine->WaitForUrl(kStartTimeout);
    EXPECT_TRUE(engine_url.has_value()) << r->engine->err();
    r->engine_url = engine_url.value_or("");
    r->sidecar = std::make_unique<ServerProcess>(
        std::vector<std::string>{testing::StitchBinary(),
                                 "sidecar",
                                 "--store",
                                 r->store,
                                 "--run-id",
                                 "r1",
                                 "--engine",
                                 "sglang",
                                 "--engine-url",
                                 engine_url.value_or(""),
                                 "--base-checkpoint",
                                 base_,
                                 "--update-mode",
                                 "disk",
                                 "--local-checkpoint",
                                 (tmp_ / ("local" + std::to_string(i))).string(),
                                 "--reconcile-interval",
                                 "0.2",
                                 "--watchdog-interval",
                                 "0.5",
                                 "--port",
                                 "0"});
    auto url = r->sidecar->WaitForUrl(kStartTimeout);
    EXPECT_TRUE(url.has_value()) << r->sidecar->err();
    r->url = url.value_or("");
    replicas_.push_back(std::move(r));
    return *replicas_.back();
  }

  static bool Serves(const Replica& r, int64_t version) {
    return Eventually([&] {
      auto info = HttpFetch("GET", r.url + "/server_info");
      if (!info.ok() || info->status != 200) return false;
      auto s = ParseServerInfo(info->body);
      return s.ok() && s->ready && s->applied.has_value() && s->applied->version == version;
    });
  }

  void WritePool(const std::vector<const Replica*>& members) {
    std::ofstream out(pool_file_, std::ios::trunc);
    for (const Replica* r : members) out << r->url << "\n";
  }

  void StartGateway() {
    gateway_ = std::make_unique<ServerProcess>(
        std::vector<std::string>{testing::StitchBinary(), "gateway", "--pool", "file:" + pool_file_,
                                 "--host", "127.0.0.1", "--port", "0", "--poll-interval", "0.2",
                                 "--admission-wait", std::to_string(kAdmissionWaitSeconds)});
    auto url = gateway_->WaitForUrl(kStartTimeout);
    ASSERT_TRUE(url.has_value()) << gateway_->err();
    gateway_url_ = *url;
  }

  int GatewayReady() {
    auto health = HttpFetch("GET", gateway_url_ + "/health");
    if (!health.ok()) return -1;
    json::object o = Parse(health->body);
    const json::value* n = o.if_contains("ready_replicas");
    return n != nullptr && n->is_int64() ? static_cast<int>(n->as_int64()) : -1;
  }

  std::string Metric(const std::string& name) {
    auto m = HttpFetch("GET", gateway_url_ + "/metrics");
    if (!m.ok()) return "";
    const size_t at = m->body.find("\n" + name + " ");
    if (at == std::string::npos) return "";
    const size_t start = at + name.size() + 2;
    return m->body.substr(start, m->body.find('\n', start) - start);
  }

  TempDir tmp_;
  std::string base_;
  std::string pool_file_ = (tmp_ / "replicas.txt").string();
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::unique_ptr<ServerProcess> gateway_;
  std::string gateway_url_;
};

// The limits on what a client may make the gateway hold come from its flags
// (sizes with units); no replica is needed to see them.
TEST(GatewayProcessTest, BodyAndSessionLimitsComeFromTheFlags) {
  ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
  ServerProcess gateway({testing::StitchBinary(), "gateway", "--pool",
                         "static:http://127.0.0.1:" + std::to_string(testing::UnusedPort()),
                         "--host", "127.0.0.1", "--port", "0", "--admission-wait", "0",
                         "--max-body-bytes", "1KiB", "--max-total-body-bytes", "4KiB",
                         "--max-session-id-bytes", "8", "--session-table-bytes", "1MiB"});
  auto url = gateway.WaitForUrl(kStartTimeout);
  ASSERT_TRUE(url.has_value()) << gateway.err();
  auto big = HttpFetch("POST", *url + "/generate", std::string(2048, ' ') + "{}");
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->status, 413);
  EXPECT_THAT(big->body, HasSubstr("1024"));
  FetchOptions options;
  options.headers.Set("X-Session-Id", "123456789");
  auto session = HttpFetch("POST", *url + "/generate", R"({"text":"hi"})", options);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(session->status, 400);
  EXPECT_THAT(session->body, HasSubstr("X-Session-Id"));
}

TEST_F(GatewayIntegrationTest, RoutesByVersionKeepsSessionsWaitsAndRetries) {
  Replica& v0 = StartReplica(0, 0);
  Replica& v1 = StartReplica(1, 1);
  Replica& v2 = StartReplica(2, 2);
  WritePool({&v0, &v1});
  StartGateway();
  ASSERT_TRUE(Eventually([&] { return GatewayReady() == 2; })) << gateway_->err();

  // A replica added to the file pool joins the rotation once ready.
  WritePool({&v0, &v1, &v2});
  ASSERT_TRUE(Eventually([&] { return GatewayReady() == 3; })) << gateway_->err();

  // Exact and minimum constraints land on satisfying replicas, as the
  // stamps prove.
  for (int i = 0; i < 6; ++i) {
    Reply exact = Post(gateway_url_, R"({"exact_version":1})");
    ASSERT_EQ(exact.status, 200) << exact.body;
    EXPECT_EQ(exact.end, 1);
    EXPECT_EQ(exact.replica, v1.url);
    Reply min = Post(gateway_url_, R"({"min_version":1})");
    ASSERT_EQ(min.status, 200) << min.body;
    EXPECT_GE(min.end, 1);
    EXPECT_NE(min.replica, v0.url);
  }

  // A session stays on its replica.
  Reply first = Post(gateway_url_, "", "trajectory-7");
  ASSERT_EQ(first.status, 200) << first.body;
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(Post(gateway_url_, "", "trajectory-7").replica, first.replica);

  // A constraint no replica meets waits; a publish during the wait lets it
  // succeed.
  auto pending =
      std::async(std::launch::async, [&] { return Post(gateway_url_, R"({"exact_version":3})"); });
  ASSERT_TRUE(Eventually([&] { return Metric("stitch_gateway_waited_total") == "1"; }));
  Publish(v2, 3);
  Reply caught_up = pending.get();
  ASSERT_EQ(caught_up.status, 200) << caught_up.body;
  EXPECT_EQ(caught_up.end, 3);
  EXPECT_EQ(caught_up.replica, v2.url);

  // Without a publish it ends in the gateway's own 409 after the wait.
  const auto start = std::chrono::steady_clock::now();
  auto rejected = HttpFetch("POST", gateway_url_ + "/generate",
                            R"({"text":"x","weight_version":{"exact_version":9}})",
                            FetchOptions{.timeout = 60s});
  ASSERT_TRUE(rejected.ok()) << rejected.status();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::seconds(kAdmissionWaitSeconds));
  EXPECT_EQ(rejected->status, 409) << rejected->body;
  json::object conflict = Parse(rejected->body);
  EXPECT_EQ(conflict["type"].as_string(), "WeightVersionNotReady");
  EXPECT_EQ(conflict["target_version"].as_int64(), 9);
  EXPECT_EQ(conflict["applied"].as_int64(), 3);
  EXPECT_EQ(conflict["applied_identity"].as_string(), "r1/weight_v000003");
  EXPECT_EQ(Metric("stitch_gateway_rejected_total"), "1");

  // Killing a replica mid-request: the request is retried elsewhere and the
  // client still gets an answer. Pin a session to v1, start a long
  // generation there, kill v1's sidecar while it runs.
  Reply pin = Post(gateway_url_, R"({"exact_version":1})", "doomed");
  ASSERT_EQ(pin.replica, v1.url);
  bool killed = false;
  Reply survived;
  // A generation on the tiny model is quick: try again when it finished
  // before the kill could land.
  for (int attempt = 0; attempt < 10 && !killed; ++attempt) {
    auto long_request =
        std::async(std::launch::async, [&] { return Post(gateway_url_, "", "doomed", 480); });
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < deadline &&
           long_request.wait_for(0s) != std::future_status::ready) {
      auto info = HttpFetch("GET", v1.url + "/server_info");
      auto s = info.ok() ? ParseServerInfo(info->body) : absl::StatusOr<ReplicaState>();
      if (s.ok() && s->active_requests > 0) {
        v1.sidecar->Signal(SIGKILL);
        killed = true;
        break;
      }
    }
    survived = long_request.get();
  }
  ASSERT_TRUE(killed) << "no generation on v1 lasted long enough to be interrupted";
  EXPECT_EQ(survived.status, 200) << survived.body;
  EXPECT_NE(survived.replica, v1.url);
  EXPECT_NE(Metric("stitch_gateway_retried_total"), "0");
  ASSERT_TRUE(Eventually([&] { return GatewayReady() == 2; }));
}

// Two replicas of one store; an evaluator holds one on version 1 while the
// trainer moves on. Exact pins at 1 go to the held replica, everything else
// to the other; gc keeps the held version; released, the replica catches
// up with the pointer.
TEST_F(GatewayIntegrationTest, AReplicaHeldForEvaluationAnswersItsVersionWhileTheRestFollow) {
  const std::string store = (tmp_ / "shared").string();
  ExpectOk(RunStitch({"claim", "--store", store, "--run-id", "r1", "--boot-version", "0"}),
           "claim");
  Replica& a = StartReplicaOn(0, store);
  Replica& b = StartReplicaOn(1, store);
  const std::string pool = "static:" + a.url + "," + b.url;
  auto publish = [&](int64_t v) {
    ExpectOk(RunStitch({"publish", "--store", store, "--run-id", "r1", "--pool", pool,
                        (tmp_ / "out" / VersionDirName(v)).string()}),
             "publish");
  };
  publish(1);
  publish(2);
  ASSERT_TRUE(Serves(a, 2) && Serves(b, 2));

  ProcessResult hold = RunStitch({"hold", "--store", store, "--version", "1", "--ttl", "3600",
                                  "--holder", "eval", "--pool", pool, "--replicas", "1"});
  ExpectOk(hold, "hold --pool");
  const bool a_held = absl::StrContains(hold.out, "replica " + a.url + " serves weight_v000001");
  const bool b_held = absl::StrContains(hold.out, "replica " + b.url + " serves weight_v000001");
  ASSERT_NE(a_held, b_held) << hold.out;
  Replica& held = a_held ? a : b;
  Replica& free = a_held ? b : a;
  // Taking more than the pool has free is refused before anything moves.
  ProcessResult greedy = RunStitch({"hold", "--store", store, "--version", "1", "--ttl", "60",
                                    "--holder", "other", "--pool", pool, "--replicas", "2"});
  EXPECT_EQ(greedy.exit_code, 1);
  EXPECT_THAT(greedy.err, HasSubstr("not held by another holder"));
  EXPECT_THAT(RunStitch({"status", "--store", store}).out, Not(HasSubstr("other")));

  publish(3);
  ASSERT_TRUE(Serves(free, 3)) << free.sidecar->err();
  ASSERT_TRUE(Serves(held, 1)) << held.sidecar->err();
  WritePool({&a, &b});
  StartGateway();
  ASSERT_TRUE(Eventually([&] { return GatewayReady() == 1; }));
  for (int i = 0; i < 6; ++i) {
    Reply pinned = Post(gateway_url_, R"({"exact_version":1})");
    EXPECT_EQ(pinned.status, 200) << pinned.body;
    EXPECT_EQ(pinned.end, 1);
    EXPECT_EQ(pinned.replica, held.url);
    Reply any = Post(gateway_url_, "");
    EXPECT_EQ(any.status, 200) << any.body;
    EXPECT_EQ(any.end, 3);
    EXPECT_EQ(any.replica, free.url);
  }
  ProcessResult status = RunStitch({"status", "--gateway", gateway_url_, "--json"});
  ExpectOk(status, "status --json");
  EXPECT_THAT(status.out, HasSubstr(R"("held":{"version":"r1/weight_v000001","holder":"eval"})"));

  // The held version and nothing else behind the pointer survives gc.
  ProcessResult gc = RunStitch({"gc", "--store", store, "--keep-last", "1"});
  ExpectOk(gc, "gc");
  EXPECT_THAT(gc.out, HasSubstr("kept    weight_v000001: held by eval"));
  EXPECT_THAT(gc.out, HasSubstr("deleted weight_v000002"));

  ProcessResult release =
      RunStitch({"release", "--store", store, "--holder", "eval", "--pool", pool});
  ExpectOk(release, "release --pool");
  EXPECT_THAT(release.out, HasSubstr("1 replica(s) released"));
  ASSERT_TRUE(Serves(held, 3)) << held.sidecar->err();
  ASSERT_TRUE(Eventually([&] { return GatewayReady() == 2; }));
  ProcessResult gc_after = RunStitch({"gc", "--store", store, "--keep-last", "1"});
  ExpectOk(gc_after, "gc after release");
  EXPECT_THAT(gc_after.out, HasSubstr("deleted weight_v000001"));
  EXPECT_FALSE(
      std::filesystem::exists(std::filesystem::path(store) / "updates" / VersionDirName(1)));
}

TEST_F(GatewayIntegrationTest, FleetToolsReportWaitAndSmoke) {
  Replica& a = StartReplica(0, 0);
  Replica& b = StartReplica(1, 1);
  WritePool({&a, &b});
  StartGateway();
  const std::string pool = "file:" + pool_file_;

  ProcessResult ready = RunStitch({"wait-ready", "--pool", pool, "--replicas", "2", "--fraction",
                                   "1", "--timeout", "60", "--gateway", gateway_url_});
  ExpectOk(ready, "wait-ready");
  EXPECT_THAT(ready.out, HasSubstr("2 of 2 discovered replicas ready"));
  ProcessResult short_of = RunStitch(
      {"wait-ready", "--pool", pool, "--replicas", "4", "--fraction", "1", "--timeout", "0.5"});
  EXPECT_NE(short_of.exit_code, 0);
  EXPECT_THAT(short_of.err, HasSubstr("2 of 2 replicas ready (needed 4 of 4)"));

  ASSERT_TRUE(Eventually([&] { return GatewayReady() == 2; }));
  ProcessResult json_status = RunStitch({"status", "--gateway", gateway_url_, "--json"});
  ExpectOk(json_status, "status --json");
  json::object doc = Parse(json_status.out);
  ASSERT_TRUE(doc.contains("replicas")) << json_status.out;
  EXPECT_EQ(doc["replicas"].as_array().size(), 2u);
  EXPECT_EQ(doc["ready"].as_int64(), 2);
  ProcessResult table = RunStitch({"status", "--pool", pool, "--store", b.store});
  ExpectOk(table, "status --pool");
  EXPECT_THAT(table.out, HasSubstr(a.url));
  EXPECT_THAT(table.out, HasSubstr("r1/weight_v000001"));
  EXPECT_THAT(table.out, HasSubstr("2 of 2 replicas ready; store pointer r1/weight_v000001"));

  // Replica a still serves v0: the smoke test for v1 fails and says where.
  ProcessResult failing = RunStitch({"smoke", "--gateway", gateway_url_, "--version", "1"});
  EXPECT_NE(failing.exit_code, 0);
  EXPECT_THAT(failing.out, HasSubstr("FAIL  " + a.url));
  EXPECT_THAT(failing.out, HasSubstr("ok    " + b.url));
  Publish(a, 1);
  ASSERT_TRUE(Serves(a, 1));
  ProcessResult passing = RunStitch({"smoke", "--gateway", gateway_url_, "--version", "1"});
  ExpectOk(passing, "smoke");
  EXPECT_THAT(passing.out, HasSubstr("ok    " + a.url));
}

// Engines abort every request whose id starts with the one given: through
// the gateway too, a client whose rid is a prefix of another's must not cut
// the other's generation when it leaves.
TEST_F(GatewayIntegrationTest, AClientThatLeavesAbortsOnlyItsOwnGeneration) {
  Replica& r = StartReplica(0, 0);
  WritePool({&r});
  StartGateway();
  ASSERT_TRUE(Eventually([&] { return GatewayReady() == 1; })) << gateway_->err();
  auto engine = [&](const std::string& method, const std::string& path, std::string body = {}) {
    return HttpFetch(method, r.engine_url + path, std::move(body));
  };
  auto queued = [&] {
    auto info = engine("GET", "/server_info");
    return info.ok() ? Parse(info->body)["num_queued_requests"].as_int64() : -1;
  };
  // Requests wait in the engine's queue while it is paused.
  ASSERT_EQ(engine("POST", "/pause_generation", R"({"mode":"in_place"})")->status, 200);
  const std::string body =
      R"(,"text":"The policy","sampling_params":{"max_new_tokens":12,"temperature":0,"ignore_eos":true}})";
  auto kept = std::async(std::launch::async, [&] {
    return HttpFetch("POST", gateway_url_ + "/generate", R"({"rid":"job-12")" + body,
                     FetchOptions{.timeout = 60s});
  });
  ASSERT_TRUE(Eventually([&] { return queued() == 1; }));
  auto gateway = ParseHttpUrl(gateway_url_);
  ASSERT_TRUE(gateway.ok());
  {
    testing::RawSocket leaving(gateway->origin.port);
    ASSERT_TRUE(leaving.connected());
    const std::string request = R"({"rid":"job-1")" + body;
    leaving.Send(
        "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(request.size()) + "\r\n\r\n" + request);
    ASSERT_TRUE(Eventually([&] { return queued() == 2; }));
  }
  ASSERT_TRUE(Eventually([&] { return queued() == 1; }));
  ASSERT_EQ(engine("POST", "/continue_generation", "{}")->status, 200);
  auto answer = kept.get();
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->status, 200) << answer->body;
  json::object o = Parse(answer->body);
  EXPECT_EQ(o["meta_info"].at("finish_reason").at("type").as_string(), "length") << answer->body;
  EXPECT_EQ(o["meta_info"].at("id").as_string(), "job-12");
  EXPECT_EQ(o["output_ids"].as_array().size(), 12u);
}

}  // namespace
}  // namespace stitch
