#include "tests/support/browser.h"

#include <cstdlib>
#include <vector>

namespace stitch::testing {

namespace {

// A browser that hangs is killed: a test fails rather than waits forever.
constexpr auto kBrowserTimeout = std::chrono::seconds(60);

std::vector<std::string> BaseArgs(std::chrono::milliseconds budget,
                                  const std::filesystem::path& profile) {
  // --no-sandbox: tests run as root in containers, where Chromium's sandbox
  // cannot start; the pages are our own.
  return {ChromiumBinary(),
          "--headless",
          "--no-sandbox",
          "--disable-gpu",
          "--no-first-run",
          "--disable-extensions",
          "--hide-scrollbars",
          "--user-data-dir=" + profile.string(),
          "--virtual-time-budget=" + std::to_string(budget.count())};
}

}  // namespace

std::string ChromiumBinary() {
  if (const char* env = std::getenv("STITCH_CHROMIUM"); env != nullptr && *env != '\0') return env;
  if (std::filesystem::exists("/usr/bin/chromium")) return "/usr/bin/chromium";
  return "";
}

ProcessResult DumpDom(const std::string& url, std::chrono::milliseconds budget,
                      const std::filesystem::path& profile) {
  std::vector<std::string> argv = BaseArgs(budget, profile);
  argv.push_back("--dump-dom");
  argv.push_back(url);
  return RunProcess(argv, kBrowserTimeout);
}

ProcessResult Screenshot(const std::string& url, std::chrono::milliseconds budget,
                         const std::filesystem::path& png, int width, int height,
                         const std::filesystem::path& profile) {
  std::vector<std::string> argv = BaseArgs(budget, profile);
  argv.push_back("--screenshot=" + png.string());
  argv.push_back("--window-size=" + std::to_string(width) + "," + std::to_string(height));
  argv.push_back(url);
  return RunProcess(argv, kBrowserTimeout);
}

std::filesystem::path ArtifactsDir() {
  std::filesystem::path dir = STITCH_ARTIFACTS_DIR_DEFAULT;
  if (const char* env = std::getenv("STITCH_ARTIFACTS_DIR"); env != nullptr && *env != '\0') {
    dir = env;
  }
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace stitch::testing
