#include "stitch/demo/report_charts.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stitch {
namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                    "#9467bd", "#8c564b", "#e377c2", "#17becf"};

const char* Color(size_t i) { return kPalette[i % (sizeof(kPalette) / sizeof(kPalette[0]))]; }

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
class FleetLanes {
 public:
  explicit FleetLanes(const DemoRecord& record)
      : record_(record),
        t1_(EndTime(record)),
        v0_(static_cast<double>(record.boot_version)),
        v1_(std::max(v0_ + 1, static_cast<double>(record.final_version()))),
        height_(kTop + static_cast<double>(record.replicas.size()) * (kLane + kGap) + kAxis),
        times_(MoveTimes(record, t1_)) {}

  std::string Draw() const {
    std::string s = absl::StrFormat(
        R"svg(<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" role="img" aria-label="each replica's applied version against the store's pointer">)svg"
        "\n",
        kWidth, height_, kWidth, height_);
    for (size_t i = 0; i < record_.replicas.size(); ++i) s += Lane(i);
    s += TimeAxis();
    return s;
  }

 private:
  static constexpr double kWidth = 760;
  static constexpr double kLeft = 110;
  static constexpr double kRight = 16;
  static constexpr double kLane = 64;
  static constexpr double kGap = 10;
  static constexpr double kTop = 8;
  static constexpr double kAxis = 36;

  // The time axis ends at the last thing that happened, 1 s at least.
  static double EndTime(const DemoRecord& record) {
    double t1 = std::max(1.0, record.wall_s);
    for (const DemoStep& step : record.steps) t1 = std::max(t1, step.published_at);
    for (const DemoReplica& r : record.replicas) {
      if (!r.timeline.empty()) t1 = std::max(t1, r.timeline.back().t);
    }
    return t1;
  }

  // Every time at which the pointer or some replica moved, in order.
  static std::vector<double> MoveTimes(const DemoRecord& record, double t1) {
    std::vector<double> times = {0, t1};
    for (const DemoStep& step : record.steps) times.push_back(step.published_at);
    for (const DemoReplica& r : record.replicas) {
      for (const DemoReplicaSample& sample : r.timeline) times.push_back(sample.t);
    }
    std::sort(times.begin(), times.end());
    times.erase(std::unique(times.begin(), times.end()), times.end());
    return times;
  }

  double X(double t) const {
    return kLeft + std::clamp(t / t1_, 0.0, 1.0) * (kWidth - kLeft - kRight);
  }

  // The height of version `v` in the lane whose top is `top`.
  double Y(double top, double v) const {
    return top + 4 + (1 - (v - v0_) / (v1_ - v0_)) * (kLane - 8);
  }

  std::string Lane(size_t i) const {
    const DemoReplica& r = record_.replicas[i];
    const double top = kTop + static_cast<double>(i) * (kLane + kGap);
    const double end = r.killed_at.value_or(t1_);
    const std::optional<double> ready = r.ready_at();
    std::string s = absl::StrFormat(
        R"svg(<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#fafafa" stroke="#ccc"/>)svg"
        R"svg(<text x="4" y="%.1f" font-size="12" fill="%s">%s%s</text>)svg"
        R"svg(<text x="4" y="%.1f" font-size="10" fill="#777">v%.0f..v%.0f</text>)svg"
        "\n",
        kLeft, top, kWidth - kLeft - kRight, kLane, top + kLane / 2, Color(i + 1),
        HtmlEscape(r.name), r.joined ? " (joined)" : (r.killed_at.has_value() ? " (killed)" : ""),
        top + kLane / 2 + 14, v0_, v1_);
    const double ready_t = ready.value_or(end);
    s += Shading(r, top, ready_t, end);
    s += AppliedLine(r, i, top, end);
    absl::StrAppendFormat(
        &s,
        R"svg(<polyline fill="none" stroke="#000" stroke-width="1" stroke-dasharray="4 3" points="%s"/>)svg"
        "\n",
        PointerLine(top));
    s += Markers(r, i, top, ready);
    s += "\n";
    return s;
  }

  // Grey before the replica was first ready, red after a kill, orange
  // wherever it served a version older than the pointer.
  std::string Shading(const DemoReplica& r, double top, double ready_t, double end) const {
    std::string s;
    if (ready_t > r.started_at) {
      absl::StrAppendFormat(
          &s,
          R"svg(<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#e3e3e3"><title>%s starting: not ready until %.2fs</title></rect>)svg",
          X(r.started_at), top, X(ready_t) - X(r.started_at), kLane, HtmlEscape(r.name), ready_t);
    }
    if (r.killed_at.has_value()) {
      absl::StrAppendFormat(
          &s,
          R"svg(<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#f3d5d5"><title>%s killed at %.2fs</title></rect>)svg",
          X(*r.killed_at), top, X(t1_) - X(*r.killed_at), kLane, HtmlEscape(r.name), *r.killed_at);
    }
    for (size_t k = 0; k + 1 < times_.size(); ++k) {
      const double a = std::max(times_[k], ready_t);
      const double b = std::min(times_[k + 1], end);
      if (b <= a) continue;
      const int64_t applied = AppliedAt(r, a);
      const int64_t pointer = record_.pointer_at(a);
      if (applied < 0 || applied >= pointer) continue;
      absl::StrAppendFormat(
          &s,
          R"svg(<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#f5a623" opacity="0.45"><title>%s %d behind at %.2fs</title></rect>)svg",
          X(a), Y(top, static_cast<double>(pointer)), std::max(0.5, X(b) - X(a)),
          Y(top, static_cast<double>(applied)) - Y(top, static_cast<double>(pointer)),
          HtmlEscape(r.name), pointer - applied, a);
    }
    return s;
  }

  // The pointer's points, the same in every lane.
  std::string PointerLine(double top) const {
    std::string pointer = absl::StrFormat("%.1f,%.1f", X(0), Y(top, v0_));
    double last = v0_;
    for (const DemoStep& step : record_.steps) {
      const auto v = static_cast<double>(step.version);
      absl::StrAppendFormat(&pointer, " %.1f,%.1f %.1f,%.1f", X(step.published_at), Y(top, last),
                            X(step.published_at), Y(top, v));
      last = v;
    }
    absl::StrAppendFormat(&pointer, " %.1f,%.1f", X(t1_), Y(top, last));
    return pointer;
  }

  // The replica's applied version, from its first report to its end ("" if
  // it never reported one).
  std::string AppliedLine(const DemoReplica& r, size_t i, double top, double end) const {
    std::string points;
    double applied = -1;
    for (const DemoReplicaSample& sample : r.timeline) {
      if (sample.applied < 0 || sample.t > end) continue;
      const auto v = static_cast<double>(sample.applied);
      if (applied < 0) {
        absl::StrAppendFormat(&points, "%.1f,%.1f", X(sample.t), Y(top, v));
      } else {
        absl::StrAppendFormat(&points, " %.1f,%.1f %.1f,%.1f", X(sample.t), Y(top, applied),
                              X(sample.t), Y(top, v));
      }
      applied = v;
    }
    if (applied < 0) return "";
    absl::StrAppendFormat(&points, " %.1f,%.1f", X(end), Y(top, applied));
    return absl::StrFormat(
        R"svg(<polyline fill="none" stroke="%s" stroke-width="2.5" points="%s"/>)svg", Color(i + 1),
        points);
  }

  // A ring at a join, a dot where it became ready, a cross at a kill.
  std::string Markers(const DemoReplica& r, size_t i, double top,
                      const std::optional<double>& ready) const {
    std::string s;
    if (r.joined) {
      absl::StrAppendFormat(
          &s,
          R"svg(<circle cx="%.1f" cy="%.1f" r="6" fill="none" stroke="%s" stroke-width="2"><title>%s started at %.2fs</title></circle>)svg",
          X(r.started_at), top + kLane / 2, Color(i + 1), HtmlEscape(r.name), r.started_at);
    }
    if (ready.has_value()) {
      absl::StrAppendFormat(
          &s,
          R"svg(<circle cx="%.1f" cy="%.1f" r="4" fill="%s"><title>%s ready at %.2fs</title></circle>)svg",
          X(*ready), Y(top, static_cast<double>(std::max<int64_t>(AppliedAt(r, *ready), 0))),
          Color(i + 1), HtmlEscape(r.name), *ready);
    }
    if (r.killed_at.has_value()) {
      absl::StrAppendFormat(
          &s,
          R"svg(<path d="M%.1f %.1f l12 12 m0 -12 l-12 12" stroke="#c00" stroke-width="3"><title>%s killed (SIGKILL) at %.2fs</title></path>)svg",
          X(*r.killed_at) - 6, top + kLane / 2 - 6, HtmlEscape(r.name), *r.killed_at);
    }
    return s;
  }

  // The shared time axis, with a tick per publish instant.
  std::string TimeAxis() const {
    std::string s;
    const double axis = height_ - kAxis + 4;
    for (const DemoStep& step : record_.steps) {
      absl::StrAppendFormat(
          &s,
          R"svg(<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555"><title>v%d published at %.2fs (%s)</title></line>)svg",
          X(step.published_at), axis, X(step.published_at), axis + 5, step.version,
          step.published_at, step.full ? "FULL" : "DELTA");
    }
    for (double t : Ticks(0, t1_, 8)) {
      absl::StrAppendFormat(
          &s, R"svg(<text x="%.1f" y="%.1f" font-size="11" text-anchor="middle">%s</text>)svg",
          X(t), axis + 17, TickLabel(t));
    }
    absl::StrAppendFormat(
        &s,
        R"svg(<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle">seconds since start</text>)svg"
        "\n</svg>\n",
        (kLeft + kWidth - kRight) / 2, height_ - 2);
    return s;
  }

  const DemoRecord& record_;
  const double t1_;
  const double v0_;
  const double v1_;
  const double height_;
  const std::vector<double> times_;
};

}  // namespace

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

std::string FleetChart(const DemoRecord& record) { return FleetLanes(record).Draw(); }

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

}  // namespace stitch
