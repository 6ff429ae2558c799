#include "stitch/demo/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace stitch {
namespace {

constexpr auto kPollEvery = std::chrono::milliseconds(20);

int StatusCode(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

std::string Describe(int exit_status) {
  if (exit_status > 128) return absl::StrCat("was killed by signal ", exit_status - 128);
  return absl::StrCat("exited with status ", exit_status);
}

// The first "on http://HOST:PORT" in `text`: how the engine, the sidecar and
// the gateway announce where they listen.
std::optional<std::string> AnnouncedUrl(const std::string& text) {
  const std::string marker = "on http://";
  const size_t at = text.find(marker);
  if (at == std::string::npos) return std::nullopt;
  const size_t begin = at + 3;
  size_t end = begin + 7;
  while (end < text.size() && text[end] != ' ' && text[end] != '\n' && text[end] != ')' &&
         text[end] != '/') {
    ++end;
  }
  // Only a complete line counts: the port may still be arriving.
  if (end >= text.size()) return std::nullopt;
  return text.substr(begin, end - begin);
}

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

ProcessSupervisor::ProcessSupervisor(std::string program, std::string who)
    : program_(std::move(program)), who_(std::move(who)), spawner_([this] { SpawnLoop(); }) {}

ProcessSupervisor::~ProcessSupervisor() {
  StopAll(std::chrono::seconds(5));
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  spawner_.join();
}

bool ProcessSupervisor::HasWorkOrStopping() const { return stopping_ || !jobs_.empty(); }

void ProcessSupervisor::SpawnLoop() {
  const pid_t parent = ::getpid();
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(this, &ProcessSupervisor::HasWorkOrStopping));
    if (jobs_.empty()) return;
    SpawnJob* job = jobs_.front();
    jobs_.pop_front();
    // Everything the child touches is prepared before fork: between fork and
    // exec it may only make async-signal-safe calls.
    std::vector<char*> argv;
    static char kArgv0[] = "stitch";
    argv.push_back(job->program.empty() ? kArgv0 : job->program.data());
    for (std::string& a : job->args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int log_fd = job->log_fd;
    const char* program = job->program.empty() ? program_.c_str() : job->program.c_str();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::setpgid(0, 0);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGPIPE, SIG_DFL);
      const int in = ::open("/dev/null", O_RDONLY);
      if (in < 0 || ::dup2(in, 0) < 0 || ::dup2(log_fd, 1) < 0 || ::dup2(log_fd, 2) < 0) {
        ::_exit(127);
      }
      ::syscall(SYS_close_range, 3U, ~0U, 0U);
      ::execv(program, argv.data());
      ::_exit(127);
    }
    if (pid < 0) {
      job->result = absl::InternalError(absl::StrCat(who_, ": fork: ", std::strerror(errno)));
    } else {
      // Also here, so that the group exists before anyone signals it.
      ::setpgid(pid, pid);
      job->result = static_cast<int>(pid);
    }
  }
}

absl::StatusOr<int> ProcessSupervisor::Start(const std::string& name,
                                             const std::vector<std::string>& args,
                                             const std::filesystem::path& log) {
  return StartProgram(name, "", args, log);
}

absl::StatusOr<int> ProcessSupervisor::StartProgram(const std::string& name,
                                                    const std::string& program,
                                                    const std::vector<std::string>& args,
                                                    const std::filesystem::path& log) {
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat(who_, ": cannot open ", log.string(), ": ", std::strerror(errno)));
  }
  SpawnJob job;
  job.program = program;
  job.args = args;
  job.log_fd = fd;
  absl::StatusOr<int> pid;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      ::close(fd);
      return absl::CancelledError(absl::StrCat(who_, ": the supervisor is stopping"));
    }
    jobs_.push_back(&job);
    mu_.Await(absl::Condition(
        +[](SpawnJob* j) { return j->result.has_value(); }, &job));
    pid = *job.result;
    if (pid.ok()) {
      children_[*pid] = Child{name, log, std::nullopt};
      order_.push_back(*pid);
    }
  }
  ::close(fd);
  return pid;
}

std::optional<int> ProcessSupervisor::Reap(int pid) {
  auto it = children_.find(pid);
  if (it == children_.end()) return std::nullopt;
  if (it->second.exit_status.has_value()) return it->second.exit_status;
  int status = 0;
  pid_t r = ::waitpid(pid, &status, WNOHANG);
  while (r < 0 && errno == EINTR) r = ::waitpid(pid, &status, WNOHANG);
  if (r == pid) it->second.exit_status = StatusCode(status);
  return it->second.exit_status;
}

std::optional<int> ProcessSupervisor::ExitStatus(int pid) {
  absl::MutexLock lock(&mu_);
  return Reap(pid);
}

absl::StatusOr<std::string> ProcessSupervisor::WaitForUrl(int pid,
                                                          std::chrono::milliseconds timeout,
                                                          const std::atomic<bool>* cancel) {
  std::filesystem::path log;
  std::string name;
  {
    absl::MutexLock lock(&mu_);
    auto it = children_.find(pid);
    if (it == children_.end()) return absl::NotFoundError(absl::StrCat(who_, ": no such child"));
    log = it->second.log;
    name = it->second.name;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (std::optional<std::string> url = AnnouncedUrl(ReadAll(log)); url.has_value()) return *url;
    if (std::optional<int> status = ExitStatus(pid); status.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(who_, ": ", name, " ", Describe(*status),
                                                        " before listening; see ", log.string()));
    }
    if (cancel != nullptr && cancel->load())
      return absl::CancelledError(absl::StrCat(who_, ": interrupted"));
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(who_, ": ", name, " did not announce its URL within ",
                       std::chrono::duration_cast<std::chrono::seconds>(timeout).count(),
                       " s; see ", log.string()));
    }
    std::this_thread::sleep_for(kPollEvery);
  }
}

absl::StatusOr<int> ProcessSupervisor::WaitForExit(int pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (std::optional<int> status = ExitStatus(pid); status.has_value()) return *status;
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(who_, ": process ", pid, " still runs"));
    }
    std::this_thread::sleep_for(kPollEvery);
  }
}

void ProcessSupervisor::Signal(int pid, int signal) {
  absl::MutexLock lock(&mu_);
  if (Reap(pid).has_value()) return;
  ::kill(-pid, signal);
}

void ProcessSupervisor::StopAll(std::chrono::milliseconds grace) {
  {
    absl::MutexLock lock(&mu_);
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      if (!Reap(*it).has_value()) ::kill(-*it, SIGTERM);
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (;;) {
    bool running = false;
    {
      absl::MutexLock lock(&mu_);
      for (int pid : order_) running |= !Reap(pid).has_value();
    }
    if (!running || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(kPollEvery);
  }
  absl::MutexLock lock(&mu_);
  for (int pid : order_) {
    if (Reap(pid).has_value()) continue;
    ::kill(-pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    children_[pid].exit_status = StatusCode(status);
  }
}

}  // namespace stitch
