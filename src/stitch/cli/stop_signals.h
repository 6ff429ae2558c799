// How the long-running commands that supervise processes (demo, chaos) stop
// on Ctrl-C or SIGTERM: cleanly, after stopping what they started.
#pragma once

#include <atomic>

namespace stitch {

// Blocks SIGINT and SIGTERM in the calling thread (call it before any other
// thread exists, so that every thread inherits the mask; children unblock
// them again) and starts a thread that sets the returned flag when either
// arrives. The flag lives as long as the process.
std::atomic<bool>& StopOnSignals();

}  // namespace stitch
