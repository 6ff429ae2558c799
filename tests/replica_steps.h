// Steps the replica integration tests share (SGLang and vLLM dialects
// alike): a tiny model, versions published with `stitch publish`, and the
// wait for a sidecar to serve a version.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

namespace stitch::testing {

// `stitch engine init-model DIR`: one layer, hidden 32; fast to load, stage
// and run.
void InitTinyModel(const std::string& dir, int seed);

// Where a test publishes run r1: its store, and the folder version
// directories are written to before publishing.
struct RunOfR1 {
  std::string store;
  std::filesystem::path out;

  // Writes `checkpoint` as FULL version `version` and publishes it, waking
  // `wake_url` too when it is not empty.
  void PublishFull(int64_t version, const std::string& checkpoint,
                   const std::string& wake_url = "") const;
  // Encodes base -> target as DELTA version `version` and publishes it.
  void PublishDelta(int64_t version, const std::string& base, const std::string& target) const;
};

// Waits up to `timeout` for the sidecar at `url` to be ready, idle and
// serving `version` of r1.
bool ServesVersionOfR1(const std::string& url, int64_t version, std::chrono::milliseconds timeout);

}  // namespace stitch::testing
