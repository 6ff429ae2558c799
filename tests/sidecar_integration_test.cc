// The replica sidecar end to end: real `stitch engine` (the reference engine)
// and `stitch sidecar` processes over a filesystem store, following
// `stitch publish` of FULL and DELTA versions, and their failure paths.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <future>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "stitch/api/server_info.h"
#include "stitch/core/state.h"
#include "stitch/core/version.h"
#include "stitch/delta/checkpoint_image.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/net/client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/net_test_util.h"
#include "stitch/net/sse.h"
#include "stitch/refengine/config.h"
#include "stitch/refengine/init_model.h"
#include "tests/replica_steps.h"
#include "tests/sidecar_process.h"
#include "tests/support/cli_expect.h"
#include "tests/support/json_object.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
namespace json = boost::json;
using ::stitch::testing::Eventually;
using ::stitch::testing::ExpectOk;
using ::stitch::testing::ProcessResult;
using ::stitch::testing::RawSocket;
using ::stitch::testing::RunStitch;
using ::stitch::testing::ServerProcess;
using ::stitch::testing::TempDir;
using ::testing::HasSubstr;

constexpr auto kStartTimeout = std::chrono::seconds(60);
constexpr auto kConverge = std::chrono::seconds(60);

using testing::ParseObject;

struct FleetOptions {
  std::string engine = "sglang";
  std::string update_mode = "disk";
  std::vector<std::string> engine_flags;   // fault injection
  std::vector<std::string> sidecar_flags;  // extra sidecar flags
  std::string reconcile_interval = "0.2";
};

class SidecarIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
    store_ = (tmp_ / "store").string();
    base_ = (tmp_ / "base").string();
    std::filesystem::create_directories(tmp_ / "out");  // where versions are written
    // A tiny model: one layer, hidden 32; fast to load, stage and run.
    InitModel(base_, 1);
  }

  void InitModel(const std::string& dir, int seed) { testing::InitTinyModel(dir, seed); }

  // Starts the engine on the base checkpoint and a sidecar in front of it.
  void StartFleet(const FleetOptions& options = {}) {
    ExpectOk(RunStitch({"claim", "--store", store_, "--run-id", "r1", "--boot-version", "0"}),
             "claim");
    StartEngine(options, "0");
    StartSidecar(options);
  }
  // Starts the engine on the base checkpoint, listening on `port`.
  void StartEngine(const FleetOptions& options, const std::string& port) {
    std::vector<std::string> engine = {
        testing::StitchBinary(), "engine", "--model", base_, "--port", port, "--run-id", "r1"};
    engine.insert(engine.end(), options.engine_flags.begin(), options.engine_flags.end());
    engine_ = std::make_unique<ServerProcess>(engine);
    ASSERT_TRUE(engine_->started());
    auto engine_url = engine_->WaitForUrl(kStartTimeout);
    ASSERT_TRUE(engine_url.has_value()) << "engine did not start:\n" << engine_->err();
    engine_url_ = *engine_url;
  }
  // The engine's own answer to `method path`.
  absl::StatusOr<HttpResponse> EngineCall(const std::string& method, const std::string& path,
                                          std::string body = {}) {
    FetchOptions options;
    options.timeout = std::chrono::seconds(30);
    return HttpFetch(method, engine_url_ + path, std::move(body), options);
  }
  void StartSidecar(const FleetOptions& options) {
    std::vector<std::string> args = {testing::StitchBinary(),
                                     "sidecar",
                                     "--store",
                                     store_,
                                     "--run-id",
                                     "r1",
                                     "--engine",
                                     options.engine,
                                     "--engine-url",
                                     engine_url_,
                                     "--base-checkpoint",
                                     base_,
                                     "--update-mode",
                                     options.update_mode,
                                     "--reconcile-interval",
                                     options.reconcile_interval,
                                     "--watchdog-interval",
                                     "0.5",
                                     "--port",
                                     "0"};
    if (options.update_mode == "disk") {
      args.push_back("--local-checkpoint");
      args.push_back((tmp_ / "local").string());
    }
    args.insert(args.end(), options.sidecar_flags.begin(), options.sidecar_flags.end());
    sidecar_ = std::make_unique<ServerProcess>(args);
    ASSERT_TRUE(sidecar_->started());
    auto url = sidecar_->WaitForUrl(kStartTimeout);
    ASSERT_TRUE(url.has_value()) << "sidecar did not start:\n" << sidecar_->err();
    url_ = *url;
  }

  absl::StatusOr<HttpResponse> Call(const std::string& method, const std::string& path,
                                    std::string body = {}) {
    FetchOptions options;
    options.timeout = std::chrono::seconds(30);
    return HttpFetch(method, url_ + path, std::move(body), options);
  }
  std::optional<ReplicaState> ServerInfo() {
    auto r = Call("GET", "/server_info");
    if (!r.ok() || r->status != 200) return std::nullopt;
    auto state = ParseServerInfo(r->body);
    if (!state.ok()) return std::nullopt;
    return *state;
  }
  // Waits until the sidecar is ready and serves `version` of r1.
  bool ServesVersion(int64_t version) {
    return testing::ServesVersionOfR1(url_, version, kConverge);
  }

  // Publishes `checkpoint` as FULL `version`, waking the sidecar.
  void PublishFull(int64_t version, const std::string& checkpoint) {
    Run().PublishFull(version, checkpoint, url_);
  }
  testing::RunOfR1 Run() const { return {store_, tmp_ / "out"}; }
  void PublishDelta(int64_t version, const std::string& base, const std::string& target) {
    Run().PublishDelta(version, base, target);
  }

  // A greedy generation through `url`: its output ids and stamps.
  struct Generation {
    int status = 0;
    std::string output;  // output_ids as JSON text
    int64_t start = -1;
    int64_t end = -1;
    std::string body;
  };
  Generation Generate(const std::string& url, const std::string& constraint) {
    std::string body =
        R"({"text":"The policy","sampling_params":{"max_new_tokens":8,"temperature":0,"ignore_eos":true})";
    if (!constraint.empty()) body += R"(,"weight_version":)" + constraint;
    body += "}";
    FetchOptions options;
    options.timeout = std::chrono::seconds(60);
    auto r = HttpFetch("POST", url + "/generate", body, options);
    Generation g;
    if (!r.ok()) {
      g.body = std::string(r.status().message());
      return g;
    }
    g.status = r->status;
    g.body = r->body;
    if (r->status != 200) return g;
    json::object o = ParseObject(r->body);
    if (const json::value* ids = o.if_contains("output_ids")) g.output = json::serialize(*ids);
    if (const json::value* meta = o.if_contains("meta_info"); meta && meta->is_object()) {
      const json::object& m = meta->get_object();
      if (m.contains("weight_version_start")) g.start = m.at("weight_version_start").as_int64();
      if (m.contains("weight_version_end")) g.end = m.at("weight_version_end").as_int64();
    }
    return g;
  }

  // The same generation from a fresh engine serving `checkpoint` directly.
  std::string ReferenceOutput(const std::string& checkpoint) {
    ServerProcess reference(
        {testing::StitchBinary(), "engine", "--model", checkpoint, "--port", "0"});
    auto url = reference.WaitForUrl(kStartTimeout);
    EXPECT_TRUE(url.has_value()) << reference.err();
    if (!url.has_value()) return "";
    Generation g = Generate(*url, "");
    EXPECT_EQ(g.status, 200) << g.body;
    return g.output;
  }

  // Follows FULL v1 and DELTA v2 and checks what is served at each step.
  void FollowsFullAndDeltaVersions(const FleetOptions& options) {
    InitModel((tmp_ / "ckpt1").string(), 2);
    InitModel((tmp_ / "ckpt2").string(), 3);
    StartFleet(options);
    ASSERT_TRUE(ServesVersion(0)) << sidecar_->err();
    Generation boot = Generate(url_, R"({"exact_version":0})");
    ASSERT_EQ(boot.status, 200) << boot.body;
    EXPECT_EQ(boot.start, 0);
    EXPECT_EQ(boot.end, 0);

    PublishFull(1, (tmp_ / "ckpt1").string());
    ASSERT_TRUE(ServesVersion(1)) << sidecar_->err();
    Generation v1 = Generate(url_, R"({"exact_version":1})");
    ASSERT_EQ(v1.status, 200) << v1.body;
    EXPECT_EQ(v1.start, 1);
    EXPECT_EQ(v1.end, 1);

    PublishDelta(2, (tmp_ / "ckpt1").string(), (tmp_ / "ckpt2").string());
    ASSERT_TRUE(ServesVersion(2)) << sidecar_->err();
    Generation v2 = Generate(url_, R"({"min_version":2})");
    ASSERT_EQ(v2.status, 200) << v2.body;
    EXPECT_EQ(v2.start, 2);
    EXPECT_EQ(v2.end, 2);
    // The fleet really serves the target weights: a fresh engine on the
    // target checkpoint generates the same tokens.
    EXPECT_EQ(v2.output, ReferenceOutput((tmp_ / "ckpt2").string()));
    EXPECT_NE(v2.output, v1.output);
    EXPECT_NE(v1.output, boot.output);

    // An exact pin on an older version is refused with the documented body.
    auto stale = Call("POST", "/generate", R"({"text":"x","weight_version":{"exact_version":1}})");
    ASSERT_TRUE(stale.ok()) << stale.status();
    EXPECT_EQ(stale->status, 409);
    json::object conflict = ParseObject(stale->body);
    EXPECT_EQ(conflict.at("type").as_string(), "WeightVersionNotReady");
    EXPECT_EQ(conflict.at("target_version").as_int64(), 1);
    EXPECT_EQ(conflict.at("applied").as_int64(), 2);
    EXPECT_EQ(conflict.at("applied_identity").as_string(), "r1/weight_v000002");
    EXPECT_FALSE(conflict.at("message").as_string().empty());

    auto metrics = Call("GET", "/metrics");
    ASSERT_TRUE(metrics.ok());
    EXPECT_THAT(metrics->body, HasSubstr("stitch_sidecar_applied_version{run_id=\"r1\"} 2"));
    EXPECT_THAT(metrics->body, HasSubstr("stitch_sidecar_ready 1"));
    // The engine's own families follow the sidecar's.
    EXPECT_THAT(metrics->body, HasSubstr("stitch_sidecar_engine_metrics_up 1"));
    EXPECT_THAT(metrics->body, HasSubstr("# TYPE sglang:num_running_reqs gauge"));
  }

  TempDir tmp_;
  std::string store_;
  std::string base_;
  std::string engine_url_;
  std::string url_;
  std::unique_ptr<ServerProcess> engine_;
  std::unique_ptr<ServerProcess> sidecar_;
};

// Every answer a rollout client got during a fault test, judged against
// the weights that really produced it.
struct RolloutTally {
  int requests = 0;
  int answered = 0;     // 200
  int retryable = 0;    // 409, 503
  int unreachable = 0;  // no answer (the sidecar was down)
  int failed = 0;       // any other status
  int crossed = 0;      // 200 whose start and end differ (not judged)
  int mislabelled = 0;  // 200 whose output is not what its version's weights give
  int violations = 0;   // 200 whose stamps do not satisfy the constraint
  std::vector<std::string> examples;

  std::string Summary() const {
    return absl::StrCat(requests, " requests: ", answered, " answered, ", retryable,
                        " retryable (409/503), ", unreachable, " unanswered, ", failed,
                        " failed otherwise; ", crossed, " crossed a commit; ", violations,
                        " constraint violations, ", mislabelled,
                        " labelled with other weights than produced them");
  }
};

TEST_F(SidecarIntegrationTest, FleetFollowsFullAndDeltaVersionsStagedByTheEngineOnDisk) {
  FollowsFullAndDeltaVersions(FleetOptions{});
}

TEST_F(SidecarIntegrationTest, FleetFollowsFullAndDeltaVersionsStagedByTheEngineInMemory) {
  FleetOptions options;
  options.update_mode = "cpu";
  FollowsFullAndDeltaVersions(options);
}

// `stitch compact` anchors a chain of DELTAs after the fact and gc deletes
// what is behind the anchor: a replica that joins then can only have
// started from the anchor, and serves the pointer's weights.
TEST_F(SidecarIntegrationTest, AReplicaJoiningAfterCompactAndGcStartsFromTheAnchor) {
  ExpectOk(RunStitch({"claim", "--store", store_, "--run-id", "r1", "--boot-version", "0"}),
           "claim");
  std::string previous = base_;
  for (int v = 1; v <= 4; ++v) {
    const std::string next = (tmp_ / absl::StrCat("ckpt", v)).string();
    InitModel(next, v + 1);
    PublishDelta(v, previous, next);
    previous = next;
  }
  ProcessResult unanchored = RunStitch({"compact", "--store", store_, "--version", "3"});
  EXPECT_EQ(unanchored.exit_code, 1);
  EXPECT_THAT(unanchored.err, HasSubstr("--base"));
  ProcessResult compact = RunStitch(
      {"compact", "--store", store_, "--version", "3", "--base", base_, "--boot-version", "0"});
  ASSERT_EQ(compact.exit_code, 0) << compact.err;
  EXPECT_THAT(compact.out, HasSubstr("wrote the anchor of weight_v000003"));
  ProcessResult again = RunStitch({"compact", "--store", store_, "--version", "3"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.out, HasSubstr("has an anchor already"));
  EXPECT_THAT(RunStitch({"status", "--store", store_}).out,
              HasSubstr("anchors (stitch compact): weight_v000003"));
  ProcessResult gc = RunStitch({"gc", "--store", store_, "--keep-last", "1"});
  ASSERT_EQ(gc.exit_code, 0) << gc.err;
  EXPECT_THAT(gc.out, HasSubstr("kept    weight_v000003: anchored, chain of weight_v000004"));
  EXPECT_THAT(gc.out, HasSubstr("2 kept, 2 deleted"));
  EXPECT_FALSE(fs::exists(tmp_ / "store/updates" / VersionDirName(1)));

  StartEngine(FleetOptions{}, "0");
  StartSidecar(FleetOptions{});
  ASSERT_TRUE(ServesVersion(4)) << sidecar_->err();
  Generation g = Generate(url_, R"({"exact_version":4})");
  ASSERT_EQ(g.status, 200) << g.body;
  EXPECT_EQ(g.output, ReferenceOutput(previous));
}

TEST_F(SidecarIntegrationTest, FleetFollowsFullAndDeltaVersionsStagedByTheSidecar) {
  FleetOptions options;
  options.engine = "sglang-stock";
  options.sidecar_flags = {"--commit-mode", "quiesce"};
  FollowsFullAndDeltaVersions(options);
}

// The base checkpoint with the LM head of the init-model of `seed`: a
// version that changes about a quarter of the tiny model's values.
void WriteLmHeadVariant(const std::filesystem::path& base, const std::filesystem::path& dir,
                        const std::filesystem::path& other, int seed) {
  testing::InitTinyModel(other.string(), seed);
  CheckpointImage::LoadOptions load;
  load.version = 0;
  absl::StatusOr<CheckpointImage> a = CheckpointImage::Load(base, load);
  absl::StatusOr<CheckpointImage> b = CheckpointImage::Load(other, load);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
  std::vector<TensorView> views = a->Views();
  for (const TensorView& v : b->Views()) {
    if (v.name != "lm_head.weight") continue;
    for (TensorView& w : views) {
      if (w.name == v.name) w = v;
    }
  }
  absl::StatusOr<ModelConfig> config = ReadModelConfig(base);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(WriteCheckpoint(dir, *config, views, ExistingDir::kRefuse).ok());
}

TEST_F(SidecarIntegrationTest, SparseVersionsArePatchedInPlaceAndAnUndonePatchIsThenSwappedIn) {
  // v1 and v2 each change the LM head only; the engine's first patch fails
  // half-way and is undone.
  WriteLmHeadVariant(base_, tmp_ / "ckpt1", tmp_ / "head1", 2);
  WriteLmHeadVariant(base_, tmp_ / "ckpt2", tmp_ / "head2", 3);
  FleetOptions options;
  options.update_mode = "cpu";
  options.engine_flags = {"--fault-fail-patches", "1", "--patch-max-density", "0.5"};
  StartFleet(options);
  ASSERT_TRUE(ServesVersion(0)) << sidecar_->err();
  const Generation boot = Generate(url_, R"({"exact_version":0})");
  ASSERT_EQ(boot.status, 200) << boot.body;

  PublishDelta(1, base_, (tmp_ / "ckpt1").string());
  ASSERT_TRUE(ServesVersion(1)) << sidecar_->err();
  const Generation v1 = Generate(url_, R"({"exact_version":1})");
  ASSERT_EQ(v1.status, 200) << v1.body;
  EXPECT_EQ(v1.output, ReferenceOutput((tmp_ / "ckpt1").string()));
  EXPECT_NE(v1.output, boot.output);

  PublishDelta(2, (tmp_ / "ckpt1").string(), (tmp_ / "ckpt2").string());
  ASSERT_TRUE(ServesVersion(2)) << sidecar_->err();
  const Generation v2 = Generate(url_, R"({"exact_version":2})");
  ASSERT_EQ(v2.status, 200) << v2.body;
  EXPECT_EQ(v2.output, ReferenceOutput((tmp_ / "ckpt2").string()));

  auto metrics = Call("GET", "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  // v1: the patch undone (the old version served on), then whole weights
  // swapped in; v2: a patch.
  EXPECT_THAT(metrics->body, HasSubstr("stitch_sidecar_commits_undone_total 1"));
  EXPECT_THAT(metrics->body, HasSubstr(R"(path="patch-undone",reason=""} 1)"));
  EXPECT_THAT(metrics->body, HasSubstr(R"(path="swap",reason="patch-failed"} 1)"));
  EXPECT_THAT(metrics->body, HasSubstr(R"(path="patch",reason=""} 1)"));
  auto info = EngineCall("GET", "/server_info");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(ParseObject(info->body).at("weight_version_id").as_string(), "r1/weight_v000002");
}

TEST_F(SidecarIntegrationTest, ControlRoutesAreBlockedWith403) {
  StartFleet();
  ASSERT_TRUE(ServesVersion(0));
  // Encoded, dotted, doubled and upper-case forms too: engines served by
  // uvicorn decode the path before routing.
  for (std::string path : {"/pause_generation", "/update_weights_from_disk", "/flush_cache",
                           "/%70ause_generation", "/%75pdate_weights_from_disk",
                           "/v1/../flush_cache", "//pause_generation", "/PAUSE_GENERATION"}) {
    auto r = Call("POST", path, "{}");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 403) << path;
    EXPECT_EQ(ParseObject(r->body).at("error").at("type").as_string(), "RouteBlocked");
  }
  // Targets a client library would not send, on a raw socket: a fragment
  // and undecodable escapes are a 400, never forwarded.
  const auto port = static_cast<uint16_t>(std::stoi(url_.substr(url_.rfind(':') + 1)));
  for (std::string path : {"/flush_cache?%zz", "/%70ause_generation%zz", "/flush_cache#f"}) {
    stitch::testing::RawSocket raw(port);
    ASSERT_TRUE(raw.connected());
    raw.Send("POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
    EXPECT_EQ(raw.ReadUntil("\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u) << path;
  }
  // The engine was never paused: generation still works.
  EXPECT_EQ(Generate(url_, "").status, 200);
}

// The sidecar's own routes match only as spelled. Another spelling of one
// (encoded, doubled or trailing slashes, another case, dot segments) is
// neither served, which would skip its token, nor forwarded, since the
// engine would read it as that route with the engine's key. The peer
// route takes plain decimal numbers only.
TEST_F(SidecarIntegrationTest, OwnRoutesMatchOnlyAsSpelledAndThePeerRouteParsesStrictly) {
  const fs::path token = tmp_ / "fleet.token";
  ASSERT_TRUE(WriteFileAtomically(token, "fleet-secret\n").ok());
  FleetOptions options;
  options.sidecar_flags = {"--auth-token-file", token.string(), "--peers",
                           "static:http://127.0.0.1:1"};
  StartFleet(options);
  ASSERT_TRUE(ServesVersion(0));
  for (std::string path : {"/%77ake", "//wake", "/wake/", "/WAKE", "/v1/../wake"}) {
    auto r = Call("POST", path, "{}");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 404) << path << ": " << r->body;
    EXPECT_THAT(r->body, HasSubstr("send POST /wake")) << path;
  }
  auto info = Call("GET", "/server_%69nfo");
  ASSERT_TRUE(info.ok());
  EXPECT_THAT(info->body, HasSubstr("send GET /server_info"));
  auto wrong_method = Call("GET", "/wake");
  ASSERT_TRUE(wrong_method.ok());
  EXPECT_EQ(wrong_method->status, 405) << wrong_method->body;
  // As spelled, /wake still needs the token and works with it.
  auto anonymous = Call("POST", "/wake", "{}");
  ASSERT_TRUE(anonymous.ok());
  EXPECT_EQ(anonymous->status, 401);

  FetchOptions with_token;
  with_token.headers.Set("Authorization", "Bearer fleet-secret");
  const std::string route = url_ + "/peer/v1/file";
  for (std::string query : {"?version=+1&name=x", "?version=%2B1&name=x", "?version=%201&name=x",
                            "?version=1%20&name=x", "?version=0x1&name=x",
                            "?version=1&name=x&wait_ms=+5", "?version=1&name=x&wait_ms=-1"}) {
    auto r = HttpFetch("GET", route + query, "", with_token);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 400) << query << ": " << r->body;
  }
  auto absent = HttpFetch("GET", route + "?version=1&name=x&wait_ms=0", "", with_token);
  ASSERT_TRUE(absent.ok());
  EXPECT_EQ(absent->status, 404) << absent->body;

  // The evaluation hold's routes: the token, plain digits, a holder; a
  // version above the pointer is a 409, a release by nobody a 404.
  auto stranger = Call("POST", "/admin/hold?version=0&holder=eval", "");
  ASSERT_TRUE(stranger.ok());
  EXPECT_EQ(stranger->status, 401);
  for (std::string query :
       {"?version=+0&holder=eval", "?version=0", "?holder=eval", "?version=0&holder="}) {
    auto r = HttpFetch("POST", url_ + "/admin/hold" + query, "", with_token);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 400) << query << ": " << r->body;
  }
  auto ahead = HttpFetch("POST", url_ + "/admin/hold?version=7&holder=eval", "", with_token);
  ASSERT_TRUE(ahead.ok());
  EXPECT_EQ(ahead->status, 409) << ahead->body;
  EXPECT_THAT(ahead->body, HasSubstr("the store's pointer is at"));
  auto nobody = HttpFetch("POST", url_ + "/admin/release?holder=eval", "", with_token);
  ASSERT_TRUE(nobody.ok());
  EXPECT_EQ(nobody->status, 404) << nobody->body;
  auto held = HttpFetch("POST", url_ + "/admin/hold?version=0&holder=eval", "", with_token);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(held->status, 200) << held->body;
  EXPECT_THAT(held->body, HasSubstr(R"("holder":"eval")"));
  auto released = HttpFetch("POST", url_ + "/admin/release?holder=eval", "", with_token);
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(released->status, 200) << released->body;
  EXPECT_THAT(released->body, HasSubstr(R"("held":null)"));
}

TEST_F(SidecarIntegrationTest, RequestBodiesAreBoundedByTheFlags) {
  FleetOptions options;
  options.sidecar_flags = {"--max-body-bytes", "1KiB", "--max-total-body-bytes", "1MiB"};
  StartFleet(options);
  ASSERT_TRUE(ServesVersion(0));
  auto big = Call("POST", "/generate", R"({"text":")" + std::string(2048, 'a') + R"("})");
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->status, 413);
  EXPECT_EQ(ParseObject(big->body).at("error").at("type").as_string(), "PayloadTooLarge");
  EXPECT_THAT(big->body, HasSubstr("1024"));
  EXPECT_EQ(Generate(url_, "").status, 200);
}

TEST_F(SidecarIntegrationTest, StreamedEventsAreEachStamped) {
  StartFleet();
  ASSERT_TRUE(ServesVersion(0));
  EventLoop loop;
  HttpClient client(loop.executor());
  auto url = ParseHttpUrl(url_);
  ASSERT_TRUE(url.ok());
  HttpRequest request;
  request.method = "POST";
  request.target = "/generate";
  request.headers.Set("Content-Type", "application/json");
  request.body =
      R"({"text":"stream me","stream":true,"sampling_params":{"max_new_tokens":6,"temperature":0},"weight_version":{"min_version":0}})";
  auto stream = loop.BlockOn(client.SendStreamed(url->origin, request));
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_EQ(stream->status(), 200);
  SseEventSplitter splitter;
  int stamped = 0;
  bool done = false;
  for (;;) {
    auto chunk = loop.BlockOn(stream->Read());
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    if (chunk->empty()) break;
    splitter.Append(*chunk);
    while (auto event = splitter.Next()) {
      std::optional<std::string> data = SseData(*event);
      ASSERT_TRUE(data.has_value()) << *event;
      if (*data == "[DONE]") {
        done = true;
        continue;
      }
      json::object o = ParseObject(*data);
      const json::object& meta = o.at("meta_info").as_object();
      EXPECT_EQ(meta.at("weight_version_start").as_int64(), 0);
      EXPECT_EQ(meta.at("weight_version_end").as_int64(), 0);
      ++stamped;
    }
  }
  EXPECT_TRUE(done);
  EXPECT_GE(stamped, 2);
}

TEST_F(SidecarIntegrationTest, KilledEngineGivesRetryable503ThenTheSidecarExits) {
  FleetOptions options;
  options.sidecar_flags = {"--engine-restart-grace", "2"};
  StartFleet(options);
  ASSERT_TRUE(ServesVersion(0));
  engine_->Signal(SIGKILL);
  ASSERT_TRUE(engine_->WaitForExit(std::chrono::seconds(30)).has_value());
  auto r = Call("POST", "/generate", R"({"text":"anyone there?"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_EQ(r->headers.Get("retry-after"), "1");
  json::object body = ParseObject(r->body);
  EXPECT_EQ(body.at("error").at("type").as_string(), "EngineUnavailable");
  EXPECT_EQ(body.at("error").at("retryable").as_bool(), true);
  // The watchdog ends the replica once the restart grace has run out.
  std::optional<int> exit = sidecar_->WaitForExit(std::chrono::seconds(30));
  ASSERT_TRUE(exit.has_value()) << sidecar_->err();
  EXPECT_EQ(*exit, 3) << sidecar_->err();
  EXPECT_THAT(sidecar_->err(), HasSubstr("did not come back within 2 s"));
}

// A real engine takes minutes to load: a sidecar started first waits for
// it, out of rotation and saying why, then serves.
TEST_F(SidecarIntegrationTest, ASidecarStartedBeforeItsEngineWaitsForItThenServes) {
  ExpectOk(RunStitch({"claim", "--store", store_, "--run-id", "r1", "--boot-version", "0"}),
           "claim");
  const uint16_t port = testing::UnusedPort();
  engine_url_ = "http://127.0.0.1:" + std::to_string(port);
  FleetOptions options;
  StartSidecar(options);
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto health = Call("GET", "/health");
        return health.ok() && health->status == 503 &&
               health->body.find("waiting for the engine to start") != std::string::npos;
      },
      kConverge));
  StartEngine(options, std::to_string(port));
  EXPECT_TRUE(ServesVersion(0)) << sidecar_->err();
  EXPECT_FALSE(sidecar_->WaitForExit(std::chrono::milliseconds(0)).has_value());
}

// An engine that restarts while serving takes the replica out of rotation;
// back within the grace, it is verified again and the replica rejoins.
TEST_F(SidecarIntegrationTest, AnEngineRestartedWithinTheGraceIsVerifiedAndRejoins) {
  StartFleet();
  ASSERT_TRUE(ServesVersion(0));
  const std::string port = engine_url_.substr(engine_url_.rfind(':') + 1);
  engine_->Signal(SIGKILL);
  ASSERT_TRUE(engine_->WaitForExit(std::chrono::seconds(30)).has_value());
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto health = Call("GET", "/health");
        return health.ok() && health->status == 503;
      },
      kConverge));
  auto refused = Call("POST", "/generate", R"({"text":"anyone there?"})");
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->status, 503) << refused->body;
  StartEngine(FleetOptions{}, port);
  EXPECT_TRUE(ServesVersion(0)) << sidecar_->err();
  EXPECT_FALSE(sidecar_->WaitForExit(std::chrono::milliseconds(0)).has_value());
  EXPECT_THAT(sidecar_->err(), HasSubstr("the engine restarted"));
}

TEST_F(SidecarIntegrationTest, CommitFailureEndsTheSidecarNonZero) {
  InitModel((tmp_ / "ckpt1").string(), 2);
  FleetOptions options;
  options.engine_flags = {"--fail-commits", "1"};
  StartFleet(options);
  ASSERT_TRUE(ServesVersion(0));
  PublishFull(1, (tmp_ / "ckpt1").string());
  std::optional<int> exit = sidecar_->WaitForExit(std::chrono::seconds(60));
  ASSERT_TRUE(exit.has_value()) << sidecar_->err();
  EXPECT_EQ(*exit, 3);
  EXPECT_THAT(sidecar_->err(), HasSubstr("weight commit of r1/weight_v000001 failed"));
}

TEST_F(SidecarIntegrationTest, MetricsAnswerAtTheBootVersion) {
  StartFleet();
  auto metrics = Call("GET", "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("# TYPE stitch_sidecar_requests_in_flight gauge"));
  // Once the engine's boot weights are verified, ready at the boot version,
  // and it serves.
  ASSERT_TRUE(ServesVersion(0));
  EXPECT_EQ(Generate(url_, R"({"exact_version":0})").status, 200);
  metrics = Call("GET", "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(metrics->body, HasSubstr("stitch_sidecar_applied_version{run_id=\"r1\"} 0"));
  EXPECT_THAT(metrics->body, HasSubstr("stitch_sidecar_engine_verified 1"));
}

// The promise behind every version label, under the faults that broke it:
// an engine killed and restarted on its boot checkpoint under a live
// sidecar, a sidecar killed and restarted beside a live engine, and the
// engine's weights swapped through its own route. Each version has distinct
// weights, so a greedy output tells which weights produced it; a rollout
// client keeps sending constrained requests while versions are published.
TEST_F(SidecarIntegrationTest, VersionLabelsHoldThroughRestartsAndOutOfBandLoads) {
  constexpr int kVersions = 5;
  std::vector<std::string> checkpoints = {base_};
  for (int v = 1; v <= kVersions; ++v) {
    checkpoints.push_back((tmp_ / absl::StrCat("ckpt", v)).string());
    InitModel(checkpoints.back(), v + 1);
  }
  std::map<int64_t, std::string> oracle;
  for (int v = 0; v <= kVersions; ++v) oracle[v] = ReferenceOutput(checkpoints[v]);
  for (int v = 1; v <= kVersions; ++v) {
    ASSERT_NE(oracle[v], oracle[v - 1]) << "versions " << v - 1 << " and " << v << " look alike";
  }
  auto publish = [&](int64_t v) {
    if (v % 3 == 1) {
      PublishFull(v, checkpoints[v]);
    } else {
      PublishDelta(v, checkpoints[v - 1], checkpoints[v]);
    }
  };

  StartFleet();
  ASSERT_TRUE(ServesVersion(0)) << sidecar_->err();
  absl::Mutex mu;
  absl::CondVar idle;  // the sidecar's address changed, or the test ends
  std::string url = url_;
  std::atomic<int64_t> latest{0};
  std::atomic<bool> stop{false};
  RolloutTally tally;
  std::thread client([&] {
    for (int i = 0; !stop.load(); ++i) {
      const int64_t known = latest.load();
      std::string constraint;
      int64_t min = 0;
      std::optional<int64_t> exact;
      switch (i % 3) {
        case 0:
          break;
        case 1:
          min = std::max<int64_t>(0, known - 1);
          constraint = absl::StrCat(R"({"min_version":)", min, "}");
          break;
        default:
          exact = known;
          constraint = absl::StrCat(R"({"exact_version":)", known, "}");
          break;
      }
      std::string target;
      {
        absl::MutexLock lock(&mu);
        target = url;
      }
      Generation g = Generate(target, constraint);
      absl::MutexLock lock(&mu);
      ++tally.requests;
      if (g.status == 409 || g.status == 503) {
        ++tally.retryable;
        continue;
      }
      if (g.status == 0) {
        ++tally.unreachable;
        // Nobody listens there (the sidecar is being restarted): wait for
        // its new address rather than spin.
        if (!stop.load() && url == target) idle.WaitWithTimeout(&mu, absl::Milliseconds(20));
        continue;
      }
      if (g.status != 200) {
        ++tally.failed;
        tally.examples.push_back(absl::StrCat("HTTP ", g.status, ": ", g.body));
        continue;
      }
      ++tally.answered;
      if (g.start < min || (exact.has_value() && (g.start != *exact || g.end != *exact))) {
        ++tally.violations;
        tally.examples.push_back(absl::StrCat(constraint, " got ", g.body));
      }
      if (g.start != g.end) {
        ++tally.crossed;
      } else if (!oracle.contains(g.start) || oracle.at(g.start) != g.output) {
        ++tally.mislabelled;
        tally.examples.push_back(absl::StrCat("labelled v", g.start, ": ", g.body));
      }
    }
  });
  auto answered = [&] {
    absl::MutexLock lock(&mu);
    return tally.answered;
  };
  auto advance = [&](int64_t v) {
    publish(v);
    latest.store(v);
    EXPECT_TRUE(ServesVersion(v)) << sidecar_->err();
  };

  advance(1);
  advance(2);

  // 1. The engine is killed and restarted on its boot checkpoint, on the
  // same port, under the live sidecar.
  const std::string port = engine_url_.substr(engine_url_.rfind(':') + 1);
  engine_->Signal(SIGKILL);
  ASSERT_TRUE(engine_->WaitForExit(std::chrono::seconds(30)).has_value());
  StartEngine(FleetOptions{}, port);
  advance(3);
  // The sidecar lived through it (whether a probe saw the new instance first
  // or the commit of v3 replaced the weights first).
  EXPECT_FALSE(sidecar_->WaitForExit(std::chrono::milliseconds(1)).has_value())
      << "the sidecar ended:\n"
      << sidecar_->err();

  // 2. The sidecar is killed and restarted beside the live engine: it
  // verifies what the engine holds and serves it without reloading.
  auto swaps = [&] {
    auto info = EngineCall("GET", "/server_info");
    return info.ok() ? ParseObject(info->body).at("weight_swaps").as_int64() : -1;
  };
  const int64_t swaps_before = swaps();
  sidecar_->Signal(SIGKILL);
  ASSERT_TRUE(sidecar_->WaitForExit(std::chrono::seconds(30)).has_value());
  StartSidecar(FleetOptions{});
  {
    absl::MutexLock lock(&mu);
    url = url_;
  }
  idle.SignalAll();
  ASSERT_TRUE(ServesVersion(3)) << sidecar_->err();
  EXPECT_EQ(swaps(), swaps_before);
  EXPECT_THAT(sidecar_->err(), HasSubstr("verified the engine's weights: r1/weight_v000003"));
  advance(4);

  // 3. Someone loads v1's checkpoint through the engine's own route.
  auto rollback = EngineCall("POST", "/update_weights_from_disk",
                             absl::StrCat(R"({"model_path":")", checkpoints[1],
                                          R"(","weight_version":"r1/weight_v000001"})"));
  ASSERT_TRUE(rollback.ok()) << rollback.status();
  ASSERT_EQ(rollback->status, 200) << rollback->body;
  // Another load under the label being served is refused by the engine.
  auto relabel = EngineCall("POST", "/update_weights_from_disk",
                            absl::StrCat(R"({"model_path":")", checkpoints[2],
                                         R"(","weight_version":"r1/weight_v000001"})"));
  ASSERT_TRUE(relabel.ok()) << relabel.status();
  EXPECT_EQ(relabel->status, 400) << relabel->body;
  advance(5);
  EXPECT_THAT(sidecar_->err(), HasSubstr("no longer vouches"));

  const int before_end = answered();
  ASSERT_TRUE(Eventually([&] { return answered() >= before_end + 5; }, kConverge));
  stop.store(true);
  client.join();
  std::printf("fault test: %s\n", tally.Summary().c_str());
  EXPECT_EQ(tally.mislabelled, 0) << tally.Summary() << "\n" << absl::StrJoin(tally.examples, "\n");
  EXPECT_EQ(tally.violations, 0) << tally.Summary() << "\n" << absl::StrJoin(tally.examples, "\n");
  EXPECT_EQ(tally.failed, 0) << tally.Summary() << "\n" << absl::StrJoin(tally.examples, "\n");
  EXPECT_GT(tally.answered, 20) << tally.Summary();
}

// Engines abort every request whose id starts with the one given: a client
// whose rid is a prefix of another's must not cut the other's generation
// when it leaves.
TEST_F(SidecarIntegrationTest, AClientThatLeavesAbortsOnlyItsOwnGeneration) {
  StartFleet();
  ASSERT_TRUE(ServesVersion(0));
  // Requests wait in the engine's queue while it is paused, so both are in
  // flight when the first client leaves.
  ASSERT_EQ(EngineCall("POST", "/pause_generation", R"({"mode":"in_place"})")->status, 200);
  const std::string body =
      R"(,"text":"The policy","sampling_params":{"max_new_tokens":12,"temperature":0,"ignore_eos":true}})";
  auto queued = [&] {
    auto info = EngineCall("GET", "/server_info");
    return info.ok() ? ParseObject(info->body).at("num_queued_requests").as_int64() : -1;
  };
  auto url = ParseHttpUrl(url_);
  ASSERT_TRUE(url.ok());
  auto kept = std::async(std::launch::async, [&] {
    return HttpFetch("POST", url_ + "/generate", R"({"rid":"job-12")" + body,
                     FetchOptions{.timeout = std::chrono::seconds(60)});
  });
  ASSERT_TRUE(Eventually([&] { return queued() == 1; }, kConverge));
  {
    RawSocket leaving(url->origin.port);
    ASSERT_TRUE(leaving.connected());
    const std::string request = R"({"rid":"job-1")" + body;
    leaving.Send(
        absl::StrCat("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     "application/json\r\nContent-Length: ",
                     request.size(), "\r\n\r\n", request));
    ASSERT_TRUE(Eventually([&] { return queued() == 2; }, kConverge));
  }
  ASSERT_TRUE(Eventually([&] { return queued() == 1; }, kConverge));
  ASSERT_EQ(EngineCall("POST", "/continue_generation", "{}")->status, 200);
  auto answer = kept.get();
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->status, 200) << answer->body;
  json::object o = ParseObject(answer->body);
  EXPECT_EQ(o.at("meta_info").at("finish_reason").at("type").as_string(), "length") << answer->body;
  EXPECT_EQ(o.at("meta_info").at("id").as_string(), "job-12");
  EXPECT_EQ(o.at("output_ids").as_array().size(), 12u);
}

// An engine that dies takes its replica out of rotation at the first failed
// check, long before the watchdog would end the replica; a frozen one too,
// and it rejoins when it answers again, without reloading anything.
TEST_F(SidecarIntegrationTest, ASilentEngineLeavesRotationAtOnceAndRejoinsWhenItAnswers) {
  FleetOptions options;
  options.sidecar_flags = {"--watchdog-threshold", "1000"};
  StartFleet(options);
  ASSERT_TRUE(ServesVersion(0));
  auto health = [&] {
    auto r = Call("GET", "/health");
    return r.ok() ? r->status : 0;
  };
  auto failures = [&] {
    auto m = Call("GET", "/metrics");
    if (!m.ok()) return -1;
    const std::string name = "\nstitch_sidecar_watchdog_failures_total ";
    const size_t at = m->body.find(name);
    return at == std::string::npos ? -1 : std::stoi(m->body.substr(at + name.size()));
  };
  engine_->Signal(SIGSTOP);
  ASSERT_TRUE(Eventually([&] { return health() == 503; }, kConverge));
  EXPECT_LE(failures(), 3);  // the first failed checks, not a threshold
  auto refused = Call("POST", "/generate", R"({"text":"x","weight_version":{"min_version":0}})");
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->status, 409) << refused->body;
  EXPECT_THAT(refused->body, HasSubstr("did not answer"));
  engine_->Signal(SIGCONT);
  ASSERT_TRUE(ServesVersion(0)) << sidecar_->err();
  EXPECT_EQ(Generate(url_, R"({"exact_version":0})").status, 200);
  EXPECT_THAT(sidecar_->err(), ::testing::Not(HasSubstr("no longer vouches")));

  engine_->Signal(SIGKILL);
  ASSERT_TRUE(Eventually([&] { return health() == 503; }, kConverge));
  EXPECT_LE(failures(), 6);
  EXPECT_FALSE(sidecar_->WaitForExit(std::chrono::milliseconds(1)).has_value());
  auto info = ServerInfo();
  ASSERT_TRUE(info.has_value());
  EXPECT_FALSE(info->ready);
  EXPECT_THAT(info->reason, HasSubstr("did not answer"));
}

// A replica that cannot apply the pointer's version says why: in
// /server_info, in the 409s it answers, and in `stitch status`.
TEST_F(SidecarIntegrationTest, AReplicaThatCannotApplyAVersionSaysWhyEverywhere) {
  InitModel((tmp_ / "ckpt1").string(), 2);
  FleetOptions options;
  options.reconcile_interval = "0";  // passes only when woken
  StartFleet(options);
  ASSERT_TRUE(ServesVersion(0));
  // v1 is published, then its bytes are damaged in the store before the
  // replica applies it.
  const std::string dir = (tmp_ / "out" / VersionDirName(1)).string();
  ExpectOk(RunStitch({"delta", "full", "--checkpoint", (tmp_ / "ckpt1").string(), "--out", dir,
                      "--version", "1", "--run-id", "r1"}),
           "delta full");
  ExpectOk(RunStitch({"publish", "--store", store_, "--run-id", "r1", dir}), "publish");
  for (const auto& entry :
       fs::directory_iterator(fs::path(store_) / "updates" / VersionDirName(1))) {
    if (entry.path().extension() == ".safetensors") fs::remove(entry.path());
  }
  ASSERT_EQ(Call("POST", "/wake")->status, 200);
  ASSERT_TRUE(Eventually(
      [&] {
        auto s = ServerInfo();
        return s.has_value() && !s->sync_error.empty();
      },
      kConverge));
  auto info = ServerInfo();
  EXPECT_THAT(info->sync_error, HasSubstr("weight_v000001"));
  auto conflict = Call("POST", "/generate", R"({"text":"x","weight_version":{"min_version":1}})");
  ASSERT_TRUE(conflict.ok());
  EXPECT_EQ(conflict->status, 409);
  const std::string message(ParseObject(conflict->body).at("message").as_string());
  EXPECT_THAT(message, HasSubstr("cannot catch up"));
  EXPECT_THAT(message, HasSubstr("weight_v000001"));
  ProcessResult status = RunStitch({"status", "--pool", "static:" + url_, "--store", store_});
  ExpectOk(status, "status");
  EXPECT_THAT(status.out, HasSubstr("cannot sync: "));
  EXPECT_THAT(status.out, HasSubstr("weight_v000001"));
}

TEST_F(SidecarIntegrationTest, AStoreNobodyClaimedIsRefusedAtStart) {
  // A mistyped --store: following it would label whatever the engine holds
  // as the boot version. The sidecar exits before it listens, and creates
  // nothing.
  const std::string typo = (tmp_ / "stor").string();
  ProcessResult r =
      RunStitch({"sidecar", "--store", typo, "--run-id", "r1", "--engine-url", "http://127.0.0.1:1",
                 "--base-checkpoint", base_, "--update-mode", "cpu", "--boot-version", "5"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, ::testing::StartsWith("stitch: sidecar: --store: store file://" + typo +
                                           " does not exist"));
  EXPECT_THAT(r.err, HasSubstr("`stitch claim`"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_THAT(r.out, ::testing::IsEmpty());
  EXPECT_FALSE(std::filesystem::exists(typo));
}

TEST_F(SidecarIntegrationTest, InconsistentFlagsAreRefusedWithOneLine) {
  ProcessResult r =
      RunStitch({"sidecar", "--store", store_, "--run-id", "r1", "--engine-url",
                 "http://127.0.0.1:1", "--base-checkpoint", base_, "--update-mode", "disk"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, ::testing::StartsWith("stitch: sidecar: --update-mode disk needs "
                                           "--local-checkpoint"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = RunStitch({"sidecar", "--store", store_, "--run-id", "r1", "--engine-url",
                 "http://127.0.0.1:1", "--base-checkpoint", base_, "--update-mode", "cpu",
                 "--boot-version", "-1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--boot-version"));
}

TEST_F(SidecarIntegrationTest, SigtermStopsTheSidecarCleanly) {
  StartFleet();
  ASSERT_TRUE(ServesVersion(0));
  sidecar_->Signal(SIGTERM);
  std::optional<int> exit = sidecar_->WaitForExit(std::chrono::seconds(30));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(*exit, 0) << sidecar_->err();
}

}  // namespace
}  // namespace stitch
