// A TCP relay in front of a store's server, for the fleet benchmark: it
// counts the requests and the bytes it serves, and caps the bytes per
// second it sends back to all clients together, as a bucket's throughput
// caps what a fleet can download at once.
//
// Requests are counted by their request lines (" HTTP/1.1\r\n" in what
// clients send). Thread-safe: the counters may be read from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"

namespace stitch {

class StoreProxy {
 public:
  // Listens on 127.0.0.1 (a free port) and relays every connection to
  // 127.0.0.1:`upstream_port`, sending at most `bytes_per_second` back in
  // all (0: no cap).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StoreProxy>> Start(uint16_t upstream_port,
                                                                         double bytes_per_second);
  ~StoreProxy();
  StoreProxy(const StoreProxy&) = delete;
  StoreProxy& operator=(const StoreProxy&) = delete;

  uint16_t port() const { return port_; }
  uint64_t requests() const;
  uint64_t bytes_served() const;

  struct Impl;

 private:
  StoreProxy() = default;

  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace stitch
