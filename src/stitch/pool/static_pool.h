// StaticPool: a fixed list of replica base URLs.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/pool/pool.h"

namespace stitch {

// Checks one replica URL: an absolute http or https URL with a host and no
// query or fragment. Returns it without trailing slashes. Errors
// (InvalidArgument) quote the entry and say what is expected.
[[nodiscard]] absl::StatusOr<std::string> NormalizeReplicaUrl(std::string_view entry);

class StaticPool final : public Pool {
 public:
  // Parses "static:URL,URL,..." or a bare "URL,URL,..." list. Each URL must
  // be an absolute http or https URL with a host and no query or fragment; a
  // trailing slash is dropped; duplicates are kept once. At least one URL.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StaticPool>> Parse(
      std::string_view spec, const WakeOptions& options = {});

  StaticPool(std::vector<std::string> urls, const WakeOptions& options);

  std::string spec() const override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> Discover() override;
  int Wake() override;

 private:
  const std::vector<std::string> urls_;
  const WakeOptions options_;
};

}  // namespace stitch
