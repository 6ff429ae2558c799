// The `stitch` binary end to end: claim, publish and pointer against a
// filesystem store, their exit codes, and their one-line failures.
#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stitch/io/fileio.h"
#include "tests/support/cli_expect.h"
#include "tests/support/loopback_http.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "tests/support/version_dirs.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::stitch::testing::IsOneFailureLine;
using ::stitch::testing::LoopbackHttpServer;
using ::stitch::testing::ProcessResult;
using ::stitch::testing::RunningProcess;
using ::stitch::testing::RunStitch;
using ::stitch::testing::TempDir;
using ::stitch::testing::WriteTestVersion;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
  }

  ProcessResult Claim(const std::string& run = "run-a", int64_t boot = 0) {
    return RunStitch({"claim", "--store", root_.string(), "--run-id", run, "--boot-version",
                      std::to_string(boot)});
  }
  ProcessResult Publish(const fs::path& dir, const std::string& run = "run-a") {
    return RunStitch({"publish", "--store", root_.string(), "--run-id", run, dir.string()});
  }
  ProcessResult Pointer() { return RunStitch({"pointer", "--store", root_.string()}); }
  fs::path Version(int64_t v, testing::TestVersionOptions options = {}) {
    auto dir = WriteTestVersion(tmp_ / "src" / std::to_string(sources_++), v, options);
    EXPECT_TRUE(dir.ok()) << dir.status();
    return dir.ok() ? *dir : fs::path();
  }
  std::set<std::string> Updates() {
    std::set<std::string> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root_ / "updates", ec)) {
      out.insert(e.path().filename().string());
    }
    return out;
  }
  std::string Uri() const { return "file://" + root_.string(); }

  TempDir tmp_;
  fs::path root_ = tmp_ / "store";
  int sources_ = 0;
};

TEST_F(CliTest, ClaimPublishAndReadThePointer) {
  ProcessResult claim = Claim();
  ASSERT_EQ(claim.exit_code, 0) << claim.err;
  EXPECT_EQ(claim.out, "claimed run-a/weight_v000000 in " + Uri() + " (the pointer was unset)\n");
  EXPECT_THAT(claim.err, IsEmpty());

  ProcessResult pointer = Pointer();
  ASSERT_EQ(pointer.exit_code, 0) << pointer.err;
  EXPECT_EQ(pointer.out, "run-a/weight_v000000\n");

  ProcessResult publish = Publish(Version(1));
  ASSERT_EQ(publish.exit_code, 0) << publish.err;
  EXPECT_EQ(publish.out, "published run-a/weight_v000001 to " + Uri() + "\n");
  EXPECT_EQ(Pointer().out, "run-a/weight_v000001\n");
  EXPECT_TRUE(testing::VerifyVersionDir(root_ / "updates" / "weight_v000001").ok());
}

TEST_F(CliTest, ClaimingTwiceIsANoOp) {
  ASSERT_EQ(Claim().exit_code, 0);
  ProcessResult again = Claim();
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, "already claimed: run-a/weight_v000000 in " + Uri() + "\n");
}

TEST_F(CliTest, AFileUriAndARunChange) {
  ASSERT_EQ(Claim("run-a").exit_code, 0);
  ASSERT_EQ(Publish(Version(1)).exit_code, 0);
  ProcessResult claim =
      RunStitch({"claim", "--store", Uri(), "--run-id", "run-b", "--boot-version", "4"});
  ASSERT_EQ(claim.exit_code, 0) << claim.err;
  EXPECT_THAT(claim.out, HasSubstr("(the pointer was run-a/weight_v000001)"));
  EXPECT_EQ(Pointer().out, "run-b/weight_v000004\n");
}

TEST_F(CliTest, PointerOfAMissingStoreExitsOneAndCreatesNothing) {
  ProcessResult pointer = Pointer();
  EXPECT_EQ(pointer.exit_code, 1);
  EXPECT_THAT(pointer.out, IsEmpty());
  EXPECT_THAT(pointer.err, IsOneFailureLine());
  EXPECT_THAT(pointer.err, StartsWith("stitch: store " + Uri() + " does not exist"));
  EXPECT_THAT(pointer.err, HasSubstr("`stitch claim`"));
  EXPECT_FALSE(fs::exists(root_));
}

TEST_F(CliTest, PublishingAnUnclaimedRunFails) {
  ProcessResult publish = Publish(Version(1));
  EXPECT_EQ(publish.exit_code, 1);
  EXPECT_THAT(publish.err, IsOneFailureLine());
  EXPECT_THAT(publish.err, HasSubstr("run run-a is not claimed"));
  EXPECT_THAT(publish.err, HasSubstr("stitch claim"));
  EXPECT_THAT(publish.out, IsEmpty());
  EXPECT_FALSE(fs::exists(root_));  // publishing never creates a store
}

TEST_F(CliTest, AMissingShardFailsAndNothingIsHalfWritten) {
  ASSERT_EQ(Claim().exit_code, 0);
  fs::path dir = Version(1);
  fs::remove(dir / "model-00001-of-00002.safetensors");
  ProcessResult publish = Publish(dir);
  EXPECT_EQ(publish.exit_code, 1);
  EXPECT_THAT(publish.err, IsOneFailureLine());
  EXPECT_THAT(publish.err, HasSubstr("\"model-00001-of-00002.safetensors\""));
  EXPECT_THAT(publish.err, StartsWith("stitch: store " + Uri() + ": "));
  EXPECT_EQ(Pointer().out, "run-a/weight_v000000\n");
  EXPECT_THAT(Updates(), IsEmpty());
}

TEST_F(CliTest, RewindsAreRefused) {
  ASSERT_EQ(Claim().exit_code, 0);
  ASSERT_EQ(Publish(Version(1)).exit_code, 0);
  ASSERT_EQ(Publish(Version(2)).exit_code, 0);
  ProcessResult older = Publish(Version(1));
  EXPECT_EQ(older.exit_code, 1);
  EXPECT_THAT(older.err, IsOneFailureLine());
  EXPECT_THAT(older.err, HasSubstr("refusing to rewind the pointer from run-a/weight_v000002"));

  ProcessResult reclaim = Claim("run-a", 0);
  EXPECT_EQ(reclaim.exit_code, 1);
  EXPECT_THAT(reclaim.err, IsOneFailureLine());
  EXPECT_THAT(reclaim.err, HasSubstr("use a new run id"));
  EXPECT_EQ(Pointer().out, "run-a/weight_v000002\n");
}

TEST_F(CliTest, DifferentBytesForAPublishedVersionAreRefused) {
  ASSERT_EQ(Claim().exit_code, 0);
  ASSERT_EQ(Publish(Version(1, {.seed = 1})).exit_code, 0);
  ASSERT_EQ(Publish(Version(2, {.seed = 1})).exit_code, 0);
  // Version 2 again, other bytes: the rewind guard refuses it first.
  ProcessResult again = Publish(Version(2, {.seed = 2}));
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_THAT(again.err, IsOneFailureLine());
}

TEST_F(CliTest, AGarbagePointerIsReportedNotTreatedAsUnset) {
  ASSERT_TRUE(fs::create_directories(root_));
  ASSERT_TRUE(WriteFileAtomically(root_ / "latest", "weight_vx\n").ok());
  for (const ProcessResult& r : {Pointer(), Claim()}) {
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, IsOneFailureLine());
    EXPECT_THAT(r.err, HasSubstr("\"weight_vx\""));
    EXPECT_THAT(r.err, HasSubstr(Uri()));
  }
  EXPECT_EQ(*ReadFileToString(root_ / "latest"), "weight_vx\n");
}

TEST_F(CliTest, BadStoreAndRunIdAreFailuresNotUsageErrors) {
  ProcessResult scheme = RunStitch({"claim", "--store", "gs://bucket/prefix", "--run-id", "run-a"});
  EXPECT_EQ(scheme.exit_code, 1);
  EXPECT_THAT(scheme.err, IsOneFailureLine());
  EXPECT_THAT(scheme.err, HasSubstr("supported"));

  ProcessResult run = RunStitch({"claim", "--store", root_.string(), "--run-id", "has space"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, IsOneFailureLine());
  EXPECT_THAT(run.err, HasSubstr("run id"));

  ProcessResult pool =
      RunStitch({"claim", "--store", root_.string(), "--run-id", "run-a", "--pool", "dns:x"});
  EXPECT_EQ(pool.exit_code, 1);
  EXPECT_THAT(pool.err, IsOneFailureLine());
  EXPECT_FALSE(fs::exists(root_ / "latest"));
}

TEST_F(CliTest, UsageErrorsExitTwo) {
  const std::string x = (tmp_ / "x").string();
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {},
           {"frobnicate"},
           {"claim", "--run-id", "run-a"},
           {"claim", "--store", x},
           {"claim", "--store", x, "--run-id", "run-a", "--boot-version", "-1"},
           {"claim", "--store", x, "--run-id", "run-a", "--boot-version", "many"},
           {"publish", "--store", x, "--run-id", "run-a"},
           {"pointer"},
       }) {
    ProcessResult r = RunStitch(args);
    EXPECT_EQ(r.exit_code, 2) << ::testing::PrintToString(args) << "\n" << r.err;
    EXPECT_THAT(r.err, ::testing::Not(IsEmpty()));
  }
  EXPECT_FALSE(fs::exists(tmp_ / x));
}

// The serving commands refuse body limits that cannot work, before they start
// anything.
TEST_F(CliTest, ServingCommandsRefuseInconsistentBodyLimits) {
  const std::string x = (tmp_ / "x").string();
  const std::vector<std::string> gateway = {"gateway", "--pool", "static:http://127.0.0.1:1",
                                            "--port", "0"};
  const std::vector<std::string> sidecar = {"sidecar",
                                            "--store",
                                            x,
                                            "--run-id",
                                            "run-a",
                                            "--engine-url",
                                            "http://127.0.0.1:1",
                                            "--base-checkpoint",
                                            x,
                                            "--local-checkpoint",
                                            x,
                                            "--port",
                                            "0"};
  for (std::vector<std::string> args : {gateway, sidecar}) {
    for (const std::vector<std::string>& limits : std::vector<std::vector<std::string>>{
             {"--max-body-bytes", "64MiB", "--max-total-body-bytes", "32MiB"},
             {"--max-body-bytes", "0"},
         }) {
      std::vector<std::string> full = args;
      full.insert(full.end(), limits.begin(), limits.end());
      ProcessResult r = RunStitch(full);
      EXPECT_EQ(r.exit_code, 2) << ::testing::PrintToString(full) << "\n" << r.err;
      EXPECT_THAT(r.err, IsOneFailureLine());
      EXPECT_THAT(r.err, HasSubstr("--max-total-body-bytes"));
      EXPECT_THAT(r.err, HasSubstr(args[0] + ": "));
    }
  }
  EXPECT_FALSE(fs::exists(x));
}

// A sidecar given another run than the one the store holds refuses to
// start (status 2, one line naming both runs) instead of following the
// store's run while its start line names the other.
TEST_F(CliTest, ASidecarWhoseRunIdIsNotTheStoresRunIsRefused) {
  ASSERT_EQ(Claim("run-a").exit_code, 0);
  const std::string x = (tmp_ / "x").string();
  ProcessResult r = RunStitch({"sidecar", "--store", root_.string(), "--run-id", "run-b",
                               "--engine-url", "http://127.0.0.1:1", "--base-checkpoint", x,
                               "--local-checkpoint", x, "--port", "0"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.out, IsEmpty());
  EXPECT_THAT(r.err, IsOneFailureLine());
  EXPECT_THAT(r.err, StartsWith("stitch: sidecar: --run-id run-b, but the store " + Uri() +
                                " holds run run-a"));
  EXPECT_THAT(r.err, HasSubstr("give --run-id run-a"));
  EXPECT_EQ(Pointer().out, "run-a/weight_v000000\n");
}

// The original Stitch's names for the sidecar's settings are accepted: each
// reaches the check of the flag it aliases (an unknown flag would be a usage
// error naming itself instead).
TEST_F(CliTest, TheSidecarAcceptsTheOriginalsFlagNames) {
  const std::string x = (tmp_ / "x").string();
  const std::vector<std::string> original = {"sidecar",
                                             "--store",
                                             x,
                                             "--run-id",
                                             "run-a",
                                             "--upstream",
                                             "http://127.0.0.1:1",
                                             "--base-checkpoint-dir",
                                             x,
                                             "--local-checkpoint-dir",
                                             x,
                                             "--port",
                                             "0"};
  for (const auto& [extra, refusal] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--disk-load-format", "fastsafetensors", "--delta-update-mode", "tape"},
            "--update-mode: "},
           {{"--watchdog-failure-threshold", "0"}, "--watchdog-threshold must be at least 1"},
           {{"--disk-load-format", "no such"}, "--disk-load-format \"no such\""},
       }) {
    std::vector<std::string> args = original;
    args.insert(args.end(), extra.begin(), extra.end());
    ProcessResult r = RunStitch(args);
    EXPECT_EQ(r.exit_code, 2) << ::testing::PrintToString(args) << "\n" << r.err;
    EXPECT_THAT(r.err, IsOneFailureLine());
    EXPECT_THAT(r.err, HasSubstr(refusal));
  }
  EXPECT_FALSE(fs::exists(x));
}

// The original Stitch's sidecar command line (tests/data/, taken from its
// source): every flag is one `stitch sidecar --help` lists, and the whole
// line is parsed; it then fails on the store it names (never claimed), not on
// a flag.
TEST_F(CliTest, TheSidecarTakesTheOriginalsWholeCommandLine) {
  std::ifstream list(fs::path(STITCH_SOURCE_DIR_DEFAULT) / "tests" / "data" /
                     "original_sidecar_flags.txt");
  ASSERT_TRUE(list.good());
  const fs::path bulletin = tmp_ / "bulletin";
  const std::string x = (tmp_ / "x").string();
  std::vector<std::string> args = {"sidecar"};
  std::vector<std::string> flags;
  for (std::string line; std::getline(list, line);) {
    std::istringstream words(line);
    std::string kind, flag, value;
    words >> kind >> flag >> value;
    if (kind != "flag") continue;
    flags.push_back(flag);
    args.push_back(flag);
    if (value == "BULLETIN") {
      value = bulletin.string();
    } else if (value == "BASE" || value == "LOCAL") {
      value = x;
    }
    if (!value.empty()) args.push_back(value);
  }
  ASSERT_GE(flags.size(), 18u);
  ProcessResult help = RunStitch({"sidecar", "--help"});
  ASSERT_EQ(help.exit_code, 0);
  for (const std::string& flag : flags) {
    EXPECT_THAT(help.out, HasSubstr(flag + " ")) << "`stitch sidecar --help` lacks " << flag;
  }
  ProcessResult r = RunStitch(args);
  EXPECT_EQ(r.exit_code, 1) << ::testing::PrintToString(args) << "\n" << r.err;
  EXPECT_THAT(r.err, IsOneFailureLine());
  EXPECT_THAT(r.err, HasSubstr("sidecar: --store: "));
  EXPECT_THAT(r.err, HasSubstr(bulletin.string()));
  EXPECT_FALSE(fs::exists(x));
}

// What of the original's store wiring cannot work here is refused, one
// line naming what replaces it.
TEST_F(CliTest, TheOriginalsStoreWiringIsRefusedNamingItsReplacement) {
  const std::string x = (tmp_ / "x").string();
  const std::vector<std::string> base = {"sidecar",
                                         "--run-id",
                                         "run-a",
                                         "--upstream",
                                         "http://127.0.0.1:1",
                                         "--base-checkpoint-dir",
                                         x,
                                         "--local-checkpoint-dir",
                                         x,
                                         "--bulletin-root",
                                         x};
  for (const auto& [extra, replacement] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--store-factory", "mypkg.stores:make_store", "--store-opt", "root=/r"},
            "give --store URI"},
           {{"--store-factory", "cookbook.common.storage:create_store", "--store-opt",
             "backend=modal-volume", "--store-opt", "volume_name=v"},
            "--store-opt backend=s3 --store-opt s3_root=s3://BUCKET/PREFIX"},
           {{"--store-opt", "backend=s3"}, "--store-opt s3_root=s3://BUCKET/PREFIX"},
           {{"--store-opt", "backend=s3", "--store-opt", "bucket=b"},
            "known: backend, s3_root, s3_endpoint_url, volume_name"},
           {{"--store", x, "--store-opt", "backend=local"}, "--store and --store-opt"},
       }) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    ProcessResult r = RunStitch(args);
    EXPECT_EQ(r.exit_code, 2) << ::testing::PrintToString(args) << "\n" << r.err;
    EXPECT_THAT(r.err, IsOneFailureLine());
    EXPECT_THAT(r.err, HasSubstr(replacement));
  }
  EXPECT_FALSE(fs::exists(x));
}

// A flag no command knows is named once, in the order given, apart from
// the values around it.
TEST_F(CliTest, UnknownFlagsAreNamedInTheOrderGiven) {
  const std::string x = (tmp_ / "x").string();
  ProcessResult r =
      RunStitch({"sidecar", "--store", x, "--run-id", "run-a", "--frobnicate", "1", "--engine-url",
                 "http://127.0.0.1:1", "--zap=2", "--base-checkpoint", x, "--frobnicate", "3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "stitch: sidecar: unknown flags --frobnicate --zap (see `stitch sidecar --help`)\n");
  ProcessResult one = RunStitch({"pointer", "--store", x, "--bogus"});
  EXPECT_EQ(one.exit_code, 2);
  EXPECT_EQ(one.err, "stitch: pointer: unknown flag --bogus (see `stitch pointer --help`)\n");
  EXPECT_FALSE(fs::exists(x));
}

// Engine, sidecar and gateway listen on this machine only unless told
// otherwise, and say so.
TEST_F(CliTest, ServingCommandsShareOneListenAddressDefaultAndSayIt) {
  for (const char* command : {"engine", "sidecar", "gateway"}) {
    ProcessResult r = RunStitch({command, "--help"});
    EXPECT_EQ(r.exit_code, 0) << command;
    EXPECT_THAT(r.out, HasSubstr("127.0.0.1 (the default) is this machine only")) << command;
  }
}

TEST_F(CliTest, HelpExitsZero) {
  ProcessResult r = RunStitch({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("publish"));
}

TEST_F(CliTest, ClaimAndPublishWakeThePool) {
  LoopbackHttpServer replica;
  std::string pool = "static:" + replica.url() + "," + testing::UnreachableUrl();
  ProcessResult claim =
      RunStitch({"claim", "--store", root_.string(), "--run-id", "run-a", "--pool", pool});
  ASSERT_EQ(claim.exit_code, 0) << claim.err;
  ProcessResult publish = RunStitch({"publish", "--store", root_.string(), "--run-id", "run-a",
                                     Version(1).string(), "--pool", pool});
  // The unreachable replica is a warning on stderr, never a failure.
  ASSERT_EQ(publish.exit_code, 0) << publish.err;
  EXPECT_THAT(publish.err, HasSubstr("wake"));
  EXPECT_EQ(publish.out, "published run-a/weight_v000001 to " + Uri() + "\n");
  EXPECT_THAT(replica.requests(), ElementsAre("POST /wake", "POST /wake"));
}

TEST_F(CliTest, EightConcurrentPublishesOfOneVersionMoveThePointerOnceAndAllSucceed) {
  ASSERT_EQ(Claim().exit_code, 0);
  std::vector<RunningProcess> running;
  std::vector<fs::path> dirs;
  for (int i = 0; i < 8; ++i) dirs.push_back(Version(1));
  for (const fs::path& dir : dirs) {
    running.push_back(testing::StartProcess({testing::StitchBinary(), "publish", "--store",
                                             root_.string(), "--run-id", "run-a", dir.string()}));
  }
  int moved = 0;
  int already = 0;
  for (RunningProcess& p : running) {
    ProcessResult r = testing::WaitProcess(p);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (r.out.starts_with("published run-a/weight_v000001")) ++moved;
    if (r.out.starts_with("already published run-a/weight_v000001")) ++already;
  }
  EXPECT_EQ(moved, 1);
  EXPECT_EQ(already, 7);
  EXPECT_EQ(Pointer().out, "run-a/weight_v000001\n");
  EXPECT_EQ(Updates(), (std::set<std::string>{"weight_v000001"}));
}

}  // namespace
}  // namespace stitch
