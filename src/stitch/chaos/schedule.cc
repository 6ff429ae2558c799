#include "stitch/chaos/schedule.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stitch {
namespace {

// What a fault occupies: two faults on one resource never overlap.
std::string Resource(FaultKind kind, int replica) {
  switch (kind) {
    case FaultKind::kEngineKill:
    case FaultKind::kEngineStop:
      return absl::StrCat("engine:", replica);
    case FaultKind::kSidecarKill:
      return absl::StrCat("sidecar:", replica);
    case FaultKind::kGatewayKill:
      return "gateway";
    case FaultKind::kPublisherKill:
      return "publisher";
    case FaultKind::kStoreUnreadable:
      return "store-path";
    case FaultKind::kStoreFull:
      return "store-space";
    case FaultKind::kS3Kill:
    case FaultKind::kS3Stall:
      return "s3";
    case FaultKind::kClientDisconnect:
      return "clients";
    case FaultKind::kStoreGc:
      return "store-versions";
  }
  return "?";
}

// A gap kept between two faults on one resource, so that the first one's
// recovery is seen before the next begins.
constexpr double kResourceGapS = 1.0;

}  // namespace

std::string_view FaultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kEngineKill:
      return "engine_kill";
    case FaultKind::kEngineStop:
      return "engine_stop";
    case FaultKind::kSidecarKill:
      return "sidecar_kill";
    case FaultKind::kGatewayKill:
      return "gateway_kill";
    case FaultKind::kPublisherKill:
      return "publisher_kill";
    case FaultKind::kStoreUnreadable:
      return "store_unreadable";
    case FaultKind::kStoreFull:
      return "store_full";
    case FaultKind::kS3Kill:
      return "s3_kill";
    case FaultKind::kS3Stall:
      return "s3_stall";
    case FaultKind::kClientDisconnect:
      return "client_disconnect";
    case FaultKind::kStoreGc:
      return "store_gc";
  }
  return "?";
}

std::optional<FaultKind> ParseFaultKind(std::string_view name) {
  for (FaultKind kind : kAllFaultKinds) {
    if (FaultKindName(kind) == name) return kind;
  }
  return std::nullopt;
}

bool TargetsReplica(FaultKind kind) {
  return kind == FaultKind::kEngineKill || kind == FaultKind::kEngineStop ||
         kind == FaultKind::kSidecarKill;
}

std::string Fault::Target() const {
  if (replica < 0) return std::string(FaultKindName(kind));
  return absl::StrCat(std::string(FaultKindName(kind)), " r", replica);
}

std::vector<Fault> MakeSchedule(uint64_t seed, const ScheduleOptions& options) {
  std::vector<Fault> out;
  const double first = options.warmup_s;
  const double last_end = options.duration_s - options.cooldown_s;
  const double min_d = std::max(0.1, options.min_duration_s);
  const double max_d = std::max(min_d, options.max_duration_s);
  if (options.kinds.empty() || last_end - first < min_d) return out;
  SplitMix64 rng(seed);

  // How many faults: one of each kind at least, then as many as the mean gap
  // gives. Their start times are uniform over the window, sorted (a Poisson
  // process with that many events).
  const double window = last_end - min_d - first;
  const size_t by_rate =
      static_cast<size_t>(std::floor(window / std::max(0.5, options.mean_gap_s)));
  const size_t count = std::max(options.kinds.size(), by_rate);
  std::vector<double> starts;
  for (size_t i = 0; i < count; ++i) starts.push_back(first + rng.Uniform() * window);
  std::sort(starts.begin(), starts.end());

  // The first round covers every kind once, in an order drawn from the seed.
  std::vector<FaultKind> order = options.kinds;
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.Below(i)]);

  std::map<std::string, double> busy_until;  // per resource
  const int replicas = std::max(1, options.replicas);
  for (size_t i = 0; i < count; ++i) {
    // Every draw happens whatever is decided below, so that one fault's
    // placement never shifts the random numbers of the next.
    const FaultKind kind =
        i < order.size() ? order[i] : options.kinds[rng.Below(options.kinds.size())];
    const int drawn_replica = static_cast<int>(rng.Below(static_cast<uint64_t>(replicas)));
    const double duration = min_d + rng.Uniform() * (max_d - min_d);
    const double param = rng.Uniform();

    Fault f;
    f.kind = kind;
    f.param = param;
    f.start_s = starts[i];
    f.replica = TargetsReplica(kind) ? drawn_replica : -1;
    if (TargetsReplica(kind)) {
      // The replica that is free first, starting from the drawn one.
      double best_free = 0;
      int best = -1;
      for (int k = 0; k < replicas; ++k) {
        const int r = (drawn_replica + k) % replicas;
        auto it = busy_until.find(Resource(kind, r));
        const double free_at = it == busy_until.end() ? 0 : it->second;
        if (best < 0 || free_at < best_free - 1e-9) {
          best = r;
          best_free = free_at;
        }
        if (free_at <= f.start_s) break;
      }
      f.replica = best;
    }
    const std::string resource = Resource(kind, f.replica);
    if (auto it = busy_until.find(resource); it != busy_until.end()) {
      f.start_s = std::max(f.start_s, it->second);
    }
    f.duration_s = std::min(duration, last_end - f.start_s);
    if (f.duration_s < min_d) continue;  // no room left for it
    busy_until[resource] = f.end_s() + kResourceGapS;
    out.push_back(f);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Fault& a, const Fault& b) { return a.start_s < b.start_s; });
  for (size_t i = 0; i < out.size(); ++i) out[i].id = static_cast<int>(i + 1);
  return out;
}

std::string FormatSchedule(const std::vector<Fault>& schedule) {
  std::string out;
  for (const Fault& f : schedule) {
    absl::StrAppendFormat(&out, "#%-3d %7.1f s + %4.1f s  %s\n", f.id, f.start_s, f.duration_s,
                          f.Target());
  }
  return out;
}

}  // namespace stitch
