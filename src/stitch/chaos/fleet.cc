#include "stitch/chaos/fleet.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "stitch/demo/engine_command.h"
#include "stitch/demo/fleet.h"
#include "stitch/io/fileio.h"
#include "stitch/net/client.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

// A process restarted on its port may find it still taken for a moment.
constexpr int kLaunchAttempts = 40;
constexpr auto kLaunchRetryEvery = std::chrono::milliseconds(250);
constexpr auto kExitTimeout = std::chrono::seconds(30);
constexpr auto kSuperviseEvery = std::chrono::milliseconds(100);
constexpr auto kProbeTimeout = std::chrono::seconds(1);

int PortOf(const std::string& url) {
  int port = 0;
  const size_t colon = url.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(url.substr(colon + 1), &port)) return 0;
  return port;
}

// A port nobody listens on now (moto cannot bind port 0 and say which).
absl::StatusOr<int> FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("chaos: cannot create a socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  if (port == 0) return absl::InternalError("chaos: cannot find a free loopback port");
  return port;
}

bool Healthy(const std::string& url) {
  FetchOptions options;
  options.timeout = kProbeTimeout;
  auto response = HttpFetch("GET", url + "/health", {}, options);
  return response.ok() && response->status == 200;
}

}  // namespace

std::string ReplicaMode(int replica) {
  static constexpr const char* kModes[] = {"cpu", "disk", "stock"};
  return kModes[replica % 3];
}

std::string ChaosFleet::Mode(int replica) const {
  if (replica == 0 && !options_.real_engine.empty()) return options_.real_engine;
  return ReplicaMode(replica);
}

ChaosFleet::ChaosFleet(ProcessSupervisor& supervisor, ChaosFleetOptions options,
                       const std::atomic<bool>* cancel)
    : supervisor_(supervisor), options_(std::move(options)), cancel_(cancel) {
  {
    absl::MutexLock lock(&mu_);
    store_uri_ = options_.store_uri;
  }
  auto make = [](std::string name, Role role, int replica) {
    auto p = std::make_unique<Proc>();
    p->name = std::move(name);
    p->role = role;
    p->replica = replica;
    return p;
  };
  for (int r = 0; r < options_.replicas; ++r) {
    engines_.push_back(make(absl::StrCat("engine r", r), Role::kEngine, r));
    sidecars_.push_back(make(absl::StrCat("sidecar r", r), Role::kSidecar, r));
  }
  gateway_ = make("gateway", Role::kGateway, -1);
  s3_ = make("s3", Role::kS3, -1);
}

ChaosFleet::~ChaosFleet() {
  stop_.store(true);
  if (supervise_.joinable()) supervise_.join();
}

double ChaosFleet::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
}

ChaosFleet::Proc* ChaosFleet::Find(Role role, int replica) const {
  switch (role) {
    case Role::kEngine:
      return replica >= 0 && replica < options_.replicas ? engines_[replica].get() : nullptr;
    case Role::kSidecar:
      return replica >= 0 && replica < options_.replicas ? sidecars_[replica].get() : nullptr;
    case Role::kGateway:
      return gateway_.get();
    case Role::kS3:
      return s3_.get();
  }
  return nullptr;
}

std::vector<std::string> ChaosFleet::Args(const Proc& p) const {
  switch (p.role) {
    case Role::kEngine: {
      std::vector<std::string> args = EngineArgs(options_.base_checkpoint, options_.run_id, p.port);
      // Like a stock SGLang, the stock replica's engine reports no spans:
      // its sidecar derives them from the engine's labels.
      if (ReplicaMode(p.replica) == "stock") args.push_back("--no-weight-version-spans");
      args.insert(args.end(), options_.engine_args.begin(), options_.engine_args.end());
      return args;
    }
    case Role::kSidecar: {
      SidecarLaunch launch;
      launch.run_id = options_.run_id;
      {
        absl::MutexLock lock(&mu_);
        launch.store = store_uri_;
        launch.engine_url = engines_[p.replica]->url;
      }
      launch.base_checkpoint = options_.base_checkpoint;
      launch.local_checkpoint = options_.dir / "replicas" / absl::StrCat("r", p.replica) / "local";
      launch.reconcile_interval_s = options_.reconcile_interval_s;
      launch.port = p.port;
      const std::string mode = Mode(p.replica);
      launch.extra = options_.sidecar_args;
      if (mode == "vllm") {
        launch.engine = "vllm";
        // Sparse versions (chaos versions differ in the LM head) become
        // in-place patches, through Stitch's worker extension.
        launch.extra.push_back("--patch-commits");
      } else {
        launch.engine = mode == "stock" || mode == "sglang" ? "sglang-stock" : "sglang";
      }
      launch.update_mode = mode == "cpu" ? "cpu" : "disk";
      return SidecarArgs(launch);
    }
    case Role::kGateway: {
      std::vector<std::string> args =
          GatewayArgs(absl::StrCat("file:", pool_file().string()), p.port,
                      options_.gateway_poll_interval_s, options_.gateway_admission_wait_s);
      args.insert(args.end(), options_.gateway_args.begin(), options_.gateway_args.end());
      return args;
    }
    case Role::kS3: {
      absl::MutexLock lock(&mu_);
      return {options_.moto_script.string(),
              "--port",
              absl::StrCat(p.port),
              "--state",
              s3_state_,
              "--no-auth",
              "--until-signal"};
    }
  }
  return {};
}

absl::Status ChaosFleet::LaunchRealEngine(Proc& p) {
  EngineCommandValues values;
  values.model = options_.base_checkpoint.string();
  values.name = absl::StrCat("r", p.replica);
  values.dir = (options_.dir / "replicas" / values.name).string();
  std::error_code ec;
  fs::create_directories(values.dir, ec);
  {
    absl::MutexLock lock(&mu_);
    values.port = p.port;
  }
  if (values.port == 0) {  // the first start; restarts keep the port
    absl::StatusOr<int> port = PickEnginePort({});
    if (!port.ok()) return port.status();
    values.port = *port;
  }
  absl::StatusOr<std::string> command = ExpandEngineCommand(options_.real_engine_command, values);
  if (!command.ok()) return command.status();
  for (const std::string& arg : options_.engine_args) {
    absl::StrAppend(&*command, " ", ShellQuote(arg));
  }
  // The engine's own temporary files (a killed vLLM leaves its IPC sockets
  // and compile caches) go to a directory of its own, apart from the run's
  // tmp/, which must end empty.
  const fs::path tmp = options_.dir / "engine-tmp" / values.name;
  fs::create_directories(tmp, ec);
  *command = absl::StrCat("export TMPDIR=", ShellQuote(tmp.string()), "; ", *command);
  int instance = 0;
  {
    absl::MutexLock lock(&mu_);
    instance = ++p.instance;
  }
  const fs::path log =
      options_.dir / "logs" /
      absl::StrCat(absl::StrReplaceAll(p.name, {{" ", "-"}}), ".", instance, ".log");
  absl::StatusOr<int> pid = supervisor_.StartProgram(p.name, "/bin/sh", {"-c", *command}, log);
  if (!pid.ok()) return pid.status();
  absl::MutexLock lock(&mu_);
  p.pid = *pid;
  p.port = values.port;
  p.url = absl::StrCat("http://", values.host, ":", values.port);
  started_.push_back({p.name, instance, *pid});
  return absl::OkStatus();
}

absl::Status ChaosFleet::Launch(Proc& p) {
  const fs::path logs = options_.dir / "logs";
  std::error_code ec;
  fs::create_directories(logs, ec);
  if (IsRealEngine(p)) return LaunchRealEngine(p);
  absl::Status last;
  for (int attempt = 0; attempt < kLaunchAttempts; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(kLaunchRetryEvery);
    if (cancel_ != nullptr && cancel_->load()) return absl::CancelledError("chaos: interrupted");
    int instance = 0;
    {
      absl::MutexLock lock(&mu_);
      instance = ++p.instance;
    }
    const fs::path log =
        logs / absl::StrCat(absl::StrReplaceAll(p.name, {{" ", "-"}}), ".", instance, ".log");
    const std::vector<std::string> args = Args(p);
    absl::StatusOr<int> pid =
        p.role == Role::kS3 ? supervisor_.StartProgram(p.name, options_.python.string(), args, log)
                            : supervisor_.Start(p.name, args, log);
    if (!pid.ok()) return pid.status();
    {
      absl::MutexLock lock(&mu_);
      p.pid = *pid;
      started_.push_back({p.name, instance, *pid});
    }
    absl::StatusOr<std::string> url = supervisor_.WaitForUrl(*pid, options_.start_timeout, cancel_);
    if (url.ok()) {
      absl::MutexLock lock(&mu_);
      p.url = *url;
      p.port = PortOf(*url);
      return absl::OkStatus();
    }
    last = url.status();
    // Only a process that wants its old port is retried (it most likely
    // found the port still taken).
    if (p.port == 0 || !absl::IsFailedPrecondition(last)) break;
  }
  return last;
}

absl::StatusOr<std::string> ChaosFleet::StartS3(const std::string& prefix) {
  std::error_code ec;
  fs::create_directories(options_.dir / "s3", ec);
  {
    absl::MutexLock lock(&mu_);
    s3_state_ = (options_.dir / "s3" / "state.jsonl").string();
  }
  absl::MutexLock op(&s3_->op);
  absl::Status last;
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto port = FreePort();
    if (!port.ok()) return port.status();
    s3_->port = *port;
    last = Launch(*s3_);
    if (last.ok()) break;
  }
  if (!last.ok()) return last;
  absl::MutexLock lock(&mu_);
  store_uri_ =
      absl::StrCat("s3://stitch-test/", prefix, "?endpoint=", s3_->url, "&region=us-east-1");
  return store_uri_;
}

absl::Status ChaosFleet::WritePoolFile() {
  std::string text = "# written by stitch chaos: the replicas the gateway routes over\n";
  {
    absl::MutexLock lock(&mu_);
    for (const auto& s : sidecars_) absl::StrAppend(&text, s->url, "\n");
  }
  return WriteFileAtomically(pool_file(), text);
}

absl::Status ChaosFleet::Start() {
  for (int r = 0; r < options_.replicas; ++r) {
    {
      absl::MutexLock op(&engines_[r]->op);
      if (absl::Status s = Launch(*engines_[r]); !s.ok()) return s;
    }
    std::error_code ec;
    fs::create_directories(options_.dir / "replicas" / absl::StrCat("r", r), ec);
    absl::MutexLock op(&sidecars_[r]->op);
    if (absl::Status s = Launch(*sidecars_[r]); !s.ok()) return s;
  }
  if (absl::Status s = WritePoolFile(); !s.ok()) return s;
  {
    absl::MutexLock op(&gateway_->op);
    if (absl::Status s = Launch(*gateway_); !s.ok()) return s;
  }
  supervise_ = std::thread([this] { SuperviseLoop(); });
  return absl::OkStatus();
}

absl::Status ChaosFleet::Kill(Role role, int replica) {
  Proc* p = Find(role, replica);
  if (p == nullptr) return absl::NotFoundError("chaos: no such process");
  absl::MutexLock op(&p->op);
  int pid = -1;
  {
    absl::MutexLock lock(&mu_);
    p->held_down = true;
    pid = p->pid;
  }
  if (pid <= 0)
    return absl::FailedPreconditionError(absl::StrCat("chaos: ", p->name, " never ran"));
  supervisor_.Signal(pid, SIGKILL);
  auto exited = supervisor_.WaitForExit(pid, kExitTimeout);
  return exited.ok() ? absl::OkStatus() : exited.status();
}

absl::Status ChaosFleet::Restart(Role role, int replica) {
  Proc* p = Find(role, replica);
  if (p == nullptr) return absl::NotFoundError("chaos: no such process");
  absl::MutexLock op(&p->op);
  int pid = -1;
  {
    absl::MutexLock lock(&mu_);
    pid = p->pid;
  }
  // Whatever ran there before is gone first (a fault may restart a process
  // the supervision already brought back).
  if (pid > 0 && !supervisor_.ExitStatus(pid).has_value()) {
    supervisor_.Signal(pid, SIGKILL);
    (void)supervisor_.WaitForExit(pid, kExitTimeout);
  }
  absl::Status s = Launch(*p);
  absl::MutexLock lock(&mu_);
  p->held_down = false;
  return s;
}

absl::Status ChaosFleet::Pause(Role role, int replica) {
  Proc* p = Find(role, replica);
  if (p == nullptr) return absl::NotFoundError("chaos: no such process");
  absl::MutexLock op(&p->op);
  absl::MutexLock lock(&mu_);
  p->held_down = true;
  supervisor_.Signal(p->pid, SIGSTOP);
  return absl::OkStatus();
}

absl::Status ChaosFleet::Continue(Role role, int replica) {
  Proc* p = Find(role, replica);
  if (p == nullptr) return absl::NotFoundError("chaos: no such process");
  absl::MutexLock op(&p->op);
  absl::MutexLock lock(&mu_);
  supervisor_.Signal(p->pid, SIGCONT);
  p->held_down = false;
  return absl::OkStatus();
}

void ChaosFleet::SuperviseLoop() {
  std::vector<Proc*> all;
  for (auto& p : engines_) all.push_back(p.get());
  for (auto& p : sidecars_) all.push_back(p.get());
  all.push_back(gateway_.get());
  all.push_back(s3_.get());
  while (!stop_.load()) {
    for (Proc* p : all) {
      if (!p->op.TryLock()) continue;  // a fault is working on it
      RestartIfExited(*p);
      p->op.Unlock();
    }
    std::this_thread::sleep_for(kSuperviseEvery);
  }
}

void ChaosFleet::RestartIfExited(Proc& p) {
  int pid = -1;
  {
    absl::MutexLock lock(&mu_);
    if (p.held_down) return;
    pid = p.pid;
  }
  if (pid <= 0) return;
  std::optional<int> status = supervisor_.ExitStatus(pid);
  if (!status.has_value()) return;
  const absl::Status restarted = Launch(p);
  absl::MutexLock lock(&mu_);
  notes_.push_back(absl::StrFormat(
      "%s exited by itself with status %d at %.1f s; the supervision restarted it%s", p.name,
      *status, Now(), restarted.ok() ? "" : absl::StrCat(" but it failed: ", restarted.message())));
}

std::string ChaosFleet::gateway_url() const {
  absl::MutexLock lock(&mu_);
  return gateway_->url;
}

std::string ChaosFleet::sidecar_url(int replica) const {
  absl::MutexLock lock(&mu_);
  return sidecars_.at(replica)->url;
}

std::string ChaosFleet::engine_url(int replica) const {
  absl::MutexLock lock(&mu_);
  return engines_.at(replica)->url;
}

std::string ChaosFleet::s3_endpoint() const {
  absl::MutexLock lock(&mu_);
  return s3_->url;
}

std::vector<FleetProcess> ChaosFleet::Processes() const {
  std::vector<FleetProcess> all;
  {
    absl::MutexLock lock(&mu_);
    auto add = [&](const Proc& p) {
      if (p.pid > 0) all.push_back({p.name, p.instance, p.pid});
    };
    for (const auto& p : engines_) add(*p);
    for (const auto& p : sidecars_) add(*p);
    add(*gateway_);
    add(*s3_);
  }
  // A process that ended is left out: its pid may soon name another one.
  std::vector<FleetProcess> out;
  for (const FleetProcess& p : all) {
    if (!supervisor_.ExitStatus(p.pid).has_value()) out.push_back(p);
  }
  return out;
}

std::vector<FleetProcess> ChaosFleet::AllStarted() const {
  absl::MutexLock lock(&mu_);
  return started_;
}

std::vector<std::string> ChaosFleet::Notes() const {
  absl::MutexLock lock(&mu_);
  return notes_;
}

absl::Status ChaosFleet::WaitReady(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::string laggards;
    for (int r = 0; r < options_.replicas; ++r) {
      if (!Healthy(sidecar_url(r)))
        absl::StrAppend(&laggards, laggards.empty() ? "" : ", ", "r", r);
    }
    if (!Healthy(gateway_url()))
      absl::StrAppend(&laggards, laggards.empty() ? "" : ", ", "gateway");
    if (laggards.empty()) return absl::OkStatus();
    if (cancel_ != nullptr && cancel_->load()) return absl::CancelledError("chaos: interrupted");
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("chaos: not ready after ",
                       std::chrono::duration_cast<std::chrono::seconds>(timeout).count(),
                       " s: ", laggards, "; see the logs in ", (options_.dir / "logs").string()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace stitch
