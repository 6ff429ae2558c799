#include "stitch/net/sse.h"

namespace stitch {
namespace {

// Calls fn(line) for each line of `text` (split on '\n', a trailing '\r'
// removed, empty lines skipped when `skip_empty`).
template <typename Fn>
void ForEachLine(std::string_view text, bool skip_empty, Fn fn) {
  while (true) {
    size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!(skip_empty && line.empty())) fn(line);
    if (end == std::string_view::npos) return;
    text.remove_prefix(end + 1);
  }
}

}  // namespace

void SseEventSplitter::Append(std::string_view bytes) {
  // Drop consumed bytes first, so the buffer holds one partial event at most.
  if (event_start_ > 0) {
    buffer_.erase(0, event_start_);
    scan_ -= event_start_;
    event_start_ = 0;
  }
  buffer_.append(bytes);
}

std::optional<std::string> SseEventSplitter::Next() {
  for (;;) {
    size_t newline = buffer_.find('\n', scan_);
    if (newline == std::string::npos) return std::nullopt;
    size_t line_start = scan_;
    scan_ = newline + 1;
    size_t line_end = newline;
    if (line_end > line_start && buffer_[line_end - 1] == '\r') --line_end;
    if (line_end != line_start) continue;  // a field line: keep assembling
    // A blank line ends the event.
    std::string event;
    event.reserve(line_start - event_start_);
    ForEachLine(std::string_view(buffer_).substr(event_start_, line_start - event_start_),
                /*skip_empty=*/true, [&](std::string_view line) {
                  event.append(line);
                  event.push_back('\n');
                });
    event_start_ = scan_;
    if (!event.empty()) return event;
  }
}

std::string_view SseEventSplitter::pending() const {
  return std::string_view(buffer_).substr(event_start_);
}

std::optional<std::string> SseData(std::string_view event) {
  std::optional<std::string> data;
  ForEachLine(event, /*skip_empty=*/true, [&](std::string_view line) {
    std::string_view value;
    if (line == "data") {
      value = "";
    } else if (line.substr(0, 5) == "data:") {
      value = line.substr(5);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    } else {
      return;
    }
    if (data.has_value()) {
      data->push_back('\n');
      data->append(value);
    } else {
      data.emplace(value);
    }
  });
  return data;
}

std::string SseEvent(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  ForEachLine(data, /*skip_empty=*/false, [&](std::string_view line) {
    out.append("data: ");
    out.append(line);
    out.push_back('\n');
  });
  out.push_back('\n');
  return out;
}

}  // namespace stitch
