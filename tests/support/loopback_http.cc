#include "tests/support/loopback_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/time/time.h"

namespace stitch::testing {
namespace {

// Binds a loopback TCP socket to an ephemeral port; aborts on failure.
int BindLoopback(int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    std::perror("bind 127.0.0.1:0");
    std::abort();
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

// Reads one request (headers and a Content-Length body); its line is ""
// when the peer closed first or `stop_fd` became readable.
LoopbackHttpServer::Request ReadRequest(int fd, int stop_fd) {
  std::string data;
  char buf[4096];
  size_t header_end = std::string::npos;
  size_t body_length = 0;
  for (;;) {
    if (header_end != std::string::npos && data.size() >= header_end + 4 + body_length) break;
    pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return {};
    }
    if (fds[1].revents != 0) return {};
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return {};
    data.append(buf, static_cast<size_t>(n));
    if (header_end == std::string::npos) {
      header_end = data.find("\r\n\r\n");
      if (header_end != std::string::npos) {
        std::string headers = data.substr(0, header_end);
        for (char& c : headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        size_t at = headers.find("\r\ncontent-length:");
        if (at != std::string::npos) {
          body_length = std::strtoul(headers.c_str() + at + 17, nullptr, 10);
        }
      }
    }
  }
  LoopbackHttpServer::Request request;
  std::string line = data.substr(0, data.find("\r\n"));
  // "POST /wake HTTP/1.1" -> "POST /wake"
  size_t last_space = line.rfind(' ');
  request.line = last_space == std::string::npos ? line : line.substr(0, last_space);
  request.head = data.substr(0, header_end);
  request.body = data.substr(header_end + 4);
  std::string lower = request.head;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (size_t at = lower.find("\r\nauthorization:"); at != std::string::npos) {
    size_t begin = at + 16;
    while (begin < request.head.size() && request.head[begin] == ' ') ++begin;
    request.authorization = request.head.substr(begin, request.head.find("\r\n", begin) - begin);
  }
  return request;
}

}  // namespace

LoopbackHttpServer::LoopbackHttpServer(Options options) : options_(std::move(options)) {
  listen_fd_ = BindLoopback(&port_);
  if (::listen(listen_fd_, 64) != 0 || ::pipe2(stop_pipe_, O_CLOEXEC) != 0) {
    std::perror("listen");
    std::abort();
  }
  thread_ = std::thread([this] { Serve(); });
}

LoopbackHttpServer::~LoopbackHttpServer() {
  ::close(stop_pipe_[1]);  // wakes the thread wherever it polls
  thread_.join();
  ::close(stop_pipe_[0]);
  ::close(listen_fd_);
}

std::string LoopbackHttpServer::url() const { return "http://127.0.0.1:" + std::to_string(port_); }

std::vector<std::string> LoopbackHttpServer::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

std::vector<std::string> LoopbackHttpServer::authorizations() const {
  absl::MutexLock lock(&mu_);
  return authorizations_;
}

bool LoopbackHttpServer::WaitForRequests(size_t n, std::chrono::milliseconds timeout) const {
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  absl::MutexLock lock(&mu_);
  while (requests_.size() < n) {
    if (arrived_.WaitWithDeadline(&mu_, deadline)) return requests_.size() >= n;
  }
  return true;
}

void LoopbackHttpServer::Serve() {
  std::vector<int> held;  // connections left unanswered in hang mode
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents != 0) break;
    int conn = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    Request request = ReadRequest(conn, stop_pipe_[0]);
    if (!request.line.empty()) {
      absl::MutexLock lock(&mu_);
      requests_.push_back(request.line);
      authorizations_.push_back(request.authorization);
      arrived_.SignalAll();
    }
    if (options_.hang) {
      held.push_back(conn);
      continue;
    }
    Reply reply{options_.status, "{}"};
    if (options_.handler && !request.line.empty()) reply = options_.handler(request);
    std::string response = "HTTP/1.1 " + std::to_string(reply.status) +
                           " X\r\nContent-Type: application/json\r\nContent-Length: " +
                           std::to_string(reply.body.size()) + "\r\nConnection: close\r\n\r\n" +
                           reply.body;
    std::string_view rest = response;
    while (!rest.empty()) {
      ssize_t n = ::write(conn, rest.data(), rest.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      rest.remove_prefix(static_cast<size_t>(n));
    }
    ::close(conn);
  }
  for (int fd : held) ::close(fd);
}

std::string UnreachableUrl() {
  int port = 0;
  int fd = BindLoopback(&port);
  ::close(fd);
  return "http://127.0.0.1:" + std::to_string(port);
}

}  // namespace stitch::testing
