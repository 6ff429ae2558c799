// Staging done by the sidecar itself, for engines that only load a
// checkpoint directory (stock SGLang, vLLM): the target version is
// materialized into a local checkpoint with the delta codec (anchor plus
// deltas, every checksum verified) while the engine keeps serving, and the
// engine is then asked to load that directory.
//
// Each call runs its codec work on `pool` and never blocks the calling
// event loop. Errors name the directory and the version.
#pragma once

#include <filesystem>

#include <boost/asio/awaitable.hpp>

#include "absl/status/status.h"
#include "stitch/core/version.h"
#include "stitch/engine/engine.h"
#include "stitch/net/worker_pool.h"

namespace stitch {

// Seeds `local` with the boot checkpoint `base`, labelled `boot`.
boost::asio::awaitable<absl::Status> SeedLocalCheckpoint(WorkerPool& pool,
                                                         const std::filesystem::path& base,
                                                         const std::filesystem::path& local,
                                                         const VersionRef& boot);

// Materializes `plan.target` into `local`: only the deltas after what it
// holds when it holds an earlier version of the run, else from the chain's
// anchor; then copies the base checkpoint's other files (config, tokenizer)
// that `local` lacks. InvalidArgument for a plan without versions.
boost::asio::awaitable<absl::Status> StageLocalCheckpoint(WorkerPool& pool, const StagePlan& plan,
                                                          const std::filesystem::path& local);

// OK when `local` holds `target`'s version; FailedPrecondition naming what
// it holds otherwise.
boost::asio::awaitable<absl::Status> CheckLocalCheckpointHolds(WorkerPool& pool,
                                                               const std::filesystem::path& local,
                                                               const VersionRef& target);

}  // namespace stitch
