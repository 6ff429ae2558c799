// What `stitch demo` shows the person running it: plain lines on stdout,
// plus, on a terminal, one live line that is redrawn in place until its step
// ends. Thread-safe.
#pragma once

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace stitch {

class DemoConsole {
 public:
  DemoConsole();

  // Whether stdout is a terminal (only then is there a live line).
  bool tty() const { return tty_; }

  // A line of its own (an event): on a terminal, above the live line.
  void Line(const std::string& text);

  // Redraws the live line (terminals only).
  void Live(const std::string& text);

  // Ends the live line with `text` as its final content.
  void Commit(const std::string& text);

 private:
  const bool tty_;
  absl::Mutex mu_;
  std::string live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stitch
