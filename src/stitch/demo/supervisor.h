// The process supervisor of `stitch demo` and `stitch chaos`: it starts the
// fleet's processes (`stitch engine`, `stitch sidecar`, `stitch gateway`,
// run from this very binary, and other programs such as an S3 server),
// watches them, signals one on request, and stops them all at the end.
//
// Each child runs /proc/self/exe (or the program given) with the given
// arguments, in its own process
// group (so a terminal's Ctrl-C reaches only the supervisor, which then stops
// the children in order), with stdin from /dev/null and stdout and stderr
// appended to its log file, and with every other descriptor closed. The
// kernel sends each child SIGKILL if the supervisor dies (PR_SET_PDEATHSIG):
// a demo that is killed outright leaves no fleet behind. Because that signal
// follows the thread that forked, every fork happens on one thread the
// supervisor owns for its whole life.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace stitch {

class ProcessSupervisor {
 public:
  // Children run `program` (tests run a shell instead of `stitch`). Messages
  // start with `who` ("demo: ...").
  explicit ProcessSupervisor(std::string program = "/proc/self/exe", std::string who = "demo");
  // StopAll(), then ends the spawning thread.
  ~ProcessSupervisor();
  ProcessSupervisor(const ProcessSupervisor&) = delete;
  ProcessSupervisor& operator=(const ProcessSupervisor&) = delete;

  // Starts `<program> <args...>` (argv[0] "stitch") as `name` (for messages), logging to `log`
  // (created or truncated). Returns the child's pid. Internal error when the
  // log cannot be opened or fork fails.
  [[nodiscard]] absl::StatusOr<int> Start(const std::string& name,
                                          const std::vector<std::string>& args,
                                          const std::filesystem::path& log);
  // The same for another program (an absolute path, also its argv[0]).
  [[nodiscard]] absl::StatusOr<int> StartProgram(const std::string& name,
                                                 const std::string& program,
                                                 const std::vector<std::string>& args,
                                                 const std::filesystem::path& log);

  // The URL the child announces in its log ("... on http://HOST:PORT"),
  // waiting until it appears. FailedPrecondition (with the exit status and
  // the log's path) when the child exits first, DeadlineExceeded after
  // `timeout`, Cancelled when `cancel` becomes true.
  [[nodiscard]] absl::StatusOr<std::string> WaitForUrl(int pid, std::chrono::milliseconds timeout,
                                                       const std::atomic<bool>* cancel);

  // Waits for the child to exit and returns its exit status (128 + signal
  // when a signal ended it). DeadlineExceeded after `timeout`.
  [[nodiscard]] absl::StatusOr<int> WaitForExit(int pid, std::chrono::milliseconds timeout);

  // The exit status if the child has ended (reaping it), else nullopt.
  std::optional<int> ExitStatus(int pid);

  // Sends `signal` to the child's process group.
  void Signal(int pid, int signal);

  // SIGTERM to every running child, newest first, then up to `grace` for
  // them to exit; SIGKILL to whatever remains. Reaps them all.
  void StopAll(std::chrono::milliseconds grace);

 private:
  struct Child {
    std::string name;
    std::filesystem::path log;
    std::optional<int> exit_status;
  };
  struct SpawnJob {
    std::string program;  // empty: program_
    std::vector<std::string> args;
    int log_fd = -1;
    std::optional<absl::StatusOr<int>> result;
  };

  void SpawnLoop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<int> Reap(int pid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string program_;
  const std::string who_;
  absl::Mutex mu_;
  std::map<int, Child> children_ ABSL_GUARDED_BY(mu_);
  std::vector<int> order_ ABSL_GUARDED_BY(mu_);  // pids, oldest first
  std::deque<SpawnJob*> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread spawner_;
};

}  // namespace stitch
