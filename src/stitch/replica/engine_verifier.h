// Trust in the engine: whether what an engine says it holds can be vouched
// for, told apart from following the store's pointer (reconciler.h), which
// asks this part before it admits anything versioned.
//
// An engine's report (Engine::Report) gives a label, an instance id, and
// perhaps a weights fingerprint. The verifier knows what the fingerprint of
// any version of the run being followed must be: the store's recorded
// checksums, folded along the version's chain from its anchor (a FULL
// version, or the boot checkpoint, hashed once), give it without loading a
// byte of weights (delta/weights_checksums.h WeightsFingerprint). With
// that it answers three questions:
//   - Verify: may an engine found holding weights (at start, or after trust
//     was withdrawn) be trusted with the version it names? Only a version of
//     the run being followed (or of the pointer's run), the boot version or
//     a published one at or below the pointer, whose fingerprint (when the
//     engine reports one) is that version's;
//   - CheckLoaded: after the sidecar loaded a version, does the engine report
//     exactly that version (and its fingerprint)?
//   - Drift: does a probe's report still describe what was vouched for (the
//     same instance, label and fingerprint), or did the engine change behind
//     the sidecar's back (a restart, an out-of-band load)?
// A vouched report becomes the baseline that Drift compares with.
//
// Threading: confined to the reconciler's event loop; store and hashing
// calls run on the worker pool.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include <boost/asio/awaitable.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stitch/core/version.h"
#include "stitch/delta/weights_checksums.h"
#include "stitch/engine/engine.h"
#include "stitch/net/worker_pool.h"
#include "stitch/store/store.h"

namespace stitch {

struct EngineVerifierOptions {
  // The version of the boot checkpoint every engine starts from, and the
  // checkpoint itself (hashed once, for the boot version's fingerprint and
  // as the anchor of chains that have no FULL version).
  int64_t boot_version = 0;
  std::filesystem::path base_checkpoint_dir;
  // How long one engine report may take (real time).
  std::chrono::milliseconds report_timeout = std::chrono::seconds(5);
};

// What Verify decided: `verified` is the version the engine's weights are
// vouched for as (its run filled in) when `unverified` is empty; otherwise
// `unverified` says why they cannot be.
struct EngineVerdict {
  VersionRef verified;
  std::string unverified;

  bool ok() const { return unverified.empty(); }
};

class EngineVerifier {
 public:
  // The references must outlive the verifier.
  EngineVerifier(EngineVerifierOptions options, Store& store, Engine& engine, WorkerPool& pool);

  // Whether the engine's report names `label` (and the expected fingerprint,
  // when both are known): "" when it does, else why not. Pure.
  static std::string Disagreement(const EngineReport& report, const VersionRef& label,
                                  const std::optional<Checksum128>& expected);

  // Whether `report` (an engine's, before anything was loaded) can be
  // vouched for while following `run` with the store's pointer at `head`
  // (nullopt: unset). A version of the pointer's run other than `run` is
  // vouched for too (the caller then follows that run). Reads the store's
  // manifest of the claimed version and computes its fingerprint when the
  // engine reports one.
  boost::asio::awaitable<EngineVerdict> Verify(const EngineReport& report,
                                               const std::optional<VersionRef>& head,
                                               const std::string& run);

  // Reads the engine's report right after the sidecar loaded `label`
  // (following `run`): OK when it names `label` (and, when the engine
  // reports fingerprints, label's fingerprint, for a version of `run`);
  // the report then becomes the baseline. Otherwise the error (Unavailable,
  // or Internal naming the disagreement) that leaves the engine's state
  // unknown.
  boost::asio::awaitable<absl::Status> CheckLoaded(const VersionRef& label, const std::string& run);

  // Whether a probe's `report` still describes the vouched weights, now
  // labelled `label`: "" when it does (a baseline field not known yet is
  // learnt from it), else what changed (a new instance: the engine
  // restarted; another label or fingerprint).
  std::string Drift(const EngineReport& report, const VersionRef& label);

  // Makes `report` the baseline (its weights were just vouched for).
  void Vouch(const EngineReport& report);

  // Whether the engine has reported a fingerprint since start: then every
  // load is checked against the store's.
  bool reports_fingerprints() const { return reports_fingerprints_; }

  // The fingerprint of `version` of `run` (the run the store holds), from
  // the store's checksums. Cached per run. Runs on the worker pool.
  boost::asio::awaitable<absl::StatusOr<Checksum128>> ExpectedFingerprint(const std::string& run,
                                                                          int64_t version);

 private:
  absl::StatusOr<TensorChecksums> BootChecksums();  // worker pool only

  const EngineVerifierOptions options_;
  Store& store_;
  Engine& engine_;
  WorkerPool& pool_;

  // What the engine reported after the last verification or load.
  std::string baseline_instance_;
  std::optional<Checksum128> baseline_fingerprint_;
  bool reports_fingerprints_ = false;
  std::string fingerprints_run_;
  std::map<int64_t, Checksum128> expected_fingerprints_;  // of fingerprints_run_
  std::optional<TensorChecksums> boot_checksums_;         // worker pool only
};

}  // namespace stitch
