// A loopback listener for tests' fake servers that speak raw bytes: a
// socket on 127.0.0.1 at a port the kernel picks, and one thread that
// accepts connections one at a time and hands each to the server's handler,
// until the listener is destroyed.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stitch::testing {

class LoopbackListener {
 public:
  // Runs on the listener's thread for each accepted connection, which is
  // closed when it returns.
  using Handler = std::function<void(int conn)>;

  explicit LoopbackListener(Handler handler) : handler_(std::move(handler)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(listen_fd_, 16) != 0 || ::pipe2(stop_, O_CLOEXEC) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      std::abort();
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Accept(); });
  }
  ~LoopbackListener() {
    ::close(stop_[1]);
    thread_.join();
    ::close(stop_[0]);
    ::close(listen_fd_);
  }
  LoopbackListener(const LoopbackListener&) = delete;
  LoopbackListener& operator=(const LoopbackListener&) = delete;

  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }

  // Whether `fd` has something to read (or was closed) before the listener
  // is stopped.
  bool Readable(int fd) const {
    pollfd fds[2] = {{fd, POLLIN, 0}, {stop_[0], POLLIN, 0}};
    while (::poll(fds, 2, -1) < 0) {
      if (errno != EINTR) return false;
    }
    return fds[1].revents == 0;
  }

 private:
  void Accept() {
    for (;;) {
      if (!Readable(listen_fd_)) return;
      const int conn = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      handler_(conn);
      ::close(conn);
    }
  }

  const Handler handler_;
  int listen_fd_ = -1;
  int stop_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
};

}  // namespace stitch::testing
