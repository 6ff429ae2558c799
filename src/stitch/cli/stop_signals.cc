#include "stitch/cli/stop_signals.h"

#include <pthread.h>
#include <signal.h>

#include <thread>

namespace stitch {

std::atomic<bool>& StopOnSignals() {
  static std::atomic<bool> stop{false};
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread([signals] {
    for (;;) {
      int received = 0;
      if (sigwait(&signals, &received) == 0) stop.store(true);
    }
  }).detach();
  return stop;
}

}  // namespace stitch
