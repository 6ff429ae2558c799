// Over ~600 lines on purpose: one run's life (set up, load, faults on a
// schedule, convergence, finish) shares the Run's state; what a run leaves
// behind is leftovers.cc's.

#include "stitch/chaos/chaos.h"
#include "stitch/api/replica_client.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stitch/chaos/checker.h"
#include "stitch/chaos/client.h"
#include "stitch/chaos/faults.h"
#include "stitch/chaos/fleet.h"
#include "stitch/chaos/history.h"
#include "stitch/chaos/judge.h"
#include "stitch/chaos/leftovers.h"
#include "stitch/chaos/oracle.h"
#include "stitch/chaos/resources.h"
#include "stitch/chaos/schedule.h"
#include "stitch/chaos/trainer.h"
#include "stitch/core/state.h"
#include "stitch/demo/supervisor.h"
#include "stitch/fetch/open_store.h"
#include "stitch/net/auth.h"
#include "stitch/net/client.h"
#include "stitch/net/prometheus.h"
#include "stitch/publish/claim.h"
#include "stitch/refengine/init_model.h"
#include "stitch/refengine/tokenizer.h"
#include "stitch/store/store.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kExitFailed = 1;
constexpr int kExitInterrupted = 130;
constexpr const char* kRunId = "chaos";
constexpr int kTmpfsMegabytes = 512;
constexpr auto kReadyTimeout = std::chrono::seconds(90);
constexpr auto kConvergeTimeout = std::chrono::seconds(90);
constexpr auto kDrainTimeout = std::chrono::seconds(20);
constexpr auto kStopGrace = std::chrono::seconds(15);
constexpr auto kProbeTimeout = std::chrono::seconds(5);

// The prompts every request continues; their greedy answers differ between
// any two versions (oracle.h).
constexpr const char* kPrompts[] = {"Once upon a time", "The trainer said:", "GET /generate",
                                    "Dear reviewer,",   "42 + 17 =",         "fn main() {"};

bool RealEngine(const ChaosOptions& options) { return options.engine != "reference"; }

// The run's timeouts for starting and converging: a real engine loads for a
// minute or more, on every restart.
std::chrono::seconds ReadyTimeout(const ChaosOptions& options) {
  return RealEngine(options) ? std::chrono::seconds(900) : kReadyTimeout;
}
std::chrono::seconds ConvergeTimeout(const ChaosOptions& options) {
  return RealEngine(options) ? std::chrono::seconds(600) : kConvergeTimeout;
}

void Say(const std::string& line) { std::cout << "chaos: " << line << std::endl; }

absl::StatusOr<fs::path> PrepareDir(const std::string& requested) {
  if (requested.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    const fs::path base = tmp != nullptr && *tmp != '\0' ? fs::path(tmp) : fs::path("/tmp");
    std::string pattern = (base / "stitch-chaos-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("chaos: cannot create a directory under ",
                                              base.string(), "; give one with --dir"));
    }
    return fs::path(pattern);
  }
  std::error_code ec;
  fs::path dir = fs::absolute(requested, ec);
  fs::create_directories(dir, ec);
  if (ec || !fs::is_empty(dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chaos: --dir ", requested, " must be a new or empty directory"));
  }
  return dir;
}

ScheduleOptions ScheduleFor(const ChaosOptions& options, std::vector<FaultKind> kinds) {
  ScheduleOptions s;
  s.duration_s = options.minutes * 60;
  s.replicas = options.replicas;
  s.kinds = std::move(kinds);
  if (s.duration_s < 180) {
    s.warmup_s = 4;
    s.cooldown_s = 8;
    s.mean_gap_s = 5;
    s.min_duration_s = 1.5;
    s.max_duration_s = 5;
  } else {
    s.warmup_s = 10;
    s.cooldown_s = 20;
    s.mean_gap_s = 12;
    s.min_duration_s = 2;
    s.max_duration_s = 10;
  }
  return s;
}

// A random token, as hex.
std::string NewToken() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

FetchOptions WithToken(const std::string& token) {
  FetchOptions o;
  o.timeout = kProbeTimeout;
  if (!token.empty()) o.headers.Set("Authorization", BearerValue(token));
  return o;
}

std::optional<ReplicaState> ServerInfo(const std::string& url, const std::string& token) {
  ReplicaCallOptions options;
  options.timeout = kProbeTimeout;
  options.bearer_token = token;
  std::vector<absl::StatusOr<ReplicaState>> state = ReadServerInfos({url}, options);
  if (!state[0].ok()) return std::nullopt;
  return *std::move(state[0]);
}

// The engine's running and queued requests, or -1 when it cannot be read.
int64_t EngineBusy(const std::string& url, const std::string& api_key) {
  FetchOptions o = WithToken(api_key);
  auto response = HttpFetch("GET", url + "/server_info", {}, o);
  if (!response.ok() || response->status != 200) return -1;
  int64_t total = 0;
  for (const char* field : {"\"num_running_requests\":", "\"num_queued_requests\":"}) {
    const size_t at = response->body.find(field);
    if (at == std::string::npos) return -1;
    int64_t n = 0;
    size_t end = at + std::strlen(field);
    while (end < response->body.size() && std::isdigit(response->body[end])) ++end;
    if (!absl::SimpleAtoi(
            response->body.substr(at + std::strlen(field), end - at - std::strlen(field)), &n)) {
      return -1;
    }
    total += n;
  }
  return total;
}

// The sum of the samples of the gauges `names` in an engine's /metrics
// (a real engine's running and queued requests); -1 when unreadable or one
// is missing.
int64_t EngineBusyFromMetrics(const std::string& url, const std::string& api_key,
                              std::initializer_list<std::string_view> names) {
  FetchOptions o = WithToken(api_key);
  auto response = HttpFetch("GET", url + "/metrics", {}, o);
  if (!response.ok() || response->status != 200) return -1;
  double total = 0;
  for (std::string_view name : names) {
    std::optional<double> samples = PrometheusSum(response->body, name);
    if (!samples.has_value()) return -1;
    total += *samples;
  }
  return static_cast<int64_t>(total);
}

class Run {
 public:
  Run(const ChaosOptions& options, const std::atomic<bool>& stop)
      : options_(options),
        stop_(stop),
        supervisor_("/proc/self/exe", "chaos"),
        oracle_(MakeOracleOptions(options)) {}

  int Go();

 private:
  static OracleOptions MakeOracleOptions(const ChaosOptions& options) {
    OracleOptions o;
    o.config = ChaosModel(RealEngine(options));
    o.seed = options.seed;
    for (const char* p : kPrompts) o.prompts.push_back(EncodeText(p, BosMode::kPrepend));
    return o;
  }
  double Now() const { return std::chrono::duration<double>(Clock::now() - epoch_).count(); }
  absl::Status SetUp();
  // The fleet's options; writes its token files and picks the filesystem
  // store's place.
  ChaosFleetOptions FleetOptions();
  // Starts the S3 server or mounts the filesystem store's tmpfs; adds the
  // store's fault kinds to `kinds` and notes the ones left out.
  absl::Status PrepareStore(std::vector<FaultKind>& kinds);
  absl::Status Load();
  EndEntry Finish();
  // The steps of Finish, each filling its part of `end`.
  void AwaitConvergence(EndEntry& end);
  void AwaitDrain(EndEntry& end);
  void StopEverything(EndEntry& end);
  std::vector<std::string> TempLeftBehind();
  int Report(EndEntry end);

  const ChaosOptions& options_;
  const std::atomic<bool>& stop_;
  const Clock::time_point epoch_ = Clock::now();
  ProcessSupervisor supervisor_;
  Oracle oracle_;
  fs::path dir_;
  // The fleet runs closed: the sidecars and the gateway with a token on
  // every route but /health and /metrics, the engines with an API key.
  std::string token_ = NewToken();
  std::string engine_key_ = NewToken();
  fs::path store_root_;   // filesystem configuration
  fs::path store_mount_;  // the directory holding it (a tmpfs when mounted)
  bool store_mounted_ = true;
  std::string store_uri_;
  std::unique_ptr<Store> store_;  // the harness's own view
  std::unique_ptr<HistoryWriter> history_;
  RunEntry run_;
  std::unique_ptr<ChaosFleet> fleet_;
  std::unique_ptr<PointerWatcher> watcher_;
  std::unique_ptr<ChaosTrainer> trainer_;
  std::unique_ptr<ExternalJudge> judge_;  // with a real engine
  std::unique_ptr<RolloutLoad> load_;
  std::unique_ptr<ResourceSampler> sampler_;
  std::unique_ptr<FaultInjector> injector_;
};

ChaosFleetOptions Run::FleetOptions() {
  const fs::path token_file = dir_ / "fleet.token";
  const fs::path engine_token_file = dir_ / "engine.token";
  std::ofstream(token_file) << token_ << "\n";
  std::ofstream(engine_token_file) << engine_key_ << "\n";
  ChaosFleetOptions fleet;
  fleet.engine_args = {"--api-key", engine_key_};
  fleet.sidecar_args = {"--auth-token-file", token_file.string(), "--auth-data-plane",
                        "--engine-token-file", engine_token_file.string()};
  fleet.gateway_args = {"--auth-token-file", token_file.string(), "--auth-data-plane"};
  fleet.dir = dir_;
  fleet.run_id = kRunId;
  fleet.base_checkpoint = dir_ / "base";
  fleet.replicas = options_.replicas;
  fleet.python = options_.python;
  fleet.moto_script = options_.moto_script;
  if (RealEngine(options_)) {
    fleet.real_engine = options_.engine;
    fleet.real_engine_command = options_.engine_command;
  }
  if (options_.store != "s3") {
    store_mount_ = dir_ / "storefs";
    store_root_ = store_mount_ / "store";
    store_uri_ = store_root_.string();
    fleet.store_uri = store_uri_;
  }
  return fleet;
}

absl::Status Run::PrepareStore(std::vector<FaultKind>& kinds) {
  if (options_.store == "s3") {
    ::setenv("AWS_ACCESS_KEY_ID", "chaos", 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", "chaos", 1);
    ::setenv("AWS_REGION", "us-east-1", 1);
    ::unsetenv("AWS_SESSION_TOKEN");
    kinds.push_back(FaultKind::kS3Kill);
    kinds.push_back(FaultKind::kS3Stall);
    run_.left_out.push_back(
        "store_unreadable: an S3 store is unreadable while its server is down (s3_kill)");
    run_.left_out.push_back(
        "store_full: the S3 server keeps objects in memory; the filesystem configuration fills "
        "a tmpfs");
    auto uri = fleet_->StartS3("chaos");
    if (!uri.ok()) return uri.status();
    store_uri_ = *uri;
    return absl::OkStatus();
  }
  kinds.push_back(FaultKind::kStoreUnreadable);
  run_.left_out.push_back(
      "s3_kill, s3_stall: S3 server faults run in the S3 configuration (CHAOS_STORE=s3)");
  run_.left_out.push_back(
      "slow store: a local file system has no delay to inject without a delay device; the "
      "S3 configuration's s3_stall is the slow store");
  if (absl::Status mounted = MountTmpfs(store_mount_, kTmpfsMegabytes); mounted.ok()) {
    kinds.push_back(FaultKind::kStoreFull);
  } else {
    run_.left_out.push_back(absl::StrCat("store_full: ", mounted.message()));
    store_mounted_ = false;
  }
  return absl::OkStatus();
}

absl::Status Run::SetUp() {
  auto dir = PrepareDir(options_.dir);
  if (!dir.ok()) return dir.status();
  dir_ = *dir;
  Say(absl::StrCat(
      "seed ", options_.seed, ", ", options_.minutes, " min, ", options_.store, " store, ",
      options_.replicas, " replicas",
      RealEngine(options_) ? absl::StrCat(" (r0 on a real ", options_.engine, ")") : std::string(),
      "; run directory ", dir_.string()));
  // Orphans of the run (a server's child whose parent was killed) come back
  // here, so that the end can tell whether any is left.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  // Every process of the run keeps its temporary files where the end can
  // see them.
  std::error_code ec;
  fs::create_directories(dir_ / "tmp", ec);
  ::setenv("TMPDIR", (dir_ / "tmp").c_str(), 1);

  std::vector<FaultKind> kinds = {FaultKind::kEngineKill,    FaultKind::kEngineStop,
                                  FaultKind::kSidecarKill,   FaultKind::kGatewayKill,
                                  FaultKind::kPublisherKill, FaultKind::kClientDisconnect,
                                  FaultKind::kStoreGc};
  fleet_ = std::make_unique<ChaosFleet>(supervisor_, FleetOptions(), &stop_);
  if (absl::Status s = PrepareStore(kinds); !s.ok()) return s;
  for (const std::string& line : run_.left_out) Say(absl::StrCat("left out: ", line));

  run_.seed = options_.seed;
  run_.minutes = options_.minutes;
  run_.store = options_.store;
  run_.replicas = options_.replicas;
  run_.dir = dir_.string();
  run_.replay = ReplayCommand(options_);
  run_.schedule = MakeSchedule(options_.seed, ScheduleFor(options_, kinds));
  Say(absl::StrCat("fault schedule (seconds after the load starts):\n",
                   FormatSchedule(run_.schedule)));

  auto history = HistoryWriter::Open(dir_ / "history.jsonl");
  if (!history.ok()) return history.status();
  history_ = *std::move(history);
  history_->Write(run_);

  const std::vector<HostTensor> base = oracle_.Tensors(0);
  std::vector<TensorView> views;
  for (const HostTensor& t : base) views.push_back(t.view());
  if (absl::Status s =
          WriteCheckpoint(dir_ / "base", oracle_.options().config, views, ExistingDir::kRefuse);
      !s.ok()) {
    return s;
  }
  if (RealEngine(options_)) {
    fs::create_directories(dir_ / "logs", ec);
    JudgeProcessOptions judge;
    judge.python = options_.judge_python;
    judge.script = options_.judge_script;
    judge.base_checkpoint = dir_ / "base";
    judge.heads_dir = dir_ / "judge";
    judge.log = dir_ / "logs" / "judge.log";
    judge.tmp_dir = dir_ / "engine-tmp" / "judge";
    auto started = ExternalJudge::Start(judge, oracle_);
    if (!started.ok()) return started.status();
    judge_ = *std::move(started);
  }
  auto store = OpenStore(store_uri_, StoreOptions{kRunId, dir_ / "harness-cache"});
  if (!store.ok()) return store.status();
  store_ = *std::move(store);
  auto claimed = ClaimRun(*store_, 0, nullptr);
  if (!claimed.ok()) return claimed.status();
  return absl::OkStatus();
}

absl::Status Run::Load() {
  if (absl::Status s = fleet_->Start(); !s.ok()) return s;
  if (absl::Status s = fleet_->WaitReady(ReadyTimeout(options_)); !s.ok()) return s;
  std::string modes;
  for (int r = 0; r < options_.replicas; ++r) {
    absl::StrAppend(&modes, r == 0 ? "" : ", ", "r", r, " ", fleet_->Mode(r));
  }
  Say(absl::StrFormat("fleet ready after %.1f s: gateway %s, replicas staging %s", Now(),
                      fleet_->gateway_url(), modes));

  auto now = [this] { return Now(); };
  watcher_ = std::make_unique<PointerWatcher>(*store_, oracle_, dir_ / "base", *history_, now);
  watcher_->Start();
  const bool short_run = options_.minutes * 60 < 180;
  ChaosTrainerOptions trainer;
  trainer.work_dir = dir_ / "publish";
  trainer.logs_dir = dir_ / "logs";
  trainer.store_uri = store_uri_;
  trainer.run_id = kRunId;
  trainer.pool_spec = absl::StrCat("file:", fleet_->pool_file().string());
  trainer.interval_s = short_run ? 1.5 : 3;
  trainer.publish_args = {"--auth-token-file", (dir_ / "fleet.token").string()};
  trainer_ = std::make_unique<ChaosTrainer>(supervisor_, oracle_, *store_, *history_, trainer, now);

  RolloutLoadOptions load;
  load.seed = options_.seed;
  load.replicas = options_.replicas;
  load.auth_token = token_;
  if (options_.engine == "vllm") {
    load.route = "completions";
    load.return_token_ids = true;
  } else if (options_.engine == "sglang") {
    load.route = "generate";
  }
  RolloutLoad::Targets targets;
  ChaosFleet* fleet = fleet_.get();
  PointerWatcher* watcher = watcher_.get();
  targets.gateway = [fleet] { return fleet->gateway_url(); };
  targets.sidecar = [fleet](int r) { return fleet->sidecar_url(r); };
  targets.pointer = [watcher] { return watcher->latest(); };
  targets.now = now;
  targets.judge = judge_.get();
  targets.judged_replica = 0;
  load_ = std::make_unique<RolloutLoad>(load, oracle_, *history_, targets);

  sampler_ = std::make_unique<ResourceSampler>(
      *fleet_, *history_, now,
      short_run ? std::chrono::milliseconds(2000) : std::chrono::milliseconds(10000));

  InjectorTargets faults;
  faults.fleet = fleet_.get();
  faults.trainer = trainer_.get();
  faults.load = load_.get();
  faults.store_root = store_root_;
  faults.store = store_.get();
  if (store_mounted_) faults.store_mount = store_mount_;
  const double origin = Now();
  injector_ = std::make_unique<FaultInjector>(run_.schedule, faults, *history_, now, origin);

  trainer_->Start();
  load_->Start();
  sampler_->Start();
  injector_->Start();
  const double duration = options_.minutes * 60;
  double next_line = origin + 10;
  while (Now() < origin + duration) {
    if (stop_.load()) return absl::CancelledError("chaos: interrupted");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (Now() >= next_line) {
      next_line += short_run ? 10 : 60;
      Say(absl::StrFormat("%.0f s of %.0f: %d requests sent, pointer v%d", Now() - origin, duration,
                          load_->sent(), watcher_->latest()));
    }
  }
  injector_->Join();
  trainer_->Stop();
  load_->StopLoad();
  return absl::OkStatus();
}

void Run::AwaitConvergence(EndEntry& end) {
  // Converged: every sidecar ready at the final pointer and the gateway
  // answering min_version = that pointer.
  const auto deadline = Clock::now() + ConvergeTimeout(options_);
  std::string why = "not checked";
  while (fleet_ != nullptr && store_ != nullptr) {
    int64_t pointer = -1;
    if (auto p = store_->ReadPointer(); p.ok() && p->has_value()) pointer = (*p)->version;
    end.final_pointer = pointer;
    why.clear();
    for (int r = 0; r < options_.replicas; ++r) {
      std::optional<ReplicaState> s = ServerInfo(fleet_->sidecar_url(r), token_);
      if (!s.has_value()) {
        absl::StrAppend(&why, "r", r, " does not answer; ");
      } else if (!s->ready || !s->applied.has_value() || s->applied->version != pointer) {
        absl::StrAppend(&why, "r", r, " is ", s->ready ? "ready" : "not ready", " at ",
                        s->applied.has_value() ? s->applied->ToString() : "nothing", " (",
                        s->reason, "); ");
      }
    }
    if (why.empty()) {
      FetchOptions o = WithToken(token_);
      // In the one API every replica serves.
      auto answer =
          options_.engine == "vllm"
              ? HttpFetch("POST", fleet_->gateway_url() + "/v1/completions",
                          absl::StrCat(R"({"prompt":[256,72],"max_tokens":1,"temperature":0,)"
                                       R"("weight_version":{"min_version":)",
                                       pointer, "}}"),
                          o)
              : HttpFetch(
                    "POST", fleet_->gateway_url() + "/generate",
                    absl::StrCat(R"({"input_ids":[256,72],"sampling_params":{"max_new_tokens":1,)"
                                 R"("temperature":0},"weight_version":{"min_version":)",
                                 pointer, "}}"),
                    o);
      if (!answer.ok() || answer->status != 200) {
        absl::StrAppend(&why, "the gateway does not answer min_version ", pointer);
      }
    }
    if (why.empty()) {
      end.converged = true;
      break;
    }
    if (Clock::now() >= deadline || stop_.load()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  end.convergence = why;
}

void Run::AwaitDrain(EndEntry& end) {
  // Nothing may keep running once the clients are gone.
  if (fleet_ == nullptr) return;
  const auto drain = Clock::now() + kDrainTimeout;
  for (;;) {
    end.unfinished.clear();
    for (int r = 0; r < options_.replicas; ++r) {
      int64_t busy = 0;
      if (r == 0 && options_.engine == "vllm") {
        busy = EngineBusyFromMetrics(fleet_->engine_url(r), engine_key_,
                                     {"vllm:num_requests_running", "vllm:num_requests_waiting"});
      } else if (r == 0 && options_.engine == "sglang") {
        busy = EngineBusyFromMetrics(fleet_->engine_url(r), engine_key_,
                                     {"sglang:num_running_reqs", "sglang:num_queue_reqs"});
      } else {
        busy = EngineBusy(fleet_->engine_url(r), engine_key_);
      }
      if (busy != 0) {
        end.unfinished.push_back(absl::StrCat("engine r", r, ": ",
                                              busy < 0 ? "unreadable" : absl::StrCat(busy),
                                              " requests running or queued"));
      }
      std::optional<ReplicaState> s = ServerInfo(fleet_->sidecar_url(r), token_);
      if (s.has_value() && s->active_requests != 0) {
        end.unfinished.push_back(
            absl::StrCat("sidecar r", r, ": ", s->active_requests, " requests in flight"));
      }
    }
    if (end.unfinished.empty() || Clock::now() >= drain) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

void Run::StopEverything(EndEntry& end) {
  std::set<int> groups;
  std::vector<FleetProcess> started;
  std::vector<FleetProcess> running;
  if (fleet_ != nullptr) {
    started = fleet_->AllStarted();
    running = fleet_->Processes();
    for (const std::string& note : fleet_->Notes()) end.notes.push_back(note);
  }
  for (const FleetProcess& p : started) groups.insert(p.pid);
  fleet_ = nullptr;  // its supervision first, so that nothing is restarted
  supervisor_.StopAll(kStopGrace);
  judge_ = nullptr;  // nothing is judged once the load has stopped
  // A real engine's processes (vLLM's engine core and workers) shut down
  // after the one the supervisor started has ended: give them the same
  // grace, reaping the orphans among them.
  const auto deadline = Clock::now() + kStopGrace;
  for (;;) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    bool any = false;
    for (int group : groups) any |= ::kill(-group, 0) == 0;
    if (!any || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // An orderly stop on SIGTERM exits 0; anything else is worth a look.
  for (const FleetProcess& p : running) {
    std::optional<int> status = supervisor_.ExitStatus(p.pid);
    if (status.value_or(0) != 0) {
      end.notes.push_back(
          absl::StrCat(p.name, " exited with status ", *status, " when stopped with SIGTERM"));
    }
  }
  // Orphans that already ended are reaped here (this process is their
  // subreaper); the living ones are reported.
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  end.leftover_processes = LeftoverProcesses(groups);
  for (const std::string& line : end.leftover_processes) Say(absl::StrCat("left behind: ", line));
}

std::vector<std::string> Run::TempLeftBehind() {
  std::error_code ec;
  fs::remove_all(dir_ / "publish", ec);  // the trainer's own work, never published
  // engine-tmp: a real engine's own (fleet.h), and the judge's.
  std::vector<fs::path> skip = {dir_ / "logs", dir_ / "s3", dir_ / "harness-cache",
                                dir_ / "engine-tmp"};
  if (!store_root_.empty()) {
    for (auto it = fs::directory_iterator(store_mount_, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      if (absl::StrContains(it->path().filename().string(), ".stray-")) skip.push_back(it->path());
    }
  }
  return LeftoverTemp(dir_, skip);
}

EndEntry Run::Finish() {
  EndEntry end;
  AwaitConvergence(end);
  if (load_ != nullptr) load_->StopProbes();
  AwaitDrain(end);
  if (watcher_ != nullptr) watcher_->Stop();
  if (sampler_ != nullptr) sampler_->Stop();

  if (store_ != nullptr && end.final_pointer >= 0) {
    absl::Status bytes = VerifyVersionBytes(*store_, oracle_, dir_ / "base", end.final_pointer);
    end.pointer_complete = bytes.ok();
    end.pointer_detail = std::string(bytes.message());
  }

  // Stop everything, then look for what is left.
  StopEverything(end);
  end.leftover_temp = TempLeftBehind();
  if (injector_ != nullptr) {
    for (const std::string& f : injector_->Findings()) end.notes.push_back(f);
  }
  end.at_s = Now();
  return end;
}

int Run::Report(EndEntry end) {
  history_->Write(end);
  auto history = ReadHistory(dir_ / "history.jsonl");
  if (!history.ok()) {
    std::cerr << "stitch: " << history.status().message() << std::endl;
    return kExitFailed;
  }
  const ChaosFigures figures = CheckHistory(*history);
  const std::string text = FormatFigures(figures);
  std::cout << text;
  {
    std::ofstream out(dir_ / "report.txt", std::ios::trunc);
    out << text;
  }
  if (!store_mount_.empty() && store_mounted_) {
    // A failed run keeps its store for a look, out of the tmpfs.
    if (!figures.failures.empty()) {
      std::error_code ec;
      fs::copy(store_mount_, dir_ / "store-at-end", fs::copy_options::recursive, ec);
    }
    if (absl::Status s = Unmount(store_mount_); !s.ok()) Say(std::string(s.message()));
  }
  const bool passed = figures.failures.empty();
  if (passed && !options_.keep) {
    std::error_code ec;
    for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name == "history.jsonl" || name == "report.txt") continue;
      std::error_code rm;
      fs::remove_all(it->path(), rm);
    }
  }
  Say(absl::StrCat("history and report in ", dir_.string()));
  if (!passed) {
    std::cerr << "stitch: chaos: " << figures.failures.size() << " check(s) failed; seed "
              << options_.seed << "; replay: " << ReplayCommand(options_) << std::endl;
    return kExitFailed;
  }
  return 0;
}

int Run::Go() {
  absl::Status status = SetUp();
  if (status.ok()) status = Load();
  if (!status.ok()) {
    if (injector_ != nullptr) {
      injector_->Cancel();
      injector_->Join();
    }
    if (trainer_ != nullptr) trainer_->Stop();
    if (load_ != nullptr) {
      load_->StopLoad();
      load_->StopProbes();
    }
    if (watcher_ != nullptr) watcher_->Stop();
    if (sampler_ != nullptr) sampler_->Stop();
    fleet_ = nullptr;
    supervisor_.StopAll(kStopGrace);
    if (!store_mount_.empty() && store_mounted_) (void)Unmount(store_mount_);
    if (stop_.load()) {
      Say("interrupted; the run directory is kept: " + dir_.string());
      return kExitInterrupted;
    }
    std::cerr << "stitch: " << status.message() << "; seed " << options_.seed
              << "; replay: " << ReplayCommand(options_) << std::endl;
    return kExitFailed;
  }
  return Report(Finish());
}

}  // namespace

std::string ReplayCommand(const ChaosOptions& options) {
  return absl::StrCat("make chaos CHAOS_SEED=", options.seed, " CHAOS_MINUTES=", options.minutes,
                      " CHAOS_STORE=", options.store,
                      options.engine == "reference" ? "" : " CHAOS_ENGINE=",
                      options.engine == "reference" ? "" : options.engine);
}

int RunChaos(const ChaosOptions& options, const std::atomic<bool>& stop) {
  Run run(options, stop);
  return run.Go();
}

}  // namespace stitch
