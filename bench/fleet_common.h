// Pieces the fleet benchmarks share (fleet_bench.cc, soak_bench.cc): the
// oracle's tensors as views, the replicas of a pool file, and judging a
// replica's greedy answer against the weights of the version it names.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "stitch/chaos/oracle.h"
#include "stitch/delta/delta_encode.h"

namespace stitch {

std::vector<TensorView> Views(const std::vector<HostTensor>& tensors);

// The replica URLs a pool file lists (LocalFleet::pool_file).
std::vector<std::string> PoolUrls(const std::filesystem::path& pool);

// Whether `url` answers a greedy generation of the oracle's prompt 0 pinned
// to `version` with that version's own greedy output, stamped with it.
bool JudgedRight(Oracle& oracle, const std::string& url, int64_t version);

void SleepSeconds(double s);

}  // namespace stitch
