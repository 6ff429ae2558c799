#include "stitch/demo/console.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <iostream>

namespace stitch {
namespace {

// `text` cut to the terminal's width, so that the live line never wraps.
std::string Fit(const std::string& text) {
  winsize w{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 1 && text.size() >= w.ws_col) {
    return text.substr(0, w.ws_col - 1);
  }
  return text;
}

}  // namespace

DemoConsole::DemoConsole() : tty_(::isatty(STDOUT_FILENO) == 1) {}

void DemoConsole::Line(const std::string& text) {
  absl::MutexLock lock(&mu_);
  if (tty_) std::cout << "\r\033[K";
  std::cout << text << "\n";
  if (tty_ && !live_.empty()) std::cout << Fit(live_);
  std::cout.flush();
}

void DemoConsole::Live(const std::string& text) {
  absl::MutexLock lock(&mu_);
  live_ = text;
  if (!tty_) return;
  std::cout << "\r\033[K" << Fit(live_);
  std::cout.flush();
}

void DemoConsole::Commit(const std::string& text) {
  absl::MutexLock lock(&mu_);
  live_.clear();
  if (tty_) std::cout << "\r\033[K";
  std::cout << text << "\n";
  std::cout.flush();
}

}  // namespace stitch
