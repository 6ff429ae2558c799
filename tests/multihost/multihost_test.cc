// Stitch across hosts, on one machine: every host a Linux network namespace.
//
// Run as root by `make test-multihost` (build/tests/multihost_netns_test [--keep]).
//
// Hosts, joined by veth pairs to a bridge in a switch namespace (10.213.0.0/24):
//   s3       .2    the moto S3 server (tests/s3_moto.py), SigV4 checked
//   dns      .3    dnsmasq: replicas.stitch.test -> every replica host's address
//   gateway  .4    stitch gateway --pool dns:replicas.stitch.test:8000
//   trainer  .5    claims the run, publishes FULL and DELTA versions to S3 and,
//                  from the same host, sends constrained rollout requests
//                  through the gateway
//   r1..r4   .11-  a reference engine and its sidecar, listening on the host's
//                  address, following the store on S3
//
// During the run: r3's link goes down while two versions are published, then
// comes back and must catch up before it serves again; r4 joins by its address
// appearing in DNS; r1 leaves by its address leaving DNS. Every response must
// satisfy its constraint and name only published versions. Prints
// publish-to-whole-fleet convergence p50/p95 and the counts.
//
// Every process runs inside a namespace of this run; all of them are killed
// and the namespaces deleted on any exit (the test's objects going out of
// scope, or SIGTERM, SIGINT, SIGHUP: a thread of this program then removes
// them and exits with 128 + the signal). A run killed with SIGKILL leaves them
// behind: each run first removes those of runs whose test process is gone
// (names carry its pid).
//
// The trainer host's HTTP requests (readiness polls, rollouts) are made by
// threads of this program that each enter the trainer's network namespace
// (setns) when they start and end with their work: a network namespace
// belongs to a thread, so no other code ever runs in the wrong one, and the
// clients keep an ordinary in-process view of the records they make. (A
// child process per request, the other way, would cost a process start per
// rollout and a wire format for the results.) The requests go to IP
// addresses, so no resolver is involved; `stitch` commands of the trainer
// host, which do resolve the pool's name, run under `ip netns exec`, which
// gives them the host's resolv.conf.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "stitch/api/server_info.h"
#include "stitch/core/constraint.h"
#include "stitch/core/state.h"
#include "stitch/core/version.h"
#include "stitch/net/client.h"
#include "tests/multihost/network.h"
#include "tests/s3_moto_server.h"
#include "tests/sidecar_process.h"
#include "tests/support/subprocess.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;
using ::stitch::testing::LinkState;
using ::stitch::testing::Network;
using ::stitch::testing::ProcessResult;
using ::stitch::testing::ServerProcess;
using namespace std::chrono_literals;

constexpr char kPrefix[] = "stxmh";
constexpr char kSubnet[] = "10.213.0";
constexpr char kName[] = "replicas.stitch.test";
constexpr int kSidecarPort = 8000;
constexpr int kGatewayPort = 8080;
constexpr char kRunId[] = "mh";
constexpr auto kStartDeadline = 120s;
constexpr auto kConvergeDeadline = 60s;
constexpr auto kGatewayDeadline = 30s;
constexpr auto kDnsDeadline = 30s;
constexpr auto kStitchTimeout = 300s;
constexpr auto kShortCommandTimeout = 10s;
constexpr auto kStopGrace = 20s;
// How often the state of other processes (HTTP answers, DNS) is looked at
// while waiting on it with a deadline: they send no notification.
constexpr auto kPoll = 20ms;

// Set by main() before the test runs.
bool keep_work = false;
std::string ip_path;
std::string dnsmasq_path;
std::string getent_path;

const std::vector<testing::HostSpec>& Hosts() {
  static const auto* hosts =
      new std::vector<testing::HostSpec>{{"s3", 2},  {"dns", 3}, {"gateway", 4}, {"trainer", 5},
                                         {"r1", 11}, {"r2", 12}, {"r3", 13},     {"r4", 14}};
  return *hosts;
}

std::string Address(const std::string& host) {
  for (const testing::HostSpec& h : Hosts()) {
    if (h.name == host) return absl::StrCat(kSubnet, ".", h.octet);
  }
  std::abort();  // a host the test never declared
}

std::string ReplicaUrl(const std::string& host) {
  return absl::StrCat("http://", Address(host), ":", kSidecarPort);
}

std::string GatewayUrl() { return absl::StrCat("http://", Address("gateway"), ":", kGatewayPort); }

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

void Log(const std::string& message) {
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  std::cout << "multihost: " << message << std::endl;
}

MATCHER(IsOk, "is OK") { return arg.ok(); }

// Polls `condition` every kPoll until it holds (true) or `timeout` passes
// (false).
bool Eventually(const std::function<bool()>& condition, Clock::duration timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!condition()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kPoll);
  }
  return true;
}

std::string Tail(const std::string& text, size_t n = 2000) {
  return text.size() <= n ? text : text.substr(text.size() - n);
}

// ---- interruption ----

// What a thread of this program removes when a signal (SIGTERM, SIGINT,
// SIGHUP) interrupts the run: every cleanup registered at that moment, the
// newest first; then the process exits with 128 + the signal. Never
// destroyed (a signal may come during static destruction).
struct Interrupts {
  absl::Mutex mu;
  std::map<int, std::function<void()>> cleanups ABSL_GUARDED_BY(mu);
  int next_id ABSL_GUARDED_BY(mu) = 0;
};

Interrupts& TheInterrupts() {
  static auto* interrupts = new Interrupts();
  return *interrupts;
}

// The write end of the pipe from the signal handler to the cleanup thread.
int interrupt_pipe = -1;

void OnSignal(int signal) {
  // Async-signal-safe: hand the signal to the cleanup thread.
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] ssize_t n = ::write(interrupt_pipe, &byte, 1);
  errno = saved;
}

// Installs the handlers and starts the cleanup thread. Before any other
// thread starts.
void InstallInterruptHandlers() {
  Interrupts& in = TheInterrupts();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) std::abort();
  interrupt_pipe = fds[1];
  std::thread([&in, read_end = fds[0]] {
    unsigned char byte = 0;
    while (::read(read_end, &byte, 1) != 1) {
    }
    // Cleanups run with the registry held: whoever would unregister one
    // (its object going out of scope) waits, and never returns.
    in.mu.Lock();
    for (auto it = in.cleanups.rbegin(); it != in.cleanups.rend(); ++it) it->second();
    Log(absl::StrCat("interrupted by signal ", static_cast<int>(byte),
                     "; namespaces and processes removed"));
    std::fflush(nullptr);
    ::_exit(128 + byte);
  }).detach();
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(s, &action, nullptr);
}

// Runs `cleanup` if the run is interrupted while this object lives.
class CleanupOnInterrupt {
 public:
  explicit CleanupOnInterrupt(std::function<void()> cleanup) {
    Interrupts& in = TheInterrupts();
    absl::MutexLock lock(&in.mu);
    id_ = in.next_id++;
    in.cleanups.emplace(id_, std::move(cleanup));
  }
  ~CleanupOnInterrupt() {
    Interrupts& in = TheInterrupts();
    absl::MutexLock lock(&in.mu);
    in.cleanups.erase(id_);
  }
  CleanupOnInterrupt(const CleanupOnInterrupt&) = delete;
  CleanupOnInterrupt& operator=(const CleanupOnInterrupt&) = delete;

 private:
  int id_ = 0;
};

// The run's work directory (checkpoints, version directories, the replicas'
// local checkpoints, DNS's hosts file), removed unless --keep.
class WorkDir {
 public:
  WorkDir() {
    std::string pattern = (fs::temp_directory_path() / "stitch-multihost-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;
  }
  ~WorkDir() { Remove(); }
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;

  void Remove() const {
    std::error_code ignored;
    if (!keep_work) fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// ---- threads on the trainer host ----

// A thread in a host's network namespace: it enters the namespace, runs
// `body` and ends, so nothing else ever runs there. R is absl::Status or
// absl::StatusOr<T>; Join() returns what `body` returned, or why the thread
// could not enter the namespace. The destructor joins.
template <typename R>
class HostThread {
 public:
  HostThread(const std::string& ns, std::function<R()> body)
      : thread_([this, ns, body = std::move(body)] {
          absl::Status entered = testing::EnterNetworkNamespace(ns);
          result_ = entered.ok() ? body() : R(entered);
        }) {}
  ~HostThread() {
    if (thread_.joinable()) thread_.join();
  }
  HostThread(const HostThread&) = delete;
  HostThread& operator=(const HostThread&) = delete;

  R Join() {
    thread_.join();
    return std::move(result_);
  }

 private:
  R result_ = absl::InternalError("the thread did not run");  // the thread's until joined
  std::thread thread_;  // after result_: starts once result_ exists
};

// Runs `body` on a HostThread in `ns` and returns what it returned.
template <typename R>
R CallInHost(const std::string& ns, std::function<R()> body) {
  return HostThread<R>(ns, std::move(body)).Join();
}

// ---- what replicas and the gateway say ----

std::optional<ReplicaState> ServerInfo(const std::string& host) {
  FetchOptions options;
  options.timeout = 2s;
  auto r = HttpFetch("GET", ReplicaUrl(host) + "/server_info", {}, options);
  if (!r.ok() || r->status != 200) return std::nullopt;
  auto state = ParseServerInfo(r->body);
  if (!state.ok()) return std::nullopt;
  return *std::move(state);
}

std::string DescribeSeconds(const std::map<std::string, double>& per_host) {
  std::vector<std::string> parts;
  parts.reserve(per_host.size());
  for (const auto& [host, s] : per_host) parts.push_back(absl::StrFormat("%s: %.2f", host, s));
  return "{" + absl::StrJoin(parts, ", ") + "}";
}

// Seconds until every host of `hosts` serves `version` (ready), from now;
// per host. DeadlineExceeded when not all of them do within `deadline`.
absl::StatusOr<std::map<std::string, double>> WaitApplied(
    const std::vector<std::string>& hosts, int64_t version,
    Clock::duration deadline = kConvergeDeadline) {
  const auto start = Clock::now();
  std::map<std::string, double> done;
  while (Clock::now() - start < deadline) {
    for (const std::string& host : hosts) {
      if (done.contains(host)) continue;
      std::optional<ReplicaState> info = ServerInfo(host);
      if (info && info->ready && info->applied && info->applied->version == version) {
        done[host] = Seconds(Clock::now() - start);
      }
    }
    if (done.size() == hosts.size()) return done;
    std::this_thread::sleep_for(kPoll);
  }
  return absl::DeadlineExceededError(absl::StrFormat(
      "not every replica of [%s] reached version %d within %.0f s: %s", absl::StrJoin(hosts, ", "),
      version, Seconds(deadline), DescribeSeconds(done)));
}

struct GatewayReplica {
  std::string url;
  bool ready = false;
  bool reachable = false;
};

std::vector<GatewayReplica> GatewayReplicas() {
  FetchOptions options;
  options.timeout = 2s;
  auto r = HttpFetch("GET", GatewayUrl() + "/replicas", {}, options);
  if (!r.ok() || r->status != 200) return {};
  boost::system::error_code ec;
  json::value doc = json::parse(r->body, ec);
  if (ec) return {};
  const json::value* list = &doc;
  if (doc.is_object()) list = doc.as_object().if_contains("replicas");
  if (list == nullptr || !list->is_array()) return {};
  std::vector<GatewayReplica> replicas;
  for (const json::value& v : list->as_array()) {
    if (!v.is_object()) continue;
    const json::object& o = v.as_object();
    GatewayReplica g;
    if (const json::value* f = o.if_contains("url"); f && f->is_string()) g.url = f->as_string();
    if (const json::value* f = o.if_contains("ready"); f && f->is_bool()) g.ready = f->as_bool();
    if (const json::value* f = o.if_contains("reachable"); f && f->is_bool()) {
      g.reachable = f->as_bool();
    }
    replicas.push_back(std::move(g));
  }
  return replicas;
}

std::string Describe(const std::vector<GatewayReplica>& replicas) {
  std::vector<std::string> parts;
  parts.reserve(replicas.size());
  for (const GatewayReplica& r : replicas) {
    parts.push_back(
        absl::StrCat(r.url, r.ready ? " ready" : " not ready", r.reachable ? "" : " unreachable"));
  }
  return "[" + absl::StrJoin(parts, "; ") + "]";
}

absl::Status WaitGateway(const std::function<bool(const std::vector<GatewayReplica>&)>& predicate,
                         const std::string& what) {
  if (Eventually([&] { return predicate(GatewayReplicas()); }, kGatewayDeadline)) {
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError(
      absl::StrCat("the gateway never ", what, ": ", Describe(GatewayReplicas())));
}

bool InRotation(const std::vector<GatewayReplica>& replicas, const std::string& host) {
  return std::any_of(replicas.begin(), replicas.end(), [&](const GatewayReplica& r) {
    return r.url == ReplicaUrl(host) && r.ready && r.reachable;
  });
}

bool Listed(const std::vector<GatewayReplica>& replicas, const std::string& host) {
  return std::any_of(replicas.begin(), replicas.end(),
                     [&](const GatewayReplica& r) { return r.url == ReplicaUrl(host); });
}

// ---- the fleet's processes ----

class Fleet {
 public:
  Fleet(Network& net, fs::path work) : net_(net), work_(std::move(work)) {}
  ~Fleet() { Close(); }
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  const std::string& store() const { return store_; }

  // Kills every process still running (the network's removal would too)
  // and stops the S3 server. Idempotent.
  void Close() {
    for (auto& [name, process] : processes_) {
      process->Signal(SIGKILL);
      process->WaitForExit(kStopGrace);
      SaveOutput(name, *process);
    }
    processes_.clear();
    moto_.reset();
  }

  // `stitch args...` run to its end on `host`; its stdout.
  absl::StatusOr<std::string> Stitch(const std::string& host, std::vector<std::string> args) {
    args.insert(args.begin(), testing::StitchBinary());
    ProcessResult r = Run(host, args, kStitchTimeout);
    if (r.exit_code != 0) {
      args.erase(args.begin());
      return absl::InternalError(absl::StrCat("stitch ", absl::StrJoin(args, " "), " on ", host,
                                              " failed (", r.exit_code, "): ", r.err));
    }
    return r.out;
  }

  absl::Status StartS3() {
    absl::StatusOr<std::unique_ptr<testing::MotoServer>> moto;
    testing::MotoServerOptions options;
    options.host = Address("s3");
    options.launcher = net_.InHost("s3", {});
    absl::Status started = net_.Start([&] { moto = testing::MotoServer::Start(options); });
    if (!started.ok()) return started;
    if (!moto.ok()) return moto.status();
    moto_ = *std::move(moto);
    // Every `stitch` process started from now on (all by this thread, while
    // the only other thread is the interrupt handler's, idle) finds the
    // store's credentials and endpoint in its environment.
    const S3Environment credentials = moto_->Credentials();
    ::setenv("AWS_ACCESS_KEY_ID", credentials.access_key_id.c_str(), 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", credentials.secret_access_key.c_str(), 1);
    ::setenv("AWS_REGION", moto_->region().c_str(), 1);
    ::setenv("AWS_ENDPOINT_URL_S3", moto_->endpoint().c_str(), 1);
    ::setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
    ::unsetenv("AWS_SESSION_TOKEN");
    store_ = absl::StrCat("s3://", moto_->bucket(), "/multihost");
    Log(absl::StrCat("s3 host: moto at ", moto_->endpoint(), ", store ", store_));
    return absl::OkStatus();
  }

  absl::Status StartDns(const std::vector<std::string>& members) {
    hosts_file_ = work_ / "replicas.hosts";
    if (absl::Status s = WriteHosts(members); !s.ok()) return s;
    absl::StatusOr<ServerProcess*> dns =
        Spawn("dns", "dns",
              {dnsmasq_path, "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv",
               "--no-hosts", "--bind-interfaces", "--listen-address=" + Address("dns"), "--port=53",
               "--addn-hosts=" + hosts_file_.string(), "--local=/stitch.test/", "--local-ttl=0",
               "--user=root", "--pid-file=", "--log-facility=-"});
    if (!dns.ok()) return dns.status();
    return WaitResolves(members);
  }

  // Points the name at `members` and waits until it resolves to them.
  absl::Status SetDns(const std::vector<std::string>& members) {
    if (absl::Status s = WriteHosts(members); !s.ok()) return s;
    processes_.at("dns")->Signal(SIGHUP);  // dnsmasq re-reads --addn-hosts
    return WaitResolves(members);
  }

  absl::Status StartReplica(const std::string& host) {
    const std::string base = (work_ / "ckpt" / "base").string();
    const std::string stitch = testing::StitchBinary();
    absl::StatusOr<ServerProcess*> engine =
        Spawn(host + "-engine", host,
              {stitch, "engine", "--model", base, "--port", "0", "--run-id", kRunId});
    if (!engine.ok()) return engine.status();
    std::optional<std::string> engine_url = (*engine)->WaitForUrl(kStartDeadline);
    if (!engine_url) {
      return absl::UnavailableError(
          absl::StrCat(host, "-engine did not print its URL: ", Tail((*engine)->err())));
    }
    absl::StatusOr<ServerProcess*> sidecar = Spawn(host + "-sidecar", host,
                                                   {stitch,
                                                    "sidecar",
                                                    "--store",
                                                    store_,
                                                    "--run-id",
                                                    kRunId,
                                                    "--engine",
                                                    "sglang",
                                                    "--engine-url",
                                                    *engine_url,
                                                    "--base-checkpoint",
                                                    base,
                                                    "--local-checkpoint",
                                                    (work_ / ("local-" + host)).string(),
                                                    "--reconcile-interval",
                                                    "1",
                                                    "--watchdog-interval",
                                                    "0.5",
                                                    "--store-outage-limit",
                                                    "2",
                                                    "--host",
                                                    Address(host),
                                                    "--port",
                                                    std::to_string(kSidecarPort)});
    if (!sidecar.ok()) return sidecar.status();
    return WaitListening(host + "-sidecar", **sidecar, ReplicaUrl(host));
  }

  void StopReplica(const std::string& host) {
    Stop(host + "-sidecar");
    Stop(host + "-engine");
  }

  absl::Status StartGateway() {
    absl::StatusOr<ServerProcess*> gateway =
        Spawn("gateway", "gateway",
              {testing::StitchBinary(), "gateway", "--pool",
               absl::StrCat("dns:", kName, ":", kSidecarPort), "--host", Address("gateway"),
               "--port", std::to_string(kGatewayPort), "--poll-interval", "0.25", "--probe-timeout",
               "1", "--admission-wait", "20"});
    if (!gateway.ok()) return gateway.status();
    return WaitListening("gateway", **gateway, GatewayUrl());
  }

 private:
  // `argv` run to its end on `host`, killed after `timeout`.
  ProcessResult Run(const std::string& host, const std::vector<std::string>& argv,
                    Clock::duration timeout) {
    testing::RunningProcess running;
    absl::Status started =
        net_.Start([&] { running = testing::StartProcess(net_.InHost(host, argv)); });
    if (!started.ok()) return ProcessResult{127, "", std::string(started.message())};
    return testing::WaitProcess(running,
                                std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
  }

  absl::StatusOr<ServerProcess*> Spawn(const std::string& name, const std::string& host,
                                       const std::vector<std::string>& argv) {
    std::unique_ptr<ServerProcess> process;
    absl::Status started =
        net_.Start([&] { process = std::make_unique<ServerProcess>(net_.InHost(host, argv)); });
    if (!started.ok()) return started;
    if (!process->started()) {
      return absl::InternalError(absl::StrCat("cannot start ", name, " (", argv[0], ")"));
    }
    ServerProcess* p = process.get();
    processes_[name] = std::move(process);
    return p;
  }

  // Waits until `process` announces that it listens at `url`.
  absl::Status WaitListening(const std::string& name, ServerProcess& process,
                             const std::string& url) {
    if (process.WaitForOutput("listening on " + url, kStartDeadline)) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(name, " did not print \"listening on ", url,
                                               "\": ", Tail(process.out()), Tail(process.err())));
  }

  // SIGTERM, then SIGKILL if it is still running after kStopGrace.
  void Stop(const std::string& name) {
    auto it = processes_.find(name);
    if (it == processes_.end()) return;
    std::unique_ptr<ServerProcess> process = std::move(it->second);
    processes_.erase(it);
    process->Signal(SIGTERM);
    process->WaitForExit(kStopGrace);
    SaveOutput(name, *process);
  }

  // With --keep, what the process printed goes to <work>/<name>.{out,err}.
  void SaveOutput(const std::string& name, const ServerProcess& process) const {
    if (!keep_work) return;
    std::ofstream(work_ / (name + ".out")) << process.out();
    std::ofstream(work_ / (name + ".err")) << process.err();
  }

  absl::Status WriteHosts(const std::vector<std::string>& members) {
    const fs::path tmp = hosts_file_.string() + ".tmp";
    {
      std::ofstream f(tmp);
      for (const std::string& host : members) f << Address(host) << " " << kName << "\n";
      if (!f.flush()) return absl::InternalError("cannot write " + tmp.string());
    }
    std::error_code ec;
    fs::rename(tmp, hosts_file_, ec);  // atomic: dnsmasq never reads half a file
    if (ec)
      return absl::InternalError("cannot write " + hosts_file_.string() + ": " + ec.message());
    return absl::OkStatus();
  }

  // Waits until the name resolves, on the gateway host, to exactly `members`.
  absl::Status WaitResolves(const std::vector<std::string>& members) {
    std::set<std::string> want;
    for (const std::string& host : members) want.insert(Address(host));
    std::set<std::string> got;
    bool resolved = Eventually(
        [&] {
          ProcessResult r = Run("gateway", {getent_path, "ahostsv4", kName}, kShortCommandTimeout);
          got.clear();
          for (absl::string_view line : absl::StrSplit(r.out, '\n', absl::SkipWhitespace())) {
            got.insert(std::string(line.substr(0, line.find_first_of(" \t"))));
          }
          return got == want;
        },
        kDnsDeadline);
    if (resolved) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(kName, " resolves to [", absl::StrJoin(got, ", "),
                                               "], not [", absl::StrJoin(want, ", "),
                                               "]: ", Tail(processes_.at("dns")->err())));
  }

  Network& net_;
  const fs::path work_;
  std::unique_ptr<testing::MotoServer> moto_;
  std::map<std::string, std::unique_ptr<ServerProcess>> processes_;
  std::string store_;
  fs::path hosts_file_;
};

// ---- rollouts ----

struct Record {
  VersionConstraint constraint;
  Clock::time_point sent;
  Clock::time_point received;
  int status = 0;  // 0: no answer
  std::string replica;
  int64_t start = -1;
  int64_t end = -1;
  std::string error;
  int64_t published_max = 0;  // the newest version whose publish had started by `received`
};

std::string Describe(const Record& r, Clock::time_point began) {
  std::string text = absl::StrFormat(
      "{constraint %s, sent %.2f s, received %.2f s, status %d, replica %s, start %d, end %d, "
      "published_max %d",
      r.constraint.ToString(), Seconds(r.sent - began), Seconds(r.received - began), r.status,
      r.replica, r.start, r.end, r.published_max);
  if (!r.error.empty()) absl::StrAppend(&text, ", error ", r.error);
  return text + "}";
}

// Rollout clients on the trainer host: constrained requests through the
// gateway until stopped.
class Rollouts {
 public:
  ~Rollouts() { Stop().IgnoreError(); }

  // Starts `clients` clients in namespace `ns`, client i seeded with i.
  void Start(const std::string& ns, int clients) {
    for (int seed = 0; seed < clients; ++seed) {
      clients_.push_back(std::make_unique<HostThread<absl::Status>>(ns, [this, seed] {
        Run(static_cast<uint32_t>(seed));
        return absl::OkStatus();
      }));
    }
  }

  // Ends the clients once their request in flight is answered (each is
  // bounded by its timeout); the status of the first that could not run.
  absl::Status Stop() {
    stop_ = true;
    absl::Status first;
    for (auto& client : clients_) first.Update(client->Join());
    clients_.clear();
    return first;
  }

  void SetPublishing(int64_t version) {
    absl::MutexLock lock(&mu_);
    publishing_ = version;
  }
  void SetLatest(int64_t version) {
    absl::MutexLock lock(&mu_);
    latest_ = version;
  }

  std::vector<Record> records() const {
    absl::MutexLock lock(&mu_);
    return records_;
  }

 private:
  VersionConstraint Constraint(std::mt19937& rng) {
    int64_t latest;
    {
      absl::MutexLock lock(&mu_);
      latest = latest_;
    }
    const double kind = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    if (kind < 0.2) return {};                                                             // any
    if (kind < 0.55) return VersionConstraint::AtLeast(std::max<int64_t>(latest - 1, 0));  // lag 1
    if (kind < 0.8) return VersionConstraint::AtLeast(latest);
    return VersionConstraint::Exact(latest);
  }

  void Run(uint32_t seed) {
    std::mt19937 rng(seed);
    FetchOptions options;
    options.timeout = 60s;
    while (!stop_) {
      Record rec;
      rec.constraint = Constraint(rng);
      const std::string body =
          absl::StrCat(R"({"text": "The policy", "weight_version": )", rec.constraint.ToJson(),
                       R"(, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})");
      rec.sent = Clock::now();
      auto r = HttpFetch("POST", GatewayUrl() + "/generate", body, options);
      if (!r.ok()) {
        rec.error = std::string(r.status().message());
      } else {
        rec.status = r->status;
        if (auto h = r->headers.Get("X-Stitch-Replica")) rec.replica = std::string(*h);
        if (r->status == 200) ReadVersions(r->body, rec);
      }
      rec.received = Clock::now();
      absl::MutexLock lock(&mu_);
      rec.published_max = publishing_;
      records_.push_back(std::move(rec));
    }
  }

  // meta_info's versions into `rec`; an answer without them counts as none.
  static void ReadVersions(const std::string& body, Record& rec) {
    boost::system::error_code ec;
    json::value doc = json::parse(body, ec);
    const json::value* meta =
        !ec && doc.is_object() ? doc.as_object().if_contains("meta_info") : nullptr;
    const json::value* start = nullptr;
    const json::value* end = nullptr;
    if (meta != nullptr && meta->is_object()) {
      start = meta->as_object().if_contains("weight_version_start");
      end = meta->as_object().if_contains("weight_version_end");
    }
    if (start == nullptr || end == nullptr || !start->is_int64() || !end->is_int64()) {
      rec.error = "no weight_version_start/end in: " + Tail(body, 300);
      rec.status = 0;
      return;
    }
    rec.start = start->as_int64();
    rec.end = end->as_int64();
  }

  mutable absl::Mutex mu_;
  int64_t latest_ ABSL_GUARDED_BY(mu_) = 0;      // the newest version whose pointer moved
  int64_t publishing_ ABSL_GUARDED_BY(mu_) = 0;  // the newest version whose publish started
  std::vector<Record> records_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_ = false;
  std::vector<std::unique_ptr<HostThread<absl::Status>>> clients_;  // the test thread's
};

// ---- versions ----

enum class Kind { kFull, kDelta };

const char* KindName(Kind k) { return k == Kind::kFull ? "FULL" : "DELTA"; }

absl::Status RunStitchHere(const std::vector<std::string>& args) {
  std::vector<std::string> argv = args;
  argv.insert(argv.begin(), testing::StitchBinary());
  ProcessResult r = testing::RunProcess(
      argv, std::chrono::duration_cast<std::chrono::milliseconds>(kStitchTimeout));
  if (r.exit_code == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("stitch ", absl::StrJoin(args, " "), ": ", r.err));
}

// Checkpoints and version directories 1..count (every fourth FULL) under
// `work`; the kind of each version.
absl::StatusOr<std::map<int64_t, Kind>> PrepareVersions(const fs::path& work, int count) {
  const fs::path ckpt = work / "ckpt";
  const fs::path out = work / "out";
  fs::create_directories(out);
  const std::vector<std::string> model = {"--layers", "1", "--hidden",        "32",
                                          "--heads",  "2", "--max-positions", "256"};
  auto init = [&](const std::string& name, int seed) {
    std::vector<std::string> args = {"engine", "init-model", (ckpt / name).string(), "--seed",
                                     std::to_string(seed)};
    args.insert(args.end(), model.begin(), model.end());
    return RunStitchHere(args);
  };
  if (absl::Status s = init("base", 1); !s.ok()) return s;
  std::map<int64_t, Kind> kinds;
  for (int v = 1; v <= count; ++v) {
    const std::string c = absl::StrCat("c", v);
    if (absl::Status s = init(c, v + 1); !s.ok()) return s;
    const std::string target = (out / VersionDirName(v)).string();
    absl::Status s;
    if (v % 4 == 1) {
      s = RunStitchHere({"delta", "full", "--checkpoint", (ckpt / c).string(), "--out", target,
                         "--version", std::to_string(v), "--run-id", kRunId});
      kinds[v] = Kind::kFull;
    } else {
      s = RunStitchHere({"delta", "encode", "--base", (ckpt / absl::StrCat("c", v - 1)).string(),
                         "--target", (ckpt / c).string(), "--out", target, "--version",
                         std::to_string(v), "--base-version", std::to_string(v - 1), "--run-id",
                         kRunId});
      kinds[v] = Kind::kDelta;
    }
    if (!s.ok()) return s;
  }
  return kinds;
}

// ---- figures and checks ----

struct Convergence {
  int64_t version = 0;
  Kind kind = Kind::kFull;
  size_t fleet = 0;
  double seconds = 0;  // from the publish's start until every replica in rotation served it
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The nearest-rank percentile, rounding half to even as the earlier driver
// did, so that its figures and these compare.
double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double rank = std::nearbyint(p / 100.0 * static_cast<double>(v.size() - 1));
  const size_t k = static_cast<size_t>(std::clamp(rank, 0.0, static_cast<double>(v.size() - 1)));
  return v[k];
}

// When things happened, for the checks.
struct Timeline {
  Clock::time_point began;
  Clock::time_point out_of_rotation;  // r3 had left rotation
  int64_t pointer_at_restore = 0;     // the pointer when r3 came back
  Clock::time_point left;             // r1 had left DNS and the gateway
};

// Every problem with the records: constraints not met, versions never
// published, r3 serving while behind, r1 serving after it left, too few
// successes, r4 never serving, answers other than 200 and 409. Logs the
// figures.
std::vector<std::string> Check(const std::vector<Record>& records,
                               const std::vector<Convergence>& convergence, const Timeline& t) {
  std::vector<std::string> problems;
  std::map<int, int> by_status;
  std::map<std::string, int> served_by;
  std::vector<const Record*> unexpected;
  for (const Record& rec : records) {
    ++by_status[rec.status];
    if (rec.status != 200 && rec.status != 409 && unexpected.size() < 3) unexpected.push_back(&rec);
    if (rec.status != 200) continue;
    const VersionConstraint& c = rec.constraint;
    for (auto [field, v] : {std::pair{"start", rec.start}, std::pair{"end", rec.end}}) {
      if (c.min_version && v < *c.min_version) {
        problems.push_back(absl::StrCat(field, " ", v, " below min_version ", *c.min_version, ": ",
                                        Describe(rec, t.began)));
      }
      if (c.exact_version && v != *c.exact_version) {
        problems.push_back(absl::StrCat(field, " ", v, " is not exact_version ", *c.exact_version,
                                        ": ", Describe(rec, t.began)));
      }
      if (v < 0 || v > rec.published_max) {
        problems.push_back(
            absl::StrCat(field, " ", v, " was never published: ", Describe(rec, t.began)));
      }
    }
    std::string host = rec.replica;
    for (const testing::HostSpec& h : Hosts()) {
      if (rec.replica == ReplicaUrl(h.name)) host = h.name;
    }
    ++served_by[host];
    if (host == "r3" && rec.sent > t.out_of_rotation && rec.start < t.pointer_at_restore) {
      problems.push_back(absl::StrCat("r3 served v", rec.start,
                                      " after it came back behind: ", Describe(rec, t.began)));
    }
    if (host == "r1" && rec.sent > t.left) {
      problems.push_back(
          absl::StrCat("r1 served a request sent after it left: ", Describe(rec, t.began)));
    }
  }
  const int ok = by_status.contains(200) ? by_status.at(200) : 0;
  if (ok < 20) problems.push_back(absl::StrCat("only ", ok, " rollouts succeeded"));
  if (!served_by.contains("r4")) problems.push_back("r4 never served a rollout after joining");
  std::map<int, int> others;
  for (const auto& [status, n] : by_status) {
    if (status != 200 && status != 409) others[status] = n;
  }
  if (!others.empty()) {
    std::vector<std::string> shown;
    shown.reserve(unexpected.size());
    for (const Record* r : unexpected) shown.push_back(Describe(*r, t.began));
    problems.push_back(absl::StrCat("answers other than 200 and 409: {",
                                    absl::StrJoin(others, ", ", absl::PairFormatter(": ")), "}; [",
                                    absl::StrJoin(shown, ", "), "]"));
  }

  std::vector<double> seconds;
  seconds.reserve(convergence.size());
  for (const Convergence& c : convergence) seconds.push_back(c.seconds);
  if (!seconds.empty()) {
    Log(absl::StrFormat(
        "convergence, publish to whole fleet (%d publishes): p50 %.2f s, p95 %.2f s, max %.2f s",
        seconds.size(), Median(seconds), Percentile(seconds, 95),
        *std::max_element(seconds.begin(), seconds.end())));
  }
  for (const Convergence& c : convergence) {
    Log(absl::StrFormat("  v%d %-5s %d replicas %.2f s", c.version, KindName(c.kind), c.fleet,
                        c.seconds));
  }
  std::vector<std::string> served;
  served.reserve(served_by.size());
  for (const auto& [host, n] : served_by) served.push_back(absl::StrCat("'", host, "': ", n));
  Log(absl::StrCat("rollouts: ", records.size(), " sent, {",
                   absl::StrJoin(by_status, ", ", absl::PairFormatter(": ")), "}; served by {",
                   absl::StrJoin(served, ", "), "}"));
  return problems;
}

// ---- the run ----

class MultihostTest : public ::testing::Test {
 protected:
  // Everything is removed here, while the interrupt handler still knows
  // about it: a signal during the removal finishes it rather than cutting
  // it short.
  ~MultihostTest() override {
    rollouts_.Stop().IgnoreError();
    fleet_.Close();
    net_.Destroy();
    work_.Remove();
  }

  // Publishes `version`; records the seconds from the publish's start until
  // every replica in rotation serves it, watched while the publish runs.
  absl::Status Publish(int64_t version) {
    rollouts_.SetPublishing(version);
    const std::vector<std::string> live = live_;
    HostThread<absl::StatusOr<std::map<std::string, double>>> watcher(
        net_.Namespace("trainer"), [live, version] { return WaitApplied(live, version); });
    const auto began = Clock::now();
    absl::StatusOr<std::string> published =
        fleet_.Stitch("trainer", {"publish", "--store", fleet_.store(), "--run-id", kRunId,
                                  "--pool", absl::StrCat("dns:", kName, ":", kSidecarPort),
                                  (work_.path() / "out" / VersionDirName(version)).string()});
    if (!published.ok()) return published.status();
    const double took = Seconds(Clock::now() - began);
    rollouts_.SetLatest(version);
    absl::StatusOr<std::map<std::string, double>> per_host = watcher.Join();
    if (!per_host.ok()) {
      return absl::DeadlineExceededError(
          absl::StrCat("v", version, " did not reach every replica of [", absl::StrJoin(live, ", "),
                       "]: ", per_host.status().message()));
    }
    double whole = 0;
    for (const auto& [host, s] : *per_host) whole = std::max(whole, s);
    const Kind kind = kinds_.at(version);
    convergence_.push_back({version, kind, live.size(), whole});
    Log(
        absl::StrFormat("published v%d (%s): the command took %.2f s; %d replicas serve it "
                        "%.2f s after it started",
                        version, KindName(kind), took, live.size(), whole));
    return absl::OkStatus();
  }

  // Calls `body` on a thread in the trainer's namespace.
  template <typename R>
  R OnTrainer(std::function<R()> body) {
    return CallInHost<R>(net_.Namespace("trainer"), std::move(body));
  }

  void RemoveLive(const std::string& host) { std::erase(live_, host); }

  // Declared in the order they are made (each interrupt cleanup right after
  // what it removes).
  WorkDir work_;
  CleanupOnInterrupt remove_work_{[this] { work_.Remove(); }};
  Network net_{kPrefix, kSubnet, Hosts(), ip_path};
  CleanupOnInterrupt remove_network_{[this] { net_.Destroy(); }};
  Fleet fleet_{net_, work_.path()};
  Rollouts rollouts_;

  std::map<int64_t, Kind> kinds_;
  std::vector<std::string> live_;  // the replicas in rotation
  std::vector<Convergence> convergence_;
};

TEST_F(MultihostTest, FleetAcrossHostsServesOnlyPublishedVersionsThatMeetEachConstraint) {
  absl::StatusOr<std::map<int64_t, Kind>> kinds = PrepareVersions(work_.path(), 12);
  ASSERT_THAT(kinds.status(), IsOk());
  kinds_ = *std::move(kinds);
  ASSERT_THAT(net_.Create(Address("dns")), IsOk());
  std::vector<std::string> hosts;
  for (const testing::HostSpec& h : Hosts()) hosts.push_back(h.name + " " + Address(h.name));
  Log(absl::StrCat(Hosts().size(), " hosts on ", kSubnet, ".0/24: ", absl::StrJoin(hosts, ", ")));
  ASSERT_THAT(fleet_.StartS3(), IsOk());
  ASSERT_THAT(fleet_
                  .Stitch("trainer", {"claim", "--store", fleet_.store(), "--run-id", kRunId,
                                      "--boot-version", "0"})
                  .status(),
              IsOk());
  ASSERT_THAT(fleet_.StartDns({"r1", "r2", "r3"}), IsOk());
  for (const char* host : {"r1", "r2", "r3"}) ASSERT_THAT(fleet_.StartReplica(host), IsOk());
  using PerHost = absl::StatusOr<std::map<std::string, double>>;
  ASSERT_THAT(OnTrainer<PerHost>([] {
                return WaitApplied({"r1", "r2", "r3"}, 0);
              }).status(),
              IsOk());
  ASSERT_THAT(fleet_.StartGateway(), IsOk());
  ASSERT_THAT(OnTrainer<absl::Status>([] {
                return WaitGateway(
                    [](const auto& rs) {
                      return InRotation(rs, "r1") && InRotation(rs, "r2") && InRotation(rs, "r3");
                    },
                    "saw three ready replicas");
              }),
              IsOk());

  Timeline timeline;
  timeline.began = Clock::now();
  rollouts_.Start(net_.Namespace("trainer"), 3);
  live_ = {"r1", "r2", "r3"};
  for (int64_t v : {1, 2, 3}) ASSERT_THAT(Publish(v), IsOk());

  // r3 is cut off while two versions are published, then comes back.
  ASSERT_THAT(net_.SetLink("r3", LinkState::kDown), IsOk());
  RemoveLive("r3");
  ASSERT_THAT(OnTrainer<absl::Status>([] {
                return WaitGateway([](const auto& rs) { return !InRotation(rs, "r3"); },
                                   "took the cut-off r3 out of rotation");
              }),
              IsOk());
  // From here on a request can reach r3 only after it comes back.
  timeline.out_of_rotation = Clock::now();
  Log("r3 cut off (link down)");
  ASSERT_THAT(Publish(4), IsOk());
  ASSERT_THAT(Publish(5), IsOk());
  timeline.pointer_at_restore = 5;
  ASSERT_THAT(net_.SetLink("r3", LinkState::kUp), IsOk());
  PerHost caught_up = OnTrainer<PerHost>(
      [pointer = timeline.pointer_at_restore] { return WaitApplied({"r3"}, pointer); });
  ASSERT_THAT(caught_up.status(), IsOk());
  live_.push_back("r3");
  Log(absl::StrFormat("r3 restored; caught up to v%d %.2f s later", timeline.pointer_at_restore,
                      caught_up->at("r3")));

  // r4 joins: its address appears in DNS once it serves the pointer.
  ASSERT_THAT(fleet_.StartReplica("r4"), IsOk());
  ASSERT_THAT(OnTrainer<PerHost>([pointer = timeline.pointer_at_restore] {
                return WaitApplied({"r4"}, pointer);
              }).status(),
              IsOk());
  ASSERT_THAT(fleet_.SetDns({"r1", "r2", "r3", "r4"}), IsOk());
  ASSERT_THAT(OnTrainer<absl::Status>([] {
                return WaitGateway([](const auto& rs) { return InRotation(rs, "r4"); }, "added r4");
              }),
              IsOk());
  live_.push_back("r4");
  Log("r4 joined through DNS");
  for (int64_t v : {6, 7, 8}) ASSERT_THAT(Publish(v), IsOk());

  // r1 leaves: its address leaves DNS, then it stops.
  ASSERT_THAT(fleet_.SetDns({"r2", "r3", "r4"}), IsOk());
  ASSERT_THAT(OnTrainer<absl::Status>([] {
                return WaitGateway([](const auto& rs) { return !Listed(rs, "r1"); }, "dropped r1");
              }),
              IsOk());
  RemoveLive("r1");
  timeline.left = Clock::now();
  fleet_.StopReplica("r1");
  Log("r1 left through DNS");
  for (int64_t v : {9, 10, 11, 12}) ASSERT_THAT(Publish(v), IsOk());

  ASSERT_THAT(rollouts_.Stop(), IsOk());
  std::vector<std::string> problems = Check(rollouts_.records(), convergence_, timeline);
  for (size_t i = 0; i < problems.size() && i < 20; ++i) Log("FAIL: " + problems[i]);
  EXPECT_TRUE(problems.empty()) << problems.size() << " problem(s): the FAIL lines above";
  if (problems.empty()) {
    Log("every response satisfied its constraint and named only published versions");
  }
}

}  // namespace
}  // namespace stitch

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--keep") {
      stitch::keep_work = true;
    } else {
      std::cerr << "multihost: unknown argument " << argv[i]
                << "; usage: multihost_netns_test [--keep] [--gtest_...]" << std::endl;
      return 2;
    }
  }
  if (::geteuid() != 0) {
    std::cerr << "multihost: needs root (network namespaces): run it as root, as CI does "
                 "(sudo make test-multihost)"
              << std::endl;
    return 1;
  }
  for (auto [tool, path] :
       {std::pair{"ip", &stitch::ip_path}, std::pair{"dnsmasq", &stitch::dnsmasq_path},
        std::pair{"getent", &stitch::getent_path}}) {
    *path = stitch::testing::FindProgram(tool);
    if (path->empty()) {
      std::cerr << "multihost: " << tool << " is missing: run scripts/install-deps" << std::endl;
      return 1;
    }
  }
  // The binary and the source tree of this build, unless the environment
  // names others.
  ::setenv("STITCH_BIN", STITCH_BIN_DEFAULT, 0);
  ::setenv("STITCH_SOURCE_DIR", STITCH_SOURCE_DIR_DEFAULT, 0);
  if (::access(stitch::testing::StitchBinary().c_str(), X_OK) != 0) {
    std::cerr << "multihost: " << stitch::testing::StitchBinary()
              << " is not an executable: build it first (make build)" << std::endl;
    return 1;
  }
  stitch::InstallInterruptHandlers();
  stitch::testing::RemoveStaleNetworks(stitch::kPrefix, "multihost_netns_test", stitch::Log);
  const auto began = stitch::Clock::now();
  const int rc = RUN_ALL_TESTS();
  stitch::Log(absl::StrFormat("done in %.0f s; namespaces and processes removed",
                              stitch::Seconds(stitch::Clock::now() - began)));
  return rc;
}
