#include "stitch/chaos/checker.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace stitch {
namespace {

std::string Describe(const RequestRecord& r) {
  std::string s = absl::StrFormat("request #%d at %.2f s via %s %s%s %s", r.id, r.sent_s, r.via,
                                  r.route, r.stream ? " (stream)" : "", r.constraint.ToString());
  absl::StrAppend(&s, " -> ", r.status);
  if (r.start.has_value())
    absl::StrAppend(&s, " stamped [", *r.start, ", ", r.end.value_or(-1), "]");
  if (!r.error.empty()) absl::StrAppend(&s, ": ", r.error);
  return s;
}

bool Violates(const RequestRecord& r) {
  if (!r.start.has_value() || !r.end.has_value()) return false;
  if (*r.start > *r.end) return true;
  if (r.constraint.exact_version.has_value()) {
    return *r.start != *r.constraint.exact_version || *r.end != *r.constraint.exact_version;
  }
  if (r.constraint.min_version.has_value()) return *r.start < *r.constraint.min_version;
  return false;
}

int64_t Mean(const std::vector<int64_t>& v, size_t begin, size_t end) {
  if (end <= begin) return 0;
  int64_t sum = std::accumulate(v.begin() + static_cast<ptrdiff_t>(begin),
                                v.begin() + static_cast<ptrdiff_t>(end), int64_t{0});
  return sum / static_cast<int64_t>(end - begin);
}

struct Window {
  double from = 0;
  double to = 0;
  FaultKind kind = FaultKind::kEngineKill;
};

}  // namespace

double KindFigures::availability() const {
  return requests == 0 ? 1.0 : static_cast<double>(answered) / static_cast<double>(requests);
}

double KindFigures::alone_availability() const {
  return alone_requests == 0
             ? 1.0
             : static_cast<double>(alone_answered) / static_cast<double>(alone_requests);
}

ChaosFigures CheckHistory(const std::vector<HistoryEntry>& history, const CheckOptions& options) {
  ChaosFigures f;
  std::vector<const RequestRecord*> requests;
  std::vector<const FaultEntry*> faults;
  std::map<std::pair<std::string, int>, std::vector<const ResourceEntry*>> series;
  std::set<int64_t> published = {0};
  int64_t highest_pointer = 0;
  std::vector<std::string> incomplete_pointers;
  for (const HistoryEntry& entry : history) {
    if (const auto* run = std::get_if<RunEntry>(&entry)) {
      f.run = *run;
      f.has_run = true;
    } else if (const auto* r = std::get_if<RequestRecord>(&entry)) {
      requests.push_back(r);
    } else if (const auto* fault = std::get_if<FaultEntry>(&entry)) {
      faults.push_back(fault);
    } else if (const auto* p = std::get_if<PublishEntry>(&entry)) {
      ++f.publish_attempts;
      if (absl::StartsWith(p->outcome, "published")) {
        published.insert(p->version);
        ++(p->full ? f.published_full : f.published_delta);
      } else if (p->outcome == "killed") {
        ++f.publishes_killed;
      } else {
        ++f.publishes_failed;
      }
    } else if (const auto* p = std::get_if<PointerEntry>(&entry)) {
      ++f.pointer_values;
      highest_pointer = std::max(highest_pointer, p->version);
      if (!p->complete) {
        ++f.pointer_incomplete;
        incomplete_pointers.push_back(
            absl::StrFormat("pointer at %.2f s named v%d: %s", p->at_s, p->version, p->detail));
      }
    } else if (const auto* res = std::get_if<ResourceEntry>(&entry)) {
      series[{res->process, res->instance}].push_back(res);
    } else if (const auto* end = std::get_if<EndEntry>(&entry)) {
      f.end = *end;
      f.has_end = true;
      highest_pointer = std::max(highest_pointer, end->final_pointer);
    }
  }
  // The pointer moves one version at a time, so every version up to the
  // highest it named was published.
  for (int64_t v = 0; v <= highest_pointer; ++v) published.insert(v);
  f.final_version = f.has_end ? f.end.final_pointer : highest_pointer;

  auto example = [&](std::vector<std::string>& list, std::string line) {
    if (list.size() < options.max_examples) list.push_back(std::move(line));
  };
  std::vector<std::string> violations, unpublished, mislabelled, failed, wrong_spans;
  std::vector<Window> windows;
  for (const FaultEntry* e : faults) {
    if (!e->skipped) windows.push_back({e->applied_s, e->ended_s, e->fault.kind});
  }
  for (const RequestRecord* r : requests) {
    ++f.requests;
    (r->via == "gateway" ? f.via_gateway : f.via_sidecar) += 1;
    if (r->stream) ++f.streamed;
    if (!r->session.empty()) ++f.with_session;
    if (r->probe) ++f.probes;
    if (r->constraint.exact_version.has_value()) {
      ++f.exact_constrained;
    } else if (r->constraint.min_version.has_value()) {
      ++f.min_constrained;
    } else {
      ++f.unconstrained;
    }
    switch (r->outcome) {
      case Outcome::kAnswered:
        ++f.answered;
        break;
      case Outcome::kRetryable:
        ++f.retryable;
        break;
      case Outcome::kFailed:
        ++f.failed;
        example(failed, Describe(*r));
        break;
      case Outcome::kClientLeft:
        ++f.client_left;
        break;
    }
    if (r->outcome != Outcome::kClientLeft) {
      const bool calm = std::none_of(windows.begin(), windows.end(), [&](const Window& w) {
        return r->sent_s >= w.from && r->sent_s <= w.to;
      });
      if (calm) {
        ++f.calm_requests;
        if (r->outcome == Outcome::kAnswered) ++f.calm_answered;
      }
    }
    if (r->outcome != Outcome::kAnswered) continue;
    if (Violates(*r)) {
      ++f.constraint_violations;
      example(violations, Describe(*r));
    }
    if (r->start.has_value() && r->end.has_value() &&
        (!published.contains(*r->start) || !published.contains(*r->end))) {
      ++f.unpublished;
      example(unpublished, Describe(*r));
    }
    if (r->spans_check == "exact") {
      ++f.spans_exact;
      if (r->spans.find("],[") != std::string::npos) ++f.spans_exact_crossed;
    } else if (r->spans_check == "unknown") {
      ++f.spans_unknown;
    } else if (!r->spans_check.empty()) {
      ++f.spans_wrong;
      example(wrong_spans, absl::StrCat(Describe(*r), "; spans ", r->spans, ": ",
                                        r->spans_check.substr(r->spans_check.find(':') + 2)));
    }
    switch (r->verdict) {
      case Verdict::kSame:
        ++f.judged_same;
        break;
      case Verdict::kCrossed:
        ++f.judged_crossed;
        break;
      case Verdict::kUnjudged:
        ++f.unjudged;
        break;
      case Verdict::kMismatch:
      case Verdict::kNone:
        ++f.mislabelled;
        example(mislabelled,
                absl::StrCat(Describe(*r),
                             r->matches.has_value()
                                 ? absl::StrCat("; it is v", *r->matches, "'s greedy output")
                                 : std::string("; no nearby version's output")));
        break;
    }
  }

  // Per fault kind: availability while active, and time to recover.
  std::vector<const RequestRecord*> probes;
  for (const RequestRecord* r : requests) {
    if (r->probe && r->outcome == Outcome::kAnswered) probes.push_back(r);
  }
  std::vector<std::string> unrecovered;
  for (FaultKind kind : kAllFaultKinds) {
    KindFigures k;
    k.kind = kind;
    bool scheduled = false;
    std::set<int64_t> counted;
    for (const Fault& s : f.run.schedule) scheduled |= s.kind == kind;
    for (const FaultEntry* e : faults) {
      if (e->fault.kind != kind) continue;
      scheduled = true;
      if (e->skipped) {
        ++k.skipped;
        continue;
      }
      ++k.injected;
      for (const RequestRecord* r : requests) {
        if (r->outcome == Outcome::kClientLeft || r->sent_s < e->applied_s ||
            r->sent_s > e->ended_s || !counted.insert(r->id).second) {
          continue;
        }
        ++k.requests;
        if (r->outcome == Outcome::kAnswered) ++k.answered;
        const bool alone = std::none_of(windows.begin(), windows.end(), [&](const Window& w) {
          return w.kind != kind && r->sent_s >= w.from && r->sent_s <= w.to;
        });
        if (alone) {
          ++k.alone_requests;
          if (r->outcome == Outcome::kAnswered) ++k.alone_answered;
        }
      }
      std::optional<double> recovered;
      for (const RequestRecord* p : probes) {
        if (p->sent_s < e->ended_s) continue;
        const double took = p->done_s - e->ended_s;
        if (!recovered.has_value() || took < *recovered) recovered = took;
      }
      if (recovered.has_value() && *recovered <= options.max_recovery_s) {
        k.recovery_s.push_back(*recovered);
      } else {
        ++k.not_recovered;
        example(unrecovered,
                absl::StrFormat("fault #%d %s (%.1f s to %.1f s): %s", e->fault.id,
                                e->fault.Target(), e->applied_s, e->ended_s,
                                recovered.has_value()
                                    ? absl::StrFormat("recovered only after %.1f s", *recovered)
                                    : std::string("no probe succeeded after it ended")));
      }
    }
    if (scheduled) f.kinds.push_back(std::move(k));
  }

  // Resource growth over long-lived processes.
  for (const auto& [key, samples] : series) {
    if (samples.size() < 2) continue;
    GrowthFigures g;
    g.process = absl::StrCat(key.first, " #", key.second);
    g.samples = static_cast<int>(samples.size());
    g.span_s = samples.back()->at_s - samples.front()->at_s;
    std::vector<int64_t> rss, files;
    for (const ResourceEntry* s : samples) {
      rss.push_back(s->rss_kib);
      files.push_back(s->open_files);
    }
    const size_t third = samples.size() / 3;
    if (third == 0) continue;
    g.rss_first_kib = Mean(rss, 0, third);
    g.rss_last_kib = Mean(rss, samples.size() - third, samples.size());
    g.files_first = Mean(files, 0, third);
    g.files_last = Mean(files, samples.size() - third, samples.size());
    if (g.span_s >= options.growth_min_span_s && g.samples >= options.growth_min_samples) {
      g.rss_grew = g.rss_last_kib - g.rss_first_kib >
                   std::max<int64_t>(options.rss_growth_floor_kib,
                                     static_cast<int64_t>(options.rss_growth_fraction *
                                                          static_cast<double>(g.rss_first_kib)));
      g.files_grew = g.files_last - g.files_first >
                     std::max<int64_t>(options.files_growth_floor,
                                       static_cast<int64_t>(options.files_growth_fraction *
                                                            static_cast<double>(g.files_first)));
    }
    f.growth.push_back(std::move(g));
  }

  // The checks.
  auto check = [&](bool ok, std::string what, const std::vector<std::string>& behind) {
    if (ok) return;
    f.failures.push_back(std::move(what));
    for (const std::string& line : behind) f.examples.push_back(line);
  };
  check(f.has_run, "the history has no run line", {});
  check(f.constraint_violations == 0,
        absl::StrCat(f.constraint_violations, " answers violated their constraint"), violations);
  check(f.unpublished == 0,
        absl::StrCat(f.unpublished, " answers were attributed to an unpublished version"),
        unpublished);
  check(
      f.mislabelled == 0,
      absl::StrCat(f.mislabelled, " answers' labels disagree with the weights that produced them"),
      mislabelled);
  check(f.spans_wrong == 0,
        absl::StrCat(f.spans_wrong,
                     " answers' version spans disagree with the weights that "
                     "produced them"),
        wrong_spans);
  check(f.failed == 0,
        absl::StrCat(f.failed,
                     " requests failed otherwise (not a 409, a 503 or a dropped "
                     "connection)"),
        failed);
  check(f.pointer_incomplete == 0,
        absl::StrCat("the pointer named incomplete bytes ", f.pointer_incomplete, " times"),
        incomplete_pointers);
  int64_t not_recovered = 0;
  for (const KindFigures& k : f.kinds) not_recovered += k.not_recovered;
  check(not_recovered == 0,
        absl::StrCat(not_recovered, " faults were not recovered from within ",
                     options.max_recovery_s, " s"),
        unrecovered);
  check(f.has_end, "the history has no end line (the run did not finish)", {});
  if (f.has_end) {
    check(f.end.pointer_complete,
          absl::StrCat("the final pointer v", f.end.final_pointer, " does not name complete bytes"),
          {f.end.pointer_detail});
    check(f.end.converged, "the fleet did not converge to the final pointer", {f.end.convergence});
    check(f.end.leftover_processes.empty(),
          absl::StrCat(f.end.leftover_processes.size(), " processes were left behind"),
          f.end.leftover_processes);
    check(f.end.leftover_temp.empty(),
          absl::StrCat(f.end.leftover_temp.size(),
                       " temporary files or directories were left "
                       "behind"),
          f.end.leftover_temp);
    check(f.end.unfinished.empty(),
          absl::StrCat("generations kept running after their clients and the load were gone: ",
                       f.end.unfinished.size(), " places"),
          f.end.unfinished);
  }
  std::vector<std::string> grew;
  for (const GrowthFigures& g : f.growth) {
    if (g.rss_grew) {
      grew.push_back(absl::StrFormat("%s: resident memory %d KiB -> %d KiB over %.0f s", g.process,
                                     g.rss_first_kib, g.rss_last_kib, g.span_s));
    }
    if (g.files_grew) {
      grew.push_back(absl::StrFormat("%s: open files %d -> %d over %.0f s", g.process,
                                     g.files_first, g.files_last, g.span_s));
    }
  }
  check(grew.empty(),
        absl::StrCat("resident memory or open files grew during the soak (", grew.size(),
                     " findings)"),
        grew);
  return f;
}

std::string FormatFigures(const ChaosFigures& f) {
  std::string out;
  auto pct = [](int64_t part, int64_t whole) {
    return whole == 0 ? 100.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
  };
  absl::StrAppendFormat(&out, "chaos: seed %d, %g min, %s store, %d replicas, %d faults\n",
                        f.run.seed, f.run.minutes, f.run.store, f.run.replicas,
                        f.run.schedule.size());
  absl::StrAppendFormat(
      &out,
      "requests     %d: answered %d (%.1f%%), retryable %d, failed otherwise %d, left by "
      "the client %d\n",
      f.requests, f.answered, pct(f.answered, f.requests - f.client_left), f.retryable, f.failed,
      f.client_left);
  absl::StrAppendFormat(&out,
                        "             via the gateway %d, direct to sidecars %d; streamed %d; "
                        "with a session %d; recovery probes %d\n",
                        f.via_gateway, f.via_sidecar, f.streamed, f.with_session, f.probes);
  absl::StrAppendFormat(&out,
                        "             constraints: none %d, min_version %d, exact_version %d\n",
                        f.unconstrained, f.min_constrained, f.exact_constrained);
  absl::StrAppendFormat(&out,
                        "oracle       constraint violations %d, attributed to an unpublished "
                        "version %d, label disagrees with the weights %d\n",
                        f.constraint_violations, f.unpublished, f.mislabelled);
  absl::StrAppendFormat(&out,
                        "             judged: %d on one version, %d across a commit (switch "
                        "points found exactly), %d across a commit not judged\n",
                        f.judged_same, f.judged_crossed, f.unjudged);
  absl::StrAppendFormat(&out,
                        "             version spans: %d exact (%d across a commit), %d unknown, "
                        "%d wrong\n",
                        f.spans_exact, f.spans_exact_crossed, f.spans_unknown, f.spans_wrong);
  absl::StrAppendFormat(&out,
                        "versions     final v%d; published %d FULL, %d DELTA; publishes killed "
                        "%d, failed %d; pointer seen at %d values, %d incomplete\n",
                        f.final_version, f.published_full, f.published_delta, f.publishes_killed,
                        f.publishes_failed, f.pointer_values, f.pointer_incomplete);
  absl::StrAppendFormat(&out, "faults       %-18s %8s %9s %13s %15s %16s\n", "kind", "injected",
                        "requests", "availability", "(kind alone)", "recover mean/max");
  for (const KindFigures& k : f.kinds) {
    std::string recovery = "-";
    if (!k.recovery_s.empty()) {
      const double sum = std::accumulate(k.recovery_s.begin(), k.recovery_s.end(), 0.0);
      const double max = *std::max_element(k.recovery_s.begin(), k.recovery_s.end());
      recovery =
          absl::StrFormat("%.2f / %.2f s", sum / static_cast<double>(k.recovery_s.size()), max);
    }
    if (k.not_recovered > 0) absl::StrAppend(&recovery, " (", k.not_recovered, " not)");
    std::string injected = absl::StrCat(k.injected);
    if (k.skipped > 0) absl::StrAppend(&injected, "+", k.skipped, "s");
    const std::string alone =
        k.alone_requests == 0
            ? std::string("-")
            : absl::StrFormat("%.1f%% of %d", 100.0 * k.alone_availability(), k.alone_requests);
    absl::StrAppendFormat(&out, "             %-18s %8s %9d %12.1f%% %15s %16s\n",
                          FaultKindName(k.kind), injected, k.requests, 100.0 * k.availability(),
                          alone, recovery);
  }
  absl::StrAppendFormat(&out, "             %-18s %8s %9d %12.1f%%\n", "(no fault active)", "-",
                        f.calm_requests, pct(f.calm_answered, f.calm_requests));
  for (const std::string& line : f.run.left_out) {
    absl::StrAppend(&out, "left out     ", line, "\n");
  }
  if (!f.growth.empty()) {
    bool header = false;
    for (const GrowthFigures& g : f.growth) {
      if (g.span_s < 60) continue;
      absl::StrAppendFormat(&out, "%s%-22s %5.0f s  rss %6d -> %6d KiB  files %4d -> %4d%s\n",
                            header ? "             " : "resources    ", g.process, g.span_s,
                            g.rss_first_kib, g.rss_last_kib, g.files_first, g.files_last,
                            g.rss_grew || g.files_grew ? "  GREW" : "");
      header = true;
    }
  }
  if (f.has_end) {
    absl::StrAppendFormat(
        &out,
        "hygiene      final pointer v%d %s; fleet %s; processes left %d; temporary files left "
        "%d; generations left running %d\n",
        f.end.final_pointer, f.end.pointer_complete ? "complete" : "INCOMPLETE",
        f.end.converged ? "converged" : "DID NOT CONVERGE", f.end.leftover_processes.size(),
        f.end.leftover_temp.size(), f.end.unfinished.size());
    for (const std::string& note : f.end.notes) absl::StrAppend(&out, "note         ", note, "\n");
  }
  if (f.failures.empty()) {
    absl::StrAppend(&out, "checks       all passed\n");
  } else {
    absl::StrAppend(&out, "checks       ", f.failures.size(),
                    " FAILED: ", absl::StrJoin(f.failures, "; "), "\n");
    for (const std::string& e : f.examples) absl::StrAppend(&out, "  ", e, "\n");
  }
  return out;
}

}  // namespace stitch
