// A tiny HTTP/1.1 server on 127.0.0.1 (port 0) that records the requests it
// receives, for testing clients such as the pool's wakes. One thread, one
// connection at a time, `Connection: close`: just enough HTTP for that.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace stitch::testing {

class LoopbackHttpServer {
 public:
  struct Request {
    std::string line;  // "POST /wake"
    std::string head;  // the request line and headers, as received
    std::string body;
    std::string authorization;  // the Authorization header's value, "" when absent
  };
  struct Reply {
    int status = 200;
    std::string body = "{}";
  };
  struct Options {
    int status = 200;   // the status every request is answered with
    bool hang = false;  // read requests but never answer (until destroyed)
    // When set, answers each request instead (called on the server's thread).
    std::function<Reply(const Request&)> handler;
  };

  LoopbackHttpServer() : LoopbackHttpServer(Options{}) {}
  explicit LoopbackHttpServer(Options options);
  ~LoopbackHttpServer();
  LoopbackHttpServer(const LoopbackHttpServer&) = delete;
  LoopbackHttpServer& operator=(const LoopbackHttpServer&) = delete;

  // "http://127.0.0.1:<port>".
  std::string url() const;

  // The request lines received so far ("POST /wake").
  std::vector<std::string> requests() const;
  // The Authorization header of each of them ("" when absent).
  std::vector<std::string> authorizations() const;

  // Waits until at least `n` requests arrived or `timeout` passed; returns
  // whether they did.
  bool WaitForRequests(size_t n, std::chrono::milliseconds timeout) const;

 private:
  void Serve();

  const Options options_;
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  int port_ = 0;
  mutable absl::Mutex mu_;
  mutable absl::CondVar arrived_;  // a request arrived
  std::vector<std::string> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> authorizations_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// A loopback URL nothing listens on ("http://127.0.0.1:<port>"): its port was
// bound and released, so connecting is refused.
std::string UnreachableUrl();

}  // namespace stitch::testing
