// The Prometheus text exposition format (version 0.0.4), for the /metrics
// endpoints: each metric gets its HELP and TYPE lines, then its samples.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/net/http.h"

namespace stitch {

class PrometheusText {
 public:
  // Every metric name starts with `prefix` ("stitch_sidecar_").
  explicit PrometheusText(std::string prefix) : prefix_(std::move(prefix)) {}

  // The HELP and TYPE ("counter", "gauge", "summary") lines of `name`.
  void Header(std::string_view name, std::string_view type, std::string_view help) {
    absl::StrAppend(&out_, "# HELP ", prefix_, AbslView(name), " ", AbslView(help), "\n", "# TYPE ",
                    prefix_, AbslView(name), " ", AbslView(type), "\n");
  }
  // One sample of `name`; `labels` is "" or a set from PromLabels().
  template <typename T>
  void Sample(std::string_view name, std::string_view labels, T value) {
    absl::StrAppend(&out_, prefix_, AbslView(name), AbslView(labels), " ", value, "\n");
  }
  // A metric with one sample and no labels.
  template <typename T>
  void One(std::string_view name, std::string_view type, std::string_view help, T value) {
    Header(name, type, help);
    Sample(name, "", value);
  }

  std::string Take() { return std::move(out_); }

 private:
  std::string prefix_;
  std::string out_;
};

// The label set {key="value"}, with the value escaped as the format asks
// (backslash, double quote and newline).
std::string PromLabels(std::string_view key, std::string_view value);

// A GET /metrics answer carrying `text`, with the format's content type.
HttpResponse PrometheusResponse(std::string text);

// Reading an exposition: the sum of the samples of metric `name` (the lines
// "name value" and "name{labels} value"; not HELP or TYPE lines, not
// "name_other"), or nullopt when it has none or one does not parse.
std::optional<double> PrometheusSum(std::string_view text, std::string_view name);

}  // namespace stitch
