// The chaos run's fault schedule: which fault, when, for how long and on
// which replica, drawn from a seed (docs/chaos.md).
//
// MakeSchedule is a pure function of its seed and options: the same seed,
// duration, replica count and list of fault kinds give the same schedule on
// every machine (the generator is our own SplitMix64 and plain arithmetic,
// not <random>'s implementation-defined distributions), so a failing run is
// replayed by its seed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace stitch {

// SplitMix64: small, fast, and the same numbers on every machine, so that a
// seed replays the same schedule and the same request mix.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // In [0, 1), 53 bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // In [0, n). REQUIRES: n > 0.
  uint64_t Below(uint64_t n) { return Next() % n; }

 private:
  uint64_t state_;
};

enum class FaultKind {
  kEngineKill,        // kill -9 an engine; restarted on its port when the fault ends
  kEngineStop,        // SIGSTOP an engine; SIGCONT when the fault ends
  kSidecarKill,       // kill -9 a sidecar; restarted on its port when the fault ends
  kGatewayKill,       // kill -9 the gateway; restarted on its port when the fault ends
  kPublisherKill,     // kill -9 the `stitch publish` process in the middle of a publish
  kStoreUnreadable,   // the filesystem store's root renamed away, and back at the end
  kStoreFull,         // the filesystem store's file system (a small tmpfs) filled up
  kS3Kill,            // kill -9 the S3 server; restarted (its data kept) at the end
  kS3Stall,           // SIGSTOP the S3 server (every store call hangs): a slow store
  kClientDisconnect,  // rollout clients leave their requests and streams midway
  kStoreGc,           // retention keeping only the pointer's chain, pass after pass
};

inline constexpr FaultKind kAllFaultKinds[] = {
    FaultKind::kEngineKill,       FaultKind::kEngineStop,    FaultKind::kSidecarKill,
    FaultKind::kGatewayKill,      FaultKind::kPublisherKill, FaultKind::kStoreUnreadable,
    FaultKind::kStoreFull,        FaultKind::kS3Kill,        FaultKind::kS3Stall,
    FaultKind::kClientDisconnect, FaultKind::kStoreGc,
};

// "engine_kill", "engine_stop", "sidecar_kill", "gateway_kill",
// "publisher_kill", "store_unreadable", "store_full", "s3_kill", "s3_stall",
// "client_disconnect", "store_gc".
std::string_view FaultKindName(FaultKind kind);
std::optional<FaultKind> ParseFaultKind(std::string_view name);

// Whether the fault acts on one replica (its `replica` is then >= 0).
bool TargetsReplica(FaultKind kind);

struct Fault {
  int id = 0;  // 1, 2, ... in order of start
  FaultKind kind = FaultKind::kEngineKill;
  double start_s = 0;     // seconds after the load starts
  double duration_s = 0;  // how long the fault lasts
  int replica = -1;       // the replica it acts on, -1 for the others
  // A number in [0, 1) for the kind's own use (publisher_kill: how far into
  // the publish process's life it is killed).
  double param = 0;

  double end_s() const { return start_s + duration_s; }
  // "engine_kill r1" / "gateway_kill".
  std::string Target() const;
  friend bool operator==(const Fault&, const Fault&) = default;
};

struct ScheduleOptions {
  double duration_s = 120;  // of the load; faults start and end inside it
  int replicas = 3;
  std::vector<FaultKind> kinds;  // the kinds this run can inject
  // No fault starts before warmup_s, and every fault ends cooldown_s before
  // the end, so that the run ends with a recovered fleet.
  double warmup_s = 5;
  double cooldown_s = 10;
  // Mean gap between fault starts (exponentially distributed).
  double mean_gap_s = 8;
  double min_duration_s = 2;
  double max_duration_s = 8;
};

// The schedule, sorted by start. Every kind of `options.kinds` appears once
// (in an order drawn from the seed) before any kind repeats, as long as the
// time allows. Faults on the same resource (one engine, one sidecar, the
// gateway, the publisher, the store's path, the store's space, the S3
// server, the clients) never overlap; faults on different resources may.
// Empty when there is no room between warm-up and cool-down or no kinds.
std::vector<Fault> MakeSchedule(uint64_t seed, const ScheduleOptions& options);

// One line per fault: "#3  12.4 s + 5.0 s  engine_kill r1".
std::string FormatSchedule(const std::vector<Fault>& schedule);

}  // namespace stitch
