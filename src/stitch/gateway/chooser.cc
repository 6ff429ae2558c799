#include "stitch/gateway/chooser.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "stitch/core/stable_hash.h"

namespace stitch {
namespace {

bool Tried(std::span<const ReplicaPtr> tried, const ReplicaEntry* r) {
  return std::any_of(tried.begin(), tried.end(), [r](const ReplicaPtr& t) { return t.get() == r; });
}

}  // namespace

uint64_t AffinityKey(std::optional<int64_t> version, std::string_view prompt_prefix) {
  return StableMix(StableHash(prompt_prefix) ^
                   StableMix(static_cast<uint64_t>(version.value_or(-1))));
}

void ReplicaIndex::Clear() {
  all_.clear();
  by_version_.clear();
}

void ReplicaIndex::Add(const ReplicaPtr& r) {
  all_.push_back(r);
  if (std::optional<int64_t> v = r->version(); v.has_value()) by_version_[*v].push_back(r);
}

void RoutingIndex::Rebuild(const ReplicaMap& replicas) {
  routable_.Clear();
  held_.Clear();
  preferred_.Clear();
  all_preferred_ = true;
  oldest_applied_.reset();
  newest_pointer_.reset();
  ring_.clear();
  bool one_run = !replicas.empty();
  for (const auto& [url, r] : replicas) {
    if (std::optional<int64_t> p = r->state.pointer_version(); p.has_value() && r->reachable) {
      newest_pointer_ = std::max(newest_pointer_.value_or(*p), *p);
    }
    const std::optional<VersionRef>& applied = r->state.applied;
    if (!applied.has_value() ||
        (oldest_applied_.has_value() && applied->run_id != oldest_applied_->run_id)) {
      one_run = false;
    } else if (!oldest_applied_.has_value() || applied->version < oldest_applied_->version) {
      oldest_applied_ = applied;
    }
    if (!r->routable()) continue;
    if (r->held()) {
      held_.Add(r);
      continue;
    }
    routable_.Add(r);
    for (int i = 0; i < kRingPoints; ++i) {
      ring_.emplace_back(StableHash(absl::StrCat(r->url, "#", i)), r);
    }
    if (r->preferred()) {
      preferred_.Add(r);
    } else {
      all_preferred_ = false;
    }
  }
  if (!one_run) oldest_applied_.reset();
  if (all_preferred_) preferred_.Clear();
  std::sort(ring_.begin(), ring_.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
}

std::optional<VersionRef> RoutingIndex::newest_routable() const {
  if (routable_.by_version().empty()) return std::nullopt;
  return routable_.by_version().rbegin()->second.front()->state.applied;
}

VersionConstraint RoutingIndex::RoutingConstraint(const VersionConstraint& c) const {
  if (!c.max_staleness.has_value()) return c;
  VersionConstraint routed = c;
  routed.max_staleness.reset();
  if (!c.is_exact()) routed.min_version = c.Floor(newest_pointer_);
  return routed;
}

bool RoutingIndex::NeverServable(const VersionConstraint& c) const {
  if (!c.is_exact()) return false;
  return oldest_applied_.has_value() && *c.exact_version < oldest_applied_->version;
}

ReplicaPtr Chooser::AffineReplica(const RoutingIndex& index, const Affinity& affinity,
                                  std::span<const ReplicaPtr> tried) {
  const auto& ring = index.ring();
  const auto& routable = index.routable().all();
  if (ring.empty()) return nullptr;
  int64_t outstanding = 1;  // this request
  for (const ReplicaPtr& r : routable) outstanding += r->in_flight;
  const double mean = static_cast<double>(outstanding) / static_cast<double>(routable.size());
  const auto bound = static_cast<int64_t>(std::ceil(std::max(1.0, affinity.load_factor) * mean));
  auto it = std::lower_bound(ring.begin(), ring.end(), affinity.key,
                             [](const auto& point, uint64_t key) { return point.first < key; });
  for (size_t n = 0; n < ring.size(); ++n, ++it) {
    if (it == ring.end()) it = ring.begin();
    const ReplicaPtr& r = it->second;
    if (!r->preferred() || Tried(tried, r.get())) continue;
    if (r->in_flight + 1 <= bound) return r;
  }
  return nullptr;
}

ReplicaPtr Chooser::Choose(const RoutingIndex& index, const VersionConstraint& c,
                           const ReplicaPtr& home, std::span<const ReplicaPtr> tried,
                           const std::optional<Affinity>& affinity) {
  if (c.is_exact() && index.held().by_version().contains(*c.exact_version)) {
    if (ReplicaPtr r = ChooseFrom(index.held(), c, tried); r != nullptr) return r;
  }
  if (home != nullptr && home->routable() && !home->held() && home->preferred() &&
      c.SatisfiedBy(home->version()) && !Tried(tried, home.get())) {
    return home;
  }
  if (affinity.has_value()) {
    if (ReplicaPtr r = AffineReplica(index, *affinity, tried);
        r != nullptr && c.SatisfiedBy(r->version())) {
      return r;
    }
  }
  if (const ReplicaIndex* preferred = index.preferred(); preferred != nullptr) {
    if (ReplicaPtr r = ChooseFrom(*preferred, c, tried); r != nullptr) return r;
  }
  return ChooseFrom(index.routable(), c, tried);
}

ReplicaPtr Chooser::ChooseFrom(const ReplicaIndex& index, const VersionConstraint& c,
                               std::span<const ReplicaPtr> tried) {
  // The candidates: a few contiguous groups.
  std::vector<const std::vector<ReplicaPtr>*> groups;
  if (c.is_exact()) {
    auto it = index.by_version().find(*c.exact_version);
    if (it != index.by_version().end()) groups.push_back(&it->second);
  } else if (c.min_version.has_value()) {
    for (auto it = index.by_version().lower_bound(*c.min_version); it != index.by_version().end();
         ++it) {
      groups.push_back(&it->second);
    }
  } else {
    groups.push_back(&index.all());
  }
  size_t total = 0;
  for (const auto* g : groups) total += g->size();
  if (total == 0) return nullptr;
  auto at = [&](size_t i) -> const ReplicaPtr* {
    for (const auto* g : groups) {
      if (i < g->size()) return &(*g)[i];
      i -= g->size();
    }
    return nullptr;
  };
  const ReplicaPtr* best = nullptr;
  auto consider = [&](size_t i) {
    const ReplicaPtr* r = at(i);
    if (Tried(tried, r->get())) return;
    if (best == nullptr || (*r)->in_flight < (*best)->in_flight) best = r;
  };
  // Two picks, never the same replica twice: otherwise a replica that
  // stopped answering (its outstanding count only grows) would still win
  // every time both picks fell on it.
  const size_t first = rng_() % total;
  consider(first);
  if (total > 1) {
    size_t second = rng_() % (total - 1);
    if (second >= first) ++second;
    consider(second);
  }
  if (best != nullptr) return *best;
  // Both picks were tried already (a small pool, or a retry): scan.
  for (size_t i = 0; i < total; ++i) consider(i);
  if (best == nullptr) return nullptr;
  return *best;
}

}  // namespace stitch
