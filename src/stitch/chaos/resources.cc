#include "stitch/chaos/resources.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace stitch {

std::optional<ProcessUsage> ReadProcessUsage(int pid) {
  const std::string dir = absl::StrCat("/proc/", pid);
  std::ifstream status(dir + "/status");
  if (!status) return std::nullopt;
  ProcessUsage usage;
  bool found = false;
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmRSS:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, " kB");
    found = absl::SimpleAtoi(rest, &usage.rss_kib);
  }
  // A zombie has no VmRSS: it is gone for our purposes.
  if (!found) return std::nullopt;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++usage.open_files;
  }
  return usage;
}

ResourceSampler::ResourceSampler(const ChaosFleet& fleet, HistoryWriter& history,
                                 std::function<double()> now, std::chrono::milliseconds every)
    : fleet_(fleet), history_(history), now_(std::move(now)), every_(every) {}

ResourceSampler::~ResourceSampler() { Stop(); }

void ResourceSampler::Start() {
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      for (const FleetProcess& p : fleet_.Processes()) {
        if (p.name == "s3") continue;
        std::optional<ProcessUsage> usage = ReadProcessUsage(p.pid);
        if (!usage.has_value()) continue;
        history_.Write(
            ResourceEntry{now_(), p.name, p.instance, p.pid, usage->rss_kib, usage->open_files});
      }
      const auto until = std::chrono::steady_clock::now() + every_;
      while (!stop_.load() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  });
}

void ResourceSampler::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

}  // namespace stitch
