// DnsPool: every address record (A and AAAA) of a name, each a replica at
// one port ("dns:replicas.rollout.svc.cluster.local:8000"): a Kubernetes
// headless service, or any name with one record per replica.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/pool/pool.h"

namespace stitch {

class DnsPool final : public Pool {
 public:
  // Parses "dns:NAME:PORT" (an IPv6 literal NAME in brackets). Errors
  // (InvalidArgument) say what is wrong and show the expected form.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DnsPool>> Parse(
      std::string_view spec, const WakeOptions& options = {});

  DnsPool(std::string name, uint16_t port, const WakeOptions& options);

  std::string spec() const override;

  // Resolves the name now (the system resolver: /etc/hosts, then DNS) and
  // returns "http://<address>:<port>" for each distinct address, sorted
  // (IPv6 addresses in brackets). Errors: Unavailable when the name does not
  // resolve (the message carries the resolver's reason).
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> Discover() override;

  // Wakes the replicas the name resolves to now.
  int Wake() override;

 private:
  const std::string name_;
  const uint16_t port_;
  const WakeOptions options_;
};

}  // namespace stitch
