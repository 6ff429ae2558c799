// The `stitch sidecar` flags: consistent ones are accepted, each kind of
// inconsistency is refused with one line naming the flag.
#include "stitch/cli/sidecar_flags.h"

#include <string>

#include <gtest/gtest.h>

#include <cmath>

namespace stitch {
namespace {

SidecarFlags Good() {
  SidecarFlags f;
  f.store = "/tmp/store";
  f.run_id = "r1";
  f.engine_url = "http://127.0.0.1:30000";
  f.base_checkpoint = "/models/base";
  f.local_checkpoint = "/var/stitch/local";
  return f;
}

// The refusal for `flags`: one line, naming `flag`.
void ExpectRefused(const SidecarFlags& flags, std::string_view flag) {
  auto config = CheckSidecarFlags(flags);
  ASSERT_FALSE(config.ok()) << "accepted; expected a refusal naming " << flag;
  EXPECT_TRUE(absl::IsInvalidArgument(config.status()));
  std::string message(config.status().message());
  EXPECT_NE(message.find(flag), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(SidecarFlagsTest, ConsistentFlagsAreAccepted) {
  auto config = CheckSidecarFlags(Good());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->engine, EngineKind::kSglang);
  EXPECT_EQ(config->update_mode, UpdateDestination::kDisk);
  EXPECT_EQ(config->reconciler.commit_mode, CommitMode::kInPlace);
  EXPECT_EQ(config->reconciler.reconcile_interval, std::chrono::seconds(5));
  EXPECT_EQ(config->watchdog.interval, std::chrono::seconds(1));
  EXPECT_EQ(config->watchdog.threshold, 15);
  EXPECT_EQ(config->engine_http.origin.port, 30000);

  SidecarFlags cpu = Good();
  cpu.update_mode = "cpu";
  cpu.local_checkpoint.clear();
  cpu.commit_mode = "quiesce";
  cpu.reconcile_interval_s = 0;
  cpu.boot_version = 119;
  config = CheckSidecarFlags(cpu);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->update_mode, UpdateDestination::kCpu);
  EXPECT_EQ(config->reconciler.commit_mode, CommitMode::kQuiesce);
  EXPECT_EQ(config->reconciler.reconcile_interval, Clock::Duration::zero());
  EXPECT_EQ(config->reconciler.boot_version, 119);
}

TEST(SidecarFlagsTest, VllmIsAnEngineTheSidecarStagesFor) {
  SidecarFlags f = Good();
  f.engine = "vllm";
  auto config = CheckSidecarFlags(f);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->engine, EngineKind::kVllm);
  EXPECT_EQ(config->local_checkpoint, f.local_checkpoint);
}

TEST(SidecarFlagsTest, PatchCommitsAreForVllmWithADensityAndAVerification) {
  SidecarFlags f = Good();
  f.engine = "vllm";
  auto config = CheckSidecarFlags(f);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->patch_commits);
  EXPECT_EQ(config->patch_verify, "checksums");
  f.patch_commits = true;
  f.patch_max_density = 0.1;
  f.patch_verify = "values";
  config = CheckSidecarFlags(f);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->patch_commits);
  EXPECT_DOUBLE_EQ(config->patch_max_density, 0.1);
  EXPECT_EQ(config->patch_verify, "values");

  SidecarFlags sglang = Good();
  sglang.patch_commits = true;
  ExpectRefused(sglang, "--patch-commits");
  for (double density : {0.0, -0.5, 1.5}) {
    SidecarFlags d = f;
    d.patch_max_density = density;
    ExpectRefused(d, "--patch-max-density");
  }
  SidecarFlags verify = f;
  verify.patch_verify = "nothing";
  ExpectRefused(verify, "--patch-verify");
}

// As the original Stitch: port 8000, disks loaded with load_format auto.
TEST(SidecarFlagsTest, DefaultsAreTheOriginalsPortAndLoadFormat) {
  auto config = CheckSidecarFlags(Good());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server.port, 8000);
  EXPECT_EQ(config->server.host, "127.0.0.1");
  EXPECT_EQ(config->disk_load_format, "auto");
}

TEST(SidecarFlagsTest, ALoadFormatIsKeptAsGivenOrRefusedWhenItIsNoName) {
  SidecarFlags f = Good();
  f.disk_load_format = "fastsafetensors";
  auto config = CheckSidecarFlags(f);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->disk_load_format, "fastsafetensors");
  for (const char* bad : {"", "auto safetensors", "../x", "a\"b"}) {
    f.disk_load_format = bad;
    ExpectRefused(f, "--disk-load-format");
  }
}

// Whole /generate requests are assembled from the engine's stream unless
// relayed is asked for, and never for vLLM, whose events carry no label.
TEST(SidecarFlagsTest, WholeGenerateIsAssembledForSglangUnlessRelayIsAsked) {
  SidecarFlags f = Good();
  auto config = CheckSidecarFlags(f);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->assemble_whole_generate);
  f.whole_generate = "relay";
  config = CheckSidecarFlags(f);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->assemble_whole_generate);
  f = Good();
  f.engine = "vllm";
  config = CheckSidecarFlags(f);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->assemble_whole_generate);
  f = Good();
  f.whole_generate = "buffer";
  ExpectRefused(f, "--whole-generate");
}

// Each transfer from a peer has a deadline from the file's size and a floor
// rate (StorePeers); the flags set both, and a floor that bounds nothing is
// refused.
TEST(SidecarFlagsTest, PeerTransfersGetAFloorRateAndAnAllowance) {
  auto config = CheckSidecarFlags(Good());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->peers.min_rate, StorePeers{}.min_rate);
  EXPECT_EQ(config->peers.allowance, StorePeers{}.allowance);
  SidecarFlags f = Good();
  f.peer_min_rate_mib_s = 0.5;
  f.peer_allowance_s = 1.5;
  config = CheckSidecarFlags(f);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->peers.min_rate, uint64_t{512} << 10);
  EXPECT_EQ(config->peers.allowance, std::chrono::milliseconds(1500));
  for (double rate : {0.0, -1.0, std::nan("")}) {
    f = Good();
    f.peer_min_rate_mib_s = rate;
    ExpectRefused(f, "--peer-min-rate");
  }
  f = Good();
  f.peer_allowance_s = -1;
  ExpectRefused(f, "--peer-allowance");
}

TEST(SidecarFlagsTest, InconsistentFlagsAreRefusedWithOneLine) {
  SidecarFlags f = Good();
  f.local_checkpoint.clear();
  ExpectRefused(f, "--local-checkpoint");  // disk mode needs one

  f = Good();
  f.engine = "sglang-stock";
  f.local_checkpoint.clear();
  f.update_mode = "cpu";
  ExpectRefused(f, "--update-mode cpu");  // the stock engine loads only from disk

  f = Good();
  f.engine = "sglang-stock";
  f.local_checkpoint.clear();
  ExpectRefused(f, "--local-checkpoint");

  f = Good();
  f.boot_version = -1;
  ExpectRefused(f, "--boot-version");

  f = Good();
  f.run_id = "";
  ExpectRefused(f, "--run-id");

  f = Good();
  f.run_id = "bad/run";
  ExpectRefused(f, "--run-id");

  f = Good();
  f.engine = "trtllm";
  ExpectRefused(f, "--engine");

  f = Good();
  f.engine = "vllm";
  f.local_checkpoint.clear();
  ExpectRefused(f, "--engine vllm needs --local-checkpoint");

  f = Good();
  f.engine = "vllm";
  f.update_mode = "cpu";
  ExpectRefused(f, "--update-mode cpu");  // vLLM loads only from disk

  f = Good();
  f.engine = "vllm";
  f.disk_load_format = "safetensors";
  ExpectRefused(f, "does not apply to --engine vllm");

  f = Good();
  f.engine_url = "localhost:30000";
  ExpectRefused(f, "--engine-url");

  f = Good();
  f.update_mode = "gpu";
  ExpectRefused(f, "--update-mode");

  f = Good();
  f.commit_mode = "eventually";
  ExpectRefused(f, "--commit-mode");

  f = Good();
  f.reconcile_interval_s = -1;
  ExpectRefused(f, "--reconcile-interval");

  f = Good();
  f.watchdog_threshold = 0;
  ExpectRefused(f, "--watchdog-threshold");

  f = Good();
  f.port = 70000;
  ExpectRefused(f, "--port");

  f = Good();
  f.base_checkpoint.clear();
  ExpectRefused(f, "--base-checkpoint");

  f = Good();
  f.store.clear();
  ExpectRefused(f, "--store");
}

// A sidecar follows the store's run: a --run-id naming another run at start
// is refused naming both runs, not followed away from in silence.
TEST(SidecarFlagsTest, ARunIdOtherThanTheStoresRunIsRefusedNamingBoth) {
  absl::Status s = CheckRunMatchesStore("run-b", "file:///runs/a", VersionRef{"run-a", 3});
  ASSERT_TRUE(absl::IsInvalidArgument(s)) << s;
  const std::string message(s.message());
  EXPECT_EQ(message,
            "sidecar: --run-id run-b, but the store file:///runs/a holds run run-a (its pointer "
            "names run-a/weight_v000003); give --run-id run-a (or claim run-b with `stitch "
            "claim`, which starts a new run at its boot weights and moves every replica to it)");
  EXPECT_TRUE(CheckRunMatchesStore("run-a", "file:///runs/a", VersionRef{"run-a", 3}).ok());
  // A bare identity names no run: nothing to disagree with.
  EXPECT_TRUE(CheckRunMatchesStore("run-b", "file:///runs/a", VersionRef{"", 3}).ok());
}

// The original Stitch's store wiring: its cookbook's store options become
// the store URI, and its bulletin root the cache directory (or, for a local
// backend, the store).
TEST(SidecarFlagsTest, TheOriginalsStoreOptionsBecomeAStoreUri) {
  SidecarFlags s3 = Good();
  s3.store.clear();
  s3.store_factory = std::string(kOriginalStoreFactory);
  s3.store_opts = {"backend=s3", "s3_root=s3://bucket/runs/a",
                   "s3_endpoint_url=http://127.0.0.1:9000"};
  s3.bulletin_root = "/var/stitch/bulletin";
  auto config = CheckSidecarFlags(s3);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->store_uri, "s3://bucket/runs/a?endpoint=http%3A%2F%2F127.0.0.1%3A9000");
  EXPECT_EQ(config->cache_dir, "/var/stitch/bulletin");

  s3.store_opts = {"s3_root=bucket/runs/a", "volume_name=unused"};
  s3.store_factory.clear();
  config = CheckSidecarFlags(s3);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->store_uri, "s3://bucket/runs/a");

  SidecarFlags local = Good();
  local.store.clear();
  local.store_opts = {"backend=local"};
  local.bulletin_root = "/shared/store";
  config = CheckSidecarFlags(local);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->store_uri, "/shared/store");
  EXPECT_TRUE(config->cache_dir.empty());

  SidecarFlags plain = Good();
  plain.bulletin_root = "/cache";
  plain.debug_requests = true;
  config = CheckSidecarFlags(plain);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->store_uri, "/tmp/store");
  EXPECT_EQ(config->cache_dir, "/cache");
  EXPECT_TRUE(config->log_requests);
}

TEST(SidecarFlagsTest, TheOriginalsStoreWiringThatCannotWorkIsRefused) {
  SidecarFlags f = Good();
  f.store_factory = "mypkg.stores:make";
  ExpectRefused(f, "--store-factory mypkg.stores:make");
  f = Good();
  f.store_opts = {"backend=local"};
  ExpectRefused(f, "--store and --store-opt");
  f.store.clear();
  ExpectRefused(f, "--bulletin-root");
  f.store_opts = {"backend"};
  ExpectRefused(f, "KEY=VALUE");
  f.store_opts = {"backend=s3", "backend=s3"};
  ExpectRefused(f, "more than once");
  f.store_opts = {"backend=s3", "region=eu"};
  ExpectRefused(f, "--store-opt region");
  f.store_opts = {"backend=modal-volume", "volume_name=v"};
  ExpectRefused(f, "backend=modal-volume");
  f.store_opts = {"backend=gcs"};
  ExpectRefused(f, "backend=gcs");
  f.store_opts = {"backend=s3", "s3_root=s3://b/p?endpoint=x"};
  ExpectRefused(f, "s3_endpoint_url");
  f = Good();
  f.cache_dir = "/a";
  f.bulletin_root = "/b";
  ExpectRefused(f, "--cache-dir");
}

}  // namespace
}  // namespace stitch
