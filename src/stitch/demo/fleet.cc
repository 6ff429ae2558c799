#include "stitch/demo/fleet.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "stitch/api/replica_client.h"
#include "stitch/core/state.h"
#include "stitch/demo/engine_command.h"
#include "stitch/io/fileio.h"
#include "stitch/net/client.h"
#include "stitch/net/prometheus.h"

namespace stitch {
namespace {

constexpr auto kProbeTimeout = std::chrono::seconds(1);

std::optional<ReplicaState> Probe(const std::string& url) {
  ReplicaCallOptions options;
  options.timeout = kProbeTimeout;
  std::vector<absl::StatusOr<ReplicaState>> state = ReadServerInfos({url}, options);
  if (!state[0].ok()) return std::nullopt;
  return *std::move(state[0]);
}

std::string StateText(const ReplicaState& s) {
  if (!s.terminal_error.empty()) return "error";
  if (!s.ready) return "catching up";
  if (s.sync_state == SyncState::kIdle) return "ready";
  std::string name(SyncStateName(s.sync_state));
  absl::AsciiStrToLower(&name);
  return name;
}

std::optional<double> Metric(const ReplicaState& s, const std::string& key) {
  auto it = s.metrics.find(key);
  if (it == s.metrics.end()) return std::nullopt;
  return it->second;
}

}  // namespace

std::vector<std::string> EngineArgs(const std::filesystem::path& model, const std::string& run_id,
                                    int port) {
  return {"engine",           "--model",  model.string(), "--host",           "127.0.0.1", "--port",
          absl::StrCat(port), "--run-id", run_id,         "--worker-threads", "1"};
}

std::vector<std::string> SidecarArgs(const SidecarLaunch& launch) {
  std::vector<std::string> args = {"sidecar",
                                   "--store",
                                   launch.store,
                                   "--run-id",
                                   launch.run_id,
                                   "--engine",
                                   launch.engine,
                                   "--engine-url",
                                   launch.engine_url,
                                   "--base-checkpoint",
                                   launch.base_checkpoint.string(),
                                   "--update-mode",
                                   launch.update_mode,
                                   "--local-checkpoint",
                                   launch.local_checkpoint.string(),
                                   "--reconcile-interval",
                                   absl::StrCat(launch.reconcile_interval_s),
                                   "--watchdog-interval",
                                   absl::StrCat(launch.watchdog_interval_s),
                                   "--host",
                                   "127.0.0.1",
                                   "--port",
                                   absl::StrCat(launch.port)};
  args.insert(args.end(), launch.extra.begin(), launch.extra.end());
  return args;
}

std::vector<std::string> GatewayArgs(const std::string& pool_spec, int port, double poll_interval_s,
                                     double admission_wait_s) {
  return {"gateway",
          "--pool",
          pool_spec,
          "--host",
          "127.0.0.1",
          "--port",
          absl::StrCat(port),
          "--poll-interval",
          absl::StrCat(poll_interval_s),
          "--admission-wait",
          absl::StrCat(admission_wait_s)};
}

LocalFleet::LocalFleet(ProcessSupervisor& supervisor, FleetOptions options, Clock::time_point epoch,
                       const std::atomic<bool>* cancel)
    : supervisor_(supervisor), options_(std::move(options)), epoch_(epoch), cancel_(cancel) {
  {
    absl::MutexLock lock(&mu_);
    // The gateway starts on an empty pool rather than a missing file.
    (void)WritePoolFile();
  }
  monitor_ = std::thread([this] { MonitorLoop(); });
}

LocalFleet::~LocalFleet() { Finish(); }

double LocalFleet::Now() const {
  return std::chrono::duration<double>(Clock::now() - epoch_).count();
}

std::filesystem::path LocalFleet::pool_file() const { return options_.dir / "replicas.txt"; }

std::string LocalFleet::gateway_url() const {
  absl::MutexLock lock(&mu_);
  return gateway_url_;
}

absl::Status LocalFleet::WritePoolFile() {
  // Replaced atomically, so that the gateway never reads half a list.
  std::string text = "# written by stitch demo: the replicas the gateway routes over\n";
  for (const auto& m : members_) {
    if (m->listed && !m->killed) absl::StrAppend(&text, m->record.url, "\n");
  }
  return WriteFileAtomically(pool_file(), text);
}

LocalFleet::Member* LocalFleet::AddMember(bool joined) {
  absl::MutexLock lock(&mu_);
  auto m = std::make_unique<Member>();
  m->record.name = absl::StrCat("r", next_index_++);
  m->record.started_at = Now();
  m->record.joined = joined;
  const std::filesystem::path logs = options_.dir / "logs";
  m->engine_log = logs / absl::StrCat("engine-", m->record.name, ".log");
  m->sidecar_log = logs / absl::StrCat("sidecar-", m->record.name, ".log");
  members_.push_back(std::move(m));
  return members_.back().get();
}

absl::StatusOr<std::string> LocalFleet::StartReplica(bool joined) {
  Member* member = AddMember(joined);
  std::string name;
  {
    absl::MutexLock lock(&mu_);
    name = member->record.name;
  }
  auto fail = [&](absl::Status status) {
    absl::MutexLock lock(&mu_);
    member->state = "failed";
    return status;
  };
  std::error_code ec;
  std::filesystem::create_directories(options_.dir / "replicas" / name, ec);
  std::filesystem::create_directories(options_.dir / "logs", ec);
  auto engine_url = StartEngine(*member, name);
  if (!engine_url.ok()) return fail(engine_url.status());
  auto url = StartSidecar(*member, name, *engine_url);
  if (!url.ok()) return fail(url.status());
  absl::MutexLock lock(&mu_);
  member->record.url = *url;
  member->listed = true;
  member->state = "catching up";
  if (absl::Status s = WritePoolFile(); !s.ok()) return s;
  return name;
}

absl::StatusOr<std::string> LocalFleet::StartEngine(Member& member, const std::string& name) {
  if (!options_.engine_command.empty()) return StartEngineCommand(member, name);
  std::vector<std::string> args = EngineArgs(options_.base_checkpoint, options_.run_id, /*port=*/0);
  args.push_back("--api");
  args.push_back(std::string(EngineApiName(options_.api)));
  auto engine = supervisor_.Start(absl::StrCat("engine ", name), args, member.engine_log);
  if (!engine.ok()) return engine.status();
  {
    absl::MutexLock lock(&mu_);
    member.engine_pid = *engine;
  }
  return supervisor_.WaitForUrl(*engine, options_.start_timeout, cancel_);
}

absl::StatusOr<std::string> LocalFleet::StartEngineCommand(Member& member,
                                                           const std::string& name) {
  EngineCommandValues values;
  values.model = options_.base_checkpoint.string();
  values.name = name;
  values.dir = (options_.dir / "replicas" / name).string();
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<int> port = PickEnginePort(engine_ports_);
    if (!port.ok()) return port.status();
    engine_ports_.insert(*port);
    values.port = *port;
  }
  absl::StatusOr<std::string> command = ExpandEngineCommand(options_.engine_command, values);
  if (!command.ok()) return command.status();
  auto engine = supervisor_.StartProgram(absl::StrCat("engine ", name), "/bin/sh", {"-c", *command},
                                         member.engine_log);
  if (!engine.ok()) return engine.status();
  absl::MutexLock lock(&mu_);
  member.engine_pid = *engine;
  // The sidecar waits for the engine to answer there.
  return absl::StrCat("http://", values.host, ":", values.port);
}

absl::StatusOr<std::string> LocalFleet::StartSidecar(Member& member, const std::string& name,
                                                     const std::string& engine_url) {
  SidecarLaunch launch;
  launch.store = options_.store;
  launch.run_id = options_.run_id;
  launch.engine_url = engine_url;
  launch.base_checkpoint = options_.base_checkpoint;
  launch.local_checkpoint = options_.dir / "replicas" / name / "local";
  launch.reconcile_interval_s = options_.reconcile_interval_s;
  // vLLM loads versions only from disk: the sidecar stages them.
  if (options_.api == EngineApi::kVllm) {
    launch.engine = "vllm";
    launch.update_mode = "disk";
  }
  if (!options_.engine_command.empty()) {
    launch.extra = {"--engine-start-timeout",
                    absl::StrCat(std::chrono::duration<double>(options_.ready_timeout).count())};
    // A real vLLM started with Stitch's worker extension commits sparse
    // versions in place; without it, the sidecar falls back to reloads.
    if (options_.api == EngineApi::kVllm) launch.extra.push_back("--patch-commits");
  }
  launch.extra.insert(launch.extra.end(), options_.sidecar_extra.begin(),
                      options_.sidecar_extra.end());
  int index = 0;
  if (options_.cache_hosts > 0 && absl::SimpleAtoi(name.substr(1), &index)) {
    launch.extra.push_back("--cache-dir");
    launch.extra.push_back(
        (options_.dir / "hosts" / absl::StrCat("h", index % options_.cache_hosts)).string());
  }
  auto sidecar =
      supervisor_.Start(absl::StrCat("sidecar ", name), SidecarArgs(launch), member.sidecar_log);
  if (!sidecar.ok()) return sidecar.status();
  {
    absl::MutexLock lock(&mu_);
    member.sidecar_pid = *sidecar;
  }
  return supervisor_.WaitForUrl(*sidecar, options_.start_timeout, cancel_);
}

void LocalFleet::StartReplicaInBackground() {
  if (background_.joinable()) background_.join();
  background_ = std::thread([this] {
    auto started = StartReplica(true);
    if (!started.ok()) {
      absl::MutexLock lock(&mu_);
      background_error_ = started.status();
    }
  });
}

std::optional<absl::Status> LocalFleet::BackgroundError() {
  absl::MutexLock lock(&mu_);
  return background_error_;
}

absl::Status LocalFleet::StartGateway() {
  const std::filesystem::path logs = options_.dir / "logs";
  std::error_code ec;
  std::filesystem::create_directories(logs, ec);
  auto pid = supervisor_.Start(
      "gateway",
      GatewayArgs(absl::StrCat("file:", pool_file().string()), /*port=*/0,
                  options_.gateway_poll_interval_s, options_.gateway_admission_wait_s),
      logs / "gateway.log");
  if (!pid.ok()) return pid.status();
  auto url = supervisor_.WaitForUrl(*pid, options_.start_timeout, cancel_);
  if (!url.ok()) return url.status();
  absl::MutexLock lock(&mu_);
  gateway_url_ = *url;
  gateway_pid_ = *pid;
  return absl::OkStatus();
}

int LocalFleet::gateway_pid() const {
  absl::MutexLock lock(&mu_);
  return gateway_pid_;
}

std::vector<int> LocalFleet::sidecar_pids() const {
  absl::MutexLock lock(&mu_);
  std::vector<int> pids;
  for (const auto& m : members_) {
    if (!m->killed && m->sidecar_pid > 0) pids.push_back(m->sidecar_pid);
  }
  return pids;
}

absl::Status LocalFleet::CheckAlive() {
  struct Watched {
    std::string name;
    std::string what;
    int pid;
    std::filesystem::path log;
  };
  std::vector<Watched> watched;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& m : members_) {
      if (m->killed || m->ready) continue;
      watched.push_back({m->record.name, "engine", m->engine_pid, m->engine_log});
      watched.push_back({m->record.name, "sidecar", m->sidecar_pid, m->sidecar_log});
    }
  }
  for (const Watched& w : watched) {
    if (w.pid < 0) continue;
    if (std::optional<int> status = supervisor_.ExitStatus(w.pid); status.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat("demo: replica ", w.name, "'s ", w.what, " ended (status ", *status,
                       ") before the replica was ready; see ", w.log.string()));
    }
  }
  return absl::OkStatus();
}

absl::Status LocalFleet::WaitReady(int count) {
  const auto deadline = Clock::now() + options_.ready_timeout;
  for (;;) {
    int ready = 0;
    std::string laggards;
    std::string gateway;
    {
      absl::MutexLock lock(&mu_);
      gateway = gateway_url_;
      for (const auto& m : members_) {
        if (m->killed) continue;
        if (m->ready) {
          ++ready;
        } else {
          absl::StrAppend(&laggards, laggards.empty() ? "" : ", ", m->record.name, " ", m->state);
        }
      }
    }
    bool gateway_ok = gateway.empty();
    if (!gateway_ok) {
      FetchOptions options;
      options.timeout = kProbeTimeout;
      auto health = HttpFetch("GET", gateway + "/health", {}, options);
      gateway_ok = health.ok() && health->status == 200;
    }
    if (ready >= count && gateway_ok) return absl::OkStatus();
    if (absl::Status s = CheckAlive(); !s.ok()) return s;
    if (cancel_ != nullptr && cancel_->load()) return absl::CancelledError("demo: interrupted");
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "demo: ", ready, " of ", count, " replicas ready after ",
          std::chrono::duration_cast<std::chrono::seconds>(options_.ready_timeout).count(), " s (",
          laggards, gateway_ok ? "" : "; gateway not healthy", "); see the logs in ",
          (options_.dir / "logs").string()));
    }
    std::this_thread::sleep_for(options_.poll_every);
  }
}

absl::Status LocalFleet::WaitJoinedReady() {
  const auto deadline = Clock::now() + options_.ready_timeout;
  for (;;) {
    if (std::optional<absl::Status> e = BackgroundError(); e.has_value()) return *e;
    std::string state = "not started";
    bool ready = false;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& m : members_) {
        if (!m->record.joined || m->killed) continue;
        state = m->state;
        ready = m->ready;
      }
    }
    if (ready) return absl::OkStatus();
    if (absl::Status s = CheckAlive(); !s.ok()) return s;
    if (cancel_ != nullptr && cancel_->load()) return absl::CancelledError("demo: interrupted");
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "demo: the joining replica is not ready after ",
          std::chrono::duration_cast<std::chrono::seconds>(options_.ready_timeout).count(), " s (",
          state, "); see the logs in ", (options_.dir / "logs").string()));
    }
    std::this_thread::sleep_for(options_.poll_every);
  }
}

absl::Status LocalFleet::Kill(const std::string& name) {
  int engine = -1;
  int sidecar = -1;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& m : members_) {
      if (m->record.name != name || m->killed) continue;
      engine = m->engine_pid;
      sidecar = m->sidecar_pid;
      m->killed = true;
      m->record.killed_at = Now();
      m->state = "killed";
      m->ready = false;
    }
  }
  if (sidecar < 0) return absl::NotFoundError(absl::StrCat("demo: no live replica ", name));
  supervisor_.Signal(sidecar, SIGKILL);
  if (engine > 0) supervisor_.Signal(engine, SIGKILL);
  absl::MutexLock lock(&mu_);
  return WritePoolFile();
}

bool LocalFleet::WaitConverged(int64_t version, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    bool done = true;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& m : members_) {
        if (m->killed || m->state == "failed" || m->state.starts_with("exited")) continue;
        done &= m->applied.has_value() && *m->applied >= version;
      }
    }
    if (done) return true;
    if (Clock::now() >= deadline || (cancel_ != nullptr && cancel_->load())) return false;
    std::this_thread::sleep_for(options_.poll_every);
  }
}

std::vector<ReplicaView> LocalFleet::Views() {
  absl::MutexLock lock(&mu_);
  std::vector<ReplicaView> out;
  for (const auto& m : members_) {
    out.push_back({m->record.name, m->applied.value_or(-1), m->ready, m->state});
  }
  return out;
}

int64_t LocalFleet::GatewayRetries() {
  const std::string gateway = gateway_url();
  if (gateway.empty()) return 0;
  FetchOptions options;
  options.timeout = kProbeTimeout;
  auto metrics = HttpFetch("GET", gateway + "/metrics", {}, options);
  if (!metrics.ok() || metrics->status != 200) return 0;
  const std::optional<double> retried =
      PrometheusSum(metrics->body, "stitch_gateway_retried_total");
  return static_cast<int64_t>(retried.value_or(0));
}

void LocalFleet::MonitorLoop() {
  while (!stop_monitor_.load()) {
    std::vector<std::pair<Member*, std::string>> targets;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& m : members_) {
        if (m->killed || m->record.url.empty()) continue;
        targets.emplace_back(m.get(), m->record.url);
      }
    }
    for (auto& [member, url] : targets) {
      std::optional<ReplicaState> state = Probe(url);
      std::optional<int> exited =
          state.has_value() ? std::nullopt : supervisor_.ExitStatus(member->sidecar_pid);
      const double now = Now();
      absl::MutexLock lock(&mu_);
      Member& m = *member;
      if (m.killed) continue;
      if (!state.has_value()) {
        m.ready = false;
        m.state = exited.has_value() ? absl::StrCat("exited ", *exited) : "unreachable";
        continue;
      }
      const int64_t applied = state->applied.has_value() ? state->applied->version : -1;
      if (m.applied.has_value() && *m.applied >= 0 && applied > *m.applied &&
          Metric(*state, "skipped_weight_update").value_or(1) == 0) {
        if (auto stage = Metric(*state, "stage_s")) m.record.stage_s.push_back(*stage);
        if (auto commit = Metric(*state, "commit_s")) m.record.commit_s.push_back(*commit);
      }
      if (!m.applied.has_value() || applied != *m.applied || state->ready != m.ready) {
        m.record.timeline.push_back({now, applied, state->ready});
      }
      m.applied = applied;
      m.ready = state->ready;
      m.state = StateText(*state);
    }
    std::this_thread::sleep_for(options_.poll_every);
  }
}

std::vector<DemoReplica> LocalFleet::Finish() {
  stop_monitor_.store(true);
  if (monitor_.joinable()) monitor_.join();
  if (background_.joinable()) background_.join();
  absl::MutexLock lock(&mu_);
  std::vector<DemoReplica> out;
  for (const auto& m : members_) {
    DemoReplica r = m->record;
    if (m->applied.has_value()) r.final_applied = *m->applied;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace stitch
