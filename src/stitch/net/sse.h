// Server-sent events framing (text/event-stream), for handlers that rewrite a
// streamed response event by event. Events are separated by a blank line;
// lines end in "\n" or "\r\n" (a lone "\r" line ending is not supported).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace stitch {

// Cuts a byte stream, fed as it arrives, into complete events.
class SseEventSplitter {
 public:
  // Appends received bytes.
  void Append(std::string_view bytes);

  // The next complete event: its lines, each ending in "\n", without the
  // blank line that ended it. nullopt until a complete event is buffered.
  // Blank lines between events are skipped.
  std::optional<std::string> Next();

  // Bytes of the event still incomplete (for example a final event the
  // server ended without a blank line).
  std::string_view pending() const;

 private:
  std::string buffer_;
  size_t event_start_ = 0;  // start of the event being assembled
  size_t scan_ = 0;         // where the search for the next line end resumes
};

// The event's data: the values of its "data" fields joined by "\n" (one
// space after the colon is dropped, per the SSE rules); nullopt when the
// event has no data field.
std::optional<std::string> SseData(std::string_view event);

// One event carrying `data` ("data: <line>\n" per line, then "\n").
std::string SseEvent(std::string_view data);

}  // namespace stitch
