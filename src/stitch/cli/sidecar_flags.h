// The `stitch sidecar` flags (docs/sidecar.md, "Running it"): as given, and
// checked into the settings of the sidecar (replica/sidecar.h) and of the
// engine adapter it drives.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/core/version.h"
#include "stitch/engine/engine.h"
#include "stitch/fetch/peers.h"
#include "stitch/net/http.h"
#include "stitch/net/server.h"
#include "stitch/replica/reconciler.h"
#include "stitch/replica/watchdog.h"
#include "stitch/store/store.h"

namespace stitch {

// The `stitch sidecar` flags, as given.
struct SidecarFlags {
  // The store URI; or the original Stitch's store wiring below, translated
  // into one (docs/migrating.md, "Sidecar flags").
  std::string store;
  // The original's `--store-factory MODULE:CALLABLE`: only the original
  // cookbook's factory (kOriginalStoreFactory) is understood, through its
  // --store-opt keys; any other Python factory is refused.
  std::string store_factory;
  // The original's `--store-opt KEY=VALUE`, in the order given.
  std::vector<std::string> store_opts;
  // The original's `--bulletin-root`, the store factory's local root: where
  // an S3 store caches versions, and the store itself for backend=local.
  std::string bulletin_root;
  // Where a remote store caches versions (default: beside --local-checkpoint,
  // else a fresh temporary directory).
  std::string cache_dir;
  // The pool of other replicas' sidecars a remote store fetches version
  // files from before the store itself (a pool spec: static:, file:, dns:).
  std::string peers;
  // Each transfer from a peer must finish within --peer-allowance seconds
  // (plus the connect timeout and any wait for the owner) and the file's
  // size at --peer-min-rate MiB/s, or it is left for the next peer or the
  // store (StorePeers::min_rate, ::allowance).
  double peer_min_rate_mib_s = static_cast<double>(StorePeers{}.min_rate) / (1 << 20);
  double peer_allowance_s = std::chrono::duration<double>(StorePeers{}.allowance).count();
  // Log every request the sidecar receives (method and target) at info.
  bool debug_requests = false;
  std::string run_id;
  std::string engine = "sglang";
  std::string engine_url;
  std::string base_checkpoint;
  std::string local_checkpoint;
  std::string update_mode = "disk";
  // Sent as `load_format` with every update_weights_from_disk.
  std::string disk_load_format = "auto";
  // Commit DELTAs as in-place patches of the values that changed (vLLM with
  // Stitch's worker extension), falling back to a reload when dense.
  bool patch_commits = false;
  double patch_max_density = 0.3;
  std::string patch_verify = "checksums";
  std::string commit_mode = "in_place";
  int64_t boot_version = 0;
  bool flush_cache_on_commit = false;
  // How a whole /generate reaches the engine: "stream" (assembled from its
  // stream, for exact version spans) or "relay".
  std::string whole_generate = "stream";
  double reconcile_interval_s = 5;
  double reconcile_max_interval_s = 30;
  double store_outage_limit_s = 30;
  double watchdog_interval_s = 1;
  int64_t watchdog_threshold = 15;
  // A real engine loads a large model in minutes: how long the sidecar waits
  // for one to start, and for one that went away to come back.
  double engine_start_timeout_s = 1800;
  double engine_restart_grace_s = 1800;
  // How long one engine check may take (SGLang's /health runs a generation
  // that waits behind the queue under load).
  double engine_check_timeout_s = 10;
  std::string host = kDefaultListenHost;
  // The original Stitch sidecar's port.
  int64_t port = 8000;
  // Bearer tokens (net/auth.h): the sidecar's own, and the engine's.
  std::string auth_token_file;
  bool auth_data_plane = false;
  std::string engine_token_file;
};

enum class EngineKind {
  kSglang,       // stages by itself (/stage_weight_update)
  kSglangStock,  // the sidecar stages into --local-checkpoint
  kVllm,         // vLLM; the sidecar stages into --local-checkpoint
};

// The flags, checked and parsed.
struct SidecarConfig {
  std::string store_uri;
  // Where a remote store caches versions; empty: the sidecar picks one.
  std::filesystem::path cache_dir;
  // How the store fetches from --peers: the deadline's terms (min_rate,
  // allowance); the sidecar adds the pool and the token.
  StorePeers peers;
  bool log_requests = false;
  EngineKind engine = EngineKind::kSglang;
  std::string engine_url;
  HttpUrl engine_http;
  std::filesystem::path local_checkpoint;
  std::string disk_load_format;
  bool patch_commits = false;
  double patch_max_density = 0.3;
  std::string patch_verify;
  UpdateDestination update_mode = UpdateDestination::kDisk;
  // ProxyOptions::assemble_whole_generate: --whole-generate stream, for an
  // SGLang engine (vLLM labels no streamed event, so streaming cannot help).
  bool assemble_whole_generate = false;
  ReconcilerOptions reconciler;
  WatchdogOptions watchdog;
  ServerOptions server;
};

// The original Stitch cookbook's store factory, whose --store-opt keys
// (backend, s3_root, s3_endpoint_url, volume_name) are understood here.
inline constexpr std::string_view kOriginalStoreFactory = "cookbook.common.storage:create_store";

// Checks the flags for consistency without touching anything. Errors are
// InvalidArgument with one line naming the flag and saying what to do: an
// empty or invalid run id, a negative boot version, disk mode (or the stock
// engine) without --local-checkpoint, cpu mode with the stock engine or vLLM
// (they load versions only from disk), an unknown engine, mode, commit mode or
// --whole-generate, a
// bad engine URL, negative intervals, a threshold below 1, a port out of
// range, a missing --store or --base-checkpoint, --patch-commits without
// --engine vllm or with a density outside (0, 1] or an unknown --patch-verify; of the original's
// store wiring: a Python --store-factory other than kOriginalStoreFactory,
// --store together with --store-opt, a malformed, repeated or unknown
// --store-opt key, backend=modal-volume, an S3 backend without s3_root, a
// local backend without --bulletin-root, --cache-dir and --bulletin-root
// naming two cache directories, and a --peer-min-rate that is not positive
// or a negative --peer-allowance.
[[nodiscard]] absl::StatusOr<SidecarConfig> CheckSidecarFlags(const SidecarFlags& flags);

// Checks --run-id against the run the store holds at start (`pointer`, its
// claimed pointer, read from the store at `store_uri`). A sidecar follows the
// store's run, so a --run-id naming another run would be followed silently
// away from, with the start line and /server_info disagreeing about the run.
// InvalidArgument, one line naming both runs and how to reconcile them, when
// the pointer names another run; OK for a bare identity (no run named). A
// run change published while the sidecar runs is followed, not checked here.
[[nodiscard]] absl::Status CheckRunMatchesStore(std::string_view run_id, std::string_view store_uri,
                                                const VersionRef& pointer);

}  // namespace stitch
