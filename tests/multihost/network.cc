#include "tests/multihost/network.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/support/subprocess.h"

namespace stitch::testing {
namespace {

namespace fs = std::filesystem;

constexpr auto kIpTimeout = std::chrono::seconds(30);
constexpr auto kKillGrace = std::chrono::seconds(5);
// How often a namespace is checked for processes still in it; there is no
// event to wait on for that.
constexpr auto kPoll = std::chrono::milliseconds(20);

std::vector<std::string> Words(const std::string& text) {
  return absl::StrSplit(text, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

std::vector<int> NamespacePids(const std::string& ip, const std::string& ns) {
  ProcessResult r = RunProcess({ip, "netns", "pids", ns}, kIpTimeout);
  std::vector<int> pids;
  for (const std::string& w : Words(r.out)) pids.push_back(std::atoi(w.c_str()));
  return pids;
}

// SIGTERM to everything in `ns`, then SIGKILL to what is left, each followed
// by a bounded wait for the namespace to empty.
void KillNamespaceProcesses(const std::string& ip, const std::string& ns) {
  for (int sig : {SIGTERM, SIGKILL}) {
    std::vector<int> pids = NamespacePids(ip, ns);
    if (pids.empty()) return;
    for (int pid : pids) {
      if (pid > 0) ::kill(pid, sig);
    }
    const auto deadline = std::chrono::steady_clock::now() + kKillGrace;
    while (std::chrono::steady_clock::now() < deadline) {
      if (NamespacePids(ip, ns).empty()) return;
      std::this_thread::sleep_for(kPoll);
    }
  }
}

void DeleteNamespace(const std::string& ip, const std::string& ns) {
  KillNamespaceProcesses(ip, ns);
  RunProcess({ip, "netns", "del", ns}, kIpTimeout);
  std::error_code ignored;
  fs::remove_all(fs::path("/etc/netns") / ns, ignored);
}

// Whether `pid` is a live (not zombie) process whose command line contains
// `process_name`.
bool RunAlive(int pid, const std::string& process_name) {
  std::ifstream stat_file("/proc/" + std::to_string(pid) + "/stat");
  std::ifstream cmdline_file("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  if (!stat_file || !cmdline_file) return false;
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  std::string cmdline((std::istreambuf_iterator<char>(cmdline_file)),
                      std::istreambuf_iterator<char>());
  // The state follows the command name, which may itself hold ") ".
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return false;
  std::vector<std::string> rest = Words(stat.substr(close + 1));
  return !rest.empty() && rest[0] != "Z" && cmdline.find(process_name) != std::string::npos;
}

}  // namespace

std::string FindProgram(const std::string& program) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path == nullptr ? "" : path, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", program);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

void RemoveStaleNetworks(const std::string& prefix, const std::string& process_name,
                         const std::function<void(const std::string&)>& log) {
  const std::string ip = FindProgram("ip");
  const std::regex run_name("^" + prefix + R"(-(\d+)-)");
  std::smatch m;
  for (const std::string& line : Lines(RunProcess({ip, "netns", "list"}, kIpTimeout).out)) {
    std::vector<std::string> words = Words(line);
    if (words.empty()) continue;
    const std::string& ns = words[0];
    if (std::regex_search(ns, m, run_name) && !RunAlive(std::stoi(m[1]), process_name)) {
      log("removing stale namespace " + ns);
      DeleteNamespace(ip, ns);
    }
  }
  // A veth pair of a run killed while it set up a host, not yet moved into
  // the namespaces.
  const std::regex link(R"(^\d+: (sx(\d+)[a-z]\d+[ab])[@:])");
  for (const std::string& line : Lines(RunProcess({ip, "-o", "link", "show"}, kIpTimeout).out)) {
    if (std::regex_search(line, m, link) && !RunAlive(std::stoi(m[2]), process_name)) {
      RunProcess({ip, "link", "del", m[1]}, kIpTimeout);
    }
  }
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator("/etc/netns", ec)) {
    const std::string name = e.path().filename().string();
    if (std::regex_search(name, m, run_name) && !RunAlive(std::stoi(m[1]), process_name)) {
      std::error_code ignored;
      fs::remove_all(e.path(), ignored);
    }
  }
}

absl::Status EnterNetworkNamespace(const std::string& ns) {
  const std::string path = "/run/netns/" + ns;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return absl::UnavailableError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  int rc = ::setns(fd, CLONE_NEWNET);
  int error = errno;
  ::close(fd);
  if (rc != 0)
    return absl::UnavailableError(absl::StrCat("setns ", ns, ": ", std::strerror(error)));
  return absl::OkStatus();
}

Network::Network(std::string prefix, std::string subnet, std::vector<HostSpec> hosts,
                 std::string ip_path)
    : prefix_(std::move(prefix)),
      subnet_(std::move(subnet)),
      hosts_(std::move(hosts)),
      ip_(std::move(ip_path)),
      run_(std::to_string(::getpid())),
      switch_(absl::StrCat(prefix_, "-", run_, "-net")) {}

absl::Status Network::Create(const std::string& nameserver) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = AddNamespace(switch_); !s.ok()) return s;
  if (absl::Status s = Ip({"netns", "exec", switch_, ip_, "link", "add", "br0", "type", "bridge"});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Ip({"netns", "exec", switch_, ip_, "link", "set", "br0", "up"}); !s.ok()) {
    return s;
  }
  for (const HostSpec& host : hosts_) {
    if (absl::Status s = AddHost(host, nameserver); !s.ok()) return s;
  }
  return absl::OkStatus();
}

Network::~Network() { Destroy(); }

const HostSpec& Network::Host(const std::string& name) const {
  for (const HostSpec& h : hosts_) {
    if (h.name == name) return h;
  }
  std::abort();  // a host the test never declared: a bug in the test
}

std::string Network::Namespace(const std::string& host) const {
  return absl::StrCat(prefix_, "-", run_, "-", Host(host).name);
}

std::string Network::Address(const std::string& host) const {
  return absl::StrCat(subnet_, ".", Host(host).octet);
}

std::vector<std::string> Network::InHost(const std::string& host,
                                         std::vector<std::string> argv) const {
  argv.insert(argv.begin(), {ip_, "netns", "exec", Namespace(host)});
  return argv;
}

absl::Status Network::Ip(std::vector<std::string> args) const {
  args.insert(args.begin(), ip_);
  ProcessResult r = RunProcess(args, kIpTimeout);
  if (r.exit_code != 0) {
    return absl::InternalError(
        absl::StrCat(absl::StrJoin(args, " "), " failed (", r.exit_code, "): ", r.err));
  }
  return absl::OkStatus();
}

absl::Status Network::AddNamespace(const std::string& ns) {
  if (destroyed_) return absl::FailedPreconditionError("the network was removed");
  if (absl::Status s = Ip({"netns", "add", ns}); !s.ok()) return s;
  namespaces_.push_back(ns);
  return Ip({"netns", "exec", ns, ip_, "link", "set", "lo", "up"});
}

absl::Status Network::AddHost(const HostSpec& host, const std::string& nameserver) {
  const std::string ns = Namespace(host.name);
  if (absl::Status s = AddNamespace(ns); !s.ok()) return s;
  const std::string inner = absl::StrCat("sx", run_, "p", host.octet, "a");
  const std::string outer = absl::StrCat("sx", run_, "p", host.octet, "b");
  const std::vector<std::vector<std::string>> steps = {
      {"link", "add", inner, "type", "veth", "peer", "name", outer},
      {"link", "set", inner, "netns", ns},
      {"link", "set", outer, "netns", switch_},
      {"netns", "exec", ns, ip_, "link", "set", inner, "name", "eth0"},
      {"netns", "exec", ns, ip_, "addr", "add", Address(host.name) + "/24", "dev", "eth0"},
      {"netns", "exec", ns, ip_, "link", "set", "eth0", "up"},
      {"netns", "exec", switch_, ip_, "link", "set", outer, "master", "br0"},
      {"netns", "exec", switch_, ip_, "link", "set", outer, "up"},
  };
  for (const std::vector<std::string>& step : steps) {
    if (absl::Status s = Ip(step); !s.ok()) return s;
  }
  // The resolver of every process of this host: `ip netns exec` mounts
  // /etc/netns/<ns>/resolv.conf over /etc/resolv.conf.
  std::error_code ec;
  fs::create_directories(fs::path("/etc/netns") / ns, ec);
  std::ofstream resolv(fs::path("/etc/netns") / ns / "resolv.conf");
  resolv << "nameserver " << nameserver << "\noptions timeout:1 attempts:2\n";
  resolv.close();
  if (ec || !resolv) {
    return absl::InternalError(absl::StrCat("cannot write /etc/netns/", ns, "/resolv.conf"));
  }
  return absl::OkStatus();
}

absl::Status Network::Start(const std::function<void()>& start) {
  absl::MutexLock lock(&mu_);
  if (destroyed_) return absl::FailedPreconditionError("the network was removed");
  start();
  return absl::OkStatus();
}

absl::Status Network::SetLink(const std::string& host, LinkState state) {
  absl::MutexLock lock(&mu_);
  if (destroyed_) return absl::FailedPreconditionError("the network was removed");
  return Ip({"netns", "exec", switch_, ip_, "link", "set",
             absl::StrCat("sx", run_, "p", Host(host).octet, "b"),
             state == LinkState::kUp ? "up" : "down"});
}

void Network::Destroy() {
  absl::MutexLock lock(&mu_);
  destroyed_ = true;
  // Hosts first, the switch last: the reverse of creation.
  for (auto it = namespaces_.rbegin(); it != namespaces_.rend(); ++it) DeleteNamespace(ip_, *it);
  namespaces_.clear();
}

}  // namespace stitch::testing
