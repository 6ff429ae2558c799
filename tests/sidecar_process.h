// A long-running process for the sidecar's integration tests (`stitch
// engine`, `stitch sidecar`): started with its output drained by a thread
// (so that it never blocks on a full pipe), its announced URL read from
// stdout, stopped or killed by the test.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace stitch::testing {

class ServerProcess {
 public:
  // Starts `argv` (argv[0] is a path). started() says whether it did.
  explicit ServerProcess(std::vector<std::string> argv);
  // Kills the process (SIGKILL) if it still runs, and reaps it.
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  bool started() const { return pid_ > 0; }
  int pid() const { return pid_; }

  // The first "http://127.0.0.1:<port>" (or other host) the process prints
  // on stdout, waiting up to `timeout`; nullopt if it exits or the time
  // passes first.
  std::optional<std::string> WaitForUrl(std::chrono::milliseconds timeout);

  // Whether the process prints `text` on stdout within `timeout`; false if
  // it exits or the time passes first.
  bool WaitForOutput(const std::string& text, std::chrono::milliseconds timeout);

  // Sends `signal`.
  void Signal(int signal);

  // Waits up to `timeout` for the process to exit, and for what it printed
  // to be read; its exit code (128 + signal when killed), or nullopt when it
  // still runs.
  std::optional<int> WaitForExit(std::chrono::milliseconds timeout);

  // Everything printed so far.
  std::string out() const;
  std::string err() const;

 private:
  void Drain(int out_fd, int err_fd);

  int pid_ = -1;
  std::optional<int> exit_code_;
  mutable absl::Mutex mu_;
  absl::CondVar output_;  // more output, or the end of it
  std::string out_ ABSL_GUARDED_BY(mu_);
  std::string err_ ABSL_GUARDED_BY(mu_);
  bool drained_ ABSL_GUARDED_BY(mu_) = false;
  std::thread drain_;
  const std::string name_;
};

}  // namespace stitch::testing
