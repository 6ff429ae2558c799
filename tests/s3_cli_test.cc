// The real `stitch` binary (claim, publish, pointer) against an s3:// store
// on a real S3 protocol server, credentials from the AWS_* variables.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "stitch/api/routes.h"
#include "stitch/api/server_info.h"
#include "stitch/core/state.h"
#include "stitch/io/fileio.h"
#include "stitch/net/client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/net_test_util.h"
#include "stitch/net/server.h"
#include "stitch/store/store.h"
#include "tests/s3_test_base.h"
#include "tests/sidecar_process.h"
#include "tests/support/subprocess.h"
#include "tests/support/version_dirs.h"

namespace stitch::testing {
namespace {

namespace fs = std::filesystem;

class S3CliTest : public S3Test {
 protected:
  void SetUp() override {
    S3Test::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_FALSE(StitchBinary().empty()) << "STITCH_BIN is not set";
    SetCredentials(server().Credentials());
  }
  void TearDown() override {
    for (const char* name : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                             "AWS_REGION", "AWS_ENDPOINT_URL"}) {
      ::unsetenv(name);
    }
  }
  // The child processes inherit this process's environment; the test sets
  // it while no other thread runs.
  static void SetCredentials(const S3Environment& env) {
    ::setenv("AWS_ACCESS_KEY_ID", env.access_key_id.c_str(), 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", env.secret_access_key.c_str(), 1);
    if (env.session_token.empty()) {
      ::unsetenv("AWS_SESSION_TOKEN");
    } else {
      ::setenv("AWS_SESSION_TOKEN", env.session_token.c_str(), 1);
    }
    ::setenv("AWS_REGION", env.region.c_str(), 1);
  }
};

TEST_F(S3CliTest, ClaimPublishAndPointerWorkOnAnS3Store) {
  const std::string store = Uri();
  const std::string cache = (tmp() / "cache").string();
  ProcessResult unset = RunStitch({"pointer", "--store", store});
  EXPECT_EQ(unset.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(unset.err, "does not exist")) << unset.err;
  EXPECT_TRUE(absl::StrContains(unset.err, "`stitch claim`")) << unset.err;

  ProcessResult claim =
      RunStitch({"claim", "--store", store, "--run-id", "run-a", "--cache-dir", cache});
  ASSERT_EQ(claim.exit_code, 0) << claim.err;
  EXPECT_TRUE(absl::StrContains(claim.out, "claimed run-a/weight_v000000")) << claim.out;

  auto v1 = WriteTestVersion(tmp() / "src", 1);
  ASSERT_TRUE(v1.ok());
  ProcessResult publish = RunStitch(
      {"publish", "--store", store, "--run-id", "run-a", "--cache-dir", cache, v1->string()});
  ASSERT_EQ(publish.exit_code, 0) << publish.err;
  EXPECT_TRUE(absl::StrContains(publish.out, "published run-a/weight_v000001")) << publish.out;

  // The endpoint may come from AWS_ENDPOINT_URL instead of the URI.
  ::setenv("AWS_ENDPOINT_URL", server().endpoint().c_str(), 1);
  ProcessResult pointer =
      RunStitch({"pointer", "--store", absl::StrCat("s3://", server().bucket(), "/", prefix())});
  ASSERT_EQ(pointer.exit_code, 0) << pointer.err;
  EXPECT_EQ(pointer.out, "run-a/weight_v000001\n");

  // What the binary published is whole and readable by a store in-process.
  auto reader = Open("");
  ASSERT_NE(reader, nullptr);
  auto dir = reader->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  EXPECT_TRUE(VerifyVersionDir(*dir).ok());

  // Republishing the published version with its bytes is a no-op that
  // says so; with other bytes it is refused in one line.
  ProcessResult retry = RunStitch({"publish", "--store", store, "--run-id", "run-a", v1->string()});
  EXPECT_EQ(retry.exit_code, 0) << retry.err;
  EXPECT_TRUE(retry.out.starts_with("already published run-a/weight_v000001 with these bytes"))
      << retry.out;
  auto other = WriteTestVersion(tmp() / "other", 1, {.seed = 5});
  ASSERT_TRUE(other.ok());
  ProcessResult refused =
      RunStitch({"publish", "--store", store, "--run-id", "run-a", other->string()});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_TRUE(refused.err.starts_with("stitch: store s3://")) << refused.err;
  EXPECT_TRUE(absl::StrContains(refused.err, "publish new weights as weight_v000002"))
      << refused.err;
  EXPECT_EQ(std::count(refused.err.begin(), refused.err.end(), '\n'), 1) << refused.err;
}

// Retention and holds through the binary on an S3 store.
TEST_F(S3CliTest, GcHoldReleaseAndStatusWorkOnAnS3Store) {
  const std::string store = Uri();
  ASSERT_EQ(RunStitch({"claim", "--store", store, "--run-id", "run-a"}).exit_code, 0);
  for (int64_t v = 1; v <= 4; ++v) {
    auto dir = WriteTestVersion(tmp() / "src" / std::to_string(v), v, {.seed = int(v)});
    ASSERT_TRUE(dir.ok());
    ProcessResult p = RunStitch({"publish", "--store", store, "--run-id", "run-a", "--cache-dir",
                                 (tmp() / "cache").string(), dir->string()});
    ASSERT_EQ(p.exit_code, 0) << p.err;
  }
  ProcessResult hold =
      RunStitch({"hold", "--store", store, "--version", "2", "--ttl", "600", "--holder", "eval"});
  ASSERT_EQ(hold.exit_code, 0) << hold.err;
  ProcessResult status = RunStitch({"status", "--store", store, "--json"});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  EXPECT_TRUE(absl::StrContains(status.out, R"("holder":"eval","version":2)")) << status.out;
  ProcessResult gc = RunStitch({"gc", "--store", store, "--keep-last", "1"});
  ASSERT_EQ(gc.exit_code, 0) << gc.err;
  EXPECT_TRUE(absl::StrContains(gc.out, "deleted weight_v000001")) << gc.out;
  EXPECT_TRUE(absl::StrContains(gc.out, "deleted weight_v000003")) << gc.out;
  EXPECT_TRUE(absl::StrContains(gc.out, "kept    weight_v000002: held by eval")) << gc.out;
  ASSERT_EQ(RunStitch({"release", "--store", store, "--holder", "eval"}).exit_code, 0);
  gc = RunStitch({"gc", "--store", store, "--keep-last", "1"});
  ASSERT_EQ(gc.exit_code, 0) << gc.err;
  EXPECT_TRUE(absl::StrContains(gc.out, "1 kept, 1 deleted")) << gc.out;
  auto reader = Open("");
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(*reader->ListVersions(), std::vector<int64_t>{4});
}

TEST_F(S3CliTest, TemporaryCredentialsWork) {
  SetCredentials(server().SessionCredentials());
  ProcessResult claim = RunStitch({"claim", "--store", Uri(), "--run-id", "run-s"});
  ASSERT_EQ(claim.exit_code, 0) << claim.err;
  ProcessResult pointer = RunStitch({"pointer", "--store", Uri()});
  ASSERT_EQ(pointer.exit_code, 0) << pointer.err;
  EXPECT_EQ(pointer.out, "run-s/weight_v000000\n");
}

TEST_F(S3CliTest, BadCredentialsAreOneClearLine) {
  S3Environment wrong = server().Credentials();
  wrong.secret_access_key = "wrong";
  SetCredentials(wrong);
  ProcessResult pointer = RunStitch({"pointer", "--store", Uri()});
  EXPECT_EQ(pointer.exit_code, 1);
  EXPECT_TRUE(pointer.err.starts_with("stitch: store s3://")) << pointer.err;
  EXPECT_TRUE(absl::StrContains(pointer.err, "AWS_SECRET_ACCESS_KEY")) << pointer.err;
  EXPECT_EQ(std::count(pointer.err.begin(), pointer.err.end(), '\n'), 1) << pointer.err;
}

// The pieces of a replica fleet over the S3 store: tiny models, a claimed
// run, replicas (an engine and its sidecar) and versions published by the
// binary.
class S3FleetTest : public S3CliTest {
 protected:
  static constexpr auto kTimeout = std::chrono::seconds(60);

  struct Replica {
    std::unique_ptr<ServerProcess> engine;
    std::unique_ptr<ServerProcess> sidecar;
    std::string url;
  };

  void SetUp() override {
    S3CliTest::SetUp();
    if (HasFatalFailure()) return;
    fs::create_directories(out_);
    for (const auto& [dir, seed] :
         {std::pair{base_, 1}, std::pair{tmp() / "ckpt1", 2}, std::pair{tmp() / "ckpt2", 3}}) {
      ProcessResult init =
          RunStitch({"engine", "init-model", dir.string(), "--layers", "1", "--hidden", "32",
                     "--heads", "2", "--seed", std::to_string(seed), "--max-positions", "256"});
      ASSERT_EQ(init.exit_code, 0) << init.err;
    }
    ProcessResult claim = RunStitch({"claim", "--store", Uri(), "--run-id", "r1"});
    ASSERT_EQ(claim.exit_code, 0) << claim.err;
  }

  // An engine on the base checkpoint and a sidecar following the store,
  // with `flags` added to the sidecar's.
  void StartReplica(const std::string& name, const std::vector<std::string>& flags,
                    Replica& replica) {
    replica.engine = std::make_unique<ServerProcess>(std::vector<std::string>{
        StitchBinary(), "engine", "--model", base_.string(), "--port", "0", "--run-id", "r1"});
    std::optional<std::string> engine_url = replica.engine->WaitForUrl(kTimeout);
    ASSERT_TRUE(engine_url.has_value()) << replica.engine->err();
    std::vector<std::string> args = {StitchBinary(),
                                     "sidecar",
                                     "--store",
                                     Uri(),
                                     "--run-id",
                                     "r1",
                                     "--engine",
                                     "sglang",
                                     "--engine-url",
                                     *engine_url,
                                     "--base-checkpoint",
                                     base_.string(),
                                     "--local-checkpoint",
                                     (tmp() / name / "local").string(),
                                     "--reconcile-interval",
                                     "0.2",
                                     "--port",
                                     "0"};
    args.insert(args.end(), flags.begin(), flags.end());
    replica.sidecar = std::make_unique<ServerProcess>(args);
    std::optional<std::string> url = replica.sidecar->WaitForUrl(kTimeout);
    ASSERT_TRUE(url.has_value()) << replica.sidecar->err();
    replica.url = *url;
  }

  // Whether the sidecar at `url` comes to serve `version` of r1, ready.
  static bool Serves(const std::string& url, int64_t version) {
    return Eventually(
        [&] {
          auto r = HttpFetch("GET", url + "/server_info");
          if (!r.ok() || r->status != 200) return false;
          auto state = ParseServerInfo(r->body);
          return state.ok() && state->ready && state->applied.has_value() &&
                 *state->applied == VersionRef{"r1", version} &&
                 state->sync_state == SyncState::kIdle;
        },
        kTimeout);
  }

  // The weight_version_start of a greedy generation through `url` that
  // demands `constraint` (-1 when it was refused), its HTTP status, and
  // its output ids.
  struct Generated {
    int status = 0;
    int64_t start = -1;
    std::string output;
    friend bool operator==(const Generated&, const Generated&) = default;
  };
  static Generated Generate(const std::string& url, const std::string& constraint) {
    auto r = HttpFetch("POST", url + "/generate",
                       absl::StrCat(R"({"text":"hi","sampling_params":{"max_new_tokens":4,)",
                                    R"("temperature":0},"weight_version":)", constraint, "}"));
    if (!r.ok()) return {};
    if (r->status != 200) return {r->status, -1, ""};
    boost::json::value v = boost::json::parse(r->body);
    return {r->status, v.at("meta_info").at("weight_version_start").as_int64(),
            boost::json::serialize(v.at("output_ids"))};
  }

  // Publishes ckpt1 as FULL v1, or ckpt2 as a DELTA v2 over it, waking
  // the replicas of `pool` (a pool spec) when given.
  void PublishFullV1(const std::string& pool) {
    const std::string v1 = (out_ / "weight_v000001").string();
    ProcessResult full = RunStitch({"delta", "full", "--checkpoint", (tmp() / "ckpt1").string(),
                                    "--out", v1, "--version", "1", "--run-id", "r1"});
    ASSERT_EQ(full.exit_code, 0) << full.err;
    Publish(v1, pool);
  }
  void PublishDeltaV2(const std::string& pool) {
    const std::string v2 = (out_ / "weight_v000002").string();
    ProcessResult encode = RunStitch({"delta", "encode", "--base", (tmp() / "ckpt1").string(),
                                      "--target", (tmp() / "ckpt2").string(), "--out", v2,
                                      "--version", "2", "--base-version", "1", "--run-id", "r1"});
    ASSERT_EQ(encode.exit_code, 0) << encode.err;
    Publish(v2, pool);
  }
  void Publish(const std::string& dir, const std::string& pool) {
    std::vector<std::string> publish = {"publish", "--store", Uri(), "--run-id", "r1"};
    if (!pool.empty()) publish.insert(publish.end(), {"--pool", pool});
    publish.insert(publish.end(), publish_flags_.begin(), publish_flags_.end());
    publish.push_back(dir);
    ProcessResult published = RunStitch(publish);
    ASSERT_EQ(published.exit_code, 0) << published.err;
  }

  const fs::path base_ = tmp() / "base";
  const fs::path out_ = tmp() / "out";
  // Added to every `stitch publish` (the fleet's token, for its wakes).
  std::vector<std::string> publish_flags_;
};

// The whole replica path through S3: the binary claims the run, an engine
// and its sidecar follow the s3:// pointer, and a FULL then a DELTA version
// published by the binary are served, each stamped with its version.
TEST_F(S3FleetTest, SidecarFollowsThePointerThroughS3) {
  Replica r;
  StartReplica("r", {}, r);
  ASSERT_TRUE(Serves(r.url, 0)) << r.sidecar->err();
  PublishFullV1(absl::StrCat("static:", r.url));
  ASSERT_TRUE(Serves(r.url, 1)) << r.sidecar->err();
  EXPECT_EQ(Generate(r.url, R"({"exact_version":1})").start, 1);
  PublishDeltaV2("");
  ASSERT_TRUE(Serves(r.url, 2)) << r.sidecar->err();
  EXPECT_EQ(Generate(r.url, R"({"min_version":2})").start, 2);
  EXPECT_EQ(Generate(r.url, R"({"exact_version":1})").status, 409);
}

// `stitch compact` on S3: the anchor of v2 is written under the store's
// prefix, gc deletes v1 behind it, and a replica joining afterwards loads
// the anchor and the DELTA after it through its cache.
TEST_F(S3FleetTest, AReplicaJoiningAfterCompactAndGcStartsFromTheAnchor) {
  PublishFullV1("");
  PublishDeltaV2("");
  ProcessResult init =
      RunStitch({"engine", "init-model", (tmp() / "ckpt3").string(), "--layers", "1", "--hidden",
                 "32", "--heads", "2", "--seed", "4", "--max-positions", "256"});
  ASSERT_EQ(init.exit_code, 0) << init.err;
  const std::string v3 = (out_ / "weight_v000003").string();
  ProcessResult encode = RunStitch({"delta", "encode", "--base", (tmp() / "ckpt2").string(),
                                    "--target", (tmp() / "ckpt3").string(), "--out", v3,
                                    "--version", "3", "--base-version", "2", "--run-id", "r1"});
  ASSERT_EQ(encode.exit_code, 0) << encode.err;
  Publish(v3, "");

  ProcessResult compact = RunStitch({"compact", "--store", Uri(), "--version", "2", "--cache-dir",
                                     (tmp() / "compact-cache").string()});
  ASSERT_EQ(compact.exit_code, 0) << compact.err;
  EXPECT_TRUE(absl::StrContains(compact.out, "wrote the anchor of weight_v000002")) << compact.out;
  ProcessResult gc = RunStitch({"gc", "--store", Uri(), "--keep-last", "1"});
  ASSERT_EQ(gc.exit_code, 0) << gc.err;
  EXPECT_TRUE(absl::StrContains(gc.out, "deleted weight_v000001")) << gc.out;
  EXPECT_TRUE(absl::StrContains(gc.out, "kept    weight_v000002: anchored")) << gc.out;

  Replica r;
  StartReplica("r", {"--cache-dir", (tmp() / "r" / "cache").string()}, r);
  ASSERT_TRUE(Serves(r.url, 3)) << r.sidecar->err();
  EXPECT_EQ(Generate(r.url, R"({"exact_version":3})").start, 3);
  EXPECT_TRUE(fs::exists(tmp() / "r" / "cache"));
}

// A sidecar's value of one metric, or -1.
double Metric(const std::string& url, std::string_view name) {
  auto r = HttpFetch("GET", url + "/metrics");
  if (!r.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(r->body, '\n')) {
    if (!absl::ConsumePrefix(&line, std::string(name)) || !absl::ConsumePrefix(&line, " "))
      continue;
    double value = 0;
    return absl::SimpleAtod(line, &value) ? value : -1;
  }
  return -1;
}

// Replicas fetch version files from peers before the store, and verify
// every byte against the store's record: a replica whose peers are a
// corrupt one and a good one takes every file from the good one and none
// from the store; one whose only peer is corrupt detects every file it sent
// and takes them from the store. Either way it serves the published
// weights.
TEST_F(S3FleetTest, PeersServeVerifiedFilesAndACorruptPeerIsPassedOver) {
  const fs::path token = tmp() / "fleet.token";
  ASSERT_TRUE(WriteFileAtomically(token, "fleet-secret\n").ok());
  const std::vector<std::string> auth = {"--auth-token-file", token.string()};
  PublishFullV1("");
  PublishDeltaV2("");

  // The first replica's only peer is down: it takes every file from the
  // store (and, being in a fleet with peers, serves them).
  Replica first;
  std::vector<std::string> flags = auth;
  flags.insert(flags.end(), {"--peers", "static:http://127.0.0.1:1"});
  StartReplica("first", flags, first);
  ASSERT_TRUE(Serves(first.url, 2)) << first.sidecar->err();
  const double store_files = Metric(first.url, "stitch_sidecar_store_files_downloaded_total");
  ASSERT_GT(store_files, 0);

  // The route is the fleet's: no token, no file; a file it never verified
  // is not found.
  const std::string route =
      absl::StrCat(first.url, std::string(kPeerFileRoute), "?version=2&name=");
  auto anonymous = HttpFetch("GET", route + "delta-0.safetensors");
  ASSERT_TRUE(anonymous.ok());
  EXPECT_EQ(anonymous->status, 401);
  FetchOptions with_token;
  with_token.headers.Set("Authorization", "Bearer fleet-secret");
  auto absent =
      HttpFetch("GET", absl::StrCat(first.url, std::string(kPeerFileRoute), "?version=7&name=x"),
                "", with_token);
  ASSERT_TRUE(absent.ok());
  EXPECT_EQ(absent->status, 404) << absent->body;

  // A peer that answers every file with other bytes.
  EventLoop loop;
  HttpRouter liar;
  liar.Add("GET", std::string(kPeerFileRoute),
           [](HttpExchange& ex) -> boost::asio::awaitable<void> {
             HttpResponse r;
             r.status = 200;
             r.body = std::string(4096, 'x');
             (void)co_await ex.Respond(std::move(r));
           });
  auto corrupt = HttpServer::Start(loop.executor(), ServerOptions{}, liar.AsHandler());
  ASSERT_TRUE(corrupt.ok()) << corrupt.status();

  Replica second;
  flags = auth;
  flags.insert(flags.end(),
               {"--peers", absl::StrCat("static:", (*corrupt)->url(), ",", first.url)});
  StartReplica("second", flags, second);
  ASSERT_TRUE(Serves(second.url, 2)) << second.sidecar->err();
  // Whichever of the two owns a file (rendezvous hashing), the good one
  // gives it: the corrupt one costs no store download.
  EXPECT_EQ(Metric(second.url, "stitch_sidecar_store_files_downloaded_total"), 0);
  EXPECT_EQ(Metric(second.url, "stitch_sidecar_peer_files_downloaded_total"), store_files);
  EXPECT_LE(Metric(second.url, "stitch_sidecar_peer_files_rejected_total"), store_files);

  Replica third;
  flags = auth;
  flags.insert(flags.end(), {"--peers", (*corrupt)->url()});
  StartReplica("third", flags, third);
  ASSERT_TRUE(Serves(third.url, 2)) << third.sidecar->err();
  EXPECT_EQ(Metric(third.url, "stitch_sidecar_store_files_downloaded_total"), store_files);
  EXPECT_EQ(Metric(third.url, "stitch_sidecar_peer_files_downloaded_total"), 0);
  EXPECT_EQ(Metric(third.url, "stitch_sidecar_peer_files_rejected_total"), store_files);

  const Generated want = Generate(first.url, R"({"exact_version":2})");
  ASSERT_EQ(want.status, 200);
  EXPECT_EQ(Generate(second.url, R"({"exact_version":2})"), want);
  EXPECT_EQ(Generate(third.url, R"({"exact_version":2})"), want);
  loop.BlockOn((*corrupt)->Shutdown());
}

// Replicas woken at once by a publish take each file from the store about
// once between them: every file has an owner among the peers, which fetches
// it, and the others wait for it there.
TEST_F(S3FleetTest, AFleetWokenAtOnceTakesEachFileFromTheStoreOnceBetweenThem) {
  const fs::path pool = tmp() / "peers.txt";
  ASSERT_TRUE(WriteFileAtomically(pool, "").ok());
  const fs::path token = tmp() / "fleet.token";
  ASSERT_TRUE(WriteFileAtomically(token, "fleet-secret\n").ok());
  publish_flags_ = {"--auth-token-file", token.string()};
  constexpr int kReplicas = 4;
  std::vector<Replica> fleet(kReplicas);
  std::string urls;
  for (int i = 0; i < kReplicas; ++i) {
    StartReplica(
        absl::StrCat("r", i),
        {"--peers", absl::StrCat("file:", pool.string()), "--auth-token-file", token.string()},
        fleet[i]);
    ASSERT_TRUE(Serves(fleet[i].url, 0)) << fleet[i].sidecar->err();
    absl::StrAppend(&urls, fleet[i].url, "\n");
  }
  ASSERT_TRUE(WriteFileAtomically(pool, urls).ok());
  PublishFullV1(absl::StrCat("file:", pool.string()));
  PublishDeltaV2(absl::StrCat("file:", pool.string()));
  double store_files = 0;
  double peer_files = 0;
  for (const Replica& r : fleet) {
    ASSERT_TRUE(Serves(r.url, 2)) << r.sidecar->err();
    store_files += Metric(r.url, "stitch_sidecar_store_files_downloaded_total");
    peer_files += Metric(r.url, "stitch_sidecar_peer_files_downloaded_total");
    EXPECT_EQ(Metric(r.url, "stitch_sidecar_peer_files_rejected_total"), 0);
  }
  // A lone replica downloads every file of v1 and v2 (3 here); the fleet
  // downloads each once, and the other replicas take them from its owner.
  Replica alone;
  StartReplica("alone", {}, alone);
  ASSERT_TRUE(Serves(alone.url, 2)) << alone.sidecar->err();
  const double files = Metric(alone.url, "stitch_sidecar_store_files_downloaded_total");
  ASSERT_GT(files, 0);
  EXPECT_EQ(store_files, files);
  EXPECT_EQ(peer_files, files * (kReplicas - 1));
  const Generated want = Generate(alone.url, R"({"exact_version":2})");
  for (const Replica& r : fleet) EXPECT_EQ(Generate(r.url, R"({"exact_version":2})"), want);
}

}  // namespace
}  // namespace stitch::testing
