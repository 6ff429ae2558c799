// Running independent pieces of blocking work (codec tasks, transfers,
// hashing) on a few threads at once.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>

#include "absl/status/status.h"

namespace stitch {

// Number of workers used when an options struct says 0:
// std::thread::hardware_concurrency(), at least 1.
int DefaultThreads();

// Runs task(i, worker) for every i in [0, n) on `threads` workers (the
// calling thread is worker 0; workers are numbered [0, threads); 0 or less:
// DefaultThreads()). Tasks start in index order. After a task fails no new
// task starts, `*cancel` (when given) is set so running tasks can stop
// early, and the error of the lowest-numbered failed task is returned (a
// Cancelled error only when no task failed otherwise). Exceptions thrown by
// a task become errors (ResourceExhausted for std::bad_alloc).
[[nodiscard]] absl::Status ParallelFor(
    size_t n, int threads, const std::function<absl::Status(size_t i, int worker)>& task,
    std::atomic<bool>* cancel = nullptr);

// The same for tasks that need no worker number.
[[nodiscard]] absl::Status ParallelFor(size_t n, int threads,
                                       const std::function<absl::Status(size_t i)>& task);

}  // namespace stitch
