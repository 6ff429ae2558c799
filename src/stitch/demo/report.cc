#include "stitch/demo/report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "stitch/demo/report_charts.h"

namespace stitch {
namespace {

std::string Bytes(double bytes) {
  if (bytes < 1024) return absl::StrFormat("%.0f B", bytes);
  if (bytes < 1024 * 1024) return absl::StrFormat("%.1f KiB", bytes / 1024);
  return absl::StrFormat("%.2f MiB", bytes / (1024 * 1024));
}

std::string Version(int64_t v) { return v < 0 ? "-" : absl::StrCat("v", v); }

std::string When(const std::optional<double>& t) {
  return t.has_value() ? absl::StrFormat("%.1fs", *t) : "-";
}

std::string P50P95(const std::vector<double>& values, double scale, const char* unit) {
  if (values.empty()) return "-";
  return absl::StrFormat("%.0f/%.0f %s", Percentile(values, 50) * scale,
                         Percentile(values, 95) * scale, unit);
}

double Mean(const std::vector<DemoStep>& steps, size_t begin, size_t end) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += steps[i].mean_reward;
  return end > begin ? sum / static_cast<double>(end - begin) : 0;
}

std::string Samples(const DemoRecord& record) {
  if (record.samples.empty()) return "";
  std::string s =
      "<h2>Samples</h2>\n<p>Completions of the policy at the start, middle and end of the run "
      "(one per prompt).</p>\n<table class=\"samples\"><tr><th>step</th><th>completion</th></tr>\n";
  for (const auto& [step, texts] : record.samples) {
    for (const std::string& text : texts) {
      absl::StrAppend(&s, "<tr><td>", step, "</td><td>&ldquo;", HtmlEscape(text),
                      "&rdquo;</td></tr>\n");
    }
  }
  s += "</table>\n";
  return s;
}

// The summary's replica lines: the counts, then one row per replica.
std::string ReplicaTable(const DemoRecord& record, const DemoSummary& summary) {
  std::string s;
  absl::StrAppendFormat(&s, "replicas       %d started, %d joined, %d killed\n",
                        record.replicas.size(), summary.joined, summary.killed);
  absl::StrAppendFormat(&s, "  %-4s %-24s %8s %8s %8s %8s %16s %16s %6s\n", "NAME", "URL",
                        "STARTED", "READY", "KILLED", "UPDATES", "STAGE p50/p95", "COMMIT p50/p95",
                        "FINAL");
  for (const DemoReplica& r : record.replicas) {
    absl::StrAppendFormat(&s, "  %-4s %-24s %8s %8s %8s %8d %16s %16s %6s\n", r.name, r.url,
                          When(r.started_at), When(r.ready_at()), When(r.killed_at),
                          r.commit_s.size(), P50P95(r.stage_s, 1000, "ms"),
                          P50P95(r.commit_s, 1000, "ms"), Version(r.final_applied.value_or(-1)));
  }
  return s;
}

// The summary's rollout lines: how many each version served, how many were
// dropped or crossed a commit, and how stale they were when served.
std::string RolloutLines(const DemoRecord& record, const DemoSummary& summary) {
  std::string s;
  absl::StrAppendFormat(&s, "rollouts       %d served; per version (weight_version_end):\n",
                        record.responses.size());
  std::string line = "              ";
  for (const auto& [v, count] : summary.served_per_version) {
    std::string item = absl::StrCat(" v", v, ":", count);
    if (line.size() + item.size() > 96) {
      s += line + "\n";
      line = "              ";
    }
    line += item;
  }
  s += line + "\n";
  int64_t dropped = 0;
  int64_t crossed = 0;
  int64_t crossed_exact = 0;
  for (const DemoStep& step : record.steps) {
    dropped += step.dropped;
    crossed += step.crossed;
    crossed_exact += step.crossed_exact;
  }
  absl::StrAppendFormat(&s, "staleness      %d samples dropped as too stale\n", dropped);
  absl::StrAppendFormat(&s,
                        "commits        %d rollouts crossed a commit mid-generation: %d weighted "
                        "per token from their version spans, %d half-weighted (spans unknown)\n",
                        crossed, crossed_exact, crossed - crossed_exact);
  s += "served         versions behind the pointer when served:";
  for (size_t i = 0; i < summary.staleness.size(); ++i) {
    absl::StrAppend(&s, " ", i, i + 1 == summary.staleness.size() ? "+" : "", ":",
                    summary.staleness[i]);
  }
  s += "\n";
  return s;
}

}  // namespace

std::optional<double> DemoReplica::ready_at() const {
  for (const DemoReplicaSample& s : timeline) {
    if (s.ready) return s.t;
  }
  return std::nullopt;
}

std::optional<double> DemoReplica::reached_at(int64_t version) const {
  for (const DemoReplicaSample& s : timeline) {
    if (s.applied >= version) return s.t;
  }
  return std::nullopt;
}

int64_t DemoRecord::final_version() const {
  return steps.empty() ? boot_version : steps.back().version;
}

int64_t DemoRecord::pointer_at(double t) const {
  int64_t pointer = boot_version;
  for (const DemoStep& step : steps) {
    if (step.published_at <= t) pointer = std::max(pointer, step.version);
  }
  return pointer;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(std::clamp(p, 0.0, 100.0) / 100.0 * values.size());
  const size_t index = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return values[std::min(index, values.size() - 1)];
}

std::string HtmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string PrintableBytes(std::string_view bytes) {
  std::string out;
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b < 0x7f && b != '\\') {
      out += c;
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", b);
    }
  }
  return out;
}

DemoSummary Summarize(const DemoRecord& record) {
  DemoSummary s;
  std::vector<double> delta_bytes;
  for (const DemoStep& step : record.steps) {
    ++s.versions;
    if (step.full) {
      ++s.full_versions;
      s.full_bytes = static_cast<double>(step.payload_bytes);
    } else {
      delta_bytes.push_back(static_cast<double>(step.payload_bytes));
    }
  }
  s.delta_bytes_p50 = Percentile(delta_bytes, 50);
  s.delta_bytes_max = Percentile(delta_bytes, 100);

  const size_t n = record.steps.size();
  const size_t window = std::max<size_t>(1, n / 4);
  if (n > 0) {
    s.reward_first = Mean(record.steps, 0, std::min(window, n));
    s.reward_last = Mean(record.steps, n - std::min(window, n), n);
  }

  for (const DemoStep& step : record.steps) {
    double worst = -1;
    bool missing = false;
    for (const DemoReplica& r : record.replicas) {
      std::optional<double> ready = r.ready_at();
      if (!ready.has_value() || *ready > step.published_at) continue;
      if (r.killed_at.has_value() && *r.killed_at <= step.published_at) continue;
      std::optional<double> reached = r.reached_at(step.version);
      if (!reached.has_value()) {
        if (!r.killed_at.has_value()) missing = true;
        continue;
      }
      worst = std::max(worst, std::max(0.0, *reached - step.published_at));
    }
    if (missing) {
      ++s.not_converged;
    } else if (worst >= 0) {
      s.convergence_s.push_back(worst);
    }
  }

  for (const DemoReplica& r : record.replicas) {
    s.joined += r.joined ? 1 : 0;
    s.killed += r.killed_at.has_value() ? 1 : 0;
  }
  std::map<int64_t, int64_t> served;
  s.staleness.assign(DemoSummary::kStalenessBuckets, 0);
  for (const DemoResponse& response : record.responses) {
    ++served[response.version_end];
    const int64_t behind =
        std::max<int64_t>(0, record.pointer_at(response.received_at) - response.version_end);
    ++s.staleness[static_cast<size_t>(
        std::min<int64_t>(behind, DemoSummary::kStalenessBuckets - 1))];
    if (response.version_start < response.min_version ||
        response.version_end < response.version_start) {
      ++s.violations;
    }
  }
  s.served_per_version.assign(served.begin(), served.end());
  return s;
}

std::vector<std::string> CheckDemo(const DemoRecord& record, const DemoSummary& summary,
                                   const std::set<int64_t>& store_versions,
                                   double min_improvement) {
  std::vector<std::string> failures;
  if (summary.violations > 0) {
    for (const DemoResponse& r : record.responses) {
      if (r.version_start >= r.min_version && r.version_end >= r.version_start) continue;
      failures.push_back(absl::StrCat(
          summary.violations,
          " response(s) did not satisfy their constraint; the first asked for "
          "min_version ",
          r.min_version, " and was served on versions ", r.version_start, "..", r.version_end,
          " by ", r.replica.empty() ? "an unknown replica" : r.replica));
      break;
    }
  }

  std::map<int64_t, double> publish_started;
  for (const DemoStep& step : record.steps) {
    publish_started[step.version] = step.published_at - step.publish_s;
  }
  int64_t unpublished = 0;
  std::string first_unpublished;
  for (const DemoResponse& r : record.responses) {
    for (int64_t v : {r.version_start, r.version_end}) {
      if (v == record.boot_version) continue;
      std::string why;
      auto started = publish_started.find(v);
      if (!store_versions.contains(v) || started == publish_started.end()) {
        why = absl::StrCat("version ", v, ", which the store does not hold as published");
      } else if (r.received_at < started->second) {
        why = absl::StrFormat("version %d at %.3fs, before its publication began at %.3fs", v,
                              r.received_at, started->second);
      }
      if (why.empty()) continue;
      if (unpublished++ == 0) {
        first_unpublished =
            absl::StrCat(why, " (from ", r.replica.empty() ? "an unknown replica" : r.replica, ")");
      }
      break;
    }
  }
  if (unpublished > 0) {
    failures.push_back(absl::StrCat(unpublished,
                                    " response(s) attributed to an unpublished version; the "
                                    "first: ",
                                    first_unpublished));
  }

  const int64_t final_version = record.final_version();
  for (const DemoReplica& r : record.replicas) {
    if (!r.ready_at().has_value() || r.killed_at.has_value()) continue;
    if (r.final_applied != final_version) {
      failures.push_back(absl::StrCat("replica ", r.name, " (", r.url, ") was ready but ended on ",
                                      Version(r.final_applied.value_or(-1)),
                                      ", not the final version v", final_version, "; see its log"));
    }
  }

  if (!record.steps.empty() && summary.reward_last < summary.reward_first + min_improvement) {
    failures.push_back(absl::StrFormat(
        "the reward did not improve: %.3f over the first quarter of the steps, %.3f over the "
        "last (needs +%.2f); try more --steps",
        summary.reward_first, summary.reward_last, min_improvement));
  }
  return failures;
}

std::string FormatSummary(const DemoRecord& record, const DemoSummary& summary,
                          const std::vector<std::string>& failures) {
  std::string s = "\n== stitch demo: summary ==\n";
  const size_t window = std::max<size_t>(1, record.steps.size() / 4);
  absl::StrAppendFormat(&s, "run            %s, %d steps, lag %d, %.1f s\n", record.run_id,
                        record.steps.size(), record.lag, record.wall_s);
  absl::StrAppendFormat(&s, "task           continue a prompt with bytes from \"%s\"\n",
                        PrintableBytes(record.targets));
  if (!record.engines.empty()) absl::StrAppend(&s, "engines        ", record.engines, "\n");
  absl::StrAppendFormat(&s, "reward         %.3f -> %.3f (mean of the first and last %d steps)\n",
                        summary.reward_first, summary.reward_last, window);
  bool first = true;
  for (const auto& [step, texts] : record.samples) {
    if (texts.empty()) continue;
    absl::StrAppendFormat(&s, "%-15sstep %-3d \"%s\"\n", first ? "samples" : "", step,
                          texts.front());
    first = false;
  }
  absl::StrAppendFormat(&s, "versions       %d published: %d FULL", summary.versions,
                        summary.full_versions);
  if (summary.full_versions > 0) absl::StrAppend(&s, " (", Bytes(summary.full_bytes), " each)");
  absl::StrAppendFormat(&s, ", %d XOR DELTA", summary.versions - summary.full_versions);
  if (summary.versions > summary.full_versions) {
    absl::StrAppend(&s, " (p50 ", Bytes(summary.delta_bytes_p50), ", max ",
                    Bytes(summary.delta_bytes_max), ")");
  }
  s += "\n";
  if (summary.convergence_s.empty()) {
    s += "convergence    publish -> whole fleet: no version measured\n";
  } else {
    absl::StrAppendFormat(
        &s, "convergence    publish -> whole fleet: p50 %.0f ms, p95 %.0f ms (%d versions",
        Percentile(summary.convergence_s, 50) * 1000, Percentile(summary.convergence_s, 95) * 1000,
        summary.convergence_s.size());
    if (summary.not_converged > 0) absl::StrAppend(&s, ", ", summary.not_converged, " never");
    s += ")\n";
  }
  s += ReplicaTable(record, summary);
  s += RolloutLines(record, summary);
  absl::StrAppendFormat(&s, "retries        %d by the gateway, %d by the demo\n",
                        record.gateway_retries, record.client_retries);
  absl::StrAppendFormat(&s, "violations     %d constraint violations\n", summary.violations);
  if (failures.empty()) {
    s += "checks         all passed: constraints held, only published versions served, every "
         "ready replica reached the final version, the reward improved\n";
  } else {
    for (const std::string& f : failures) s += "CHECK FAILED   " + f + "\n";
  }
  return s;
}

std::string RenderHtmlReport(const DemoRecord& record, const DemoSummary& summary,
                             const std::vector<std::string>& failures) {
  std::string s =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<title>stitch demo report</title>\n<style>"
      "body{font-family:system-ui,sans-serif;margin:24px;max-width:900px;color:#222}"
      "pre{background:#f6f6f6;padding:12px;font-size:12px;white-space:pre-wrap;"
      "overflow-wrap:anywhere}svg{max-width:100%;height:auto}"
      ".samples td{text-align:left;font-family:monospace;white-space:pre-wrap}"
      "table{border-collapse:collapse;font-size:13px}td,th{padding:2px 10px;text-align:right}"
      "th{border-bottom:1px solid #999}td:first-child,th:first-child{text-align:left}"
      ".ok{color:#2ca02c}.fail{color:#d62728;font-weight:bold}svg{display:block;margin:8px 0 "
      "24px}</style></head><body>\n";
  absl::StrAppend(&s, "<h1>stitch demo</h1>\n<p>Run <code>", HtmlEscape(record.run_id),
                  "</code>: ", record.steps.size(), " training steps, lag ", record.lag, ", ",
                  record.replicas.size(), " replicas (", summary.joined, " joined, ",
                  summary.killed, " killed), ", absl::StrFormat("%.1f", record.wall_s),
                  " s. Task: continue a prompt with bytes "
                  "from <code>",
                  HtmlEscape(PrintableBytes(record.targets)), "</code>.</p>\n");
  if (!record.engines.empty()) {
    absl::StrAppend(&s, "<p>Engines: <code>", HtmlEscape(record.engines), "</code>.</p>\n");
  }
  if (failures.empty()) {
    s += "<p class=\"ok\">All checks passed.</p>\n";
  } else {
    s += "<ul>\n";
    for (const std::string& f : failures) {
      absl::StrAppend(&s, "<li class=\"fail\">", HtmlEscape(f), "</li>\n");
    }
    s += "</ul>\n";
  }
  absl::StrAppendFormat(&s, "<h2>Reward</h2>\n<p>%.3f &rarr; %.3f (first and last quarter).</p>\n",
                        summary.reward_first, summary.reward_last);
  s += RewardChart(record);
  s += Samples(record);
  s += "<h2>Fleet</h2>\n<p>One lane per replica: its applied version (solid) against the "
       "store's pointer (dashed), the lag between them shaded orange, grey until it was first "
       "ready, red after a kill; a ring marks a join, a dot readiness and a cross the kill. Ticks "
       "on the time axis are publish instants.</p>\n";
  s += FleetChart(record);
  s += "<h2>Staleness</h2>\n<p>How many versions behind the store's pointer each rollout's "
       "version was when it arrived (bounded by the lag the requests asked for).</p>\n";
  s += StalenessChart(summary);
  s += "<h2>Rollouts served per version</h2>\n";
  s += ServedChart(summary);
  s += "<h2>Replicas</h2>\n<table><tr><th>name</th><th>url</th><th>started</th><th>ready</th>"
       "<th>killed</th><th>updates</th><th>stage p50/p95</th><th>commit p50/p95</th>"
       "<th>final</th></tr>\n";
  for (const DemoReplica& r : record.replicas) {
    absl::StrAppend(&s, "<tr><td>", HtmlEscape(r.name), "</td><td>", HtmlEscape(r.url), "</td><td>",
                    When(r.started_at), "</td><td>", When(r.ready_at()), "</td><td>",
                    When(r.killed_at), "</td><td>", r.commit_s.size(), "</td><td>",
                    P50P95(r.stage_s, 1000, "ms"), "</td><td>", P50P95(r.commit_s, 1000, "ms"),
                    "</td><td>", Version(r.final_applied.value_or(-1)), "</td></tr>\n");
  }
  s += "</table>\n<h2>Summary</h2>\n<pre>";
  s += HtmlEscape(FormatSummary(record, summary, failures));
  s += "</pre>\n</body></html>\n";
  return s;
}

}  // namespace stitch
