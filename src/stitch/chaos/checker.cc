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

double Percent(int64_t part, int64_t whole) {
  return whole == 0 ? 100.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}

struct Window {
  double from = 0;
  double to = 0;
  FaultKind kind = FaultKind::kEngineKill;
};

// One pass of CheckHistory: the history's entries sorted by kind, the
// figures counted from them, and the examples behind each failed check.
class HistoryCheck {
 public:
  explicit HistoryCheck(const CheckOptions& options) : options_(options) {}

  ChaosFigures Run(const std::vector<HistoryEntry>& history) {
    for (const HistoryEntry& entry : history) Sort(entry);
    // The pointer moves one version at a time, so every version up to the
    // highest it named was published.
    for (int64_t v = 0; v <= highest_pointer_; ++v) published_.insert(v);
    f_.final_version = f_.has_end ? f_.end.final_pointer : highest_pointer_;
    for (const FaultEntry* e : faults_) {
      if (!e->skipped) windows_.push_back({e->applied_s, e->ended_s, e->fault.kind});
    }
    for (const RequestRecord* r : requests_) CountRequest(*r);
    // Per fault kind: availability while active, and time to recover.
    for (const RequestRecord* r : requests_) {
      if (r->probe && r->outcome == Outcome::kAnswered) probes_.push_back(r);
    }
    for (FaultKind kind : kAllFaultKinds) FigureKind(kind);
    // Resource growth over long-lived processes.
    for (const auto& [key, samples] : series_) FigureGrowth(key, samples);
    CheckAnswers();
    CheckEnd();
    CheckGrowth();
    return std::move(f_);
  }

 private:
  void Example(std::vector<std::string>& list, std::string line) const {
    if (list.size() < options_.max_examples) list.push_back(std::move(line));
  }

  void Check(bool ok, std::string what, const std::vector<std::string>& behind) {
    if (ok) return;
    f_.failures.push_back(std::move(what));
    for (const std::string& line : behind) f_.examples.push_back(line);
  }

  void Sort(const HistoryEntry& entry) {
    if (const auto* run = std::get_if<RunEntry>(&entry)) {
      f_.run = *run;
      f_.has_run = true;
    } else if (const auto* r = std::get_if<RequestRecord>(&entry)) {
      requests_.push_back(r);
    } else if (const auto* fault = std::get_if<FaultEntry>(&entry)) {
      faults_.push_back(fault);
    } else if (const auto* p = std::get_if<PublishEntry>(&entry)) {
      CountPublish(*p);
    } else if (const auto* p = std::get_if<PointerEntry>(&entry)) {
      ++f_.pointer_values;
      highest_pointer_ = std::max(highest_pointer_, p->version);
      if (!p->complete) {
        ++f_.pointer_incomplete;
        incomplete_pointers_.push_back(
            absl::StrFormat("pointer at %.2f s named v%d: %s", p->at_s, p->version, p->detail));
      }
    } else if (const auto* res = std::get_if<ResourceEntry>(&entry)) {
      series_[{res->process, res->instance}].push_back(res);
    } else if (const auto* end = std::get_if<EndEntry>(&entry)) {
      f_.end = *end;
      f_.has_end = true;
      highest_pointer_ = std::max(highest_pointer_, end->final_pointer);
    }
  }

  void CountPublish(const PublishEntry& p) {
    ++f_.publish_attempts;
    if (absl::StartsWith(p.outcome, "published")) {
      published_.insert(p.version);
      ++(p.full ? f_.published_full : f_.published_delta);
    } else if (p.outcome == "killed") {
      ++f_.publishes_killed;
    } else {
      ++f_.publishes_failed;
    }
  }

  // What was asked and how it ended; for an answer, what the oracle and the
  // span check said of it.
  void CountRequest(const RequestRecord& r) {
    ++f_.requests;
    (r.via == "gateway" ? f_.via_gateway : f_.via_sidecar) += 1;
    if (r.stream) ++f_.streamed;
    if (!r.session.empty()) ++f_.with_session;
    if (r.probe) ++f_.probes;
    if (r.constraint.exact_version.has_value()) {
      ++f_.exact_constrained;
    } else if (r.constraint.min_version.has_value()) {
      ++f_.min_constrained;
    } else {
      ++f_.unconstrained;
    }
    switch (r.outcome) {
      case Outcome::kAnswered:
        ++f_.answered;
        break;
      case Outcome::kRetryable:
        ++f_.retryable;
        break;
      case Outcome::kFailed:
        ++f_.failed;
        Example(failed_, Describe(r));
        break;
      case Outcome::kClientLeft:
        ++f_.client_left;
        break;
    }
    if (r.outcome != Outcome::kClientLeft) {
      const bool calm = std::none_of(windows_.begin(), windows_.end(), [&](const Window& w) {
        return r.sent_s >= w.from && r.sent_s <= w.to;
      });
      if (calm) {
        ++f_.calm_requests;
        if (r.outcome == Outcome::kAnswered) ++f_.calm_answered;
      }
    }
    if (r.outcome == Outcome::kAnswered) JudgeAnswer(r);
  }

  void JudgeAnswer(const RequestRecord& r) {
    if (Violates(r)) {
      ++f_.constraint_violations;
      Example(violations_, Describe(r));
    }
    if (r.start.has_value() && r.end.has_value() &&
        (!published_.contains(*r.start) || !published_.contains(*r.end))) {
      ++f_.unpublished;
      Example(unpublished_, Describe(r));
    }
    if (r.spans_check == "exact") {
      ++f_.spans_exact;
      if (r.spans.find("],[") != std::string::npos) ++f_.spans_exact_crossed;
    } else if (r.spans_check == "unknown") {
      ++f_.spans_unknown;
    } else if (!r.spans_check.empty()) {
      ++f_.spans_wrong;
      Example(wrong_spans_, absl::StrCat(Describe(r), "; spans ", r.spans, ": ",
                                         r.spans_check.substr(r.spans_check.find(':') + 2)));
    }
    switch (r.verdict) {
      case Verdict::kSame:
        ++f_.judged_same;
        break;
      case Verdict::kCrossed:
        ++f_.judged_crossed;
        break;
      case Verdict::kUnjudged:
        // The oracle's search running out of budget leaves an answer
        // unjudged; a judge that failed (the reason is in the record's
        // error) fails the run.
        if (r.error.empty()) {
          ++f_.unjudged;
        } else {
          ++f_.judge_failed;
          Example(judge_failed_, absl::StrCat(Describe(r), ": ", r.error));
        }
        break;
      case Verdict::kMismatch:
      case Verdict::kNone:
        ++f_.mislabelled;
        Example(mislabelled_,
                absl::StrCat(Describe(r),
                             r.matches.has_value()
                                 ? absl::StrCat("; it is v", *r.matches, "'s greedy output")
                                 : std::string("; no nearby version's output")));
        break;
    }
  }

  void FigureKind(FaultKind kind) {
    KindFigures k;
    k.kind = kind;
    bool scheduled = false;
    std::set<int64_t> counted;
    for (const Fault& s : f_.run.schedule) scheduled |= s.kind == kind;
    for (const FaultEntry* e : faults_) {
      if (e->fault.kind != kind) continue;
      scheduled = true;
      if (e->skipped) {
        ++k.skipped;
        continue;
      }
      ++k.injected;
      CountDuring(*e, k, counted);
      Recovery(*e, k);
    }
    if (scheduled) f_.kinds.push_back(std::move(k));
  }

  // The requests sent while `e` was active; `counted` keeps a request that
  // falls in two faults of the kind from counting twice.
  void CountDuring(const FaultEntry& e, KindFigures& k, std::set<int64_t>& counted) const {
    for (const RequestRecord* r : requests_) {
      if (r->outcome == Outcome::kClientLeft || r->sent_s < e.applied_s || r->sent_s > e.ended_s ||
          !counted.insert(r->id).second) {
        continue;
      }
      ++k.requests;
      if (r->outcome == Outcome::kAnswered) ++k.answered;
      const bool alone = std::none_of(windows_.begin(), windows_.end(), [&](const Window& w) {
        return w.kind != k.kind && r->sent_s >= w.from && r->sent_s <= w.to;
      });
      if (alone) {
        ++k.alone_requests;
        if (r->outcome == Outcome::kAnswered) ++k.alone_answered;
      }
    }
  }

  // How soon after `e` ended a recovery probe was answered.
  void Recovery(const FaultEntry& e, KindFigures& k) {
    std::optional<double> recovered;
    for (const RequestRecord* p : probes_) {
      if (p->sent_s < e.ended_s) continue;
      const double took = p->done_s - e.ended_s;
      if (!recovered.has_value() || took < *recovered) recovered = took;
    }
    if (recovered.has_value() && *recovered <= options_.max_recovery_s) {
      k.recovery_s.push_back(*recovered);
      return;
    }
    ++k.not_recovered;
    Example(unrecovered_,
            absl::StrFormat("fault #%d %s (%.1f s to %.1f s): %s", e.fault.id, e.fault.Target(),
                            e.applied_s, e.ended_s,
                            recovered.has_value()
                                ? absl::StrFormat("recovered only after %.1f s", *recovered)
                                : std::string("no probe succeeded after it ended")));
  }

  void FigureGrowth(const std::pair<std::string, int>& key,
                    const std::vector<const ResourceEntry*>& samples) {
    if (samples.size() < 2) return;
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
    if (third == 0) return;
    g.rss_first_kib = Mean(rss, 0, third);
    g.rss_last_kib = Mean(rss, samples.size() - third, samples.size());
    g.files_first = Mean(files, 0, third);
    g.files_last = Mean(files, samples.size() - third, samples.size());
    if (g.span_s >= options_.growth_min_span_s && g.samples >= options_.growth_min_samples) {
      g.rss_grew = g.rss_last_kib - g.rss_first_kib >
                   std::max<int64_t>(options_.rss_growth_floor_kib,
                                     static_cast<int64_t>(options_.rss_growth_fraction *
                                                          static_cast<double>(g.rss_first_kib)));
      g.files_grew = g.files_last - g.files_first >
                     std::max<int64_t>(options_.files_growth_floor,
                                       static_cast<int64_t>(options_.files_growth_fraction *
                                                            static_cast<double>(g.files_first)));
    }
    f_.growth.push_back(std::move(g));
  }

  // The checks on the run line, the answers, the pointer and the faults.
  void CheckAnswers() {
    Check(f_.has_run, "the history has no run line", {});
    Check(f_.constraint_violations == 0,
          absl::StrCat(f_.constraint_violations, " answers violated their constraint"),
          violations_);
    Check(f_.unpublished == 0,
          absl::StrCat(f_.unpublished, " answers were attributed to an unpublished version"),
          unpublished_);
    Check(f_.mislabelled == 0,
          absl::StrCat(f_.mislabelled,
                       " answers' labels disagree with the weights that produced them"),
          mislabelled_);
    Check(f_.judge_failed == 0,
          absl::StrCat(f_.judge_failed, " answers could not be judged (the judge failed)"),
          judge_failed_);
    Check(f_.spans_wrong == 0,
          absl::StrCat(f_.spans_wrong,
                       " answers' version spans disagree with the weights that "
                       "produced them"),
          wrong_spans_);
    Check(f_.failed == 0,
          absl::StrCat(f_.failed,
                       " requests failed otherwise (not a 409, a 503 or a dropped "
                       "connection)"),
          failed_);
    Check(f_.pointer_incomplete == 0,
          absl::StrCat("the pointer named incomplete bytes ", f_.pointer_incomplete, " times"),
          incomplete_pointers_);
    int64_t not_recovered = 0;
    for (const KindFigures& k : f_.kinds) not_recovered += k.not_recovered;
    Check(not_recovered == 0,
          absl::StrCat(not_recovered, " faults were not recovered from within ",
                       options_.max_recovery_s, " s"),
          unrecovered_);
  }

  // The checks on the end line: the final pointer and what was left behind.
  void CheckEnd() {
    Check(f_.has_end, "the history has no end line (the run did not finish)", {});
    if (!f_.has_end) return;
    const EndEntry& end = f_.end;
    Check(end.pointer_complete,
          absl::StrCat("the final pointer v", end.final_pointer, " does not name complete bytes"),
          {end.pointer_detail});
    Check(end.converged, "the fleet did not converge to the final pointer", {end.convergence});
    Check(end.leftover_processes.empty(),
          absl::StrCat(end.leftover_processes.size(), " processes were left behind"),
          end.leftover_processes);
    Check(end.leftover_temp.empty(),
          absl::StrCat(end.leftover_temp.size(),
                       " temporary files or directories were left "
                       "behind"),
          end.leftover_temp);
    Check(end.unfinished.empty(),
          absl::StrCat("generations kept running after their clients and the load were gone: ",
                       end.unfinished.size(), " places"),
          end.unfinished);
  }

  void CheckGrowth() {
    std::vector<std::string> grew;
    for (const GrowthFigures& g : f_.growth) {
      if (g.rss_grew) {
        grew.push_back(absl::StrFormat("%s: resident memory %d KiB -> %d KiB over %.0f s",
                                       g.process, g.rss_first_kib, g.rss_last_kib, g.span_s));
      }
      if (g.files_grew) {
        grew.push_back(absl::StrFormat("%s: open files %d -> %d over %.0f s", g.process,
                                       g.files_first, g.files_last, g.span_s));
      }
    }
    Check(grew.empty(),
          absl::StrCat("resident memory or open files grew during the soak (", grew.size(),
                       " findings)"),
          grew);
  }

  const CheckOptions& options_;
  ChaosFigures f_;
  std::vector<const RequestRecord*> requests_;
  std::vector<const RequestRecord*> probes_;  // answered recovery probes
  std::vector<const FaultEntry*> faults_;
  std::vector<Window> windows_;  // of the faults injected
  std::map<std::pair<std::string, int>, std::vector<const ResourceEntry*>> series_;
  std::set<int64_t> published_ = {0};
  int64_t highest_pointer_ = 0;
  std::vector<std::string> incomplete_pointers_;
  // Examples behind each check, at most options_.max_examples of each.
  std::vector<std::string> violations_, unpublished_, mislabelled_, failed_, wrong_spans_,
      unrecovered_, judge_failed_;
};

// The figures' table of fault kinds: how many were injected, the requests
// sent while each was active and how many were answered, and how soon the
// fleet recovered; then the same for no fault active.
std::string FaultTable(const ChaosFigures& f) {
  std::string out;
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
                        f.calm_requests, Percent(f.calm_answered, f.calm_requests));
  return out;
}

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
  return HistoryCheck(options).Run(history);
}

std::string FormatFigures(const ChaosFigures& f) {
  std::string out;
  absl::StrAppendFormat(&out, "chaos: seed %d, %g min, %s store, %d replicas, %d faults\n",
                        f.run.seed, f.run.minutes, f.run.store, f.run.replicas,
                        f.run.schedule.size());
  absl::StrAppendFormat(
      &out,
      "requests     %d: answered %d (%.1f%%), retryable %d, failed otherwise %d, left by "
      "the client %d\n",
      f.requests, f.answered, Percent(f.answered, f.requests - f.client_left), f.retryable,
      f.failed, f.client_left);
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
  out += FaultTable(f);
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
