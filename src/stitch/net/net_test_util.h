// Test helpers for src/stitch/net: a raw TCP client that can misbehave on the
// wire, a scripted raw TCP server, and condition waits with deadlines.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "stitch/net/client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/server.h"

namespace stitch::testing {

// Safety net for blocking reads: a test that would hang fails instead.
inline constexpr auto kSafetyTimeout = std::chrono::seconds(20);

// Polls `condition` until it holds or `timeout` passes; returns whether it
// held. For state with no notification hook (connection counters).
inline bool WaitUntil(const std::function<bool()>& condition,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// Polls `condition` (an HTTP query, another process's state) every 10 ms
// until it holds (true) or `timeout` passes (false).
inline bool Eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

inline void SetReceiveTimeout(int fd) {
  timeval tv{};
  tv.tv_sec = std::chrono::duration_cast<std::chrono::seconds>(kSafetyTimeout).count();
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

// A blocking TCP client on 127.0.0.1.
class RawSocket {
 public:
  // `source`: the loopback address to connect from (127.0.0.1 by default),
  // to stand for another client.
  explicit RawSocket(uint16_t port, const char* source = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (source != nullptr) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      ::inet_pton(AF_INET, source, &from.sin_addr);
      (void)::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof(from));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    SetReceiveTimeout(fd_);
  }
  ~RawSocket() { Close(); }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  bool connected() const { return connected_; }
  int fd() const { return fd_; }

  void Send(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
  }

  // Reads whatever arrives next (blocking); "" on end of stream or error.
  std::string ReadSome() {
    char buf[65536];
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }

  // Reads until `marker` has arrived (or the stream ends).
  std::string ReadUntil(std::string_view marker) {
    std::string out;
    while (out.find(marker) == std::string::npos) {
      std::string more = ReadSome();
      if (more.empty()) break;
      out += more;
    }
    return out;
  }

  // Reads until the peer closes. `closed` tells whether it did (rather than
  // the safety timeout expiring).
  std::string ReadUntilClosed(bool* closed) {
    std::string out;
    char buf[65536];
    for (;;) {
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n > 0) {
        out.append(buf, static_cast<size_t>(n));
        continue;
      }
      *closed = n == 0 || errno == ECONNRESET;
      return out;
    }
  }

  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// A port nothing listens on (bound, then released).
inline uint16_t UnusedPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A TCP server on a thread that serves connections one at a time, each with
// the next function of a script (fn(fd) owns the exchange; the server closes
// the fd afterwards). For peers that misbehave in ways a real server won't.
class ScriptedServer {
 public:
  explicit ScriptedServer(std::vector<std::function<void(int fd)>> script)
      : script_(std::move(script)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 16), 0);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      for (auto& step : script_) {
        int fd = ::accept(listen_fd_, nullptr, nullptr);
        if (fd < 0) return;
        accepted_.fetch_add(1);
        SetReceiveTimeout(fd);
        step(fd);
        ::close(fd);
      }
    });
  }
  ~ScriptedServer() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    thread_.join();
  }

  uint16_t port() const { return port_; }
  int accepted() const { return accepted_.load(); }

  // Reads one request head (up to the blank line) from `fd`; "" on EOF.
  static std::string ReadHead(int fd) {
    std::string out;
    char c;
    while (out.size() < 4 || out.compare(out.size() - 4, 4, "\r\n\r\n") != 0) {
      if (::recv(fd, &c, 1, 0) != 1) return "";
      out.push_back(c);
    }
    return out;
  }
  static void Write(int fd, std::string_view bytes) {
    ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }

 private:
  std::vector<std::function<void(int fd)>> script_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

// Handlers await it on their loop; Open() may be called from any thread.
class Gate {
 public:
  explicit Gate(const boost::asio::any_io_executor& executor) : timer_(executor) {
    timer_.expires_at(boost::asio::steady_timer::time_point::max());
  }
  boost::asio::awaitable<void> Wait() {
    while (!open_) co_await timer_.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
  }
  void Open() {
    boost::asio::post(timer_.get_executor(), [this] {
      open_ = true;
      timer_.cancel();
    });
  }

 private:
  boost::asio::steady_timer timer_;
  bool open_ = false;
};

// Answers 200 with the request body, its method and target as X-Method and
// X-Target, and X-Test as X-Test-Echo.
inline boost::asio::awaitable<void> Echo(HttpExchange& ex) {
  HttpResponse r;
  r.headers.Add("X-Method", ex.request().method);
  r.headers.Add("X-Target", ex.request().target);
  if (auto v = ex.request().headers.Get("x-test")) r.headers.Add("X-Test-Echo", *v);
  r.body = ex.request().body;
  (void)co_await ex.Respond(std::move(r));
}

// A server on its own loop and a client on another.
struct Harness {
  explicit Harness(HttpHandler handler, ServerOptions options = {},
                   ClientOptions client_options = {}) {
    auto started = HttpServer::Start(loop.executor(), std::move(options), std::move(handler));
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) server = std::move(*started);
    client.emplace(client_loop.executor(), client_options);
    gate.emplace(loop.executor());
  }
  // Stops both loops before anything they run is destroyed: suspended
  // handlers are then destroyed with the loops instead of being resumed.
  ~Harness() {
    loop.Stop();
    client_loop.Stop();
  }
  HttpOrigin origin() const { return {"127.0.0.1", server->port()}; }
  absl::StatusOr<HttpResponse> Send(HttpRequest request, CallOptions options = {}) {
    return client_loop.BlockOn(client->Send(origin(), std::move(request), options));
  }

  EventLoop loop;
  EventLoop client_loop;
  std::unique_ptr<HttpServer> server;
  std::optional<HttpClient> client;
  // A client living on the server's loop, for handlers that proxy.
  std::optional<HttpClient> loop_client;
  // A gate on the server's loop, for handlers to wait on.
  std::optional<Gate> gate;
};

// (A named function rather than a braced list at the call site: GCC 12
// miscompiles some braced initializers inside co_await expressions.)
inline HttpHeaders EventStreamHeaders() {
  HttpHeaders h;
  h.Add("Content-Type", "text/event-stream");
  return h;
}

inline HttpResponse Text(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

inline HttpRequest Get(std::string target) {
  HttpRequest r;
  r.target = std::move(target);
  return r;
}

inline HttpRequest Post(std::string target, std::string body) {
  HttpRequest r;
  r.method = "POST";
  r.target = std::move(target);
  r.body = std::move(body);
  return r;
}

}  // namespace stitch::testing
