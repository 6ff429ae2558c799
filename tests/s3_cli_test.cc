// The real `stitch` binary (claim, publish, pointer) against an s3:// store
// on a real S3 protocol server, credentials from the AWS_* variables.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <utility>

#include <boost/json/parse.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stitch/api/server_info.h"
#include "stitch/core/state.h"
#include "stitch/net/client.h"
#include "stitch/net/net_test_util.h"
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

// The whole replica path through S3: the binary claims the run, an engine
// and its sidecar follow the s3:// pointer, and a FULL then a DELTA version
// published by the binary are served, each stamped with its version.
TEST_F(S3CliTest, SidecarFollowsThePointerThroughS3) {
  constexpr auto kTimeout = std::chrono::seconds(60);
  const std::string store = Uri();
  const fs::path base = tmp() / "base";
  const fs::path out = tmp() / "out";
  fs::create_directories(out);
  for (const auto& [dir, seed] :
       {std::pair{base, 1}, std::pair{tmp() / "ckpt1", 2}, std::pair{tmp() / "ckpt2", 3}}) {
    ProcessResult init =
        RunStitch({"engine", "init-model", dir.string(), "--layers", "1", "--hidden", "32",
                   "--heads", "2", "--seed", std::to_string(seed), "--max-positions", "256"});
    ASSERT_EQ(init.exit_code, 0) << init.err;
  }
  ProcessResult claim = RunStitch({"claim", "--store", store, "--run-id", "r1"});
  ASSERT_EQ(claim.exit_code, 0) << claim.err;

  ServerProcess engine(
      {StitchBinary(), "engine", "--model", base.string(), "--port", "0", "--run-id", "r1"});
  std::optional<std::string> engine_url = engine.WaitForUrl(kTimeout);
  ASSERT_TRUE(engine_url.has_value()) << engine.err();
  ServerProcess sidecar({StitchBinary(), "sidecar", "--store", store, "--run-id", "r1", "--engine",
                         "sglang", "--engine-url", *engine_url, "--base-checkpoint", base.string(),
                         "--local-checkpoint", (tmp() / "local").string(), "--reconcile-interval",
                         "0.2", "--port", "0"});
  std::optional<std::string> url = sidecar.WaitForUrl(kTimeout);
  ASSERT_TRUE(url.has_value()) << sidecar.err();

  auto serves = [&](int64_t version) {
    return Eventually(
        [&] {
          auto r = HttpFetch("GET", *url + "/server_info");
          if (!r.ok() || r->status != 200) return false;
          auto state = ParseServerInfo(r->body);
          return state.ok() && state->ready && state->applied.has_value() &&
                 *state->applied == VersionRef{"r1", version} &&
                 state->sync_state == SyncState::kIdle;
        },
        kTimeout);
  };
  // The weight_version_start of a greedy generation that demands `constraint`
  // (-1 when it was refused), and its HTTP status.
  auto generate = [&](const std::string& constraint) -> std::pair<int, int64_t> {
    auto r = HttpFetch("POST", *url + "/generate",
                       absl::StrCat(R"({"text":"hi","sampling_params":{"max_new_tokens":4,)",
                                    R"("temperature":0},"weight_version":)", constraint, "}"));
    if (!r.ok()) return {0, -1};
    if (r->status != 200) return {r->status, -1};
    boost::json::value v = boost::json::parse(r->body);
    return {r->status, v.at("meta_info").at("weight_version_start").as_int64()};
  };
  ASSERT_TRUE(serves(0)) << sidecar.err();

  const std::string v1 = (out / "weight_v000001").string();
  ProcessResult full = RunStitch({"delta", "full", "--checkpoint", (tmp() / "ckpt1").string(),
                                  "--out", v1, "--version", "1", "--run-id", "r1"});
  ASSERT_EQ(full.exit_code, 0) << full.err;
  ProcessResult publish1 = RunStitch(
      {"publish", "--store", store, "--run-id", "r1", "--pool", absl::StrCat("static:", *url), v1});
  ASSERT_EQ(publish1.exit_code, 0) << publish1.err;
  ASSERT_TRUE(serves(1)) << sidecar.err();
  EXPECT_EQ(generate(R"({"exact_version":1})"), (std::pair<int, int64_t>{200, 1}));

  const std::string v2 = (out / "weight_v000002").string();
  ProcessResult encode = RunStitch({"delta", "encode", "--base", (tmp() / "ckpt1").string(),
                                    "--target", (tmp() / "ckpt2").string(), "--out", v2,
                                    "--version", "2", "--base-version", "1", "--run-id", "r1"});
  ASSERT_EQ(encode.exit_code, 0) << encode.err;
  ProcessResult publish2 = RunStitch({"publish", "--store", store, "--run-id", "r1", v2});
  ASSERT_EQ(publish2.exit_code, 0) << publish2.err;
  ASSERT_TRUE(serves(2)) << sidecar.err();
  EXPECT_EQ(generate(R"({"min_version":2})"), (std::pair<int, int64_t>{200, 2}));
  EXPECT_EQ(generate(R"({"exact_version":1})").first, 409);
}

}  // namespace
}  // namespace stitch::testing
