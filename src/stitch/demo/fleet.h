// The demo's local elastic fleet: engines (`stitch engine`, or what a
// command template starts: engine_command.h) with their sidecars following
// one store, listed in a `file:` pool that a `stitch gateway`
// routes over, all started and stopped through a ProcessSupervisor, and
// watched by a monitor thread that polls every replica's /server_info and
// records what it sees (DemoReplica) for the status line and the report.
//
// Layout under the demo directory: replicas.txt (the pool file, replaced
// atomically), logs/<process>.log, replicas/<name>/ (each sidecar's local
// checkpoint and cache).
//
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "stitch/demo/report.h"
#include "stitch/demo/supervisor.h"
#include "stitch/refengine/dialect.h"

namespace stitch {

// The command lines of a local fleet's processes (`stitch demo`, `stitch
// chaos`): arguments after `stitch`.
//
// `stitch engine` serving `model` for `run_id` on 127.0.0.1:`port` (0: any).
std::vector<std::string> EngineArgs(const std::filesystem::path& model, const std::string& run_id,
                                    int port);

struct SidecarLaunch {
  std::string store;
  std::string run_id;
  std::string engine_url;
  std::filesystem::path base_checkpoint;
  std::filesystem::path local_checkpoint;
  double reconcile_interval_s = 0.5;
  double watchdog_interval_s = 1;
  int port = 0;
  // --engine and --update-mode: an engine that stages in memory by default.
  std::string engine = "sglang";
  std::string update_mode = "cpu";
  std::vector<std::string> extra;  // appended as given
};
// `stitch sidecar` in front of a reference engine.
std::vector<std::string> SidecarArgs(const SidecarLaunch& launch);

// `stitch gateway` over `pool_spec` on 127.0.0.1:`port`.
std::vector<std::string> GatewayArgs(const std::string& pool_spec, int port, double poll_interval_s,
                                     double admission_wait_s);

struct FleetOptions {
  std::filesystem::path dir;  // the demo directory
  std::string store;          // store URI the sidecars follow
  std::string run_id;
  std::filesystem::path base_checkpoint;
  // The engines' API, and so the sidecars' engine adapter.
  EngineApi api = EngineApi::kSglang;
  // Empty: each replica's engine is `stitch engine --api <api>`, started
  // before its sidecar. Otherwise the template (engine_command.h) each
  // engine runs, on a port picked here; its sidecar starts at once and waits
  // for it.
  std::string engine_command;
  // How long a replica may take to report ready (WaitReady,
  // WaitJoinedReady), and a sidecar's --engine-start-timeout in front of a
  // templated engine: a real engine takes a minute or more to start.
  std::chrono::milliseconds ready_timeout = std::chrono::seconds(600);
  // Sidecar backstop reconcile period; publishes also wake the fleet.
  double reconcile_interval_s = 0.5;
  // More arguments for every sidecar (bench/fleet_bench's backoff flags).
  std::vector<std::string> sidecar_extra;
  // > 0: replica rK's sidecar caches versions in hosts/h<K mod hosts>/
  // under `dir`, shared as on a host of that many replicas (--cache-dir).
  int cache_hosts = 0;
  double gateway_poll_interval_s = 0.2;
  // Short: a request no replica can serve (an old exact version) gets its
  // 409 soon.
  double gateway_admission_wait_s = 5;
  std::chrono::milliseconds start_timeout = std::chrono::seconds(60);
  std::chrono::milliseconds poll_every = std::chrono::milliseconds(50);
};

// A replica as the status line shows it.
struct ReplicaView {
  std::string name;
  int64_t applied = -1;
  bool ready = false;
  // "starting", "catching up", "ready", "staging", "committing", ...,
  // "killed", "exited 3", "unreachable".
  std::string state;
};

class LocalFleet {
 public:
  using Clock = std::chrono::steady_clock;

  // Times are recorded in seconds since `epoch`. `cancel` (may be null) makes
  // blocking calls give up early. Starts the monitor thread.
  LocalFleet(ProcessSupervisor& supervisor, FleetOptions options, Clock::time_point epoch,
             const std::atomic<bool>* cancel);
  // Stops the monitor and waits for a background start.
  ~LocalFleet();
  LocalFleet(const LocalFleet&) = delete;
  LocalFleet& operator=(const LocalFleet&) = delete;

  // Starts the next replica ("r<k>"): its engine, then its sidecar, which
  // enters the pool file as soon as it listens (the gateway routes to it
  // once it reports ready, that is once it caught up with the store).
  // Blocks until the sidecar listens. `joined` marks a replica started while
  // training runs. Returns its name.
  [[nodiscard]] absl::StatusOr<std::string> StartReplica(bool joined);

  // StartReplica(true) on a background thread; its outcome through
  // BackgroundError(). One at a time.
  void StartReplicaInBackground();
  // The error of the last background start, if it failed.
  std::optional<absl::Status> BackgroundError();

  // Starts `stitch gateway` over the pool file and waits until it listens.
  [[nodiscard]] absl::Status StartGateway();
  std::string gateway_url() const;
  // The processes, for measuring them: the gateway's pid (-1 before
  // StartGateway) and every live (not killed) replica's sidecar pid.
  int gateway_pid() const;
  std::vector<int> sidecar_pids() const;
  std::filesystem::path pool_file() const;

  // Blocks until `count` replicas report ready and the gateway's /health
  // answers 200. DeadlineExceeded naming the laggards after
  // options.ready_timeout; FailedPrecondition as soon as the engine or the
  // sidecar of a replica that is not ready yet exits (CheckAlive).
  [[nodiscard]] absl::Status WaitReady(int count);

  // Blocks until the replica StartReplicaInBackground started reports ready;
  // its start's error, or as WaitReady, otherwise.
  [[nodiscard]] absl::Status WaitJoinedReady();

  // SIGKILLs the process groups of replica `name`'s sidecar and engine
  // (every process a templated engine started) and drops it from the pool
  // file, as a supervisor would once it saw the replica die.
  [[nodiscard]] absl::Status Kill(const std::string& name);

  // Blocks until every replica that is ready or catching up, and not killed,
  // applied `version`; false after `timeout`.
  bool WaitConverged(int64_t version, std::chrono::milliseconds timeout);

  std::vector<ReplicaView> Views();

  // The gateway's retried_total counter (0 when it cannot be read).
  int64_t GatewayRetries();

  // Stops the monitor and returns what it recorded, each replica's
  // final_applied set from its last poll.
  std::vector<DemoReplica> Finish();

 private:
  struct Member {
    DemoReplica record;
    int engine_pid = -1;
    int sidecar_pid = -1;
    std::filesystem::path engine_log;
    std::filesystem::path sidecar_log;
    bool listed = false;
    bool killed = false;
    std::optional<int64_t> applied;
    bool ready = false;
    std::string state = "starting";
  };

  double Now() const;
  Member* AddMember(bool joined);
  // Starts `member`'s engine; returns the URL its sidecar reaches it at.
  absl::StatusOr<std::string> StartEngine(Member& member, const std::string& name);
  absl::StatusOr<std::string> StartEngineCommand(Member& member, const std::string& name);
  // Starts `member`'s sidecar in front of `engine_url`; returns its URL once
  // it listens.
  absl::StatusOr<std::string> StartSidecar(Member& member, const std::string& name,
                                           const std::string& engine_url);
  // FailedPrecondition naming the first replica that is neither killed nor
  // ready and whose engine or sidecar exited.
  absl::Status CheckAlive();
  void MonitorLoop();
  absl::Status WritePoolFile() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ProcessSupervisor& supervisor_;
  const FleetOptions options_;
  const Clock::time_point epoch_;
  const std::atomic<bool>* cancel_;

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Member>> members_ ABSL_GUARDED_BY(mu_);
  std::string gateway_url_ ABSL_GUARDED_BY(mu_);
  int gateway_pid_ ABSL_GUARDED_BY(mu_) = -1;
  std::optional<absl::Status> background_error_ ABSL_GUARDED_BY(mu_);
  int next_index_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<int> engine_ports_ ABSL_GUARDED_BY(mu_);  // picked for templated engines

  std::atomic<bool> stop_monitor_{false};
  std::thread monitor_;
  std::thread background_;
};

}  // namespace stitch
