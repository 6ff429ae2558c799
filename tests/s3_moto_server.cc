#include "tests/s3_moto_server.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stitch/store/s3/s3_sigv4.h"
#include "stitch/store/s3/s3_uri.h"

namespace stitch::testing {
namespace {

namespace fs = std::filesystem;
namespace json = boost::json;

constexpr auto kStartDeadline = std::chrono::seconds(180);
constexpr auto kStopDeadline = std::chrono::seconds(20);

// Waits until `pid` exits or `deadline` passes; true when it exited (and
// was reaped).
bool WaitExit(int pid, std::chrono::steady_clock::time_point deadline) {
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  while (true) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      if (pidfd >= 0) ::close(pidfd);
      return true;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || pidfd < 0) break;
    // The pidfd becomes readable when the process exits.
    pollfd p{pidfd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(left.count()));
  }
  if (pidfd >= 0) ::close(pidfd);
  return false;
}

std::string StringField(const json::object& o, const char* name) {
  const json::value* v = o.if_contains(name);
  return v != nullptr && v->is_string() ? std::string(v->as_string()) : std::string();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MotoServer>> MotoServer::Start(const MotoServerOptions& options) {
  const char* source_dir = std::getenv("STITCH_SOURCE_DIR");
  if (source_dir == nullptr) {
    return absl::FailedPreconditionError("STITCH_SOURCE_DIR is not set; run the tests with ctest");
  }
  fs::path python = fs::path(source_dir) / ".venv/bin/python";
  fs::path moto = fs::path(source_dir) / ".venv/bin/moto_server";
  fs::path harness = fs::path(source_dir) / "tests/s3_moto.py";
  if (::access(python.c_str(), X_OK) != 0 || ::access(moto.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        moto.string(), " is missing: the S3 tests need the project's Python environment; run ",
        "scripts/install-deps (make test does)"));
  }
  std::vector<std::string> argv = options.launcher;
  for (std::string arg : {python.string(), harness.string(), std::string("--host"), options.host}) {
    argv.push_back(std::move(arg));
  }
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  int to_child[2];
  int from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    // Its own process group, so that stopping it stops moto_server too.
    ::setpgid(0, 0);
    ::dup2(to_child[0], STDIN_FILENO);
    ::dup2(from_child[1], STDOUT_FILENO);
    ::execv(args[0], args.data());
    std::_Exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  auto server = std::unique_ptr<MotoServer>(new MotoServer());
  server->pid_ = pid;
  server->stdin_fd_ = to_child[1];

  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + kStartDeadline;
  while (line.find('\n') == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{from_child[0], POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    char buffer[4096];
    ssize_t n = ::read(from_child[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    line.append(buffer, static_cast<size_t>(n));
  }
  ::close(from_child[0]);
  json::error_code ec;
  json::value v = json::parse(line, ec);
  if (ec || !v.is_object()) {
    return absl::UnavailableError(absl::StrCat(
        "the S3 test server did not start (see tests/s3_moto.py's messages above); it printed \"",
        line, "\""));
  }
  const json::object& o = v.as_object();
  server->endpoint_ = StringField(o, "endpoint");
  server->bucket_ = StringField(o, "bucket");
  server->region_ = StringField(o, "region");
  server->access_key_id_ = StringField(o, "access_key_id");
  server->secret_access_key_ = StringField(o, "secret_access_key");
  server->session_access_key_id_ = StringField(o, "session_access_key_id");
  server->session_secret_access_key_ = StringField(o, "session_secret_access_key");
  server->session_token_ = StringField(o, "session_token");
  return server;
}

MotoServer::~MotoServer() {
  // Closing its stdin asks the helper to stop the server and exit.
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  if (pid_ > 0 && !WaitExit(pid_, std::chrono::steady_clock::now() + kStopDeadline)) {
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

S3Environment MotoServer::Credentials() const {
  S3Environment env;
  env.access_key_id = access_key_id_;
  env.secret_access_key = secret_access_key_;
  env.region = region_;
  return env;
}

S3Environment MotoServer::SessionCredentials() const {
  S3Environment env;
  env.access_key_id = session_access_key_id_;
  env.secret_access_key = session_secret_access_key_;
  env.session_token = session_token_;
  env.region = region_;
  return env;
}

std::string MotoServer::Uri(const std::string& prefix) const {
  return absl::StrCat("s3://", bucket_, "/", prefix,
                      "?endpoint=", SigV4Encode(endpoint_, SlashEncoding::kEncode));
}

std::string UniquePrefix(const std::string& name) {
  std::random_device rd;
  return absl::StrFormat("%s-%08x", name, rd());
}

}  // namespace stitch::testing
