// A fleet on this machine: N reference engines with their sidecars over a
// filesystem store, first idle, then following a series of DELTA publishes
// (`make bench-fleet`). For each N, with the reconciler's idle backoff off
// (--reconcile-max-interval = --reconcile-interval) and on, it prints:
//
//   - idle pointer reads per replica per second (the sidecars' reconcile
//     passes, one pointer read each, over a window after a warm-up), and the
//     ratio of "on" to "off" measured in the same run;
//   - publish -> whole fleet: from the start of each `stitch publish` (which
//     writes the version, moves the pointer and wakes the pool) until a
//     replica reports the version, p50, p95 and max over every replica and
//     publish, and the max's ratio to the first fleet's (N = 1, backoff off).
//
//   - after each publish, every replica's greedy answer pinned to the new
//     version, judged against that version's weights (the chaos oracle):
//     wrong / judged;
//
//   - the gateway's resident memory and the size of its /ui/state (what the
//     dashboard polls), and the sidecars' total resident memory, after the
//     publishes;
//
//   - with --store s3 (a local S3 server, moto): the bytes the whole fleet
//     downloaded from the store per version (the sidecars'
//     store_bytes_downloaded_total), and their ratio to the version's size;
//     with --hosts H the replicas share a version cache per simulated host
//     (one --cache-dir per H-th of the fleet), so the ratio is H, not N;
//     with --peers every sidecar also takes version files from the others
//     (--peers file:<the fleet's pool file>), so the ratio is about 1;
//     the files the peers carried are printed beside it.
//
// The processes are real (`stitch engine`, `stitch sidecar`, `stitch
// publish`), as the demo starts them; on a 2-core machine 64 replicas are
// 128 processes, so the publish times measure contention as much as the
// design: run it where there are cores for the fleet.
#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "fleet_common.h"
#include "stitch/api/replica_client.h"
#include "stitch/chaos/oracle.h"
#include "stitch/chaos/resources.h"
#include "stitch/core/version.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/demo/engine_command.h"
#include "stitch/demo/fleet.h"
#include "stitch/demo/supervisor.h"
#include "stitch/fetch/open_store.h"
#include "stitch/net/client.h"
#include "stitch/net/prometheus.h"
#include "stitch/publish/claim.h"
#include "stitch/refengine/init_model.h"
#include "stitch/refengine/tokenizer.h"
#include "stitch/store/store.h"
#include "store_proxy.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace stitch {
namespace {

struct Settings {
  std::string stitch = "build/src/stitch/cli/stitch";
  std::string store = "fs";  // or "s3": a local S3 server (moto)
  std::string python = ".venv/bin/python";
  std::string moto_script = "tests/s3_moto.py";
  int hosts = 0;                 // > 0: replicas share a version cache per simulated host
  int per_host = 0;              // > 0: instead, hosts of this many replicas each
  bool peers = false;            // sidecars take version files from each other first
  std::string backoff = "both";  // the idle backoff: off, on, or both in turn
  double store_mb_per_s = 0;     // --store s3: the store's bandwidth cap (0: none)
  std::string replicas = "1,16,64";
  double interval_s = 1;
  double max_interval_s = 8;
  double warmup_s = 20;
  double idle_s = 30;
  int publishes = 3;
};

struct Result {
  int replicas = 0;
  bool backoff = false;
  double idle_reads = 0;               // per replica per second
  double store_bytes_per_version = 0;  // downloaded by the whole fleet
  double peer_bytes_per_version = 0;   // carried by peers
  double gateway_rss_mib = 0;          // after the publishes
  double ui_state_kib = 0;             // GET /ui/state, the dashboard's poll
  double sidecars_rss_mib = 0;         // all of them together
  int checked = 0;                     // greedy answers judged against the weights of their label
  int wrong = 0;                       // of which not that version's output (or not answered)
  double store_requests_per_version = 0;  // --store s3: counted by the proxy
  double served_bytes_per_version = 0;    // likewise, what the store sent back
  double version_bytes = 0;               // the versions' payload, on average
  std::vector<double> reach_s;            // per replica and publish
};

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The sum over every sidecar of one of its counters, e.g.
// "stitch_sidecar_reconcile_passes_total" (one pointer read per pass).
absl::StatusOr<double> SumOf(const std::vector<std::string>& urls, const std::string& metric) {
  double total = 0;
  for (const std::string& url : urls) {
    auto response = HttpFetch("GET", url + "/metrics", {}, FetchOptions{});
    if (!response.ok()) return response.status();
    const std::optional<double> value = PrometheusSum(response->body, metric);
    if (!value.has_value()) {
      return absl::InternalError(absl::StrCat(url, "/metrics has no readable ", metric));
    }
    total += *value;
  }
  return total;
}

constexpr char kPasses[] = "stitch_sidecar_reconcile_passes_total";
constexpr char kStoreBytes[] = "stitch_sidecar_store_bytes_downloaded_total";
constexpr char kPeerBytes[] = "stitch_sidecar_peer_bytes_downloaded_total";

// Starts the S3 server (moto, through tests/s3_moto.py) behind a counting,
// bandwidth-capped proxy (`proxy`), and returns the store's URI (the
// proxy's).
absl::StatusOr<std::string> StartS3(const Settings& settings, ProcessSupervisor& supervisor,
                                    const fs::path& dir, std::unique_ptr<StoreProxy>& proxy) {
  ::setenv("AWS_ACCESS_KEY_ID", "bench", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "bench", 1);
  ::setenv("AWS_REGION", "us-east-1", 1);
  ::unsetenv("AWS_SESSION_TOKEN");
  absl::StatusOr<int> port = PickEnginePort({});
  if (!port.ok()) return port.status();
  auto pid = supervisor.StartProgram(
      "s3", fs::absolute(settings.python).string(),
      {fs::absolute(settings.moto_script).string(), "--port", absl::StrCat(*port), "--state",
       (dir / "s3-state.jsonl").string(), "--no-auth", "--until-signal"},
      dir / "s3.log");
  if (!pid.ok()) return pid.status();
  auto url = supervisor.WaitForUrl(*pid, std::chrono::seconds(60), nullptr);
  if (!url.ok()) return url.status();
  auto started = StoreProxy::Start(static_cast<uint16_t>(*port), settings.store_mb_per_s * 1e6);
  if (!started.ok()) return started.status();
  proxy = *std::move(started);
  return absl::StrCat("s3://stitch-test/bench?endpoint=http://127.0.0.1:", proxy->port(),
                      "&region=us-east-1");
}

absl::StatusOr<Result> RunOne(const Settings& settings, int replicas, bool backoff) {
  Result result;
  result.replicas = replicas;
  result.backoff = backoff;
  std::string pattern = (fs::temp_directory_path() / "stitch-fleet-bench-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) return absl::InternalError("cannot make a directory");
  const fs::path dir = pattern;
  const std::string run = "bench";
  OracleOptions versions;  // version v: the base with its LM head drawn from v
  versions.config = ChaosModel(/*real_engine=*/false);
  versions.seed = 7;
  versions.prompts = {EncodeText("The policy", BosMode::kPrepend)};
  Oracle oracle(versions);
  if (absl::Status s = WriteCheckpoint(dir / "base", versions.config, Views(oracle.Tensors(0)),
                                       ExistingDir::kRefuse);
      !s.ok()) {
    return s;
  }
  ProcessSupervisor supervisor(fs::absolute(settings.stitch).string(), "fleet_bench");
  std::string store_uri = (dir / "store").string();
  std::unique_ptr<StoreProxy> proxy;
  if (settings.store == "s3") {
    auto uri = StartS3(settings, supervisor, dir, proxy);
    if (!uri.ok()) return uri.status();
    store_uri = *uri;
  }
  auto store = OpenStore(store_uri, StoreOptions{run, dir / "cache"});
  if (!store.ok()) return store.status();
  if (auto claimed = ClaimRun(**store, 0, nullptr); !claimed.ok()) return claimed.status();

  FleetOptions options;
  options.dir = dir;
  options.store = store_uri;
  options.run_id = run;
  options.base_checkpoint = dir / "base";
  options.reconcile_interval_s = settings.interval_s;
  options.poll_every = std::chrono::milliseconds(1000);
  options.cache_hosts =
      settings.per_host > 0 ? std::max(1, replicas / settings.per_host) : settings.hosts;
  // The dashboard's view of a big fleet is what is measured, not how often
  // the gateway refreshes it.
  options.gateway_poll_interval_s = 1;
  options.sidecar_extra = {"--reconcile-max-interval",
                           absl::StrCat(backoff ? settings.max_interval_s : settings.interval_s)};
  if (settings.peers) {
    // The fleet's pool file (LocalFleet::pool_file), re-read as replicas join.
    options.sidecar_extra.push_back("--peers");
    options.sidecar_extra.push_back(absl::StrCat("file:", (dir / "replicas.txt").string()));
    // Peers need the fleet's token; the sidecars, the gateway and `stitch
    // publish` (its wakes) all take it from the environment.
    ::setenv("STITCH_AUTH_TOKEN", "fleet-bench-token", 1);
  }
  absl::Status status;
  {
    LocalFleet fleet(supervisor, options, Clock::now(), nullptr);
    status = fleet.StartGateway();
    for (int r = 0; r < replicas && status.ok(); ++r) status = fleet.StartReplica(false).status();
    if (status.ok()) status = fleet.WaitReady(replicas);
    const std::vector<std::string> urls = PoolUrls(fleet.pool_file());
    if (status.ok() && static_cast<int>(urls.size()) != replicas) {
      status = absl::InternalError("the pool file does not list every replica");
    }
    if (status.ok()) {
      SleepSeconds(settings.warmup_s);
      auto before = SumOf(urls, kPasses);
      const auto t0 = Clock::now();
      SleepSeconds(settings.idle_s);
      auto after = SumOf(urls, kPasses);
      if (!before.ok() || !after.ok()) {
        status = before.ok() ? after.status() : before.status();
      } else {
        result.idle_reads = static_cast<double>(*after - *before) / Seconds(Clock::now() - t0) /
                            static_cast<double>(replicas);
      }
    }
    absl::StatusOr<double> bytes_before = SumOf(urls, kStoreBytes);
    if (status.ok() && !bytes_before.ok()) status = bytes_before.status();
    absl::StatusOr<double> peer_before = SumOf(urls, kPeerBytes);
    if (status.ok() && !peer_before.ok()) status = peer_before.status();
    const uint64_t requests_before = proxy ? proxy->requests() : 0;
    const uint64_t served_before = proxy ? proxy->bytes_served() : 0;
    for (int v = 1; v <= settings.publishes && status.ok(); ++v) {
      const fs::path version_dir = dir / "publish" / VersionDirName(v);
      std::error_code made;
      fs::create_directories(dir / "publish", made);
      EncodeOptions encode;
      encode.version = v;
      encode.base_version = v - 1;
      encode.run_id = run;
      encode.threads = 1;
      const std::vector<HostTensor> base = oracle.Tensors(v - 1);
      const std::vector<HostTensor> target = oracle.Tensors(v);
      auto encoded = EncodeDelta(Views(base), Views(target), version_dir, encode);
      if (!encoded.ok()) {
        status = encoded.status();
        break;
      }
      result.version_bytes += static_cast<double>(encoded->payload_bytes) / settings.publishes;
      const auto published = Clock::now();
      auto pid = supervisor.Start(
          absl::StrCat("publish v", v),
          {"publish", "--store", store_uri, "--run-id", run, "--pool",
           absl::StrCat("file:", fleet.pool_file().string()), version_dir.string()},
          dir / absl::StrCat("publish-", v, ".log"));
      if (!pid.ok()) {
        status = pid.status();
        break;
      }
      auto exited = supervisor.WaitForExit(*pid, std::chrono::seconds(120));
      if (!exited.ok() || *exited != 0) {
        status =
            absl::InternalError(absl::StrCat("stitch publish of v", v, " failed; see ",
                                             (dir / absl::StrCat("publish-", v, ".log")).string()));
        break;
      }
      std::vector<std::optional<double>> reached(urls.size());
      size_t left = urls.size();
      ReplicaCallOptions call;
      call.timeout = std::chrono::seconds(5);
      while (left > 0 && Clock::now() - published < std::chrono::seconds(120)) {
        std::vector<absl::StatusOr<ReplicaState>> states = ReadServerInfos(urls, call);
        const double at = Seconds(Clock::now() - published);
        for (size_t i = 0; i < urls.size(); ++i) {
          if (reached[i].has_value() || !states[i].ok() || !states[i]->applied.has_value() ||
              states[i]->applied->version < v) {
            continue;
          }
          reached[i] = at;
          --left;
        }
        if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (left > 0) {
        status = absl::DeadlineExceededError(
            absl::StrCat(left, " replicas did not reach v", v, " within 120 s"));
        break;
      }
      for (const auto& r : reached) result.reach_s.push_back(*r);
      // Labels against weights: every replica answers a greedy generation
      // pinned to v, judged by the oracle (the weights of v, computed here).
      for (const std::string& url : urls) {
        ++result.checked;
        if (!JudgedRight(oracle, url, v)) ++result.wrong;
      }
    }
    if (status.ok()) {
      absl::StatusOr<double> bytes_after = SumOf(urls, kStoreBytes);
      absl::StatusOr<double> peer_after = SumOf(urls, kPeerBytes);
      if (!bytes_after.ok() || !peer_after.ok()) {
        status = bytes_after.ok() ? peer_after.status() : bytes_after.status();
      } else {
        result.store_bytes_per_version = (*bytes_after - *bytes_before) / settings.publishes;
        result.peer_bytes_per_version = (*peer_after - *peer_before) / settings.publishes;
      }
      if (proxy) {
        // The publishes' own uploads and pointer writes are in it too.
        result.store_requests_per_version =
            static_cast<double>(proxy->requests() - requests_before) / settings.publishes;
        result.served_bytes_per_version =
            static_cast<double>(proxy->bytes_served() - served_before) / settings.publishes;
      }
    }
    if (status.ok()) {
      auto ui = HttpFetch("GET", fleet.gateway_url() + "/ui/state", {}, FetchOptions{});
      if (ui.ok() && ui->status == 200) result.ui_state_kib = ui->body.size() / 1024.0;
      if (auto usage = ReadProcessUsage(fleet.gateway_pid())) {
        result.gateway_rss_mib = usage->rss_kib / 1024.0;
      }
      for (int pid : fleet.sidecar_pids()) {
        if (auto usage = ReadProcessUsage(pid)) result.sidecars_rss_mib += usage->rss_kib / 1024.0;
      }
    }
    (void)fleet.Finish();
  }
  supervisor.StopAll(std::chrono::seconds(10));
  std::error_code ec;
  if (status.ok()) fs::remove_all(dir, ec);
  if (!status.ok()) {
    return absl::Status(
        status.code(), absl::StrCat(status.message(), " (run directory kept: ", dir.string(), ")"));
  }
  return result;
}

}  // namespace
}  // namespace stitch

int main(int argc, char** argv) {
  using namespace stitch;
  Settings settings;
  CLI::App app{"Fleet scale: idle pointer reads and publish -> whole fleet, backoff off and on"};
  app.add_option("--stitch", settings.stitch, "The stitch binary")->capture_default_str();
  app.add_option("--replicas", settings.replicas, "Fleet sizes, comma-separated")
      ->capture_default_str();
  app.add_option("--store", settings.store,
                 "fs (a directory) or s3 (a local S3 server: moto, from the project's .venv)")
      ->capture_default_str();
  app.add_option("--replicas-per-host", settings.per_host,
                 "Replicas share a version cache per simulated host of this many replicas "
                 "(overrides --hosts; 0: not)")
      ->capture_default_str();
  app.add_option("--hosts", settings.hosts,
                 "Replicas share a version cache per simulated host, this many hosts (0: one "
                 "cache per replica)")
      ->capture_default_str();
  app.add_option("--backoff", settings.backoff, "The idle backoff: off, on, or both in turn")
      ->check(CLI::IsMember({"off", "on", "both"}))
      ->capture_default_str();
  app.add_option("--store-mbps", settings.store_mb_per_s,
                 "--store s3: cap what the store sends back, all clients together, at this many "
                 "MB/s (0: no cap)")
      ->capture_default_str();
  app.add_flag("--peers", settings.peers,
               "Sidecars take version files from each other before the store (--peers file:POOL)");
  app.add_option("--python", settings.python, "The Python with moto, for --store s3")
      ->capture_default_str();
  app.add_option("--moto-script", settings.moto_script, "tests/s3_moto.py, for --store s3")
      ->capture_default_str();
  app.add_option("--interval", settings.interval_s, "--reconcile-interval of every sidecar")
      ->capture_default_str();
  app.add_option("--max-interval", settings.max_interval_s,
                 "--reconcile-max-interval with the backoff on")
      ->capture_default_str();
  app.add_option("--warmup", settings.warmup_s, "Seconds idle before the idle window")
      ->capture_default_str();
  app.add_option("--idle", settings.idle_s, "Seconds of the idle window")->capture_default_str();
  app.add_option("--publishes", settings.publishes, "DELTA publishes per fleet")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::vector<int> sizes;
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(settings.replicas, ','))) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      std::cerr << "fleet_bench: --replicas must list positive numbers (got \"" << settings.replicas
                << "\")\n";
      return 2;
    }
    sizes.push_back(n);
  }
  if (settings.store != "fs" && settings.store != "s3") {
    std::cerr << "fleet_bench: --store must be fs or s3\n";
    return 2;
  }
  std::printf(
      "fleet_bench: reference engines behind sidecars over a%s store, %s%s; "
      "--reconcile-interval %.1f s, backoff to %.1f s when on; idle window %.0f s after %.0f s\n",
      settings.store == "s3" ? "n S3 (moto)" : " filesystem",
      settings.per_host > 0
          ? absl::StrCat("a version cache per host of ", settings.per_host, " replicas").c_str()
      : settings.hosts > 0
          ? absl::StrCat("a version cache per host, ", settings.hosts, " hosts").c_str()
          : "a version cache per replica",
      settings.peers ? ", peers on" : "", settings.interval_s, settings.max_interval_s,
      settings.idle_s, settings.warmup_s);
  std::printf("%9s  %7s  %22s  %10s  %28s  %12s  %22s  %22s  %22s  %12s  %10s  %13s  %14s\n",
              "replicas", "backoff", "idle reads/replica/s", "on / off",
              "publish -> fleet p50/p95/max", "max / N=1's", "store bytes / version",
              "peer bytes / version", "at the store: req, bytes", "gateway RSS", "/ui/state",
              "sidecars RSS", "wrong / judged");
  std::optional<double> first_max;
  for (int n : sizes) {
    std::optional<double> off_reads;
    for (bool backoff : {false, true}) {
      if (settings.backoff != "both" && backoff != (settings.backoff == "on")) continue;
      absl::StatusOr<Result> r = RunOne(settings, n, backoff);
      if (!r.ok()) {
        std::cerr << "fleet_bench: " << n << " replicas: " << r.status().message() << "\n";
        return 1;
      }
      const double max = Percentile(r->reach_s, 100);
      if (!first_max.has_value()) first_max = max;
      if (!backoff) off_reads = r->idle_reads;
      const std::string bytes = settings.store == "s3" && r->version_bytes > 0
                                    ? absl::StrFormat("%.0f (%.2fx)", r->store_bytes_per_version,
                                                      r->store_bytes_per_version / r->version_bytes)
                                    : std::string("- (read in place)");
      const std::string peer_bytes =
          settings.store == "s3" && r->version_bytes > 0
              ? absl::StrFormat("%.0f (%.2fx)", r->peer_bytes_per_version,
                                r->peer_bytes_per_version / r->version_bytes)
              : std::string("-");
      const std::string at_store =
          settings.store == "s3" ? absl::StrFormat("%.0f, %.0f", r->store_requests_per_version,
                                                   r->served_bytes_per_version)
                                 : std::string("-");
      std::printf(
          "%9d  %7s  %22.3f  %10s  %9.3f / %6.3f / %6.3f s  %12.2f  %22s  %22s  %22s  %8.1f MiB  "
          "%6.1f KiB  %9.1f MiB  %6d / %5d\n",
          n, backoff ? "on" : "off", r->idle_reads,
          backoff && off_reads.value_or(0) > 0
              ? absl::StrFormat("%.3f", r->idle_reads / *off_reads).c_str()
              : "-",
          Percentile(r->reach_s, 50), Percentile(r->reach_s, 95), max,
          *first_max > 0 ? max / *first_max : 0.0, bytes.c_str(), peer_bytes.c_str(),
          at_store.c_str(), r->gateway_rss_mib, r->ui_state_kib, r->sidecars_rss_mib, r->wrong,
          r->checked);
      std::fflush(stdout);
    }
  }
  return 0;
}
