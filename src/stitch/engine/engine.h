// The Engine port: how a replica sidecar drives the inference engine beside
// it (docs/design.md, "Engines"). The sidecar is the only thing that talks
// to the engine's control surface; everything it needs goes through here.
//
// Lifecycle, as the reconciler uses it:
//   InitializeDestination(boot)     once, before the replica enters rotation
//   Stage(plan)                     while the engine keeps serving
//   Pause(); Commit(target); Resume()
//                                   the only paused moment (admission closed)
//   ResetToBoot(boot)               a run change, while paused and drained
//   Health(timeout), Report(timeout) the watchdog's probe: alive, and what
//                                   weights it says it holds
// and, on the data plane, Abort for requests whose client went away. How
// versioned requests are tagged and their responses stamped is the rollout
// API's, the same for every engine (api/request.h, api/response.h).
//
// Errors: every method returns a Status the caller must look at.
//   InitializeDestination  any error is terminal for the replica
//   Stage                  errors are transient (the live weights are untouched)
//   Commit                 any error is terminal: the live weights are unknown,
//                          except Aborted: the engine undid a commit that
//                          failed part-way and serves the previous weights,
//                          with their label, as before
//   Pause, Resume, ResetToBoot, FlushCache   Unavailable when the engine did
//                          not answer, Internal when it refused
//
// Threading: methods are called on one event-loop thread (the one whose
// executor the adapter was built with); the coroutines they return never
// block it (blocking work goes to a worker pool).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stitch/api/update_destination.h"
#include "stitch/core/manifest.h"
#include "stitch/core/version.h"
#include "stitch/format/checksum.h"

namespace stitch {

// One version of the chain a stage needs, as materialized locally.
struct StagedVersion {
  int64_t version = 0;
  VersionManifest manifest;
  std::filesystem::path dir;  // holds the version's index and payload files
};

// What Stage prepares: the engine's weights at `target`, built from an
// anchor and the chain of versions after it.
struct StagePlan {
  VersionRef target;
  // The boot checkpoint of the target's run and its version: the anchor when
  // `chain` starts with a DELTA.
  std::filesystem::path base_checkpoint_dir;
  int64_t base_version = 0;
  // Oldest first; the last one is `target`. The first is a FULL version (the
  // anchor) or a DELTA whose base is `base_version`. Every directory sits in
  // `source_dir`, but a first link that is an anchor written after the fact
  // (store.h Store::anchors()), which sits in the anchors store's.
  std::vector<StagedVersion> chain;
  // The directory holding the chain's version directories (weight_vNNNNNN):
  // a filesystem store's `updates/`, or a remote store's local cache.
  std::filesystem::path source_dir;
};

// What an engine says about the weights it serves (Engine::Report): the
// sidecar compares it with what it loaded to verify the engine, and to
// notice a restart or a change of weights it did not make.
struct EngineReport {
  // The engine's own label of its serving weights, as given (SGLang's
  // `weight_version`: whatever the last load named, "default" for an engine
  // started without one).
  std::string label;
  // The label read as a version (ParseEngineLabel); nullopt when it names
  // none.
  std::optional<VersionRef> held;
  // Changes when the engine process restarts; "" when it reports none.
  std::string instance;
  // WeightsFingerprint (format/checksum.h) of the serving weights, when the
  // engine reports one.
  std::optional<Checksum128> fingerprint;
  // The name the engine serves its model under (SGLang's
  // `served_model_name`); "" when it reports none.
  std::string served_model_name;
};

// Reads an engine's weight label as a version: an identity
// ("run/weight_v000007", its run included) or a bare number ("7", run "").
// nullopt for anything else ("default", "", a label someone else chose).
std::optional<VersionRef> ParseEngineLabel(std::string_view label);

// Parses an engine's /model_info (or /server_info) body into a report:
// `weight_version_id` (the reference engine's identity) when present, else
// `weight_version` (a string or a number); `instance_id`;
// `weights_fingerprint` (32 hex digits). InvalidArgument when the body is
// not a JSON object or a present field has the wrong type.
[[nodiscard]] absl::StatusOr<EngineReport> ParseEngineReport(std::string_view body);

class Engine {
 public:
  virtual ~Engine() = default;

  // "sglang", "sglang-stock", ... for messages and /server_info.
  virtual std::string_view name() const = 0;

  // Prepares wherever staged versions go (a local checkpoint seeded with the
  // boot weights, an in-memory image) for the engine serving `boot`, the
  // boot checkpoint's version. Called once before anything else.
  virtual boost::asio::awaitable<absl::Status> InitializeDestination(const VersionRef& boot) = 0;

  // Prepares `plan.target` while the engine keeps serving. A failure leaves
  // the live weights untouched; a later Stage may be asked for the same or
  // another target.
  virtual boost::asio::awaitable<absl::Status> Stage(const StagePlan& plan) = 0;

  // Activates the most recently staged target. REQUIRES: Pause() succeeded
  // and `target` is what the last successful Stage prepared.
  struct CommitOptions {
    bool flush_cache = false;
  };
  virtual boost::asio::awaitable<absl::Status> Commit(const VersionRef& target,
                                                      CommitOptions options) = 0;

  // Pauses generation in place: running requests keep their state and
  // continue after Resume().
  virtual boost::asio::awaitable<absl::Status> Pause() = 0;
  virtual boost::asio::awaitable<absl::Status> Resume() = 0;
  virtual boost::asio::awaitable<absl::Status> FlushCache() = 0;

  // Reloads the boot checkpoint as the serving weights (labelled `boot`) and
  // re-initializes the update destination from it. REQUIRES: paused, with no
  // request in flight.
  virtual boost::asio::awaitable<absl::Status> ResetToBoot(const VersionRef& boot) = 0;

  // OK when the engine answers its health check within `timeout`.
  virtual boost::asio::awaitable<absl::Status> Health(std::chrono::milliseconds timeout) = 0;

  // What the engine says it holds now. Unavailable when it did not answer
  // within `timeout`; InvalidArgument when its answer is unreadable.
  virtual boost::asio::awaitable<absl::StatusOr<EngineReport>> Report(
      std::chrono::milliseconds timeout) = 0;

  // Best effort: asks the engine to end the requests with these ids.
  virtual boost::asio::awaitable<void> Abort(std::vector<std::string> rids) = 0;

  // Whether what the engine says of a request's tokens (the spans it
  // reports, the labels of its events) places a commit exactly, as its last
  // Report found. Stock SGLang's overlap scheduler does not: its spans count
  // a change before the token it has in flight. Default: true.
  virtual bool PlacesCommitsExactly() const { return true; }

  // How commits went, for /metrics: a count per (path, reason), e.g.
  // ("patch", "") or ("reload", "dense"), as the adapter counted them
  // (CommitPathCounter). Default: none, for adapters that do not count.
  struct CommitPath {
    std::string path;
    std::string reason;
    uint64_t count = 0;
  };
  virtual std::vector<CommitPath> CommitPaths() const { return {}; }

  // Gives the body of a 200 answer to a request forwarded as is (to
  // `path`) back what the engine was started with, where the sidecar's own
  // loads changed it: stock SGLang names its served model after the last
  // disk load's directory. Default: unchanged.
  virtual void RestoreForwarded(std::string_view path, std::string& body) const {
    (void)path;
    (void)body;
  }
};

// What an adapter that counts its commits keeps for Engine::CommitPaths.
class CommitPathCounter {
 public:
  // Counts a commit that took `path` for `reason`.
  void Count(std::string path, std::string reason);
  std::vector<Engine::CommitPath> Paths() const;

 private:
  std::map<std::pair<std::string, std::string>, uint64_t> counts_;
};

}  // namespace stitch
