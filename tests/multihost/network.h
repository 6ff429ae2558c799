// Hosts on one machine for the multi-host test: each host a Linux network
// namespace with one interface, joined by veth pairs to a bridge in a switch
// namespace. Needs root.
//
// Names carry the pid of the test process that made them
// ("<prefix>-<pid>-<host>", links "sx<pid>p<octet>{a,b}"), so that a later
// run can tell the leftovers of a run killed outright (SIGKILL) from those of
// a run still going, and remove them (RemoveStaleNetworks).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace stitch::testing {

struct HostSpec {
  std::string name;  // "s3", "r1": part of the namespace's name
  int octet = 0;     // the host's address is "<subnet>.<octet>"
};

enum class LinkState { kUp, kDown };

// The path of `program` found on $PATH, or "" when it is not there.
std::string FindProgram(const std::string& program);

// Removes the namespaces, links and resolver files (/etc/netns/<ns>) named
// after `prefix` whose run (the pid in the name) is no longer a live process
// whose command line contains `process_name`. Logs each namespace removed
// through `log`.
void RemoveStaleNetworks(const std::string& prefix, const std::string& process_name,
                         const std::function<void(const std::string&)>& log);

// Moves the calling thread into network namespace `ns`: the sockets it opens
// from then on live there. Network namespaces belong to a thread, not to the
// process, so only a thread made for that purpose should call it, and it
// should never return to other work.
[[nodiscard]] absl::Status EnterNetworkNamespace(const std::string& ns);

// The hosts of one run. Thread-safe: Destroy() may run on a signal-handling
// thread while the test thread starts processes (Start() then waits, or
// refuses once Destroy() has begun).
class Network {
 public:
  // Hosts of `hosts` on `subnet` ("10.213.0"), made by Create(), with `ip`
  // at `ip_path`. Makes nothing yet.
  Network(std::string prefix, std::string subnet, std::vector<HostSpec> hosts, std::string ip_path);
  // Destroy().
  ~Network();

  // Makes the switch and every host, with /etc/netns/<ns>/resolv.conf naming
  // `nameserver` so that every process started in a host (`ip netns exec`
  // mounts that file) resolves through it. What was made before a failure
  // stays until Destroy(). REQUIRES: root; called once.
  [[nodiscard]] absl::Status Create(const std::string& nameserver) ABSL_LOCKS_EXCLUDED(mu_);

  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  // The namespace of `host`, and its address. REQUIRES: `host` is one of
  // the hosts given to Create().
  std::string Namespace(const std::string& host) const;
  std::string Address(const std::string& host) const;

  // `argv` as run in `host`: {"<ip>", "netns", "exec", ns, argv...}. `ip
  // netns exec` execs it in place, so the pid started is the program's.
  std::vector<std::string> InHost(const std::string& host, std::vector<std::string> argv) const;

  // Calls `start` (which starts a process in one of the hosts) while holding
  // off Destroy(), so that no process starts in a namespace after its
  // processes were killed. FailedPrecondition (nothing called) once
  // Destroy() has begun.
  [[nodiscard]] absl::Status Start(const std::function<void()>& start) ABSL_LOCKS_EXCLUDED(mu_);

  // Sets the link of `host` on the bridge up or down (the host is cut off
  // while it is down).
  [[nodiscard]] absl::Status SetLink(const std::string& host, LinkState state)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Ends every process in the namespaces (SIGTERM, then SIGKILL, bounded),
  // deletes them with their links and resolver files. Idempotent.
  void Destroy() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const HostSpec& Host(const std::string& name) const;
  [[nodiscard]] absl::Status Ip(std::vector<std::string> args) const;
  [[nodiscard]] absl::Status AddNamespace(const std::string& ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status AddHost(const HostSpec& host, const std::string& nameserver)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string prefix_;
  const std::string subnet_;
  const std::vector<HostSpec> hosts_;
  const std::string ip_;
  const std::string run_;  // this process's pid, in every name
  const std::string switch_;

  absl::Mutex mu_;
  std::vector<std::string> namespaces_ ABSL_GUARDED_BY(mu_);  // in order of creation
  bool destroyed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace stitch::testing
