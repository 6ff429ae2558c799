#include "stitch/net/prometheus.h"

#include <cstdlib>
#include <string>

namespace stitch {

std::string PromLabels(std::string_view key, std::string_view value) {
  std::string out;
  out.reserve(key.size() + value.size() + 5);
  out.append("{").append(key).append("=\"");
  for (char c : value) {
    if (c == '\n') {
      out.append("\\n");
      continue;
    }
    if (c == '\\' || c == '"') out.push_back('\\');
    out.push_back(c);
  }
  out.append("\"}");
  return out;
}

HttpResponse PrometheusResponse(std::string text) {
  HttpResponse response;
  response.status = 200;
  response.headers.Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8");
  response.body = std::move(text);
  return response;
}

std::optional<double> PrometheusSum(std::string_view text, std::string_view name) {
  std::optional<double> total;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (!line.starts_with(name) || line.size() <= name.size() ||
        (line[name.size()] != ' ' && line[name.size()] != '{')) {
      continue;
    }
    const size_t space = line.rfind(' ');
    const std::string value(line.substr(space + 1));
    char* parsed_end = nullptr;
    const double v = std::strtod(value.c_str(), &parsed_end);
    if (value.empty() || parsed_end != value.c_str() + value.size()) return std::nullopt;
    total = total.value_or(0) + v;
  }
  return total;
}

}  // namespace stitch
