#include "stitch/io/parallel.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <new>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace stitch {

int DefaultThreads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

absl::Status ParallelFor(size_t n, int threads,
                         const std::function<absl::Status(size_t i, int worker)>& task,
                         std::atomic<bool>* cancel) {
  if (n == 0) return absl::OkStatus();
  if (threads <= 0) threads = DefaultThreads();
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), n));
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  absl::Mutex mu;
  size_t first_failed = SIZE_MAX;
  absl::Status first_error;

  auto run = [&](int worker) {
    for (;;) {
      if (stop.load(std::memory_order_relaxed)) return;
      const size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      absl::Status s;
      try {
        s = task(i, worker);
      } catch (const std::bad_alloc&) {
        s = absl::ResourceExhaustedError("out of memory");
      } catch (const std::exception& e) {
        s = absl::InternalError(e.what());
      }
      if (!s.ok()) {
        absl::MutexLock lock(&mu);
        // A task stopped because another failed reports Cancelled; the
        // failure that caused it is the one worth returning.
        const bool cancelled = absl::IsCancelled(s);
        const bool have_real = !first_error.ok() && !absl::IsCancelled(first_error);
        if ((!cancelled && (!have_real || i < first_failed)) || (cancelled && first_error.ok())) {
          first_failed = i;
          first_error = std::move(s);
        }
        stop.store(true);
        if (cancel != nullptr) cancel->store(true);
      }
    }
  };
  {
    std::vector<std::jthread> pool;
    for (int w = 1; w < threads; ++w) {
      try {
        pool.emplace_back(run, w);
      } catch (const std::system_error&) {
        break;  // fewer workers than asked; the ones running finish the work
      }
    }
    run(0);
  }
  absl::MutexLock lock(&mu);
  return first_error;
}

absl::Status ParallelFor(size_t n, int threads, const std::function<absl::Status(size_t i)>& task) {
  return ParallelFor(n, threads, [&task](size_t i, int) { return task(i); });
}

}  // namespace stitch
