#include "stitch/net/prometheus.h"

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

}  // namespace stitch
