#include "stitch/core/json.h"

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {
namespace json = boost::json;

absl::StatusOr<int64_t> VersionFromJsonValue(const json::value& v, std::string_view field_std) {
  absl::string_view field = AbslView(field_std);
  int64_t n = 0;
  if (v.is_int64()) {
    n = v.get_int64();
  } else if (v.is_uint64()) {
    return absl::OutOfRangeError(
        absl::StrCat(field, " ", v.get_uint64(), " is above the maximum ", kMaxVersion));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be a non-negative integer, got ", json::serialize(v)));
  }
  if (absl::Status s = ValidateVersionNumber(n); !s.ok()) {
    return absl::OutOfRangeError(absl::StrCat(field, ": ", s.message()));
  }
  return n;
}

absl::StatusOr<VersionConstraint> ConstraintFromJsonValue(const json::value& v) {
  VersionConstraint c;
  if (v.is_null()) return c;
  if (!v.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_version must be an object like {\"min_version\": N} or "
                     "{\"exact_version\": N}, got ",
                     json::serialize(v)));
  }
  for (const auto& [key, value] : v.get_object()) {
    if (key != "min_version" && key != "exact_version") {
      return absl::InvalidArgumentError(absl::StrCat("weight_version has unknown field \"",
                                                     AbslView(key),
                                                     "\" (expected min_version or exact_version)"));
    }
    if (value.is_null()) continue;
    auto n = VersionFromJsonValue(value, absl::StrCat("weight_version.", AbslView(key)));
    if (!n.ok()) return n.status();
    (key == "min_version" ? c.min_version : c.exact_version) = *n;
  }
  // exact beats min: keep only what decides.
  if (c.exact_version) c.min_version.reset();
  return c;
}

absl::StatusOr<VersionConstraint> VersionConstraint::FromJson(std::string_view text) {
  json::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_version is not valid JSON: ", ec.message()));
  }
  return ConstraintFromJsonValue(v);
}

json::value ConstraintToJsonValue(const VersionConstraint& c) {
  json::object o;
  if (c.exact_version) {
    o["exact_version"] = *c.exact_version;
  } else if (c.min_version) {
    o["min_version"] = *c.min_version;
  }
  return o;
}

json::value ReplicaStateToJsonValue(const ReplicaState& s) {
  json::object o;
  o["ready"] = s.ready;
  if (s.applied) {
    o["applied"] = s.applied->ToString();
    o["applied_version"] = s.applied->version;
  } else {
    o["applied"] = nullptr;
    o["applied_version"] = nullptr;
  }
  o["sync_state"] = SyncStateName(s.sync_state);
  o["reason"] = s.reason;
  o["run_id"] = s.run_id;
  o["commit_mode"] = CommitModeName(s.commit_mode);
  o["active_requests"] = s.active_requests;
  o["update_destination_ready"] = s.update_destination_ready;
  o["update_destination_error"] = s.update_destination_error;
  o["terminal_error"] = s.terminal_error;
  o["sync_error"] = s.sync_error;
  json::object m;
  for (const auto& [k, v] : s.metrics) m[k] = v;
  o["metrics"] = std::move(m);
  return o;
}

namespace {

absl::Status TypeError(std::string_view field, std::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat("server_info.", AbslView(field), " must be ", AbslView(want)));
}

}  // namespace

absl::StatusOr<ReplicaState> ReplicaStateFromJsonValue(const json::value& v) {
  if (!v.is_object()) return absl::InvalidArgumentError("server_info must be a JSON object");
  const json::object& o = v.get_object();
  ReplicaState s;
  auto get_bool = [&](std::string_view k, bool& out) -> absl::Status {
    if (const json::value* f = o.if_contains(k)) {
      if (!f->is_bool()) return TypeError(k, "a boolean");
      out = f->get_bool();
    }
    return absl::OkStatus();
  };
  auto get_string = [&](std::string_view k, std::string& out) -> absl::Status {
    if (const json::value* f = o.if_contains(k)) {
      if (f->is_null()) return absl::OkStatus();
      if (!f->is_string()) return TypeError(k, "a string");
      out = std::string(f->get_string());
    }
    return absl::OkStatus();
  };
  for (auto [k, out] : {std::pair{"ready", &s.ready},
                        std::pair{"update_destination_ready", &s.update_destination_ready}}) {
    if (absl::Status st = get_bool(k, *out); !st.ok()) return st;
  }
  for (auto [k, out] :
       {std::pair{"reason", &s.reason}, std::pair{"run_id", &s.run_id},
        std::pair{"update_destination_error", &s.update_destination_error},
        std::pair{"terminal_error", &s.terminal_error}, std::pair{"sync_error", &s.sync_error}}) {
    if (absl::Status st = get_string(k, *out); !st.ok()) return st;
  }
  std::string text;
  if (absl::Status st = get_string("applied", text); !st.ok()) return st;
  if (!text.empty()) {
    auto ref = VersionRef::Parse(text);
    if (!ref.ok()) return Annotate(ref.status(), "server_info.applied");
    s.applied = *ref;
  }
  text.clear();
  if (absl::Status st = get_string("sync_state", text); !st.ok()) return st;
  if (!text.empty()) {
    auto state = ParseSyncState(text);
    if (!state.ok()) return state.status();
    s.sync_state = *state;
  }
  text.clear();
  if (absl::Status st = get_string("commit_mode", text); !st.ok()) return st;
  if (!text.empty()) {
    auto mode = ParseCommitMode(text);
    if (!mode.ok()) return mode.status();
    s.commit_mode = *mode;
  }
  if (const json::value* f = o.if_contains("active_requests")) {
    if (!f->is_int64() || f->get_int64() < 0)
      return TypeError("active_requests", "an integer >= 0");
    s.active_requests = f->get_int64();
  }
  if (const json::value* f = o.if_contains("metrics"); f && !f->is_null()) {
    if (!f->is_object()) return TypeError("metrics", "an object");
    for (const auto& [k, mv] : f->get_object()) {
      if (mv.is_number()) s.metrics[std::string(k)] = mv.to_number<double>();
    }
  }
  return s;
}

json::value PoolStateToJsonValue(const PoolState& p) {
  json::array replicas;
  for (const ReplicaStatus& r : p.replicas) {
    json::object o = ReplicaStateToJsonValue(r.state).as_object();
    o["url"] = r.url;
    o["reachable"] = r.reachable;
    o["in_flight"] = r.in_flight;
    o["last_error"] = r.last_error;
    replicas.push_back(std::move(o));
  }
  json::object out;
  out["replicas"] = std::move(replicas);
  out["ready"] = p.ready_count();
  return out;
}

}  // namespace stitch
