#include "tests/sidecar_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <regex>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tests/support/subprocess.h"

namespace stitch::testing {

ServerProcess::ServerProcess(std::vector<std::string> argv)
    : name_(argv.size() > 1 ? argv[1] : std::string()) {
  RunningProcess p = StartProcess(argv);
  pid_ = p.pid;
  if (pid_ <= 0) return;
  drain_ = std::thread([this, p] { Drain(p.out_fd, p.err_fd); });
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !exit_code_.has_value()) {
    ::kill(pid_, SIGKILL);
    WaitForExit(std::chrono::seconds(30));
  }
  if (drain_.joinable()) drain_.join();
}

void ServerProcess::Drain(int out_fd, int err_fd) {
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  int open = 2;
  char buf[4096];
  while (open > 0) {
    if (::poll(fds, 2, -1) < 0) {
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
        continue;
      }
      absl::MutexLock lock(&mu_);
      (i == 0 ? out_ : err_).append(buf, static_cast<size_t>(n));
      output_.SignalAll();
    }
  }
  absl::MutexLock lock(&mu_);
  drained_ = true;
  output_.SignalAll();
}

std::optional<std::string> ServerProcess::WaitForUrl(std::chrono::milliseconds timeout) {
  static const std::regex kUrl(R"(http://[A-Za-z0-9.\[\]:-]+:[0-9]+)");
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  absl::MutexLock lock(&mu_);
  for (bool timed_out = false;; timed_out = output_.WaitWithDeadline(&mu_, deadline)) {
    std::smatch m;
    if (std::regex_search(out_, m, kUrl)) return m.str(0);
    if (drained_ || timed_out) return std::nullopt;
  }
}

bool ServerProcess::WaitForOutput(const std::string& text, std::chrono::milliseconds timeout) {
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  absl::MutexLock lock(&mu_);
  for (bool timed_out = false;; timed_out = output_.WaitWithDeadline(&mu_, deadline)) {
    if (out_.find(text) != std::string::npos) return true;
    if (drained_ || timed_out) return false;
  }
}

void ServerProcess::Signal(int signal) {
  if (pid_ > 0 && !exit_code_.has_value()) ::kill(pid_, signal);
}

std::optional<int> ServerProcess::WaitForExit(std::chrono::milliseconds timeout) {
  if (exit_code_.has_value()) return exit_code_;
  if (pid_ <= 0) return std::nullopt;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      // What it wrote before exiting is read before its exit is reported, so
      // that out() and err() hold all of it.
      const absl::Time drained_by =
          absl::Now() + absl::FromChrono(deadline - std::chrono::steady_clock::now());
      absl::MutexLock lock(&mu_);
      while (!drained_ && !output_.WaitWithDeadline(&mu_, drained_by)) {
      }
      return exit_code_;
    }
    if (r < 0 && errno != EINTR) return std::nullopt;
    if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
    // Nothing to wait on but the child itself: poll its state briefly.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string ServerProcess::out() const {
  absl::MutexLock lock(&mu_);
  return out_;
}

std::string ServerProcess::err() const {
  absl::MutexLock lock(&mu_);
  return err_;
}

}  // namespace stitch::testing
