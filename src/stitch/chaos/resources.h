// What the soak watches for growth: each fleet process's resident memory and
// open files, read from /proc and recorded in the history every few seconds.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <thread>

#include "stitch/chaos/fleet.h"
#include "stitch/chaos/history.h"

namespace stitch {

struct ProcessUsage {
  int64_t rss_kib = 0;     // VmRSS
  int64_t open_files = 0;  // entries of /proc/<pid>/fd
};

// nullopt when the process is gone.
std::optional<ProcessUsage> ReadProcessUsage(int pid);

// Samples every engine, sidecar and the gateway of `fleet` every `every`
// (the S3 server is left out: it keeps every object in memory, so it grows
// by design).
class ResourceSampler {
 public:
  ResourceSampler(const ChaosFleet& fleet, HistoryWriter& history, std::function<double()> now,
                  std::chrono::milliseconds every);
  ~ResourceSampler();
  ResourceSampler(const ResourceSampler&) = delete;
  ResourceSampler& operator=(const ResourceSampler&) = delete;

  void Start();
  void Stop();

 private:
  const ChaosFleet& fleet_;
  HistoryWriter& history_;
  const std::function<double()> now_;
  const std::chrono::milliseconds every_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace stitch
