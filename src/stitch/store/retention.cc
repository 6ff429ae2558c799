#include "stitch/store/retention.h"

#include <algorithm>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stitch/core/errors.h"
#include "stitch/core/version.h"
#include "stitch/store/materialize_chain.h"

namespace stitch {
namespace {

namespace json = boost::json;

// How long a gc's record of what it is deleting stands: a gc still deleting
// past it stops (run it again); a hold ignores records older than this.
constexpr absl::Duration kGcRecordLifetime = absl::Hours(1);

std::string GcRecordName(absl::Time now) {
  std::random_device device;
  return absl::StrCat("gc-", absl::ToUnixNanos(now), "-", device());
}

std::string GcRecordJson(const std::vector<int64_t>& versions, absl::Time expires) {
  json::object o;
  json::array list;
  for (int64_t v : versions) list.emplace_back(v);
  o["deleting"] = std::move(list);
  o["expires_unix"] = absl::ToUnixSeconds(expires);
  return json::serialize(o);
}

// The versions a live gc record says are being deleted; an unreadable or
// expired record says nothing (it cannot be acted on: its gc stops at its
// expiry).
absl::StatusOr<std::set<int64_t>> BeingDeleted(Store& store, absl::Time now) {
  std::set<int64_t> out;
  auto names = store.ListRecords(kGcRecordKind);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    auto text = store.ReadRecord(kGcRecordKind, name);
    if (!text.ok()) return text.status();
    if (!text->has_value()) continue;  // its gc finished
    boost::system::error_code ec;
    json::value v = json::parse(**text, ec);
    const json::object* o = ec ? nullptr : v.if_object();
    if (o == nullptr) continue;
    const json::value* expires = o->if_contains("expires_unix");
    const json::value* deleting = o->if_contains("deleting");
    if (expires == nullptr || !expires->is_int64() || deleting == nullptr ||
        !deleting->is_array()) {
      continue;
    }
    if (absl::FromUnixSeconds(expires->as_int64()) <= now) continue;
    for (const json::value& d : deleting->as_array()) {
      if (d.is_int64()) out.insert(d.as_int64());
    }
  }
  return out;
}

}  // namespace

std::string HoldToJson(const Hold& hold) {
  json::object o;
  o["version"] = hold.version;
  o["expires_unix"] = absl::ToUnixSeconds(hold.expires);
  return json::serialize(o);
}

absl::StatusOr<Hold> HoldFromJson(std::string_view holder, std::string_view text) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("hold '", AbslView(holder), "' is malformed: ", AbslView(why)));
  };
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) return bad(ec.message());
  const json::object* o = v.if_object();
  if (o == nullptr) return bad("not a JSON object");
  Hold hold;
  hold.holder = std::string(holder);
  const json::value* version = o->if_contains("version");
  if (version == nullptr || !version->is_int64()) return bad("no integer \"version\"");
  hold.version = version->as_int64();
  if (absl::Status s = ValidateVersionNumber(hold.version); !s.ok()) {
    return bad(std::string_view(s.message().data(), s.message().size()));
  }
  const json::value* expires = o->if_contains("expires_unix");
  if (expires == nullptr || !expires->is_int64()) return bad("no integer \"expires_unix\"");
  hold.expires = absl::FromUnixSeconds(expires->as_int64());
  return hold;
}

absl::StatusOr<std::vector<Hold>> ListHolds(Store& store) {
  auto names = store.ListRecords(kHoldRecordKind);
  if (!names.ok()) return names.status();
  std::vector<Hold> out;
  for (const std::string& name : *names) {
    auto text = store.ReadRecord(kHoldRecordKind, name);
    if (!text.ok()) return text.status();
    if (!text->has_value()) continue;  // released meanwhile
    auto hold = HoldFromJson(name, **text);
    if (!hold.ok()) return Annotate(hold.status(), absl::StrCat("store ", store.uri()));
    out.push_back(*std::move(hold));
  }
  return out;
}

absl::Status PutHold(Store& store, const Hold& hold, absl::Time now) {
  if (absl::Status s = ValidateRecordWord("holder", hold.holder); !s.ok()) return s;
  if (!hold.live(now)) {
    return absl::InvalidArgumentError(
        absl::StrCat("hold '", hold.holder, "' would expire before it is taken; give a TTL"));
  }
  if (absl::Status s = store.WriteRecord(kHoldRecordKind, hold.holder, HoldToJson(hold)); !s.ok()) {
    return s;
  }
  // Written: from here on a gc that starts spares the chain. What a gc that
  // started earlier is deleting, and what is already gone, refuse the hold.
  auto refuse = [&](absl::Status why) {
    (void)store.DeleteRecord(kHoldRecordKind, hold.holder);
    return why;
  };
  const absl::StatusOr<std::set<int64_t>> deleting = BeingDeleted(store, now);
  if (!deleting.ok()) return refuse(deleting.status());
  const absl::StatusOr<std::vector<int64_t>> anchors = ListAnchors(store);
  if (!anchors.ok()) return refuse(anchors.status());
  for (int64_t v = hold.version;;) {
    if (deleting->contains(v)) {
      return refuse(absl::FailedPreconditionError(
          absl::StrCat("store ", store.uri(), ": retention is deleting ", VersionDirName(v),
                       ", on the chain of ", VersionDirName(hold.version),
                       "; hold a version retention keeps (the pointer's, or one "
                       "of the last ones)")));
    }
    auto manifest = store.ReadManifest(v);
    if (!manifest.ok()) {
      if (absl::IsNotFound(manifest.status())) {
        return refuse(absl::FailedPreconditionError(
            absl::StrCat("store ", store.uri(), ": cannot hold ", VersionDirName(hold.version),
                         ": its chain needs ", VersionDirName(v), ", which is not published")));
      }
      return refuse(manifest.status());
    }
    if (std::binary_search(anchors->begin(), anchors->end(), v)) break;
    if (manifest->kind != VersionKind::kDelta || !manifest->base_version) break;
    v = *manifest->base_version;
  }
  return absl::OkStatus();
}

absl::StatusOr<Hold> ReleaseHold(Store& store, std::string_view holder) {
  if (absl::Status s = ValidateRecordWord("holder", holder); !s.ok()) return s;
  auto text = store.ReadRecord(kHoldRecordKind, holder);
  if (!text.ok()) return text.status();
  if (!text->has_value()) {
    return absl::NotFoundError(
        absl::StrCat("store ", store.uri(), " has no hold by '", AbslView(holder), "'"));
  }
  // A malformed record is released all the same: it is what the user asked.
  auto hold = HoldFromJson(holder, **text);
  if (absl::Status s = store.DeleteRecord(kHoldRecordKind, holder); !s.ok()) return s;
  if (!hold.ok()) {
    Hold gone;
    gone.holder = std::string(holder);
    return gone;
  }
  return *hold;
}

absl::Status ValidateRetentionRule(const RetentionRule& rule) {
  if (rule.keep_last < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keep-last must be at least 1 (got ", rule.keep_last, ")"));
  }
  if (rule.keep_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--keep-every must be 0 (no milestones) or positive (got ", rule.keep_every, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RetentionPlan> PlanRetention(const VersionRef& pointer,
                                            const std::vector<int64_t>& versions,
                                            const std::vector<Hold>& holds, absl::Time now,
                                            const RetentionRule& rule,
                                            const ManifestReader& manifest,
                                            const std::vector<int64_t>& anchors) {
  if (absl::Status s = ValidateRetentionRule(rule); !s.ok()) return s;
  RetentionPlan plan;
  plan.pointer = pointer;
  const std::set<int64_t> present(versions.begin(), versions.end());
  const std::set<int64_t> anchored(anchors.begin(), anchors.end());
  std::map<int64_t, std::vector<std::string>> kept;
  // Each needed version, then its chain back to an anchor.
  std::map<int64_t, std::string> roots;
  auto need = [&](int64_t v, std::string reason) {
    if (!present.contains(v)) return;
    kept[v].push_back(reason);
    roots.try_emplace(v, std::move(reason));
  };
  need(pointer.version, "pointer");
  for (int64_t v : versions) {
    if (v > pointer.version) {
      kept[v].push_back("above the pointer (being published)");
    } else if (v > pointer.version - rule.keep_last) {
      need(v, absl::StrCat("last ", rule.keep_last));
    } else if (rule.keep_every > 0 && v % rule.keep_every == 0) {
      need(v, absl::StrCat("milestone (every ", rule.keep_every, ")"));
    }
  }
  for (const Hold& hold : holds) {
    if (!hold.live(now)) continue;
    if (!present.contains(hold.version)) {
      plan.warnings.push_back(absl::StrCat("hold '", hold.holder, "' names ",
                                           VersionDirName(hold.version),
                                           ", which the store does not hold"));
      continue;
    }
    need(hold.version, absl::StrCat("held by ", hold.holder));
  }
  std::map<int64_t, VersionManifest> read;  // each manifest read once
  for (const auto& [root, why] : roots) {
    for (int64_t v = root;;) {
      auto it = read.find(v);
      if (it == read.end()) {
        auto m = manifest(v);
        if (!m.ok()) {
          if (!absl::IsNotFound(m.status())) return m.status();
          plan.warnings.push_back(absl::StrCat(VersionDirName(root), " (", why,
                                               ") has a broken chain: ", VersionDirName(v),
                                               " is not published"));
          break;
        }
        it = read.emplace(v, *std::move(m)).first;
      }
      if (v != root) kept[v].push_back(absl::StrCat("chain of ", VersionDirName(root)));
      if (anchored.contains(v)) {
        kept[v].push_back("anchored");
        break;
      }
      const VersionManifest& m = it->second;
      if (m.kind != VersionKind::kDelta || !m.base_version) break;
      const int64_t base = *m.base_version;
      // Below every version the store holds: the run's boot checkpoint,
      // which replicas start from and the store never held.
      if (!present.contains(base) && base < *present.begin()) break;
      if (!present.contains(base)) {
        plan.warnings.push_back(absl::StrCat(
            VersionDirName(root), " (", why, ") has a broken chain: its link ", VersionDirName(v),
            " needs ", VersionDirName(base), ", which the store does not hold"));
        break;
      }
      v = base;
    }
  }
  for (auto& [v, reasons] : kept) {
    std::sort(reasons.begin(), reasons.end());
    reasons.erase(std::unique(reasons.begin(), reasons.end()), reasons.end());
    plan.kept.push_back({v, std::move(reasons)});
  }
  for (int64_t v : versions) {
    if (!kept.contains(v)) plan.deleted.push_back(v);
  }
  for (int64_t v : anchors) {
    if (!kept.contains(v) && v < pointer.version) plan.anchors_deleted.push_back(v);
  }
  return plan;
}

absl::StatusOr<RetentionReport> ApplyRetention(Store& store, const RetentionRule& rule,
                                               absl::Time now, bool dry_run,
                                               const std::function<void()>& between_looks) {
  if (absl::Status s = store.Refresh(); !s.ok()) return s;
  auto pointer = ReadClaimedPointer(store);
  if (!pointer.ok()) return pointer.status();
  if (!store.run_id().empty() && pointer->run_id != store.run_id()) {
    return absl::FailedPreconditionError(
        absl::StrCat("store ", store.uri(), ": the pointer names run '", pointer->run_id,
                     "', not '", store.run_id(), "'; retention acts on the pointer's run"));
  }
  auto versions = store.ListVersions();
  if (!versions.ok()) return versions.status();
  auto anchors = ListAnchors(store);
  if (!anchors.ok()) return anchors.status();
  auto plan_with = [&](const std::vector<Hold>& holds) {
    return PlanRetention(
        *pointer, *versions, holds, now, rule, [&](int64_t v) { return store.ReadManifest(v); },
        *anchors);
  };
  auto holds = ListHolds(store);
  if (!holds.ok()) return holds.status();
  auto plan = plan_with(*holds);
  if (!plan.ok()) return plan.status();
  RetentionReport report;
  report.plan = *std::move(plan);
  if (dry_run || (report.plan.deleted.empty() && report.plan.anchors_deleted.empty())) {
    return report;
  }

  // Say what is about to go, then read the holds again: a hold written
  // before this record is seen here; one written after it sees the record.
  const absl::Time expires = now + kGcRecordLifetime;
  const std::string record = GcRecordName(now);
  if (absl::Status s =
          store.WriteRecord(kGcRecordKind, record, GcRecordJson(report.plan.deleted, expires));
      !s.ok()) {
    return s;
  }
  if (between_looks) between_looks();
  holds = ListHolds(store);
  absl::StatusOr<RetentionPlan> again =
      holds.ok() ? plan_with(*holds) : absl::StatusOr<RetentionPlan>(holds.status());
  if (!again.ok()) {
    (void)store.DeleteRecord(kGcRecordKind, record);
    return again.status();
  }
  // Only what the record announced, and the second look still finds
  // unneeded: a version that became deletable in between (a hold released)
  // was never announced, so a hold taken on it now could not see it; the
  // next gc deletes it.
  const std::set<int64_t> announced(report.plan.deleted.begin(), report.plan.deleted.end());
  const std::set<int64_t> announced_anchors(report.plan.anchors_deleted.begin(),
                                            report.plan.anchors_deleted.end());
  report.plan = *std::move(again);
  std::erase_if(report.plan.deleted, [&](int64_t v) { return !announced.contains(v); });
  std::erase_if(report.plan.anchors_deleted,
                [&](int64_t v) { return !announced_anchors.contains(v); });
  for (int64_t v : report.plan.deleted) {
    if (absl::Now() >= expires) {
      report.failures.push_back(absl::StrCat(VersionDirName(v),
                                             ": not deleted, this gc ran past its window; run "
                                             "it again"));
      continue;
    }
    if (absl::Status s = store.DeleteVersion(v); !s.ok()) {
      report.failures.push_back(absl::StrCat(VersionDirName(v), ": ", s.message()));
      continue;
    }
    report.deleted.push_back(v);
  }
  // An anchor after its version: a reader that listed it finds either the
  // anchor or, failing cleanly, no chain through a deleted version.
  const std::set<int64_t> failed = [&] {
    std::set<int64_t> out(report.plan.deleted.begin(), report.plan.deleted.end());
    for (int64_t v : report.deleted) out.erase(v);
    return out;
  }();
  for (int64_t v : report.plan.anchors_deleted) {
    if (failed.contains(v)) continue;  // its version stays, and so does it
    if (absl::Status s = store.anchors()->DeleteVersion(v); !s.ok()) {
      report.failures.push_back(
          absl::StrCat("the anchor of ", VersionDirName(v), ": ", s.message()));
      continue;
    }
    report.anchors_deleted.push_back(v);
  }
  if (absl::Status s = store.DeleteRecord(kGcRecordKind, record); !s.ok()) {
    report.failures.push_back(absl::StrCat("record ", record, ": ", s.message()));
  }
  return report;
}

std::string DescribeRetention(const RetentionReport& report, bool dry_run) {
  std::string out;
  const RetentionPlan& plan = report.plan;
  absl::StrAppend(&out, "pointer ", plan.pointer.ToString(), "\n");
  for (const RetentionPlan::Kept& k : plan.kept) {
    absl::StrAppend(&out, "kept    ", VersionDirName(k.version), ": ",
                    absl::StrJoin(k.reasons, ", "), "\n");
  }
  const std::vector<int64_t>& gone = dry_run ? plan.deleted : report.deleted;
  for (int64_t v : gone) {
    absl::StrAppend(&out, dry_run ? "would delete " : "deleted ", VersionDirName(v), "\n");
  }
  for (int64_t v : dry_run ? plan.anchors_deleted : report.anchors_deleted) {
    absl::StrAppend(&out, dry_run ? "would delete " : "deleted ", "the anchor of ",
                    VersionDirName(v), "\n");
  }
  for (const std::string& w : plan.warnings) absl::StrAppend(&out, "warning ", w, "\n");
  for (const std::string& f : report.failures) absl::StrAppend(&out, "failed  ", f, "\n");
  absl::StrAppend(&out, plan.kept.size(), " kept, ", gone.size(),
                  dry_run ? " to delete" : " deleted", report.failures.empty() ? "" : ", ",
                  report.failures.empty() ? "" : absl::StrCat(report.failures.size(), " failed"),
                  "\n");
  return out;
}

}  // namespace stitch
