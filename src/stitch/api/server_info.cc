#include "stitch/api/server_info.h"

#include <utility>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {

namespace json = boost::json;

namespace {

// An explanation that is empty is JSON null, as the original Python
// Stitch answers: clients written for it test `is None`, not emptiness.
json::value NullIfEmpty(const std::string& text) {
  if (text.empty()) return nullptr;
  return json::value(text);
}

json::object ReplicaStateObject(const ReplicaState& s) {
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
  o["reason"] = NullIfEmpty(s.reason);
  o["run_id"] = s.run_id;
  o["commit_mode"] = CommitModeName(s.commit_mode);
  o["active_requests"] = s.active_requests;
  o["update_destination_ready"] = s.update_destination_ready;
  o["update_destination_error"] = NullIfEmpty(s.update_destination_error);
  o["terminal_error"] = NullIfEmpty(s.terminal_error);
  o["sync_error"] = NullIfEmpty(s.sync_error);
  json::object m;
  for (const auto& [k, v] : s.metrics) m[k] = v;
  o["metrics"] = std::move(m);
  if (s.pointer) {
    o["pointer"] = s.pointer->ToString();
    o["pointer_version"] = s.pointer->version;
  } else {
    o["pointer"] = nullptr;
    o["pointer_version"] = nullptr;
  }
  o["pointer_notice"] = NullIfEmpty(s.pointer_notice);
  if (s.held) {
    json::object held;
    held["version"] = s.held->version.ToString();
    held["holder"] = s.held->holder;
    o["held"] = std::move(held);
  } else {
    o["held"] = nullptr;
  }
  return o;
}

absl::Status TypeError(std::string_view field, std::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat("server_info.", AbslView(field), " must be ", AbslView(want)));
}

absl::StatusOr<ReplicaState> ReplicaStateFrom(const json::value& v) {
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
        std::pair{"terminal_error", &s.terminal_error}, std::pair{"sync_error", &s.sync_error},
        std::pair{"pointer_notice", &s.pointer_notice}}) {
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
  if (absl::Status st = get_string("pointer", text); !st.ok()) return st;
  if (!text.empty()) {
    auto ref = VersionRef::Parse(text);
    if (!ref.ok()) return Annotate(ref.status(), "server_info.pointer");
    s.pointer = *ref;
  }
  if (const json::value* held = o.if_contains("held"); held != nullptr && !held->is_null()) {
    const json::object* h = held->if_object();
    const json::value* version = h ? h->if_contains("version") : nullptr;
    const json::value* holder = h ? h->if_contains("holder") : nullptr;
    if (version == nullptr || !version->is_string() || holder == nullptr || !holder->is_string()) {
      return TypeError("held", "null or {\"version\": identity, \"holder\": string}");
    }
    auto ref = VersionRef::Parse(version->get_string());
    if (!ref.ok()) return Annotate(ref.status(), "server_info.held.version");
    s.held = ReplicaState::Held{*ref, std::string(holder->get_string())};
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
    if (!f->is_int64() || f->get_int64() < 0) {
      return TypeError("active_requests", "an integer >= 0");
    }
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

}  // namespace

std::string ServerInfoJson(const ReplicaState& state) {
  return json::serialize(ReplicaStateObject(state));
}

absl::StatusOr<ReplicaState> ParseServerInfo(std::string_view body) {
  boost::system::error_code ec;
  json::value v = json::parse(body, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("server_info is not JSON: ", ec.message()));
  return ReplicaStateFrom(v);
}

std::string ReplicasJson(const PoolState& pool, std::string_view pointer) {
  json::array replicas;
  for (const ReplicaStatus& r : pool.replicas) {
    json::object o = ReplicaStateObject(r.state);
    o["url"] = r.url;
    o["reachable"] = r.reachable;
    o["in_flight"] = r.in_flight;
    o["stalled"] = r.stalled;
    o["last_error"] = r.last_error;
    replicas.push_back(std::move(o));
  }
  json::object out;
  out["replicas"] = std::move(replicas);
  out["ready"] = pool.ready_count();
  if (!pointer.empty()) out["pointer"] = pointer;
  return json::serialize(out);
}

absl::StatusOr<PoolState> ParseReplicas(std::string_view body) {
  boost::system::error_code ec;
  json::value doc = json::parse(body, ec);
  const json::value* list =
      ec || !doc.is_object() ? nullptr : doc.get_object().if_contains("replicas");
  if (list == nullptr || !list->is_array()) {
    return absl::InvalidArgumentError("/replicas is not a replica list");
  }
  PoolState pool;
  for (const json::value& item : list->get_array()) {
    if (!item.is_object()) continue;
    const json::object& o = item.get_object();
    ReplicaStatus s;
    absl::StatusOr<ReplicaState> state = ReplicaStateFrom(item);
    if (state.ok()) s.state = *std::move(state);
    if (const json::value* v = o.if_contains("url"); v != nullptr && v->is_string()) {
      s.url = std::string(v->get_string());
    }
    if (const json::value* v = o.if_contains("reachable"); v != nullptr && v->is_bool()) {
      s.reachable = v->get_bool();
    }
    if (const json::value* v = o.if_contains("in_flight"); v != nullptr && v->is_int64()) {
      s.in_flight = v->get_int64();
    }
    if (const json::value* v = o.if_contains("stalled"); v != nullptr && v->is_bool()) {
      s.stalled = v->get_bool();
    }
    if (const json::value* v = o.if_contains("last_error"); v != nullptr && v->is_string()) {
      s.last_error = std::string(v->get_string());
    }
    pool.replicas.push_back(std::move(s));
  }
  return pool;
}

}  // namespace stitch
