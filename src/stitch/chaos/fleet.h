// The chaos run's fleet on loopback: N reference engines with their
// sidecars (replica r0 stages in memory, r1 on disk, r2 through the sidecar
// as for a stock SGLang, and so on in turn: ReplicaMode), listed in a `file:`
// pool, a `stitch gateway` over it, and, for
// the S3 configuration, an S3 server (moto, tests/s3_moto.py) whose data
// survives its restarts. Every process can be killed, stopped and continued,
// and restarted on the port it had, so that clients and the pool keep their
// addresses.
//
// The fleet also acts as the supervisor a deployment would have: a process
// that exits while no fault holds it down (a sidecar ending itself after a
// terminal error, say) is restarted, and the restart is noted.
//
// Layout under the run directory: replicas.txt (the pool file),
// logs/<process>.<instance>.log, replicas/<name>/ (each sidecar's local
// checkpoint and cache), s3/ (the S3 server's recorded state).
//
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include "absl/synchronization/mutex.h"

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stitch/demo/supervisor.h"

namespace stitch {

struct ChaosFleetOptions {
  std::filesystem::path dir;  // the run directory
  std::string run_id;
  std::filesystem::path base_checkpoint;
  int replicas = 3;
  // The store the sidecars follow; with an S3 server, StartS3() sets it.
  std::string store_uri;
  // Extra arguments for every engine, sidecar and the gateway (tokens).
  std::vector<std::string> engine_args;
  std::vector<std::string> sidecar_args;
  std::vector<std::string> gateway_args;
  double reconcile_interval_s = 0.5;
  double gateway_poll_interval_s = 0.2;
  double gateway_admission_wait_s = 3;
  // The S3 server: the project's Python and tests/s3_moto.py.
  std::filesystem::path python;
  std::filesystem::path moto_script;
  std::chrono::milliseconds start_timeout = std::chrono::seconds(60);
  // Replica 0's engine is a real one when set: "vllm" or "sglang", started
  // by `real_engine_command` (a template, demo/engine_command.h, given
  // engine_args after it) instead of `stitch engine`, behind a sidecar that
  // talks to it as that engine ("vllm", or "sglang-stock") and stages
  // versions on disk for it. Its sidecar waits for it to load. Its TMPDIR
  // is engine-tmp/r0 under the run directory.
  std::string real_engine;
  std::string real_engine_command;
};

// Which process of the fleet.
enum class Role { kEngine, kSidecar, kGateway, kS3 };

// How replica `replica` stages versions: "cpu" (the engine stages in
// memory), "disk" (the engine stages into the local checkpoint) or "stock"
// (the sidecar stages with the delta codec, the engine loads from disk).
std::string ReplicaMode(int replica);

// A running process, for the resource sampler.
struct FleetProcess {
  std::string name;  // "engine r1", "sidecar r0", "gateway", "s3"
  int instance = 0;  // 0 for the first start, then 1, 2, ... per restart
  int pid = 0;
};

class ChaosFleet {
 public:
  // `cancel` (may be null) makes blocking calls give up early.
  ChaosFleet(ProcessSupervisor& supervisor, ChaosFleetOptions options,
             const std::atomic<bool>* cancel);
  // Stops the supervision thread (not the processes: the supervisor does).
  ~ChaosFleet();
  ChaosFleet(const ChaosFleet&) = delete;
  ChaosFleet& operator=(const ChaosFleet&) = delete;

  // Starts the S3 server on a free port and returns the store URI
  // ("s3://BUCKET/PREFIX?endpoint=..."), which the sidecars then follow.
  // Credentials are the caller's to set (the server checks none).
  [[nodiscard]] absl::StatusOr<std::string> StartS3(const std::string& prefix);

  // Starts the engines, the sidecars and the gateway, each once it listens,
  // then the supervision thread.
  [[nodiscard]] absl::Status Start();

  // kill -9, then wait until the process is gone. The supervision leaves it
  // down until Restart().
  [[nodiscard]] absl::Status Kill(Role role, int replica);
  // Starts it again on its port (retrying while the port is still taken),
  // waiting until it listens.
  [[nodiscard]] absl::Status Restart(Role role, int replica);
  // SIGSTOP / SIGCONT (the supervision leaves a stopped process alone).
  [[nodiscard]] absl::Status Pause(Role role, int replica);
  [[nodiscard]] absl::Status Continue(Role role, int replica);

  std::string gateway_url() const;
  std::string sidecar_url(int replica) const;
  std::string engine_url(int replica) const;
  std::string s3_endpoint() const;
  std::filesystem::path pool_file() const { return options_.dir / "replicas.txt"; }
  int replicas() const { return options_.replicas; }
  // How replica `replica` stages versions (ReplicaMode), or which real
  // engine it runs.
  std::string Mode(int replica) const;

  // The processes running now.
  std::vector<FleetProcess> Processes() const;
  // Every pid started so far (alive or not), and its process name.
  std::vector<FleetProcess> AllStarted() const;
  // Lines saying which processes the supervision restarted, and why.
  std::vector<std::string> Notes() const;

  // Blocks until every replica's /health is 200 and the gateway's too, or
  // `timeout`. DeadlineExceeded naming the laggards.
  [[nodiscard]] absl::Status WaitReady(std::chrono::milliseconds timeout);

 private:
  struct Proc {
    std::string name;
    Role role = Role::kEngine;
    int replica = -1;
    absl::Mutex op;  // one operation (kill, restart, ...) at a time
    int pid = -1;
    int port = 0;
    std::string url;
    int instance = -1;
    bool held_down = false;  // killed or stopped by a fault
  };

  Proc* Find(Role role, int replica) const;
  std::vector<std::string> Args(const Proc& p) const;
  // Starts `p` (its op held) on p.port (0: any) and waits for its URL.
  absl::Status Launch(Proc& p);
  // Starts the real engine (its op held) on p.port (0: one picked once);
  // its sidecar is the one that waits for it.
  absl::Status LaunchRealEngine(Proc& p);
  bool IsRealEngine(const Proc& p) const {
    return p.role == Role::kEngine && p.replica == 0 && !options_.real_engine.empty();
  }
  absl::Status WritePoolFile();
  void SuperviseLoop();
  // Restarts `p` when it exited and no fault holds it down. Its `op` is held.
  void RestartIfExited(Proc& p);
  double Now() const;

  ProcessSupervisor& supervisor_;
  const ChaosFleetOptions options_;
  const std::atomic<bool>* cancel_;
  const std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();

  std::vector<std::unique_ptr<Proc>> engines_;
  std::vector<std::unique_ptr<Proc>> sidecars_;
  std::unique_ptr<Proc> gateway_;
  std::unique_ptr<Proc> s3_;

  mutable absl::Mutex mu_;  // the fields of every Proc but `op`, and these
  std::vector<FleetProcess> started_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> notes_ ABSL_GUARDED_BY(mu_);
  std::string s3_state_ ABSL_GUARDED_BY(mu_);
  std::string store_uri_ ABSL_GUARDED_BY(mu_);

  std::atomic<bool> stop_{false};
  std::thread supervise_;
};

}  // namespace stitch
