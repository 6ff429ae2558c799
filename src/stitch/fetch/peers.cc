#include "stitch/fetch/peers.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/stable_hash.h"

namespace stitch {

std::vector<size_t> PeerOrder(const std::vector<std::string>& peers, int64_t version,
                              std::string_view file) {
  std::vector<std::pair<uint64_t, size_t>> ranked;
  for (size_t i = 0; i < peers.size(); ++i) {
    ranked.emplace_back(StableHash(absl::StrCat(peers[i], "\n", version, "/", AbslView(file))), i);
  }
  std::sort(ranked.begin(), ranked.end(), std::greater<>());
  std::vector<size_t> order;
  for (const auto& [rank, i] : ranked) order.push_back(i);
  return order;
}

std::chrono::milliseconds PeerTransferDeadline(const StorePeers& peers, uint64_t size,
                                               int64_t wait_ms) {
  // Capped at a year, far beyond any transfer, so that nothing overflows.
  constexpr double kCapMs = 365.0 * 24 * 3600 * 1000;
  const double at_rate_ms = std::ceil(1000.0 * static_cast<double>(size) /
                                      static_cast<double>(std::max<uint64_t>(1, peers.min_rate)));
  const double total_ms = at_rate_ms + static_cast<double>(std::max<int64_t>(0, wait_ms)) +
                          static_cast<double>(std::max<int64_t>(0, peers.connect_timeout.count())) +
                          static_cast<double>(std::max<int64_t>(0, peers.allowance.count()));
  return std::chrono::milliseconds(static_cast<int64_t>(std::min(total_ms, kCapMs)));
}

}  // namespace stitch
