#include "stitch/demo/report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace stitch {
namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                    "#9467bd", "#8c564b", "#e377c2", "#17becf"};

const char* Color(size_t i) { return kPalette[i % (sizeof(kPalette) / sizeof(kPalette[0]))]; }

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

// A chart's plotting area inside its SVG, and the mapping of data onto it.
struct Frame {
  double width = 760;
  double height = 260;
  double left = 56;
  double right = 20;
  double top = 16;
  double bottom = 40;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;

  double X(double x) const {
    return left + (x1 > x0 ? (x - x0) / (x1 - x0) : 0) * (width - left - right);
  }
  double Y(double y) const {
    return top + (1 - (y1 > y0 ? (y - y0) / (y1 - y0) : 0)) * (height - top - bottom);
  }
};

// Round tick positions covering [lo, hi], about `count` of them.
std::vector<double> Ticks(double lo, double hi, int count) {
  std::vector<double> out;
  if (hi <= lo) return {lo};
  const double raw = (hi - lo) / count;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push_back(t);
  return out;
}

std::string TickLabel(double v) {
  if (std::abs(v) < 1e-9) return "0";
  if (std::abs(v - std::round(v)) < 1e-9) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%g", v);
}

// Opens an SVG with axes, grid lines and axis titles.
std::string OpenChart(const Frame& f, std::string_view title, std::string_view x_title,
                      std::string_view y_title, bool integer_y) {
  std::string s = absl::StrFormat(
      R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" role="img" aria-label="%s">)svg"
      "\n",
      f.width, f.height, f.width, f.height, HtmlEscape(title));
  for (double t : Ticks(f.y0, f.y1, 5)) {
    if (integer_y && std::abs(t - std::round(t)) > 1e-9) continue;
    absl::StrAppendFormat(
        &s,
        R"svg(<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>)svg"
        R"svg(<text x="%.1f" y="%.1f" font-size="11" text-anchor="end">%s</text>)svg"
        "\n",
        f.left, f.Y(t), f.width - f.right, f.Y(t), f.left - 6, f.Y(t) + 4, TickLabel(t));
  }
  for (double t : Ticks(f.x0, f.x1, 8)) {
    absl::StrAppendFormat(
        &s,
        R"svg(<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999"/>)svg"
        R"svg(<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle">%s</text>)svg"
        "\n",
        f.X(t), f.height - f.bottom, f.X(t), f.height - f.bottom + 4, f.X(t),
        f.height - f.bottom + 16, TickLabel(t));
  }
  absl::StrAppendFormat(
      &s,
      R"svg(<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#999"/>)svg"
      "\n"
      R"svg(<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle">%s</text>)svg"
      "\n"
      R"svg(<text x="14" y="%.1f" font-size="12" text-anchor="middle" transform="rotate(-90 14 %.1f)">%s</text>)svg"
      "\n",
      f.left, f.top, f.width - f.left - f.right, f.height - f.top - f.bottom,
      (f.left + f.width - f.right) / 2, f.height - 6, HtmlEscape(x_title),
      (f.top + f.height - f.bottom) / 2, (f.top + f.height - f.bottom) / 2, HtmlEscape(y_title));
  return s;
}

std::string RewardChart(const DemoRecord& record) {
  Frame f;
  f.x0 = 1;
  f.x1 = std::max<double>(2, static_cast<double>(record.steps.size()));
  f.y0 = 0;
  f.y1 = 1;
  std::string s = OpenChart(f, "mean reward per step", "step", "mean reward", false);
  std::string points;
  for (const DemoStep& step : record.steps) {
    absl::StrAppendFormat(&points, "%.1f,%.1f ", f.X(static_cast<double>(step.step)),
                          f.Y(step.mean_reward));
  }
  absl::StrAppendFormat(&s,
                        R"svg(<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>)svg",
                        Color(0), points);
  s += "\n";
  for (const DemoStep& step : record.steps) {
    absl::StrAppendFormat(
        &s,
        R"svg(<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>step %d: %.3f</title></circle>)svg",
        f.X(static_cast<double>(step.step)), f.Y(step.mean_reward), Color(0), step.step,
        step.mean_reward);
  }
  s += "\n</svg>\n";
  return s;
}

// The store's pointer at time `t`: the newest version published by then.
int64_t PointerAt(const DemoRecord& record, double t) {
  int64_t pointer = record.boot_version;
  for (const DemoStep& step : record.steps) {
    if (step.published_at <= t) pointer = std::max(pointer, step.version);
  }
  return pointer;
}

// A replica's applied version at time `t` (-1: none yet).
int64_t AppliedAt(const DemoReplica& r, double t) {
  int64_t applied = -1;
  for (const DemoReplicaSample& sample : r.timeline) {
    if (sample.t > t) break;
    applied = sample.applied;
  }
  return applied;
}

// Small multiples: one lane per replica, each with the store's pointer
// (dashed) and the replica's applied version over the same time axis, the
// lag between them shaded, the time before it was first ready greyed, a
// ring at a join, a dot where it became ready and a cross at a kill.
std::string FleetChart(const DemoRecord& record) {
  constexpr double kWidth = 760;
  constexpr double kLeft = 110;
  constexpr double kRight = 16;
  constexpr double kLane = 64;
  constexpr double kGap = 10;
  constexpr double kTop = 8;
  constexpr double kAxis = 36;
  double t1 = std::max(1.0, record.wall_s);
  for (const DemoStep& step : record.steps) t1 = std::max(t1, step.published_at);
  for (const DemoReplica& r : record.replicas) {
    if (!r.timeline.empty()) t1 = std::max(t1, r.timeline.back().t);
  }
  const auto v0 = static_cast<double>(record.boot_version);
  const double v1 = std::max(v0 + 1, static_cast<double>(record.final_version()));
  const double height = kTop + static_cast<double>(record.replicas.size()) * (kLane + kGap) + kAxis;
  auto x = [&](double t) {
    return kLeft + std::clamp(t / t1, 0.0, 1.0) * (kWidth - kLeft - kRight);
  };
  std::string s = absl::StrFormat(
      R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" role="img" aria-label="each replica's applied version against the store's pointer">)svg"
      "\n",
      kWidth, height, kWidth, height);
  // Every time at which the pointer or some replica moved, in order.
  std::vector<double> times = {0, t1};
  for (const DemoStep& step : record.steps) times.push_back(step.published_at);
  for (const DemoReplica& r : record.replicas) {
    for (const DemoReplicaSample& sample : r.timeline) times.push_back(sample.t);
  }
  std::sort(times.begin(), times.end());
  times.erase(std::unique(times.begin(), times.end()), times.end());

  for (size_t i = 0; i < record.replicas.size(); ++i) {
    const DemoReplica& r = record.replicas[i];
    const double top = kTop + static_cast<double>(i) * (kLane + kGap);
    auto y = [&](double v) { return top + 4 + (1 - (v - v0) / (v1 - v0)) * (kLane - 8); };
    const double end = r.killed_at.value_or(t1);
    const std::optional<double> ready = r.ready_at();
    absl::StrAppendFormat(
        &s,
        R"svg(<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#fafafa" stroke="#ccc"/>)svg"
        R"svg(<text x="4" y="%.1f" font-size="12" fill="%s">%s%s</text>)svg"
        R"svg(<text x="4" y="%.1f" font-size="10" fill="#777">v%.0f..v%.0f</text>)svg"
        "\n",
        kLeft, top, kWidth - kLeft - kRight, kLane, top + kLane / 2, Color(i + 1),
        HtmlEscape(r.name), r.joined ? " (joined)" : (r.killed_at.has_value() ? " (killed)" : ""),
        top + kLane / 2 + 14, v0, v1);
    // Not serving yet: from its start until it was first ready.
    const double ready_t = ready.value_or(end);
    if (ready_t > r.started_at) {
      absl::StrAppendFormat(
          &s,
          R"svg(<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#e3e3e3"><title>%s starting: not ready until %.2fs</title></rect>)svg",
          x(r.started_at), top, x(ready_t) - x(r.started_at), kLane, HtmlEscape(r.name), ready_t);
    }
    // Gone: after a kill.
    if (r.killed_at.has_value()) {
      absl::StrAppendFormat(
          &s,
          R"svg(<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#f3d5d5"><title>%s killed at %.2fs</title></rect>)svg",
          x(*r.killed_at), top, x(t1) - x(*r.killed_at), kLane, HtmlEscape(r.name), *r.killed_at);
    }
    // The lag: wherever it served a version older than the pointer.
    for (size_t k = 0; k + 1 < times.size(); ++k) {
      const double a = std::max(times[k], ready_t);
      const double b = std::min(times[k + 1], end);
      if (b <= a) continue;
      const int64_t applied = AppliedAt(r, a);
      const int64_t pointer = PointerAt(record, a);
      if (applied < 0 || applied >= pointer) continue;
      absl::StrAppendFormat(
          &s,
          R"svg(<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#f5a623" opacity="0.45"><title>%s %d behind at %.2fs</title></rect>)svg",
          x(a), y(static_cast<double>(pointer)), std::max(0.5, x(b) - x(a)),
          y(static_cast<double>(applied)) - y(static_cast<double>(pointer)), HtmlEscape(r.name),
          pointer - applied, a);
    }
    // The pointer, the same in every lane.
    std::string pointer = absl::StrFormat("%.1f,%.1f", x(0), y(v0));
    double last = v0;
    for (const DemoStep& step : record.steps) {
      const auto v = static_cast<double>(step.version);
      absl::StrAppendFormat(&pointer, " %.1f,%.1f %.1f,%.1f", x(step.published_at), y(last),
                            x(step.published_at), y(v));
      last = v;
    }
    absl::StrAppendFormat(&pointer, " %.1f,%.1f", x(t1), y(last));
    // The replica's applied version, from its first report to its end.
    std::string points;
    double applied = -1;
    for (const DemoReplicaSample& sample : r.timeline) {
      if (sample.applied < 0 || sample.t > end) continue;
      const auto v = static_cast<double>(sample.applied);
      if (applied < 0) {
        absl::StrAppendFormat(&points, "%.1f,%.1f", x(sample.t), y(v));
      } else {
        absl::StrAppendFormat(&points, " %.1f,%.1f %.1f,%.1f", x(sample.t), y(applied), x(sample.t),
                              y(v));
      }
      applied = v;
    }
    if (applied >= 0) {
      absl::StrAppendFormat(&points, " %.1f,%.1f", x(end), y(applied));
      absl::StrAppendFormat(
          &s, R"svg(<polyline fill="none" stroke="%s" stroke-width="2.5" points="%s"/>)svg",
          Color(i + 1), points);
    }
    absl::StrAppendFormat(
        &s,
        R"svg(<polyline fill="none" stroke="#000" stroke-width="1" stroke-dasharray="4 3" points="%s"/>)svg"
        "\n",
        pointer);
    if (r.joined) {
      absl::StrAppendFormat(
          &s,
          R"svg(<circle cx="%.1f" cy="%.1f" r="6" fill="none" stroke="%s" stroke-width="2"><title>%s started at %.2fs</title></circle>)svg",
          x(r.started_at), top + kLane / 2, Color(i + 1), HtmlEscape(r.name), r.started_at);
    }
    if (ready.has_value()) {
      absl::StrAppendFormat(
          &s,
          R"svg(<circle cx="%.1f" cy="%.1f" r="4" fill="%s"><title>%s ready at %.2fs</title></circle>)svg",
          x(*ready), y(static_cast<double>(std::max<int64_t>(AppliedAt(r, *ready), 0))),
          Color(i + 1), HtmlEscape(r.name), *ready);
    }
    if (r.killed_at.has_value()) {
      absl::StrAppendFormat(
          &s,
          R"svg(<path d="M%.1f %.1f l12 12 m0 -12 l-12 12" stroke="#c00" stroke-width="3"><title>%s killed (SIGKILL) at %.2fs</title></path>)svg",
          x(*r.killed_at) - 6, top + kLane / 2 - 6, HtmlEscape(r.name), *r.killed_at);
    }
    s += "\n";
  }
  // The shared time axis, with a tick per publish instant.
  const double axis = height - kAxis + 4;
  for (const DemoStep& step : record.steps) {
    absl::StrAppendFormat(
        &s,
        R"svg(<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555"><title>v%d published at %.2fs (%s)</title></line>)svg",
        x(step.published_at), axis, x(step.published_at), axis + 5, step.version, step.published_at,
        step.full ? "FULL" : "DELTA");
  }
  for (double t : Ticks(0, t1, 8)) {
    absl::StrAppendFormat(
        &s, R"svg(<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle">%s</text>)svg", x(t),
        axis + 17, TickLabel(t));
  }
  absl::StrAppendFormat(
      &s,
      R"svg(<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle">seconds since start</text>)svg"
      "\n</svg>\n",
      (kLeft + kWidth - kRight) / 2, height - 2);
  return s;
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

std::string StalenessChart(const DemoSummary& summary) {
  Frame f;
  f.height = 200;
  f.x0 = -0.5;
  f.x1 = static_cast<double>(summary.staleness.size()) - 0.5;
  int64_t most = 1;
  int64_t total = 0;
  for (int64_t n : summary.staleness) {
    most = std::max(most, n);
    total += n;
  }
  if (total == 0) return "";
  f.y0 = 0;
  f.y1 = static_cast<double>(most) * 1.15;
  std::string s = OpenChart(f, "staleness of the rollouts served",
                            "versions behind the store's pointer when served", "rollouts", true);
  const double bar = (f.X(1) - f.X(0)) * 0.7;
  for (size_t i = 0; i < summary.staleness.size(); ++i) {
    const int64_t n = summary.staleness[i];
    const double x = f.X(static_cast<double>(i));
    const bool last = i + 1 == summary.staleness.size();
    absl::StrAppendFormat(
        &s,
        R"svg(<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%d%s behind: %d rollouts</title></rect>)svg"
        R"svg(<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle">%.0f%%</text>)svg",
        x - bar / 2, f.Y(static_cast<double>(n)), bar, f.Y(0) - f.Y(static_cast<double>(n)),
        i == 0 ? "#2ca02c" : "#ff7f0e", i, last ? " or more" : "", n, x,
        f.Y(static_cast<double>(n)) - 4,
        100.0 * static_cast<double>(n) / static_cast<double>(total));
  }
  s += "\n</svg>\n";
  return s;
}

std::string ServedChart(const DemoSummary& summary) {
  Frame f;
  f.height = 220;
  if (summary.served_per_version.empty()) return "";
  f.x0 = static_cast<double>(summary.served_per_version.front().first) - 0.5;
  f.x1 = static_cast<double>(summary.served_per_version.back().first) + 0.5;
  int64_t most = 1;
  for (const auto& [v, n] : summary.served_per_version) most = std::max(most, n);
  f.y0 = 0;
  f.y1 = static_cast<double>(most) * 1.1;
  std::string s =
      OpenChart(f, "rollouts served per version", "version (weight_version_end)", "rollouts", true);
  const double bar = std::max(1.0, (f.X(1) - f.X(0)) * 0.8);
  for (const auto& [v, n] : summary.served_per_version) {
    const double x = f.X(static_cast<double>(v));
    absl::StrAppendFormat(
        &s,
        R"svg(<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>v%d: %d rollouts</title></rect>)svg",
        x - bar / 2, f.Y(static_cast<double>(n)), bar, f.Y(0) - f.Y(static_cast<double>(n)),
        Color(0), v, n);
  }
  s += "\n</svg>\n";
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
        std::max<int64_t>(0, PointerAt(record, response.received_at) - response.version_end);
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
  for (const DemoStep& step : record.steps) {
    dropped += step.dropped;
    crossed += step.crossed;
  }
  absl::StrAppendFormat(&s,
                        "staleness      %d samples dropped as too stale, %d half-weighted "
                        "(generated across a weight change)\n",
                        dropped, crossed);
  s += "served         versions behind the pointer when served:";
  for (size_t i = 0; i < summary.staleness.size(); ++i) {
    absl::StrAppend(&s, " ", i, i + 1 == summary.staleness.size() ? "+" : "", ":",
                    summary.staleness[i]);
  }
  s += "\n";
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
