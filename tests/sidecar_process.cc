#include "tests/sidecar_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <regex>

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
      std::lock_guard<std::mutex> lock(mu_);
      (i == 0 ? out_ : err_).append(buf, static_cast<size_t>(n));
      cv_.notify_all();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  drained_ = true;
  cv_.notify_all();
}

std::optional<std::string> ServerProcess::WaitForUrl(std::chrono::milliseconds timeout) {
  static const std::regex kUrl(R"(http://[A-Za-z0-9.\[\]:-]+:[0-9]+)");
  std::unique_lock<std::mutex> lock(mu_);
  std::optional<std::string> url;
  cv_.wait_for(lock, timeout, [&] {
    std::smatch m;
    if (std::regex_search(out_, m, kUrl)) {
      url = m.str(0);
      return true;
    }
    return drained_;
  });
  return url;
}

bool ServerProcess::WaitForOutput(const std::string& text, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  bool found = false;
  cv_.wait_for(lock, timeout, [&] {
    found = out_.find(text) != std::string::npos;
    return found || drained_;
  });
  return found;
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
      return exit_code_;
    }
    if (r < 0 && errno != EINTR) return std::nullopt;
    if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
    // Nothing to wait on but the child itself: poll its state briefly.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string ServerProcess::out() const {
  std::lock_guard<std::mutex> lock(mu_);
  return out_;
}

std::string ServerProcess::err() const {
  std::lock_guard<std::mutex> lock(mu_);
  return err_;
}

}  // namespace stitch::testing
