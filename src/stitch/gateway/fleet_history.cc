#include "stitch/gateway/fleet_history.h"

#include <algorithm>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"

namespace stitch {

namespace json = boost::json;

namespace {

json::value OptionalInt(const std::optional<int64_t>& v) {
  return v.has_value() ? json::value(*v) : json::value(nullptr);
}

json::value OptionalDouble(const std::optional<double>& v) {
  return v.has_value() ? json::value(*v) : json::value(nullptr);
}

// Seconds rounded to milliseconds: the page needs no more, and the JSON
// stays short.
double Rounded(double s) { return static_cast<double>(static_cast<int64_t>(s * 1000)) / 1000; }

}  // namespace

FleetHistory::FleetHistory(Clock& clock, FleetHistoryOptions options)
    : clock_(clock),
      options_(options),
      start_(clock.Now()),
      seconds_(static_cast<size_t>(std::max<int64_t>(options.window.count(), 1))) {}

double FleetHistory::Now() const {
  return Rounded(std::chrono::duration<double>(clock_.Now() - start_).count());
}

std::pair<std::string, std::string> FleetHistory::Label(const ReplicaEntry& r) {
  if (!r.discovered) return {"gone", ""};
  if (!r.reachable) return {"unreachable", r.last_error};
  const ReplicaState& s = r.state;
  if (!s.terminal_error.empty()) return {"error", s.terminal_error};
  if (s.sync_state == SyncState::kError)
    return {"error", s.sync_error.empty() ? s.reason : s.sync_error};
  if (!s.sync_error.empty()) return {"error", s.sync_error};
  if (r.stalled) return {"stalled", "requests outstanding and nothing received"};
  if (s.sync_state == SyncState::kFetching || s.sync_state == SyncState::kStaging) {
    return {"staging", ""};
  }
  if (s.sync_state == SyncState::kCommitting) return {"committing", ""};
  if (!s.ready) return {"paused", s.reason};
  if (s.held.has_value()) {
    return {"held", absl::StrCat("held by ", s.held->holder, " on ", s.held->version.ToString(),
                                 ": serves exact pins at it")};
  }
  return {"serving", ""};
}

void FleetHistory::Record(const std::string& url, Lane& lane, Event event) {
  lane.events.push_back(event);
  while (lane.events.size() > options_.events_per_replica) lane.events.pop_front();
  fleet_events_.emplace_back(url, std::move(event));
  while (fleet_events_.size() > options_.fleet_events) fleet_events_.pop_front();
}

void FleetHistory::Observe(const ReplicaEntry& r) {
  const double now = Now();
  auto [state, message] = Label(r);
  const std::optional<int64_t> version = r.version();
  auto [it, joined] = lanes_.try_emplace(r.url);
  Lane& lane = it->second;
  if (joined) {
    lane.joined = now;
    Record(r.url, lane, Event{now, "joined", version, ""});
  }
  if (state == "staging") lane.last_stage = now;
  if (state == "committing" || (!joined && version.has_value() && version != lane.version)) {
    lane.last_commit = now;
  }
  if (state == "error" || state == "unreachable") {
    lane.last_error = message;
    lane.last_error_at = now;
  }
  if (joined || state != lane.state || version != lane.version || message != lane.message) {
    lane.state = state;
    lane.version = version;
    lane.message = message;
    Record(r.url, lane, Event{now, std::move(state), version, std::move(message)});
  }

  const bool live = r.discovered && r.reachable;
  applied_.Set(r.url, live ? std::optional<int64_t>(version.value_or(-1)) : std::nullopt);
  // A replica that cannot reach the store keeps its last read.
  if (live && r.state.pointer.has_value()) pointers_.Set(r.url, r.state.pointer->version);
  if (!r.discovered) pointers_.Set(r.url, std::nullopt);
  UpdatePointer(now);
  CheckRollouts();
}

void FleetHistory::UpdatePointer(double now) {
  const std::optional<int64_t> pointer =
      pointers_.empty() ? std::nullopt : std::optional<int64_t>(pointers_.newest());
  if (!pointer.has_value() || pointer == pointer_) return;
  const bool forward = !pointer_.has_value() || *pointer > *pointer_;
  pointer_ = pointer;
  pointer_moves_.emplace_back(now, *pointer_);
  while (pointer_moves_.size() > 4 * options_.rollouts) pointer_moves_.pop_front();
  if (forward) {
    rollouts_.push_back(Rollout{*pointer_, now, std::nullopt});
    while (rollouts_.size() > options_.rollouts) rollouts_.pop_front();
  } else {
    // Rollouts of versions above the pointer never happened.
    while (!rollouts_.empty() && rollouts_.back().version > *pointer_) rollouts_.pop_back();
  }
}

void FleetHistory::Census::Set(const std::string& url, std::optional<int64_t> version) {
  auto it = by_url_.find(url);
  if (it != by_url_.end()) {
    if (version == it->second) return;
    auto count = counts_.find(it->second);
    if (--count->second == 0) counts_.erase(count);
    by_url_.erase(it);
  }
  if (version.has_value()) {
    by_url_.emplace(url, *version);
    ++counts_[*version];
  }
}

void FleetHistory::CheckRollouts() {
  if (rollouts_.empty() || rollouts_.back().fleet.has_value() || applied_.empty()) return;
  const int64_t oldest = applied_.oldest();  // -1 while one has applied nothing
  const double now = Now();
  for (auto it = rollouts_.rbegin(); it != rollouts_.rend() && !it->fleet.has_value(); ++it) {
    if (it->version <= oldest) it->fleet = Rounded(now - it->seen);
  }
}

void FleetHistory::Gone(const std::string& url) {
  applied_.Set(url, std::nullopt);
  pointers_.Set(url, std::nullopt);
  UpdatePointer(Now());
  auto it = lanes_.find(url);
  if (it == lanes_.end() || it->second.state == "gone") return;
  Lane& lane = it->second;
  lane.state = "gone";
  lane.message.clear();
  Record(url, lane, Event{Now(), "gone", lane.version, ""});
  CheckRollouts();
}

void FleetHistory::Sample(const ReplicaMap& replicas) {
  FleetSample s;
  s.t = Now();
  s.pointer = pointer_;
  for (const auto& [url, r] : replicas) {
    ++s.replicas;
    if (r->routable()) ++s.ready;
    const std::optional<int64_t> v = r->version();
    if (!v.has_value() || !r->reachable) continue;
    s.oldest = s.oldest.has_value() ? std::min(*s.oldest, *v) : *v;
    s.newest = s.newest.has_value() ? std::max(*s.newest, *v) : *v;
    if (pointer_.has_value() && *v >= *pointer_) ++s.at_pointer;
  }
  samples_.push_back(s);
  const double horizon = s.t - static_cast<double>(options_.window.count());
  while (!samples_.empty() && samples_.front().t < horizon) samples_.pop_front();
}

FleetHistory::Second& FleetHistory::Current() {
  const auto second = static_cast<int64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(clock_.Now() - start_).count());
  Second& s = seconds_[static_cast<size_t>(second) % seconds_.size()];
  if (s.second != second) {
    s.second = second;
    s.served.clear();  // keeps its capacity
    s.unknown_version = 0;
    s.staleness.fill(0);
    s.conflicts = s.unavailable = s.retries = 0;
  }
  return s;
}

void FleetHistory::Served(std::optional<int64_t> version) {
  Second& s = Current();
  if (!version.has_value()) {
    ++s.unknown_version;
    ++s.staleness[kStalenessBuckets - 1];
    return;
  }
  auto it = std::find_if(s.served.begin(), s.served.end(),
                         [&](const auto& p) { return p.first == *version; });
  if (it == s.served.end()) {
    s.served.emplace_back(*version, 1);
  } else {
    ++it->second;
  }
  if (!pointer_.has_value()) {
    ++s.staleness[kStalenessBuckets - 1];
    return;
  }
  const int64_t behind = std::max<int64_t>(*pointer_ - *version, 0);
  ++s.staleness[static_cast<size_t>(std::min<int64_t>(behind, kStalenessBuckets - 2))];
}

void FleetHistory::Conflict() { ++Current().conflicts; }
void FleetHistory::Unavailable() { ++Current().unavailable; }
void FleetHistory::Retried() { ++Current().retries; }

// Long on purpose: it writes the dashboard's one JSON document (/ui/state)
// field by field, in one place.
std::string FleetHistory::Json(const ReplicaMap& replicas) const {
  const double now = Now();
  json::object o;
  o["now"] = now;
  o["window"] = options_.window.count();
  o["pointer"] = OptionalInt(pointer_);

  json::array moves;
  for (const auto& [t, v] : pointer_moves_) moves.push_back(json::array{t, v});
  o["pointer_moves"] = std::move(moves);

  auto event_json = [](const Event& e) {
    return json::array{e.t, json::string(e.state), OptionalInt(e.version), json::string(e.message)};
  };
  json::array lanes;
  for (const auto& [url, lane] : lanes_) {
    json::object l;
    l["url"] = url;
    l["state"] = lane.state;
    l["version"] = OptionalInt(lane.version);
    l["message"] = lane.message;
    l["joined"] = lane.joined;
    l["last_stage"] = OptionalDouble(lane.last_stage);
    l["last_commit"] = OptionalDouble(lane.last_commit);
    l["last_error"] = lane.last_error;
    l["last_error_at"] = OptionalDouble(lane.last_error_at);
    auto r = replicas.find(url);
    if (r != replicas.end()) {
      l["in_flight"] = r->second->in_flight;
      l["pointer_notice"] = r->second->state.pointer_notice;
      const auto& metrics = r->second->state.metrics;
      if (auto m = metrics.find("stage_s"); m != metrics.end()) l["stage_s"] = m->second;
      if (auto m = metrics.find("commit_s"); m != metrics.end()) l["commit_s"] = m->second;
    }
    json::array events;
    for (const Event& e : lane.events) events.push_back(event_json(e));
    l["events"] = std::move(events);
    lanes.push_back(std::move(l));
  }
  o["replicas"] = std::move(lanes);

  json::array fleet_events;
  for (const auto& [url, e] : fleet_events_) {
    json::array a = event_json(e);
    a.insert(a.begin() + 1, json::string(url));
    fleet_events.push_back(std::move(a));
  }
  o["events"] = std::move(fleet_events);

  json::array samples;
  for (const FleetSample& s : samples_) {
    samples.push_back(json::array{s.t, OptionalInt(s.pointer), OptionalInt(s.oldest),
                                  OptionalInt(s.newest), s.at_pointer, s.ready, s.replicas});
  }
  o["samples"] = std::move(samples);

  json::array rollouts;
  for (const Rollout& r : rollouts_) {
    rollouts.push_back(json::array{r.version, r.seen, OptionalDouble(r.fleet)});
  }
  o["rollouts"] = std::move(rollouts);

  // Per second, oldest first, seconds with nothing left out.
  const auto current = static_cast<int64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(clock_.Now() - start_).count());
  std::vector<const Second*> recent;
  for (const Second& s : seconds_) {
    if (s.second >= 0 && s.second > current - static_cast<int64_t>(seconds_.size())) {
      recent.push_back(&s);
    }
  }
  std::sort(recent.begin(), recent.end(),
            [](const Second* a, const Second* b) { return a->second < b->second; });
  json::array per_second;
  for (const Second* s : recent) {
    json::object served;
    for (const auto& [v, n] : s->served) served[std::to_string(v)] = n;
    if (s->unknown_version > 0) served["?"] = s->unknown_version;
    json::array staleness;
    for (uint32_t n : s->staleness) staleness.push_back(n);
    json::object sec;
    sec["t"] = s->second;
    sec["served"] = std::move(served);
    sec["staleness"] = std::move(staleness);
    sec["conflicts"] = s->conflicts;
    sec["unavailable"] = s->unavailable;
    sec["retries"] = s->retries;
    per_second.push_back(std::move(sec));
  }
  o["seconds"] = std::move(per_second);
  return json::serialize(o);
}

}  // namespace stitch
