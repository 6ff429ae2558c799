#include "stitch/publish/wake.h"

#include <spdlog/spdlog.h>

namespace stitch {

void WakeAfterMove(Pool* pool, const VersionRef& now) {
  if (pool == nullptr) return;
  auto urls = pool->Discover();
  if (!urls.ok()) {
    spdlog::warn("wake after {}: cannot discover replicas of {}: {}", now.ToString(), pool->spec(),
                 std::string(urls.status().message()));
    return;
  }
  int woken = pool->Wake();
  spdlog::info("wake after {}: {} of {} replica(s) answered", now.ToString(), woken, urls->size());
}

}  // namespace stitch
