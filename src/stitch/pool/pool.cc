#include "stitch/pool/pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stitch/api/replica_client.h"
#include "stitch/core/errors.h"
#include "stitch/pool/dns_pool.h"
#include "stitch/pool/file_pool.h"
#include "stitch/pool/static_pool.h"

namespace stitch {
int WakeReplicas(const std::vector<std::string>& urls, const WakeOptions& options) {
  ReplicaCallOptions calls;
  calls.timeout = std::max(options.timeout, std::chrono::milliseconds(1));
  calls.concurrency = static_cast<size_t>(std::max(1, options.max_concurrency));
  calls.bearer_token = options.bearer_token;
  const std::vector<absl::Status> woken = WakeEach(urls, calls);
  int succeeded = 0;
  for (size_t i = 0; i < urls.size(); ++i) {
    if (woken[i].ok()) {
      ++succeeded;
      continue;
    }
    spdlog::warn("wake {}/wake: {}; the replica will still catch up on its own", urls[i],
                 std::string(woken[i].message()));
  }
  return succeeded;
}

absl::StatusOr<std::unique_ptr<Pool>> MakePool(std::string_view spec, const WakeOptions& options) {
  const absl::string_view text = AbslView(spec);
  if (absl::StartsWith(text, "static:") || absl::StartsWithIgnoreCase(text, "http://") ||
      absl::StartsWithIgnoreCase(text, "https://")) {
    auto pool = StaticPool::Parse(spec, options);
    if (!pool.ok()) return pool.status();
    return std::unique_ptr<Pool>(*std::move(pool));
  }
  if (absl::StartsWith(text, "file:")) {
    auto pool = FilePool::Parse(spec, options);
    if (!pool.ok()) return pool.status();
    return std::unique_ptr<Pool>(*std::move(pool));
  }
  if (absl::StartsWith(text, "dns:")) {
    auto pool = DnsPool::Parse(spec, options);
    if (!pool.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(pool.status().message(),
                                                     " (supported: static:URL,URL,..., file:PATH, "
                                                     "dns:NAME:PORT)"));
    }
    return std::unique_ptr<Pool>(*std::move(pool));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("pool spec \"", absl::CEscape(text),
                   "\" is not supported; use static:URL,URL,..., file:PATH (one URL per line), "
                   "dns:NAME:PORT, or a comma-separated list of http(s) replica URLs"));
}

int WakeDiscovered(Pool& pool, const WakeOptions& options) {
  auto urls = pool.Discover();
  if (!urls.ok()) {
    spdlog::warn("wake {}: {}; the replicas will still catch up on their own", pool.spec(),
                 std::string(urls.status().message()));
    return 0;
  }
  return WakeReplicas(*urls, options);
}

}  // namespace stitch
