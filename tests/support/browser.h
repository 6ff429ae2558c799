// A real browser for tests that look at pages: headless Chromium (Debian's
// `chromium` package, installed by scripts/install-deps), run once per call.
// Its virtual time runs the page's script (timers, fetches) for a budget
// without the test sleeping.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>

#include "tests/support/subprocess.h"

namespace stitch::testing {

// $STITCH_CHROMIUM, else /usr/bin/chromium; "" when neither exists.
std::string ChromiumBinary();

// The DOM of `url` after its script ran for `budget` of virtual time
// (--dump-dom); the whole result, so a test can show stderr on failure.
// `profile` is a scratch directory for the browser's profile.
ProcessResult DumpDom(const std::string& url, std::chrono::milliseconds budget,
                      const std::filesystem::path& profile);

// A PNG of `url` (`width` x `height` CSS pixels) after `budget` of virtual
// time, written to `png`.
ProcessResult Screenshot(const std::string& url, std::chrono::milliseconds budget,
                         const std::filesystem::path& png, int width, int height,
                         const std::filesystem::path& profile);

// Where tests keep what a person may want to look at after a run
// (screenshots): $STITCH_ARTIFACTS_DIR, else <build>/artifacts; created if
// needed.
std::filesystem::path ArtifactsDir();

}  // namespace stitch::testing
