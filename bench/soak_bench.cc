// A run of weeks, compressed (`make bench-soak`): a thousand publishes of
// the tiny model through `stitch publish` with retention and the anchor
// budget on, two resident replicas behind a gateway, a replica joining
// every hundred versions (three in a row, and three at v10, the baseline),
// and a hold taken
// on an old version for one resident replica, then released. It prints:
//
//   - the store's bytes and versions every hundred publishes, and its peak
//     in each half of the run after warm-up: flat when the second half's
//     peak is the first's;
//   - the joiners' median time from start to ready at the pointer, and the
//     ratio of the last to the one at v10 (goal: at most 1.5);
//   - the DELTAs a joiner applies (the pointer's chain behind its anchor);
//   - wrong labels: every joiner's and resident's greedy answer pinned to
//     the version it serves, judged against that version's weights, and
//     the held replica's answers at the held version through the gateway;
//   - replicas stuck or failed: any resident or joiner that did not reach
//     the pointer, or reports a sync or terminal error at the end.
//
// The processes are real (`stitch engine`, `stitch sidecar`, `stitch
// gateway`, `stitch publish`, `stitch hold`, `stitch release`) over a
// filesystem store.
#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "fleet_common.h"
#include "stitch/api/replica_client.h"
#include "stitch/chaos/oracle.h"
#include "stitch/core/version.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/demo/fleet.h"
#include "stitch/demo/supervisor.h"
#include "stitch/fetch/open_store.h"
#include "stitch/publish/anchor.h"
#include "stitch/publish/claim.h"
#include "stitch/refengine/init_model.h"
#include "stitch/refengine/tokenizer.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace stitch {
namespace {

struct Settings {
  std::string stitch = "build/src/stitch/cli/stitch";
  int versions = 1000;
  int join_every = 100;
  int keep_last = 10;
  int anchor_every = 20;
  int hold_version = 250;
  int hold_at = 255;
  int release_at = 600;
  int warmup = 200;  // versions before the store's size counts as flat
  int joins_per_point = 3;
};

struct Sample {
  int64_t version = 0;
  uint64_t store_bytes = 0;
  size_t stored_versions = 0;
  int64_t chain_deltas = 0;
  double join_s = -1;  // -1: no join at this version
};

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

uint64_t TreeBytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) total += it->file_size(size_ec);
  }
  return total;
}

// Runs `stitch <args>` to its end; an error naming its log when it fails.
absl::Status RunStitch(ProcessSupervisor& supervisor, const std::string& name,
                       const std::vector<std::string>& args, const fs::path& log) {
  auto pid = supervisor.Start(name, args, log);
  if (!pid.ok()) return pid.status();
  auto exited = supervisor.WaitForExit(*pid, std::chrono::seconds(300));
  if (!exited.ok()) return exited.status();
  if (*exited != 0) {
    return absl::InternalError(absl::StrCat(name, " exited ", *exited, "; see ", log.string()));
  }
  return absl::OkStatus();
}

// Waits up to `timeout` for `url` to serve `version` with no error.
bool WaitAt(const std::string& url, int64_t version, std::chrono::seconds timeout,
            std::string* why);

// A replica is stuck when it is not at `version`, or reports an error.
bool Healthy(const std::string& url, int64_t version, std::string* why) {
  ReplicaCallOptions call;
  call.timeout = std::chrono::seconds(5);
  auto states = ReadServerInfos({url}, call);
  if (!states[0].ok()) {
    *why = std::string(states[0].status().message());
    return false;
  }
  const ReplicaState& s = *states[0];
  if (!s.terminal_error.empty() || !s.sync_error.empty() || !s.applied.has_value() ||
      s.applied->version != version) {
    *why = absl::StrCat("at ", s.applied ? s.applied->ToString() : "-", ", sync error '",
                        s.sync_error, "', terminal '", s.terminal_error, "'");
    return false;
  }
  return true;
}

bool WaitAt(const std::string& url, int64_t version, std::chrono::seconds timeout,
            std::string* why) {
  const auto deadline = Clock::now() + timeout;
  while (!Healthy(url, version, why)) {
    if (Clock::now() >= deadline) return false;
    SleepSeconds(0.05);
  }
  return true;
}

int Run(const Settings& settings) {
  std::string pattern = (fs::temp_directory_path() / "stitch-soak-bench-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) return 1;
  const fs::path dir = pattern;
  const std::string run = "soak";
  OracleOptions oracle_options;  // version v: the base with its LM head drawn from v
  oracle_options.config = ChaosModel(/*real_engine=*/false);
  oracle_options.seed = 11;
  oracle_options.prompts = {EncodeText("The policy", BosMode::kPrepend)};
  Oracle oracle(oracle_options);
  auto fail = [&](const absl::Status& s) {
    std::cerr << "soak_bench: " << s.message() << " (run directory kept: " << dir.string() << ")\n";
    return 1;
  };
  if (absl::Status s = WriteCheckpoint(dir / "base", oracle_options.config,
                                       Views(oracle.Tensors(0)), ExistingDir::kRefuse);
      !s.ok()) {
    return fail(s);
  }
  const std::string store_uri = (dir / "store").string();
  auto store = OpenStore(store_uri, StoreOptions{run, dir / "cache"});
  if (!store.ok()) return fail(store.status());
  if (auto claimed = ClaimRun(**store, 0, nullptr); !claimed.ok()) return fail(claimed.status());

  ProcessSupervisor supervisor(fs::absolute(settings.stitch).string(), "soak_bench");
  FleetOptions options;
  options.dir = dir;
  options.store = store_uri;
  options.run_id = run;
  options.base_checkpoint = dir / "base";
  options.reconcile_interval_s = 1;
  options.poll_every = std::chrono::milliseconds(10);
  std::vector<Sample> samples;
  int wrong = 0, judged = 0, stuck = 0;
  uint64_t peak_first = 0, peak_second = 0;  // the store's peak in each half after warm-up
  std::vector<std::string> notes;
  absl::Status status;
  {
    LocalFleet fleet(supervisor, options, Clock::now(), nullptr);
    status = fleet.StartGateway();
    for (int r = 0; r < 2 && status.ok(); ++r) status = fleet.StartReplica(false).status();
    if (status.ok()) status = fleet.WaitReady(2);
    const std::vector<std::string> residents = PoolUrls(fleet.pool_file());
    const std::string pool = absl::StrCat("file:", fleet.pool_file().string());
    std::string held_url;
    fs::create_directories(dir / "publish");
    for (int64_t v = 1; v <= settings.versions && status.ok(); ++v) {
      const fs::path version_dir = dir / "publish" / VersionDirName(v);
      EncodeOptions encode;
      encode.version = v;
      encode.base_version = v - 1;
      encode.run_id = run;
      encode.threads = 1;
      // Version 1 is FULL, as a trainer's first publish of its own weights
      // is: the store then holds an anchor to write the next ones from.
      absl::Status encoded;
      if (v == 1) {
        FullVersionOptions full;
        full.version = v;
        full.run_id = run;
        encoded = WriteFullVersion(Views(oracle.Tensors(v)), version_dir, full).status();
      } else {
        encoded =
            EncodeDelta(Views(oracle.Tensors(v - 1)), Views(oracle.Tensors(v)), version_dir, encode)
                .status();
      }
      if (!encoded.ok()) {
        status = encoded;
        break;
      }
      status = RunStitch(supervisor, absl::StrCat("publish v", v),
                         {"publish", "--store", store_uri, "--run-id", run, "--pool", pool,
                          "--anchor-every", absl::StrCat(settings.anchor_every), "--keep-last",
                          absl::StrCat(settings.keep_last), version_dir.string()},
                         dir / "publish.log");
      std::error_code ec;
      fs::remove_all(version_dir, ec);
      if (!status.ok()) break;

      if (v == settings.hold_at) {
        status = RunStitch(supervisor, "hold",
                           {"hold", "--store", store_uri, "--version",
                            absl::StrCat(settings.hold_version), "--ttl", "86400", "--holder",
                            "soak-eval", "--pool", pool, "--replicas", "1", "--wait", "120"},
                           dir / "hold.log");
        if (!status.ok()) break;
        // Exact pins at the held version, through the gateway.
        for (int i = 0; i < 5; ++i) {
          ++judged;
          if (!JudgedRight(oracle, fleet.gateway_url(), settings.hold_version)) ++wrong;
        }
        for (const std::string& url : residents) {
          std::string why;
          if (Healthy(url, settings.hold_version, &why)) held_url = url;
        }
        std::printf("  v%-5lld hold on v%d taken: %s serves it\n", static_cast<long long>(v),
                    settings.hold_version, held_url.c_str());
        if (held_url.empty()) status = absl::InternalError("no resident serves the held version");
      }
      if (v == settings.release_at) {
        status =
            RunStitch(supervisor, "release",
                      {"release", "--store", store_uri, "--holder", "soak-eval", "--pool", pool},
                      dir / "release.log");
        held_url.clear();
        std::printf("  v%-5lld hold released\n", static_cast<long long>(v));
      }
      if (!status.ok()) break;
      // The store's size after every publish: flat means the second half
      // of the run peaks no higher than the first.
      const uint64_t bytes = TreeBytes(dir / "store");
      if (v >= settings.warmup) {
        uint64_t& peak = v <= (settings.warmup + settings.versions) / 2 ? peak_first : peak_second;
        peak = std::max(peak, bytes);
      }

      const bool join = v == 10 || v % settings.join_every == 0;
      if (!join) continue;
      Sample sample;
      sample.version = v;
      sample.store_bytes = bytes;
      sample.stored_versions = (*store)->ListVersions().value_or(std::vector<int64_t>{}).size();
      if (auto chain = MeasureChain(**store, v); chain.ok()) sample.chain_deltas = chain->deltas;
      // Replicas join at v, one after another: from start to ready at the
      // pointer, the median of `joins_per_point` (one join is noise at
      // these sizes). Each is judged, then leaves again.
      std::vector<double> joins;
      for (int j = 0; j < settings.joins_per_point && status.ok(); ++j) {
        const auto started = Clock::now();
        fleet.StartReplicaInBackground();
        status = fleet.WaitJoinedReady();
        if (!status.ok()) {
          ++stuck;
          break;
        }
        joins.push_back(Seconds(Clock::now() - started));
        for (const std::string& url : PoolUrls(fleet.pool_file())) {
          const int64_t serving = url == held_url ? settings.hold_version : v;
          std::string why;
          if (!WaitAt(url, serving, std::chrono::seconds(60), &why)) {
            ++stuck;
            notes.push_back(absl::StrCat("v", v, ": ", url, " not at v", serving, ": ", why));
          }
          ++judged;
          if (!JudgedRight(oracle, url, serving)) ++wrong;
        }
        for (const ReplicaView& r : fleet.Views()) {
          if (r.name != "r0" && r.name != "r1" && r.state != "killed") (void)fleet.Kill(r.name);
        }
      }
      if (!status.ok()) break;
      std::sort(joins.begin(), joins.end());
      sample.join_s = joins[joins.size() / 2];
      samples.push_back(sample);
      std::printf("  v%-5lld store %8.1f KiB, %3zu versions, chain %2lld DELTAs, join %.2f s\n",
                  static_cast<long long>(v), sample.store_bytes / 1024.0, sample.stored_versions,
                  static_cast<long long>(sample.chain_deltas), sample.join_s);
      std::fflush(stdout);
    }
    if (status.ok()) {
      for (const std::string& url : residents) {
        std::string why;
        if (!WaitAt(url, settings.versions, std::chrono::seconds(60), &why)) {
          ++stuck;
          notes.push_back(absl::StrCat(url, ": ", why));
        }
      }
    }
    (void)fleet.Finish();
  }
  supervisor.StopAll(std::chrono::seconds(10));
  if (!status.ok()) return fail(status);

  double join_first = -1, join_last = -1;
  for (const Sample& s : samples) {
    if (join_first < 0) join_first = s.join_s;
    join_last = s.join_s;
  }
  std::printf(
      "store peak after warm-up (v%d): first half %.1f KiB, second half %.1f KiB (second / "
      "first %.2f: flat at 1.00, growing above)\n",
      settings.warmup, peak_first / 1024.0, peak_second / 1024.0,
      peak_first > 0 ? static_cast<double>(peak_second) / peak_first : 0.0);
  std::printf("join at v%lld / join at v%lld: %.2f s / %.2f s = %.2f (goal <= 1.5)\n",
              static_cast<long long>(samples.back().version),
              static_cast<long long>(samples.front().version), join_last, join_first,
              join_first > 0 ? join_last / join_first : 0.0);
  std::printf("wrong labels %d of %d judged; replicas stuck or failed %d\n", wrong, judged, stuck);
  for (const std::string& n : notes) std::printf("note: %s\n", n.c_str());
  std::error_code ec;
  if (getenv("SOAK_KEEP") == nullptr) fs::remove_all(dir, ec);
  return wrong == 0 && stuck == 0 ? 0 : 1;
}

}  // namespace
}  // namespace stitch

int main(int argc, char** argv) {
  stitch::Settings settings;
  CLI::App app{
      "A run of weeks, compressed: retention, anchors, joins and a hold over 1000 publishes"};
  app.add_option("--stitch", settings.stitch, "The stitch binary")->capture_default_str();
  app.add_option("--versions", settings.versions, "Publishes")->capture_default_str();
  app.add_option("--join-every", settings.join_every, "A replica joins every this many versions")
      ->capture_default_str();
  app.add_option("--keep-last", settings.keep_last, "Retention: stitch publish --keep-last")
      ->capture_default_str();
  app.add_option("--anchor-every", settings.anchor_every, "stitch publish --anchor-every")
      ->capture_default_str();
  app.add_option("--hold-version", settings.hold_version, "The version held for evaluation")
      ->capture_default_str();
  app.add_option("--hold-at", settings.hold_at, "Taken once this version is published")
      ->capture_default_str();
  app.add_option("--release-at", settings.release_at, "Released once this one is")
      ->capture_default_str();
  app.add_option("--joins", settings.joins_per_point,
                 "Replicas joining at each join point (the median time is printed)")
      ->capture_default_str();
  app.add_option("--warmup", settings.warmup, "Versions before the store counts as flat")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (settings.hold_version > settings.hold_at || settings.hold_at > settings.release_at ||
      settings.release_at > settings.versions || settings.join_every < 1 ||
      settings.joins_per_point < 1) {
    std::cerr << "soak_bench: need --hold-version <= --hold-at <= --release-at <= --versions\n";
    return 2;
  }
  std::printf(
      "soak_bench: %d publishes of the tiny model, --keep-last %d, --anchor-every %d, a join "
      "every %d, a hold on v%d from v%d to v%d\n",
      settings.versions, settings.keep_last, settings.anchor_every, settings.join_every,
      settings.hold_version, settings.hold_at, settings.release_at);
  return stitch::Run(settings);
}
