#include "tests/support/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace stitch::testing {

RunningProcess StartProcess(const std::vector<std::string>& argv) {
  int out[2];
  int err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return {};
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return {};
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    return {};
  }
  return RunningProcess{pid, out[0], err[0]};
}

ProcessResult WaitProcess(RunningProcess process,
                          std::optional<std::chrono::milliseconds> timeout) {
  ProcessResult result;
  if (process.pid < 0) {
    result.exit_code = 127;
    result.err = "could not start the process";
    return result;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout.value_or(std::chrono::hours(0));
  bool timed_out = false;
  // Milliseconds left until the deadline; at the deadline, the process is
  // killed (rather than waited on) and 0 is returned.
  auto left_ms = [&]() -> int {
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() > 0) return static_cast<int>(left.count());
    ::kill(process.pid, SIGKILL);
    timed_out = true;
    return 0;
  };
  // Drain both pipes together so that a chatty child never blocks on a full
  // one while we wait on the other.
  pollfd fds[2] = {{process.out_fd, POLLIN, 0}, {process.err_fd, POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open = 2;
  char buf[4096];
  while (open > 0) {
    int wait_ms = -1;
    if (timeout.has_value()) {
      // Once killed, its pipes are not drained any further, since a child
      // of its own might hold them open.
      wait_ms = left_ms();
      if (timed_out) break;
    }
    int ready = ::poll(fds, 2, wait_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      } else {
        sinks[i]->append(buf, static_cast<size_t>(n));
      }
    }
  }
  for (pollfd& p : fds) {
    if (p.fd >= 0) ::close(p.fd);
  }
  if (timeout.has_value() && !timed_out) {
    // Both pipes closed, but the process may still run: its exit makes its
    // pidfd readable.
    int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, process.pid, 0));
    while (pidfd >= 0) {
      const int wait = left_ms();
      if (timed_out) break;
      pollfd p{pidfd, POLLIN, 0};
      if (::poll(&p, 1, wait) > 0) break;
    }
    if (pidfd >= 0) ::close(pidfd);
  }
  int status = 0;
  while (::waitpid(process.pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  if (timed_out) {
    result.err += "\n(killed: still running after " + std::to_string(timeout->count()) + " ms)\n";
  }
  return result;
}

ProcessResult RunProcess(const std::vector<std::string>& argv,
                         std::optional<std::chrono::milliseconds> timeout) {
  return WaitProcess(StartProcess(argv), timeout);
}

std::string StitchBinary() {
  const char* bin = std::getenv("STITCH_BIN");
  return bin == nullptr ? std::string() : std::string(bin);
}

ProcessResult RunStitch(std::vector<std::string> args) {
  args.insert(args.begin(), StitchBinary());
  return RunProcess(args);
}

}  // namespace stitch::testing
